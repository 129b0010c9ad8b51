//! The settings tried (`--recommend`) and the advice after an out-of-memory.

use super::{Bounds, Ev, Input, Outcome, ReplayError, read, replay};
use crate::report::torch_replay::model::TorchConf;
use crate::report::units::human_bytes;
use crate::trace::reader::ReadOptions;
use serde::Serialize;
use std::path::Path;

/// The settings `--recommend` tries: expandable segments on and off, a grid of
/// `max_split_size_mb` and `roundup_power2_divisions`, and with a memory fraction the
/// collector's thresholds. The recorded setting's other keys are kept.
pub fn candidates(recorded: &TorchConf, fraction: bool) -> Vec<TorchConf> {
    const MIB: u64 = 1 << 20;
    let mut out = Vec::new();
    let gcs: &[f64] = if fraction { &[0.0, 0.6, 0.8] } else { &[0.0] };
    for expandable in [false, true] {
        for split in [None, Some(64), Some(128), Some(256), Some(512), Some(1024)] {
            for div in [0u64, 2, 4, 8, 16] {
                for &gc in gcs {
                    let mut c = recorded.clone();
                    c.expandable_segments = expandable;
                    c.max_split_size = split.map_or(u64::MAX, |s: u64| s * MIB);
                    c.roundup_divisions =
                        [div; crate::report::torch_replay::model::conf::INTERVALS];
                    c.gc_threshold = gc;
                    out.push(c);
                }
            }
        }
    }
    out
}

/// Replays every candidate (on all cores) and returns them best first: no failure first,
/// then the lowest peak reserved, then fewer device allocations, then the shorter setting.
pub fn recommend(input: &Input, recorded: &TorchConf, bounds: &Bounds) -> Vec<Outcome> {
    let list = candidates(recorded, bounds.fraction.is_some());
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(list.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Outcome> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(c) = list.get(i) else {
                            break;
                        };
                        mine.push(replay(input, c, bounds, false).0);
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    out.sort_by(|a, b| {
        (
            a.failures > 0,
            a.peak_reserved_bytes,
            a.device_allocs,
            a.setting.len(),
        )
            .cmp(&(
                b.failures > 0,
                b.peak_reserved_bytes,
                b.device_allocs,
                b.setting.len(),
            ))
    });
    out
}

/// The run's setting, parsed (a text PyTorch accepted that the model does not: the defaults,
/// with the reason).
pub fn recorded_conf(input: &Input) -> Result<TorchConf, ReplayError> {
    TorchConf::parse(&input.recorded.text).map_err(|e| ReplayError::Setting {
        text: input.recorded.text.clone(),
        reason: e.to_string(),
    })
}

/// For a run whose PyTorch allocator failed a tensor: the settings under which the replay, up
/// to that request and with the memory the device had then, serves it.
#[derive(Clone, Debug, Serialize)]
pub struct OomAdvice {
    /// PyTorch refused the request with no `cudaMalloc` tried: a memory fraction held it, to
    /// at least this many bytes (the most it had reserved before); the replay holds it there.
    pub fraction_bytes: Option<u64>,
    /// The trace's ring began after the run's first tensors: (records the run made, a
    /// `trace_max` that would have held them all).
    pub ring_began_late: Option<(u64, u64)>,
    pub requested_bytes: u64,
    /// What PyTorch could have held on that device: what it held plus what CUDA said was free.
    pub capacity_bytes: Option<u64>,
    pub run_setting: String,
    /// Whether the replay of the run's own setting fails there too (if not, the replay does
    /// not see what the run saw, and the advice is weak).
    pub run_setting_fails_too: bool,
    /// Settings tried.
    pub tried: usize,
    /// Those that serve the request, best first (lowest peak reserved up to it).
    pub serving: Vec<Outcome>,
}

/// The advice for the trace's first failed tensor, if it has one.
pub fn oom_advice(path: &Path, opts: &ReadOptions) -> Result<Option<OomAdvice>, ReplayError> {
    let input = match read(path, opts) {
        Ok(i) => i,
        Err(ReplayError::NoTensors { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(first) = input.events.iter().find(|e| e.ev == Ev::Oom) else {
        return Ok(None);
    };
    let info = input.reader.info();
    // A ring that began after the run's first tensors: the replay starts from what was live
    // then, not from the segments PyTorch held, so it is not the run's to the byte.
    let ring_began_late = input.from_checkpoint.then(|| {
        // Every record the run made, at 32 bytes, and room for the header and tables.
        let needed = info.claimed.saturating_mul(32).saturating_add(64 << 20);
        (info.claimed, needed)
    });
    let recorded = recorded_conf(&input)?;
    let bounds = Bounds {
        limit: None,
        fraction: None,
        stop_at_oom: true,
    };
    let (own, _) = replay(&input, &recorded, &bounds, false);
    let all = recommend(&input, &recorded, &bounds);
    let tried = all.len();
    let serving = all
        .into_iter()
        .filter(|o| o.serves_recorded_oom == Some(true))
        .collect();
    Ok(Some(OomAdvice {
        fraction_bytes: input
            .devices
            .get(&first.device)
            .and_then(|d| d.allowed_at_oom),
        requested_bytes: first.size,
        capacity_bytes: input
            .devices
            .get(&first.device)
            .and_then(|d| d.capacity_at_oom),
        run_setting: recorded.to_string(),
        run_setting_fails_too: own.serves_recorded_oom == Some(false),
        tried,
        serving,
        ring_began_late,
    }))
}

/// The advice in words, for `gpushim oom`.
pub fn render_advice(a: &OomAdvice) -> String {
    use std::fmt::Write as _;
    let name = |t: &str| {
        if t.is_empty() {
            "the defaults".to_string()
        } else {
            t.to_string()
        }
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "PyTorch's allocator replayed up to the failed request of {} under {} settings{}:",
        human_bytes(a.requested_bytes),
        a.tried,
        match (a.fraction_bytes, a.capacity_bytes) {
            (Some(f), _) => format!(
                ", PyTorch's allocator held to {} by its memory fraction \
                 (set_per_process_memory_fraction: it refused the request without asking CUDA, \
                 having reserved at most that much before)",
                human_bytes(f)
            ),
            (None, Some(c)) => format!(
                ", PyTorch's allocator held to {}: what it held at the failure (its tensors \
                 and cache) plus what CUDA then said was free; the rest of the device was not \
                 PyTorch's to take",
                human_bytes(c)
            ),
            (None, None) => String::new(),
        }
    );
    if let Some((records, needed)) = a.ring_began_late {
        let _ = writeln!(
            s,
            "  the trace's ring began after the run's first tensors ({records} records made, \
             the rest summarized): the replay starts from the tensors live when it began, not \
             from the segments PyTorch held then, so it is not the run's to the byte; to replay \
             exactly, record with GPUSHIM_CONF=trace_max:{}MiB or more",
            needed.div_ceil(1 << 20)
        );
    }
    if a.run_setting_fails_too {
        let _ = writeln!(
            s,
            "  the run's own setting ({}) fails there too, as in the run",
            name(&a.run_setting)
        );
    } else {
        let _ = writeln!(
            s,
            "  the replay of the run's own setting ({}) does not fail there: memory outside \
             PyTorch's allocator changed, so what follows is a rough guide",
            name(&a.run_setting)
        );
    }
    match a.serving.first() {
        Some(best) => {
            let shown: Vec<String> = a.serving.iter().take(3).map(|o| name(&o.setting)).collect();
            let _ = writeln!(
                s,
                "  {} of them serve it, among them {}; the one reserving least ({} at its peak):\n  \
                 export PYTORCH_CUDA_ALLOC_CONF={}",
                a.serving.len(),
                shown.join("; "),
                human_bytes(best.peak_reserved_bytes),
                if best.setting.is_empty() {
                    "\"\"".to_string()
                } else {
                    best.setting.clone()
                }
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  none of them serves it: the program needs more memory there than the device \
                 had, whatever PyTorch's allocator does"
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_ring_that_began_late_says_the_replay_is_not_exact_and_the_trace_max_that_would_be() {
        let a = super::OomAdvice {
            fraction_bytes: None,
            ring_began_late: Some((1_000_000, 100 << 20)),
            requested_bytes: 1 << 20,
            capacity_bytes: None,
            run_setting: String::new(),
            run_setting_fails_too: true,
            tried: 1,
            serving: Vec::new(),
        };
        let text = super::render_advice(&a);
        assert!(text.contains("not the run's to the byte"), "{text}");
        assert!(text.contains("GPUSHIM_CONF=trace_max:100MiB"), "{text}");
    }
}
