//! The steps of `fit_run`: a second run's measurements, the limit, one setting's rows and
//! largest batch, and the requests at the run's batch by how they scale.

use super::largest::largest;
use super::requests::measured;
use super::*;

/// A second run at batch `other` can decide for the run at `at`: it is at another batch.
pub(super) fn second_batch_asked(at: u64, other: u64) -> Result<(), FitError> {
    if other == at {
        return Err(FitError::Batch(format!(
            "the second run's batch ({other}) is the run's own: give a run at another batch"
        )));
    }
    Ok(())
}

/// A second run at batch `other` (`second`) decides the scale of the requests the kinds
/// cannot (see below); how many it measured.
pub(super) fn measure_by_second_run(
    input: &torch_allocator::Input,
    req: &mut Requests,
    at: u64,
    second: &torch_allocator::Input,
    other: u64,
) -> Result<u64, FitError> {
    let mut measured_requests = 0u64;
    second_batch_asked(at, other)?;
    // The second run decides where the kinds cannot: a tensor of unknown kind, one of the
    // program's own lines (any buffer it makes), and a temporary kept for its parameter's
    // size. Elsewhere the kinds' rule holds better than a line through two sizes: cuDNN
    // picks its convolutions' workspaces by batch, and two of them say little of an
    // eighth (ResNet-50 on an H100: 10.8% low from 16 and 32 to 128, 0.3% high by kinds).
    // A request of the program's own lines: an input, or what the program computed from
    // a module's output (an activation of its own line), whose size the kinds cannot say.
    let mut own: crate::fasthash::FastMap<u64, bool> = Default::default();
    let mut own_line = |stack: u64| {
        *own.entry(stack)
            .or_insert_with(|| phase_of_stack(input.tables(), stack) == Phase::Program)
    };
    let measured = measured(input, at, second, other);
    for (n, ((k, m), (_, stack))) in req
        .kinds
        .iter()
        .zip(measured)
        .zip(input.requests())
        .enumerate()
    {
        let s = req.scale.get(n);
        // And an activation kept at its size as a weight's copy: where the two runs' sizes
        // differ, it follows the batch after all, and the run given decides.
        let undecided = matches!(k, Kind::Unknown | Kind::Input)
            || (*k == Kind::Activation && (own_line(stack) || s == Some(Scale::Fixed)))
            || (*k == Kind::Temporary && s == Some(Scale::Fixed));
        if let Some(m) = m.filter(|_| undecided && s.is_some()) {
            req.scale.set(n, m);
            measured_requests += 1;
        }
    }
    Ok(measured_requests)
}

/// What the replays may hold, and where that came from in words: the limit given, else the
/// device's memory (the one named, or the run's as CUDA counts it) less the run's headroom.
pub(super) fn limit_of(ask: &Ask, total: u64, headroom: u64) -> (Bounds, u64, String) {
    match (ask.limit, ask.device_memory) {
        (Some(l), _) => (
            Bounds {
                fraction: Some(l as f64 / total.max(1) as f64),
                afresh: true,
                ..Bounds::default()
            },
            l,
            "the limit given (PyTorch's allocator alone, as a memory fraction holds it)"
                .to_string(),
        ),
        (None, d) => {
            let device = d.unwrap_or(total);
            let limit = device.saturating_sub(headroom);
            (
                Bounds {
                    limit: Some(limit),
                    afresh: true,
                    ..Bounds::default()
                },
                limit,
                format!(
                    "{} of {}, less the {} the CUDA context and libraries took in the run",
                    crate::report::units::human_bytes(device),
                    if d.is_some() {
                        "the device named"
                    } else {
                        "the run's device"
                    },
                    crate::report::units::human_bytes(headroom)
                ),
            )
        }
    }
}

/// The what-ifs a fit is asked for, and where to say how its replays go.
pub(super) struct WhatIfs<'a> {
    pub(super) checkpointing: Option<&'a torch_allocator::Checkpointing>,
    pub(super) autocast: Option<&'a torch_allocator::Autocast>,
    /// Another world size: the shards resized to it.
    pub(super) world: Option<&'a super::world::World>,
    /// The model sharded as FSDP2 shards it.
    pub(super) sharding: Option<&'a torch_allocator::Sharding>,
    /// Requests replayed as not made (none of their bytes): a leak's growth, for the steady
    /// step.
    pub(super) without: Option<&'a [bool]>,
    /// Said before each replay: its setting and batch, and how many replays are done.
    pub(super) working: Option<fn(&str)>,
    pub(super) done: &'a std::sync::atomic::AtomicU64,
}

/// One setting's rows and largest batch.
pub(super) fn setting_fit(
    input: &torch_allocator::Input,
    req: &Requests,
    optional: &[bool],
    ask: &Ask,
    (conf, is_recorded): (&torch_allocator::model::TorchConf, bool),
    bounds: &Bounds,
    what_if: &WhatIfs<'_>,
) -> SettingFit {
    let scale = |n: usize| req.scale.get(n).unwrap_or(Scale::Fixed);
    let optional_at = |n: usize| optional.get(n).copied().unwrap_or(false);
    // Each size below reads of a request only its scale and whether it is optional (and,
    // under autocast, whether it is made in 16 bits: a what-if's replays check each repeat's
    // sizes, not this).
    let shard = |n: usize| what_if.world.is_some_and(|w| w.sharded(n));
    let without = |n: usize| {
        what_if
            .without
            .is_some_and(|w| w.get(n).copied().unwrap_or(false))
    };
    let repeating = input.repeating(|n| (scale(n), optional_at(n), shard(n), without(n)));
    let setting = super::setting_name(&conf.to_string());
    let at_batch = |batch: u64, bounds: &Bounds| -> Row {
        if let Some(say) = what_if.working {
            use std::sync::atomic::Ordering::Relaxed;
            let done = what_if.done.fetch_add(1, Relaxed);
            say(&format!(
                "fit: replaying {setting} at batch {batch} ({done} replays before it)"
            ));
        }
        let size = |n: usize, size: u64, _| {
            // Under autocast, a request made in 16 bits is half its recorded size first.
            let half = what_if.autocast.is_some_and(|a| a.half(n));
            let base = if half { size / 2 } else { size };
            let sized = resize(scale(n), base, ask.at, batch);
            let sized = match what_if.world {
                Some(w) if w.sharded(n) => w.resize(sized),
                _ => sized,
            };
            (if without(n) { 0 } else { sized }, optional_at(n))
        };
        // An autocast copy scales as the request it copies does, where that follows the batch.
        let copy_size = |bytes: u64, like: Option<usize>| match like.map(scale) {
            Some(Scale::Batch) => resize(Scale::Batch, bytes, ask.at, batch),
            _ => bytes,
        };
        let events = input
            .resized_optional(
                &torch_allocator::WhatIf {
                    checkpointing: what_if.checkpointing,
                    autocast: what_if.autocast,
                    // A run at one rank answered at more: what it does not show of more
                    // ranks, edited in (the world's edits; never with --shard).
                    edits: what_if
                        .sharding
                        .map(|s| &s.edits)
                        .or(what_if.world.and_then(|w| w.edits.as_ref())),
                    copy_size: &copy_size,
                },
                size,
            )
            .knowing(repeating);
        let o = torch_allocator::replay_resized(input, &events, conf, bounds);
        Row {
            batch,
            peak_reserved_bytes: o.peak_reserved_bytes,
            peak_allocated_bytes: o.peak_allocated_bytes,
            failures: o.failures,
            workspaces_done_without: o.done_without,
        }
    };
    // The rows, and the search's steps, replayed side by side where there are cores.
    let threads = super::largest::threads_per_setting();
    let rows: Vec<Row> =
        super::largest::in_parallel(&ask.batches, threads, &|b| at_batch(b, bounds));
    // The search asks only whether a batch fits: a replay stops at its first failure.
    let search = Bounds {
        stop_at_failure: true,
        ..*bounds
    };
    let (largest, peak) = largest(&|b| at_batch(b, &search), ask.max_batch, threads);
    SettingFit {
        setting: conf.to_string(),
        recorded: is_recorded,
        rows,
        largest_batch: largest,
        largest_is_the_cap: largest >= ask.max_batch,
        largest_peak_reserved_bytes: peak,
    }
}

/// The requests at the run's batch by how they scale, and the lines of those whose scale is not
/// known or that are as large as a parameter.
pub(super) struct Tally {
    pub(super) batch_bytes: u64,
    pub(super) fixed_bytes: u64,
    pub(super) unknown_bytes: u64,
    pub(super) unknown_lines: Vec<LineBytes>,
    pub(super) parameter_sized_lines: Vec<LineBytes>,
    pub(super) reductions: u64,
}

pub(super) fn tally(input: &torch_allocator::Input, req: &Requests) -> Tally {
    let reductions = req
        .scale
        .iter()
        .filter(|s| matches!(s, Scale::Reduction(_)))
        .count() as u64;
    let (mut batch_bytes, mut fixed_bytes, mut unknown_bytes) = (0u64, 0u64, 0u64);
    let mut unknown: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut parameter_sized: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    // A line's phase is read from its frames once (a long run asks from a line millions of
    // times).
    let mut phases: crate::fasthash::FastMap<u64, Phase> = Default::default();
    for (((size, stack), s), k) in input.requests().zip(req.scale.iter()).zip(&req.kinds) {
        let tally = |m: &mut BTreeMap<u64, (u64, u64)>| {
            let e = m.entry(stack).or_default();
            e.0 = e.0.saturating_add(size);
            e.1 += 1;
        };
        match s {
            Scale::Batch | Scale::Reduction(_) => batch_bytes = batch_bytes.saturating_add(size),
            Scale::Measured { here, there, .. } if here == there => {
                fixed_bytes = fixed_bytes.saturating_add(size);
            }
            Scale::Measured { .. } => batch_bytes = batch_bytes.saturating_add(size),
            Scale::Semaphore | Scale::Latent(_) => fixed_bytes = fixed_bytes.saturating_add(size),
            Scale::Fixed => {
                fixed_bytes = fixed_bytes.saturating_add(size);
                if matches!(k, Kind::Temporary | Kind::Activation) {
                    let phase = *phases
                        .entry(stack)
                        .or_insert_with(|| phase_of_stack(input.tables(), stack));
                    if phase != Phase::Optimizer {
                        tally(&mut parameter_sized);
                    }
                }
            }
            Scale::Unknown => {
                unknown_bytes = unknown_bytes.saturating_add(size);
                tally(&mut unknown);
            }
        }
    }
    let named = |m: BTreeMap<u64, (u64, u64)>| -> Vec<LineBytes> {
        let mut v: Vec<LineBytes> = m
            .into_iter()
            .map(|(stack, (bytes, tensors))| LineBytes {
                line: crate::report::sites::site_label(input.tables(), stack),
                bytes,
                tensors,
            })
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.line.cmp(&b.line)));
        v.truncate(8);
        v
    };
    Tally {
        batch_bytes,
        fixed_bytes,
        unknown_bytes,
        unknown_lines: named(unknown),
        parameter_sized_lines: named(parameter_sized),
        reductions,
    }
}
