//! `gpushim fit`: what fits, from one run. The tensors that depend on the batch are resized to
//! another batch and the run's requests replayed through the model of PyTorch's allocator
//! (`torch_allocator`), under the run's setting and under expandable segments: peak allocated and
//! reserved at each batch asked, and the largest batch whose replay never fails under the
//! device's memory less what the CUDA context and the libraries took in the run.
//!
//! Which tensors follow the batch comes from their kinds ([`super::kinds`]): activations, the
//! input and the temporaries of the forward, the backward and the program's own lines grow with
//! it; parameters, gradients, optimizer state, cuBLAS's workspaces and the optimizer's
//! temporaries do not, nor a temporary outside the forward the size of a parameter (a weight's
//! gradient being summed), nor one of half a parameter's size (its half-precision copy under
//! autocast). A tensor of unknown kind keeps its size, and its lines are named (`docs/fit.md`).

mod batch;
mod largest;
mod latent;
mod leaking;
mod padded;
mod reduce;
mod requests;
mod scales;
mod seq;
mod steps;
mod world;

pub use batch::{batch_from_cmdline, seq_from_cmdline};
pub use latent::LatentReductions;
pub use leaking::Leaking;
pub use seq::{SeqAsk, SeqAxis};
pub use world::WorldSize;

use largest::largest;
use requests::{Labels, classed, optional_requests};
use scales::Scales;
use steps::{limit_of, measure_by_second_run, setting_fit, tally};

use super::kinds::{Kind, Phase, phase_of_stack};
use super::torch_allocator::{self, Bounds, ReplayError};
use crate::trace::reader::ReadOptions;
use serde::Serialize;
use std::collections::BTreeMap;

/// How each request of the run scales with the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scale {
    /// Its size is the batch's multiple.
    Batch,
    Fixed,
    /// Kept as it is, for want of a kind.
    Unknown,
    /// A global reduction's staging buffer: with the batch until the device is full.
    Reduction(reduce::Reduction),
    /// A global reduction's semaphore: as many as the blocks across its outputs.
    Semaphore,
    /// A staging buffer or semaphore the run never asked (no bytes in it): a sum within
    /// thread blocks at the run's rows that goes through global memory at more.
    Latent(reduce::Latent),
    /// As a second run at another batch showed it: `here` bytes at the run's batch `at`,
    /// `there` at the second run's `other`; other batches on the line through both.
    Measured {
        here: u64,
        there: u64,
        at: u64,
        other: u64,
    },
}

/// What the run says of each request: its kind, and how it scales.
struct Requests {
    scale: Scales,
    kinds: Vec<Kind>,
}

/// One batch replayed under one setting.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub batch: u64,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// Requests the replay could not serve within the limit.
    pub failures: u64,
    /// Convolutions' workspaces the replay could not serve within the limit: cuDNN then runs
    /// an algorithm that needs less (taken as none), so they fail nothing.
    #[serde(skip_serializing_if = "is_zero")]
    pub workspaces_done_without: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Serialize)]
pub struct SettingFit {
    /// As `PYTORCH_CUDA_ALLOC_CONF` takes it ("" for the defaults).
    pub setting: String,
    /// Whether this is the run's own setting.
    pub recorded: bool,
    pub rows: Vec<Row>,
    /// The largest batch whose replay never fails under the limit (0: not even one).
    pub largest_batch: u64,
    /// Every batch looked at fits: the largest is at least `largest_batch`, the search's cap
    /// (`--max-batch`), not an answer.
    pub largest_is_the_cap: bool,
    /// Its peak reserved.
    pub largest_peak_reserved_bytes: u64,
}

/// A line and its bytes among the requests (all of them, summed).
#[derive(Clone, Debug, Serialize)]
pub struct LineBytes {
    pub line: String,
    pub bytes: u64,
    pub tensors: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Fit {
    /// The run's batch, as given.
    pub at: u64,
    /// What the replays may hold: the device's memory less the headroom, or the limit given.
    pub limit_bytes: u64,
    /// Where the limit came from, in words.
    pub limit_from: String,
    /// NVML's figure less what PyTorch held, at NVML's peak in the run: the CUDA context,
    /// module code and the libraries' own allocations (0 when the trace has no NVML figure).
    pub headroom_bytes: u64,
    pub settings: Vec<SettingFit>,
    /// The bytes requested at the run's own batch, by how they scale.
    pub batch_bytes: u64,
    pub fixed_bytes: u64,
    /// Requests of tensors whose kind is unknown: kept at their size (their lines below).
    pub unknown_bytes: u64,
    pub unknown_lines: Vec<LineBytes>,
    /// Requests of a forward or backward kept at their size as a weight's gradient or 16-bit
    /// copy (a parameter's size or half of it).
    pub parameter_sized_lines: Vec<LineBytes>,
    /// Staging buffers of PyTorch's global reductions resized as PyTorch sizes them (with
    /// the batch until the device is full), not in proportion.
    pub reductions: u64,
    /// Sums of a bias's gradient the run made within thread blocks, which PyTorch makes
    /// through a staging buffer from a larger batch on: added where a replay's batch asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latent_reductions: Option<LatentReductions>,
    /// A second run of the program at another batch, when given: the requests it scaled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub second: Option<SecondRun>,
    /// With a second run at another sequence length: each length asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<SeqAxis>,
    /// The what-if of activation checkpointing, when asked: every row is under it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<torch_allocator::Blocks>,
    /// The what-if of autocast, when asked: every row is under it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autocast: Option<torch_allocator::AutocastSummary>,
    /// From a ring: how much of the run its records hold (every replay above is of those).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring: Option<crate::report::kinds::StepsBegun>,
    /// The trace was cut or damaged: what it is missing (every replay is of what it holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// The run leaks: what grew every iteration, and what that does to the answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaking: Option<Leaking>,
    /// Another world size, when asked: every row is one rank's at it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world_size: Option<WorldSize>,
    /// The what-if of sharding the model, when asked: every row is one rank's under it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<torch_allocator::Sharded>,
}

impl Fit {
    /// Nothing of the run's requests follows the batch (every one fixed or of unknown kind, and
    /// no second run measured any): every batch's peak is the run's, and no largest batch can
    /// be said.
    pub fn nothing_scales(&self) -> bool {
        self.batch_bytes == 0
    }
}

/// A second run at another batch, and how many of the run's requests it scaled.
#[derive(Clone, Debug, Serialize)]
pub struct SecondRun {
    pub trace: String,
    pub at: u64,
    pub requests: u64,
}

/// What `fit` is asked.
#[derive(Clone, Debug)]
pub struct Ask {
    /// The run's batch.
    pub at: u64,
    /// The batches to show.
    pub batches: Vec<u64>,
    /// A device of this many bytes (the headroom the run measured comes off it).
    pub device_memory: Option<u64>,
    /// PyTorch's allocator held to this many bytes, as `set_per_process_memory_fraction` holds
    /// it (no headroom comes off).
    pub limit: Option<u64>,
    /// The largest batch looked for.
    pub max_batch: u64,
    /// A second run of the same program at another batch: each request scales as the two
    /// runs show it, not as its kind says.
    pub second: Option<(std::path::PathBuf, u64)>,
    /// A second run at another sequence length: the peaks and the largest batch at the
    /// lengths asked.
    pub seq: Option<SeqAsk>,
    /// What-if: the repeated blocks checkpointed, of the class named (`Some(None)`: found from
    /// the frames).
    pub checkpoint: Option<Option<String>>,
    /// How the checkpoint what-if makes a block again: reentrant (`Some(true)`) or not
    /// (`Some(false)`), else as the frames suggest (see `torch_allocator::Blocks::reentrant`).
    pub checkpoint_reentrant: Option<bool>,
    /// What-if: the forward under autocast to this 16-bit type (`bf16`, `fp16`).
    pub autocast: Option<String>,
    /// One rank of the job at this world size (the batch per rank as the rows say), and the
    /// run's own when its trace does not say it.
    pub world_size: Option<u64>,
    pub run_world_size: Option<u64>,
    /// What-if: the model sharded as FSDP2 shards it (resharded after the forward or not), or
    /// as DeepSpeed's ZeRO-1 or ZeRO-2 holds it, over `world_size` or the run's.
    pub shard: Option<torch_allocator::ShardWay>,
}

#[derive(Debug)]
pub enum FitError {
    Replay(ReplayError),
    /// A batch of 0, or more than the search covers.
    Batch(String),
    /// The blocks to checkpoint cannot be found.
    Checkpoint(String),
    /// The autocast what-if cannot be made of this run.
    Autocast(String),
    /// Another world size cannot be answered from this run.
    World(String),
    /// The sharding what-if cannot be made of this run.
    Shard(String),
}

impl std::fmt::Display for FitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FitError::Replay(e) => e.fmt(f),
            FitError::Batch(s) => f.write_str(s),
            FitError::Checkpoint(s) => write!(f, "--checkpoint: {s}"),
            FitError::Autocast(s) => write!(f, "--autocast: {s}"),
            FitError::World(s) => write!(f, "--world-size: {s}"),
            FitError::Shard(s) => write!(f, "--shard: {s}"),
        }
    }
}

impl From<ReplayError> for FitError {
    fn from(e: ReplayError) -> Self {
        FitError::Replay(e)
    }
}

/// The scales with reductions' buffers in proportion to the batch again: the sequence axis
/// resizes a request's size first, which a count of blocks does not follow.
fn proportional(scale: &Scales) -> Scales {
    scale
        .iter()
        .map(|s| match s {
            Scale::Reduction(_) => Scale::Batch,
            Scale::Latent(_) => Scale::Fixed,
            s => s,
        })
        .collect()
}

/// `size` at `batch` for a request recorded at `at` that scales as `s`.
fn resize(s: Scale, size: u64, at: u64, batch: u64) -> u64 {
    match s {
        Scale::Batch => {
            let v = u128::from(size) * u128::from(batch);
            u64::try_from(v.div_ceil(u128::from(at.max(1)))).unwrap_or(u64::MAX)
        }
        Scale::Fixed | Scale::Unknown | Scale::Semaphore => size,
        Scale::Reduction(r) => r.at(at, batch),
        Scale::Latent(l) => l.at(at, batch),
        Scale::Measured {
            here,
            there,
            at,
            other,
        } => on_line(here, there, at, other, batch).unwrap_or(size),
    }
}

/// At `x`, the line through `here` bytes at `at` and `there` at `other`, rounded up and never
/// below 0 (`None` when `at` and `other` are one point).
fn on_line(here: u64, there: u64, at: u64, other: u64, x: u64) -> Option<u64> {
    // here + (there - here) * (x - at) / (other - at).
    let (here, there) = (i128::from(here), i128::from(there));
    let den = i128::from(other) - i128::from(at);
    if den == 0 {
        return None;
    }
    let (rise, run) = (there - here, i128::from(x) - i128::from(at));
    // Past 2^127 (sizes and batches near 2^64): as far as the line goes that way.
    let Some(num) = rise.checked_mul(run) else {
        return Some(if ((rise > 0) == (run > 0)) == (den > 0) {
            u64::MAX
        } else {
            0
        });
    };
    let step = if (num >= 0) == (den > 0) {
        num.abs().saturating_add(den.abs() - 1) / den.abs()
    } else {
        -(num.abs() / den.abs())
    };
    Some(u64::try_from(here.saturating_add(step).max(0)).unwrap_or(u64::MAX))
}

/// The run a fit is made from, read once: PyTorch's requests with their kinds, and what the
/// CUDA context and libraries held beside PyTorch's allocator. Several asks (the page's two,
/// for one) are answered from one reading.
pub struct FitRun {
    input: torch_allocator::Input,
    headroom: u64,
    /// What the trace is missing, when it was cut or damaged (the analysis's words).
    cut: Option<String>,
    /// What grew every iteration of the run, from the same pass (`leaks`'s finding).
    growth: Option<Leaking>,
    /// The second runs an ask names, read by the analysis ([`FitRun::with_second_runs`]):
    /// at another batch (`Ask::second`) and at another sequence length (`Ask::seq`).
    second_batch: Option<torch_allocator::Input>,
    second_seq: Option<torch_allocator::Input>,
    /// The reductions the run summed within thread blocks: each placeholder's place among the
    /// requests (its staging buffer's; its semaphore the next), and how it grows.
    latent: Vec<(usize, reduce::Latent)>,
}

impl FitRun {
    /// PyTorch's requests, as the run made them.
    pub fn input(&self) -> &torch_allocator::Input {
        &self.input
    }

    /// With what grew every iteration, as `leaks` found it in the same read.
    pub fn with_growth_of(mut self, leaks: Option<&super::leaks::Leaks>) -> FitRun {
        self.growth = leaks.and_then(Leaking::of);
        self
    }

    /// With the second runs the asks name, as read: the run at another batch
    /// (`Ask::second`) and the run at another sequence length (`Ask::seq`).
    pub fn with_second_runs(
        mut self,
        batch: Option<torch_allocator::Input>,
        seq: Option<torch_allocator::Input>,
    ) -> FitRun {
        (self.second_batch, self.second_seq) = (batch, seq);
        self
    }
}

/// The run for [`fit_run`] from an analysis's parts: PyTorch's requests, the summary (for the
/// headroom, when there is one) and what the trace is missing when it was cut or damaged.
pub fn run_from(
    mut input: torch_allocator::Input,
    summary: Option<&super::summary::Summary>,
    cut: Option<String>,
) -> FitRun {
    let latent = latent::placed(&mut input);
    FitRun {
        input,
        latent,
        headroom: summary.map_or(0, headroom_of),
        cut,
        growth: None,
        second_batch: None,
        second_seq: None,
    }
}

/// A second run an ask names, as the analysis read it ([`FitRun::with_second_runs`]).
fn second_run(run: Option<&torch_allocator::Input>) -> Result<&torch_allocator::Input, FitError> {
    run.ok_or_else(|| FitError::Batch("the second run named was not read".into()))
}

/// The second runs an ask names can decide for it: at another batch than the run's, at
/// another sequence length with every length asked at least 1.
pub fn second_runs_asked(ask: &Ask) -> Result<(), FitError> {
    if let Some((_, other)) = ask.second {
        steps::second_batch_asked(ask.at, other)?;
    }
    ask.seq.as_ref().map_or(Ok(()), seq::lengths_asked)
}

/// Every batch asked is at least 1.
pub fn batches_asked(ask: &Ask) -> Result<(), FitError> {
    if ask.at == 0 || ask.batches.contains(&0) {
        return Err(FitError::Batch("a batch is at least 1".into()));
    }
    Ok(())
}

/// Whether the machine has two cores or more (the work of `fit` is split over two threads
/// there).
pub(super) fn two_cores() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
}

/// The fit of a run read once ([`read_run`]).
pub fn fit_run(run: &FitRun, ask: &Ask, opts: &ReadOptions) -> Result<Fit, FitError> {
    batches_asked(ask)?;
    let input = &run.input;
    let (labels, mut req) = classed(input);
    latent::mark(&run.latent, &mut req);
    let measured_requests = match &ask.second {
        Some((_, other)) => {
            let second = second_run(run.second_batch.as_ref())?;
            measure_by_second_run(input, &mut req, ask.at, second, *other)?
        }
        None => 0,
    };
    let recorded = torch_allocator::recorded_conf(input)?;
    let mut expandable = recorded.clone();
    expandable.expandable_segments = !recorded.expandable_segments;
    let headroom = run.headroom;
    let (bounds, limit_bytes, limit_from) = limit_of(ask, input.total_memory(), headroom);
    let optional = optional_requests(input, &labels);
    let checkpointing = match &ask.checkpoint {
        Some(class) => Some(
            input
                .checkpointing(class.as_deref(), ask.checkpoint_reentrant)
                .map_err(FitError::Checkpoint)?,
        ),
        None => None,
    };
    let autocast = match &ask.autocast {
        Some(dtype) => Some(input.autocast(dtype).map_err(FitError::Autocast)?),
        None => None,
    };
    let (world, sharding) = match ask.shard {
        Some(way) => (None, Some(world::sharding(input, ask, way)?)),
        None => (world::asked(input, &req, ask)?, None),
    };
    let done = std::sync::atomic::AtomicU64::new(0);
    let what_if = steps::WhatIfs {
        checkpointing: checkpointing.as_ref(),
        autocast: autocast.as_ref(),
        world: world.as_ref(),
        sharding: sharding.as_ref(),
        without: None,
        working: opts.working,
        done: &done,
    };
    let with = |conf, recorded, w: &steps::WhatIfs<'_>| {
        setting_fit(input, &req, &optional, ask, (conf, recorded), &bounds, w)
    };
    let one = |conf, recorded| with(conf, recorded, &what_if);
    // The two settings' replays are each their own: on two threads where there are two cores.
    let settings = if two_cores() {
        std::thread::scope(|s| {
            let other = s.spawn(|| one(&expandable, false));
            let first = one(&recorded, true);
            let second = other.join().unwrap_or_else(|_| one(&expandable, false));
            vec![first, second]
        })
    } else {
        vec![one(&recorded, true), one(&expandable, false)]
    };
    let seq = match &ask.seq {
        None => None,
        Some(s) => Some(seq::axis(
            (input, second_run(run.second_seq.as_ref())?),
            s,
            &proportional(&req.scale),
            ask.at,
            ask.max_batch,
            &[&recorded, &expandable],
            &bounds,
        )?),
    };
    let t = tally(input, &req);
    // A leaking run: its setting replayed again without the growth, the steady step.
    let leaking = run.growth.clone().map(|g| {
        g.answered(input, (&settings, ask.at, limit_bytes), |grown| {
            let without = steps::WhatIfs {
                without: Some(grown),
                ..what_if
            };
            with(&recorded, true, &without)
        })
    });
    Ok(Fit {
        at: ask.at,
        limit_bytes,
        limit_from,
        headroom_bytes: headroom,
        settings,
        batch_bytes: t.batch_bytes,
        fixed_bytes: t.fixed_bytes,
        unknown_bytes: t.unknown_bytes,
        unknown_lines: t.unknown_lines,
        parameter_sized_lines: t.parameter_sized_lines,
        reductions: t.reductions,
        latent_reductions: latent::said(&run.latent, ask.at),
        second: ask.second.as_ref().map(|(p, b)| SecondRun {
            trace: crate::files::shown(p).to_string(),
            at: *b,
            requests: measured_requests,
        }),
        seq,
        checkpoint: checkpointing.map(|c| c.blocks),
        autocast: autocast.map(|a| a.summary),
        ring: input.from_checkpoint.then_some(input.steps_begun),
        incomplete: run.cut.clone(),
        leaking,
        world_size: world.map(|w| w.said),
        shard: sharding.map(|s| s.said),
    })
}

/// What the CUDA context, module code and the libraries held beside PyTorch's allocator at
/// NVML's peak in the run (0 without NVML's figure), from the trace's summary.
fn headroom_of(s: &super::summary::Summary) -> u64 {
    s.device_memory
        .iter()
        .map(|m| {
            let torch: u64 = m
                .at_peak
                .parts
                .iter()
                .filter(|p| p.owner.starts_with("PyTorch"))
                .map(|p| p.bytes)
                .sum();
            m.at_peak.nvml_bytes.saturating_sub(torch)
        })
        .max()
        .unwrap_or(0)
}

/// A setting as the text names it: its `PYTORCH_CUDA_ALLOC_CONF`, or "the defaults"; escaped
/// for a terminal (the run's setting is the trace's text, and a key PyTorch accepts may carry
/// any value).
pub fn setting_name(s: &str) -> String {
    if s.is_empty() {
        "the defaults".into()
    } else {
        crate::fixedfmt::Escaped(s.as_bytes()).to_string()
    }
}

impl Ask {
    /// Only the largest batch that fits the run's device, from a run at `at`, looked for up
    /// to `max_batch`.
    pub fn largest(at: u64, max_batch: u64) -> Ask {
        Ask {
            at,
            batches: Vec::new(),
            device_memory: None,
            limit: None,
            max_batch,
            second: None,
            seq: None,
            checkpoint: None,
            checkpoint_reentrant: None,
            autocast: None,
            world_size: None,
            run_world_size: None,
            shard: None,
        }
    }
}

impl Fit {
    /// `N under SETTING (the run's), M under ...`: the largest batch under each setting.
    pub fn largest_by_setting(&self) -> String {
        if self.nothing_scales() {
            return "not known (nothing of the run's requests follows the batch)".into();
        }
        self.settings
            .iter()
            .map(|s| {
                format!(
                    "{}{} under {}{}",
                    if s.largest_is_the_cap {
                        "at least "
                    } else {
                        ""
                    },
                    s.largest_batch,
                    setting_name(&s.setting),
                    if s.recorded { " (the run's)" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests;
