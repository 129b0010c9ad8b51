//! `simulate --torch`: the trace's tensors replayed under the run's setting, each one asked,
//! and the best found; one model for the text and `--json`.

use super::model::TorchConf;
use super::{Bounds, Fidelity, Outcome, RecordedSetting, ReplayError};
use serde::Serialize;

/// What `simulate --torch --json` prints for one trace.
#[derive(Serialize)]
pub struct TorchReport {
    pub trace: String,
    pub tensors: u64,
    pub recorded_setting: RecordedSetting,
    /// The recorded setting replayed first, then each `--torch` setting.
    pub outcomes: Vec<Outcome>,
    /// The recorded setting's replay against the run, per device.
    pub fidelity: Vec<Fidelity>,
    /// With `--recommend`: the best setting found, then the next four.
    pub recommended: Vec<Outcome>,
}

/// A run's tensors (`input`) replayed under its own setting, then each of `asked`, and with
/// `recommend` the best settings found; `say` hears what takes a while and what the reader
/// should know.
pub fn simulate(
    input: &super::Input,
    asked: &[TorchConf],
    recommend: bool,
    bounds: &Bounds,
    say: &dyn Fn(String),
) -> Result<TorchReport, ReplayError> {
    let trace = &input.tables().info().path;
    let recorded = super::recorded_conf(input)?;
    let (first, fidelity) = super::replay(input, &recorded, bounds, true);
    let mut outcomes = vec![first];
    for c in asked {
        outcomes.push(super::replay(input, c, bounds, false).0);
    }
    let mut recommended = Vec::new();
    if recommend {
        say(format!(
            "gpushim: replaying {} settings of PyTorch's allocator over {} tensors...",
            super::candidates(&recorded, bounds.fraction.is_some()).len(),
            input.tensors
        ));
        recommended = super::recommend(input, &recorded, bounds);
        // Settings that come out the same are one row: the shortest text stands for them.
        let mut seen = std::collections::HashSet::new();
        recommended.retain(|o| {
            seen.insert((
                o.peak_reserved_bytes,
                o.peak_allocated_bytes,
                o.device_allocs,
                o.device_frees,
                o.failures,
            ))
        });
        recommended.truncate(5);
    }
    if input.from_checkpoint {
        let (segments, reserved) = input.seed.reserved();
        say(match &outcomes[0].start_not_exact {
            None => format!(
                "gpushim: {}: the trace's oldest records were folded into its checkpoint (it \
                 reached trace_max): the replay starts from PyTorch's cache as the checkpoint \
                 kept it ({segments} segments of {}, {} tensors live), the run's own to the \
                 byte; other settings start from the tensors it kept live, in a cache of their own",
                crate::files::shown(trace),
                crate::report::units::human_bytes(reserved),
                input.seed.tensors()
            ),
            Some(why) => format!(
                "gpushim: {}: the trace's oldest records were folded into its checkpoint (it \
                 reached trace_max): the replay starts from what the checkpoint kept, which is \
                 not PyTorch's cache to the byte ({why}); record with a larger trace_max for an \
                 exact replay",
                crate::files::shown(trace)
            ),
        });
        let b = input.steps_begun;
        say(format!(
            "gpushim: {}: the records after it hold {b} of the run{}",
            crate::files::shown(trace),
            if b.few() {
                ": every figure below is of those alone; a larger trace_max keeps more of the run"
            } else {
                ""
            }
        ));
    }
    Ok(TorchReport {
        trace: crate::files::shown(trace).to_string(),
        tensors: input.tensors,
        recorded_setting: input.recorded.clone(),
        outcomes,
        fidelity,
        recommended,
    })
}
