//! The settings tried (`--recommend`) and the advice after an out-of-memory.

use super::{Bounds, Ev, Input, Outcome, ReplayError, replay};
use crate::report::torch_allocator::model::TorchConf;
use crate::report::units::human_bytes;
use serde::Serialize;

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
                        [div; crate::report::torch_allocator::model::conf::INTERVALS];
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
    // The setting's text last: ties come out in one order whichever worker finished first.
    out.sort_by(|a, b| {
        (
            a.failures > 0,
            a.peak_reserved_bytes,
            a.device_allocs,
            a.setting.len(),
            &a.setting,
        )
            .cmp(&(
                b.failures > 0,
                b.peak_reserved_bytes,
                b.device_allocs,
                b.setting.len(),
                &b.setting,
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
    /// The trace's ring began after the run's first tensors: where the replay starts.
    pub ring_began_late: Option<RingStart>,
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
    /// The replay of the run's own setting served the request the run failed: why.
    pub run_setting_serves_it: Option<String>,
    /// What PyTorch's private pools (CUDA graphs' pools, `torch.cuda.MemPool`s) held at the
    /// failure: memory its default pools could not use.
    pub private_pool_bytes: u64,
    /// The failed request was in a private pool: the replay judges no setting on it.
    pub in_private_pool: bool,
}

/// A replay that starts where a ring's checkpoint stood (the run made more records than its
/// trace held).
#[derive(Clone, Debug, Serialize)]
pub struct RingStart {
    /// Records the run made.
    pub records: u64,
    /// A `trace_max` that would have held them all.
    pub trace_max_needed: u64,
    /// PyTorch's cache as the checkpoint kept it: segments, bytes reserved, tensors live.
    pub segments: usize,
    pub reserved_bytes: u64,
    pub tensors: usize,
    /// Why that is not the run's cache to the byte (absent: it is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_exact: Option<String>,
}

impl ReplayError {
    /// The error as the advice for a failure says it: a ring whose checkpoint summarized every
    /// tensor summarized the failure too.
    pub fn for_failure(self) -> ReplayError {
        self.failure_summarized().unwrap_or(self)
    }

    /// [`ReplayError::for_failure`] where it differs.
    pub fn failure_summarized(&self) -> Option<ReplayError> {
        match *self {
            ReplayError::Summarized {
                records,
                trace_max_needed,
            } => Some(ReplayError::FailureSummarized {
                records,
                trace_max_needed,
            }),
            _ => None,
        }
    }
}

/// [`oom_advice`] of the requests already read.
pub fn oom_advice_of(input: &Input) -> Result<Option<OomAdvice>, ReplayError> {
    let info = input.tables.info();
    let Some(first) = input.events.iter().find(|e| e.ev == Ev::Oom) else {
        if input.from_checkpoint {
            return Err(ReplayError::FailureSummarized {
                records: info.claimed,
                trace_max_needed: super::trace_max_for(info.claimed),
            });
        }
        return Ok(None);
    };
    let recorded = recorded_conf(input)?;
    let bounds = Bounds {
        limit: None,
        fraction: None,
        stop_at_oom: true,
        afresh: false,
        ..Bounds::default()
    };
    let (own, fidelity) = replay(input, &recorded, &bounds, true);
    let limit = {
        let d = input.devices.get(&first.device);
        d.and_then(|d| d.allowed_at_oom)
            .or(d.and_then(|d| d.capacity_at_oom))
    };
    let run_setting_serves_it = (own.serves_recorded_oom == Some(true)).then(|| {
        let parted = fidelity
            .iter()
            .find(|f| f.device == first.device)
            .and_then(|f| f.first_difference.clone());
        why_the_run_setting_serves(parted, limit)
    });
    // A ring that began after the run's first tensors: the replay starts from the cache the
    // checkpoint kept.
    let ring_began_late = input.from_checkpoint.then(|| {
        let (segments, reserved_bytes) = input.seed.reserved();
        RingStart {
            records: info.claimed,
            trace_max_needed: super::trace_max_for(info.claimed),
            segments,
            reserved_bytes,
            tensors: input.seed.tensors(),
            not_exact: own.start_not_exact.clone(),
        }
    });
    let all = recommend(input, &recorded, &bounds);
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
        run_setting_serves_it,
        tried,
        serving,
        ring_began_late,
        private_pool_bytes: own.private_pool_bytes_at_oom,
        in_private_pool: own.oom_in_private_pool,
    }))
}

/// Why the replay of the run's own setting served a request the run failed: its segments
/// parted from the run's (`parted`: where, the run's event, the replay's), so its cache was not
/// the run's; or it had the run's cache and the limit found at the failure let it take more
/// than CUDA did.
fn why_the_run_setting_serves(
    parted: Option<(usize, String, String)>,
    limit: Option<u64>,
) -> String {
    match parted {
        Some((i, run, replay)) => format!(
            "its segments part from the run's at segment event {} (the run: {run}; the \
             replay: {replay}), so its cache there is not the run's: the model of PyTorch's \
             allocator differs from this run",
            i + 1
        ),
        None => format!(
            "it took the run's very segments up to the failure, so it had the run's cache \
             there, and the limit found at the failure{} let it take what the run could not: \
             CUDA gave PyTorch less than that (memory outside PyTorch's allocator grew after \
             CUDA last said what was free)",
            limit.map_or(String::new(), |l| format!(" ({})", human_bytes(l)))
        ),
    }
}

#[cfg(test)]
mod tests {
    fn advice(not_exact: Option<&str>) -> super::OomAdvice {
        super::OomAdvice {
            fraction_bytes: None,
            ring_began_late: Some(super::RingStart {
                records: 1_000_000,
                trace_max_needed: 100 << 20,
                segments: 3,
                reserved_bytes: 60 << 20,
                tensors: 7,
                not_exact: not_exact.map(str::to_string),
            }),
            requested_bytes: 1 << 20,
            capacity_bytes: None,
            run_setting: String::new(),
            run_setting_fails_too: true,
            run_setting_serves_it: None,
            tried: 1,
            serving: Vec::new(),
            private_pool_bytes: 0,
            in_private_pool: false,
        }
    }

    #[test]
    fn a_ring_that_began_late_says_whether_its_start_is_the_runs_cache() {
        let text = crate::report::render::torch_allocator::render_advice(&advice(None));
        assert!(text.contains("the run's own to the byte"), "{text}");
        assert!(
            text.contains("3 segments of 60.00 MiB with 7 tensors live"),
            "{text}"
        );
        assert!(!text.contains("trace_max"), "{text}");
    }

    #[test]
    fn a_ring_that_began_late_says_the_replay_is_not_exact_and_the_trace_max_that_would_be() {
        let a = advice(Some("the checkpoint summed its oldest allocations by line"));
        let text = crate::report::render::torch_allocator::render_advice(&a);
        assert!(text.contains("not PyTorch's cache to the byte"), "{text}");
        assert!(text.contains("summed its oldest allocations"), "{text}");
        assert!(text.contains("GPUSHIM_CONF=trace_max:100MiB"), "{text}");
    }
}
