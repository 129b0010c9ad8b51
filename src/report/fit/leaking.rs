//! A run that leaks, as `fit` says it before its answers: the growth `leaks` found in the same
//! read, and how soon it alone would fill the room the run's batch leaves.

use super::SettingFit;
use crate::report::leaks::{Growth, Leaks};
use crate::report::torch_allocator::Input;
use serde::Serialize;

/// A run whose memory grows every iteration: the replays hold what it had grown to by the
/// trace's end, so their peaks are the leak's as much as the batch's.
#[derive(Clone, Debug, Serialize)]
pub struct Leaking {
    /// The growing lines' growth per iteration, summed, and the iterations the run had.
    pub bytes_per_iteration: u64,
    pub iterations: u64,
    /// What the growing lines held at the last boundary, summed.
    pub grown_bytes: u64,
    /// The line that grows most, and its kind's name.
    pub line: String,
    pub kind: Option<String>,
    /// Of the room the run's own batch leaves under the limit (the recorded setting), the
    /// iterations until the growth alone fills it (`None`: the run's batch does not fit).
    pub iterations_until_full: Option<u64>,
    /// The run's setting replayed without the growth: what earlier iterations kept on the
    /// growing lines let go, the last iteration's kept (the steady step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady: Option<SettingFit>,
    /// Each growing line and its growth per iteration.
    #[serde(skip)]
    pub(super) lines: Vec<(String, u64)>,
}

impl Leaking {
    /// The growth `leaks` found, if any line grows.
    pub(super) fn of(l: &Leaks) -> Option<Leaking> {
        let it = l.iterations.as_ref()?;
        let top = it.growing.iter().max_by_key(|g| g.bytes_per_iteration)?;
        let sum = |f: fn(&Growth) -> u64| it.growing.iter().map(f).fold(0u64, u64::saturating_add);
        Some(Leaking {
            bytes_per_iteration: sum(|g| g.bytes_per_iteration),
            iterations: it.count,
            grown_bytes: sum(|g| g.live_at_last_boundary),
            line: top.call_site.clone(),
            kind: top.kind.map(|k| k.name().to_string()),
            iterations_until_full: None,
            steady: None,
            lines: it
                .growing
                .iter()
                .map(|g| (g.call_site.clone(), g.bytes_per_iteration))
                .collect(),
        })
    }

    /// With what it does to the answers: the iterations until full ([`Leaking::at_run`]) and
    /// the steady step, the run's setting replayed by `steady_of` with the growth's requests
    /// ([`grown_requests`]) made as nothing.
    pub(super) fn answered(
        self,
        input: &Input,
        (settings, at, limit): (&[SettingFit], u64, u64),
        steady_of: impl Fn(&[bool]) -> SettingFit,
    ) -> Leaking {
        let grown = grown_requests(input, &self.lines);
        let steady = grown.iter().any(|&d| d).then(|| steady_of(&grown));
        Leaking {
            steady,
            ..self.at_run(settings, at, limit)
        }
    }

    /// With the iterations until the growth alone fills the room the run's own batch leaves
    /// under `limit` under the run's setting (none where that batch does not fit).
    fn at_run(mut self, settings: &[SettingFit], at: u64, limit: u64) -> Leaking {
        let row = settings
            .iter()
            .find(|s| s.recorded)
            .and_then(|s| s.rows.iter().find(|r| r.batch == at));
        self.iterations_until_full = row
            .filter(|r| r.failures == 0)
            .map(|r| limit.saturating_sub(r.peak_reserved_bytes) / self.bytes_per_iteration.max(1));
        self
    }
}

/// The requests that make the growth, to be replayed as not made (none of their bytes): on
/// each growing line, the tensors never freed, but for the last iteration's (the latest ones,
/// up to the line's growth per iteration, at least one), which a steady step keeps as long
/// as the step does.
fn grown_requests(input: &Input, lines: &[(String, u64)]) -> Vec<bool> {
    let reader = input.tables();
    let mut of_stack: crate::fasthash::FastMap<u64, Option<u64>> = Default::default();
    let mut line_of = |stack: u64| {
        *of_stack.entry(stack).or_insert_with(|| {
            let label = crate::report::sites::site_label(reader, stack);
            lines.iter().find(|(l, _)| *l == label).map(|&(_, per)| per)
        })
    };
    let never: Vec<bool> = input.last_before_free().map(|l| l.is_none()).collect();
    let requests: Vec<(u64, u64)> = input.requests().collect();
    let mut grown = vec![false; requests.len()];
    // From the end: each line's latest tensors kept up to its growth per iteration.
    let mut kept: crate::fasthash::FastMap<u64, u64> = Default::default();
    for (n, &(size, stack)) in requests.iter().enumerate().rev() {
        if !never.get(n).copied().unwrap_or(false) {
            continue;
        }
        let Some(per) = line_of(stack) else {
            continue;
        };
        let k = kept.entry(stack).or_default();
        if *k == 0 || k.saturating_add(size) <= per {
            *k = k.saturating_add(size).max(1);
        } else if let Some(g) = grown.get_mut(n) {
            *g = true;
        }
    }
    grown
}
