//! `gpushim simulate --torch`: the tensors a run's PyTorch allocator handed out and took back,
//! replayed in order through the model of that allocator (`model`) under another
//! `PYTORCH_CUDA_ALLOC_CONF`; and the replay of the setting the run used, checked against the
//! segments the run really took.
//!
//! What the replay takes from the trace: each tensor's request (size, stream, device) and its
//! free; when a freed tensor's memory came back (PyTorch's own record of it, so work still
//! running on another stream delays reuse in the replay as it did in the run); calls of
//! `torch.cuda.empty_cache()` (segments given back with no failed allocation before them);
//! and the addresses CUDA handed out, offered to the model for its segments so a replay of the
//! recorded setting places every tensor where the run placed it.
//!
//! Here the types; [`read`] (reading a trace's tensors), [`replayer`] (one replay through the
//! model), [`advice`] (the settings tried, `--recommend`, and the advice after an
//! out-of-memory).

mod advice;
pub mod model;
mod settings;

pub use settings::{TorchReport, simulate};
mod autocast;
mod checkpoint;
mod read;
mod replayer;
mod sharding;

pub use autocast::{Autocast, AutocastSummary};
pub use checkpoint::{Blocks, Checkpointing, staging_shape};
pub use sharding::{
    BUCKET_ELEMENTS, Bucket, Edits, Role, Sharded, Sharding, Way as ShardWay, ZeroSaid,
};

pub use advice::{OomAdvice, RingStart, candidates, oom_advice_of, recommend, recorded_conf};
pub use read::{Requests, as_replay, devices_only, read_by};
pub use replayer::{Repeating, Resized, WhatIf, replay, replay_resized};

use crate::trace::reader::{ReadError, TraceTables};
use serde::Serialize;
use std::collections::BTreeMap;

const GIB: u64 = 1 << 30;
/// The device memory assumed when the trace never learned it (an 80 GB GPU's).
const TOTAL_UNKNOWN: u64 = 80 * GIB;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ev {
    Alloc,
    FreeRequested,
    Free,
    EmptyCache,
    /// PyTorch could not serve the request; `ptr` holds the free memory CUDA reported.
    Oom,
    /// A segment the run took (or pages it mapped): an address for the model.
    Reserve {
        pages: bool,
    },
    Release,
    /// An address range reserved through the driver (an expandable segment's).
    Reservation,
    /// Nothing (a release that turned out to serve an allocation, not `empty_cache`).
    Skip,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Event {
    ev: Ev,
    device: u8,
    stream: u16,
    ptr: u64,
    size: u64,
    time_ns: u64,
    /// The stack of a request (its Python line), once its `StackRef` is read.
    stack: u64,
    /// PyTorch's autograd sequence number its `StackRef` carried (0: none): a forward tensor's
    /// op and the backward tensors of that op's node share it.
    sequence: u64,
    /// In one of PyTorch's private pools (a CUDA graph's, a `torch.cuda.MemPool`), once its
    /// `TensorPool` is read: not the default pools the model replays.
    private: bool,
    /// A request the program can do without when memory is short (a convolution's
    /// workspace: cuDNN then runs an algorithm that needs less): a replay that cannot serve
    /// it goes on without it, failing nothing. Only `fit` marks requests so.
    optional: bool,
    /// A request's kind (parameter, activation, ...), decided in the same read as the request
    /// itself, so the two can never come from different reads of a ring.
    kind: crate::report::kinds::Kind,
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct DeviceFacts {
    /// The device's memory as `cudaMemGetInfo` reported it.
    total: Option<u64>,
    /// The device's memory as NVML reported it (a little more than CUDA's figure).
    nvml_total: Option<u64>,
    /// At the run's first failed tensor: what PyTorch held plus what CUDA said was free.
    capacity_at_oom: Option<u64>,
    /// At the run's first failed tensor, when PyTorch refused it with no `cudaMalloc` tried (a
    /// memory fraction, `set_per_process_memory_fraction`, held it): the most it had reserved
    /// until then, which the fraction allowed (and the failed request's segment would not fit
    /// under).
    allowed_at_oom: Option<u64>,
}

/// The tensors of one trace, in order, and what the replay needs to know about the run.
pub struct Input {
    /// The run's header and what its records defined: no reader, no file.
    tables: TraceTables,
    events: Vec<Event>,
    devices: BTreeMap<u8, DeviceFacts>,
    /// The run's setting: its text and where it came from.
    pub recorded: RecordedSetting,
    pub tensors: u64,
    /// The trace starts at a checkpoint: its first tensors were folded into it.
    pub from_checkpoint: bool,
    /// The forwards, backward passes and optimizer steps that began in the records (a ring's:
    /// how much of the run its replay holds).
    pub steps_begun: crate::report::kinds::StepsBegun,
    /// What the checkpoint says PyTorch held when the ring began, which the replay starts from.
    pub seed: Seed,
    /// The autograd graph the shim walked when backward passes began (for `--autocast`).
    pub graph: crate::trace::graph::Walks,
    /// Where the events repeat, found when a replay first asks.
    period: std::sync::OnceLock<Option<replayer::Stretch>>,
    /// Each request's last request before its free (see [`Input::last_before_free`]).
    last_before_free: std::sync::OnceLock<Vec<u32>>,
}

/// A `trace_max` that holds every record of a run of `records`: 32 bytes each, and room for
/// the header and tables.
fn trace_max_for(records: u64) -> u64 {
    records.saturating_mul(32).saturating_add(64 << 20)
}

/// PyTorch's cache as a ring's checkpoint kept it: per device, its segments and the tensors
/// live in them. A plain segment's free blocks are the gaps between its tensors (PyTorch merges
/// free neighbours), so segments and tensors are the cache, and a replay that starts from them
/// goes on as the run did.
#[derive(Clone, Debug, Default)]
pub struct Seed {
    pub devices: BTreeMap<u8, DeviceSeed>,
    /// Why what the checkpoint kept is not PyTorch's cache to the byte (none: it is).
    pub inexact: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct DeviceSeed {
    /// Base and size of each segment.
    pub segments: Vec<(u64, u64)>,
    /// Each live tensor.
    pub tensors: Vec<SeedTensor>,
}

/// A tensor live when the ring began, as the checkpoint kept it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SeedTensor {
    pub ptr: u64,
    /// Bytes asked.
    pub size: u64,
    pub stream: u16,
    /// When it was made.
    pub made_ns: u64,
}

impl Seed {
    /// Segments and bytes reserved in all.
    pub fn reserved(&self) -> (usize, u64) {
        self.devices.values().fold((0, 0), |(n, b), d| {
            (
                n + d.segments.len(),
                d.segments.iter().fold(b, |b, s| b.saturating_add(s.1)),
            )
        })
    }

    /// Tensors live in all.
    pub fn tensors(&self) -> usize {
        self.devices.values().map(|d| d.tensors.len()).sum()
    }

    fn not_exact(&mut self, why: &str) {
        self.inexact.get_or_insert_with(|| why.to_string());
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RecordedSetting {
    /// `PYTORCH_CUDA_ALLOC_CONF`'s (or `PYTORCH_ALLOC_CONF`'s) text; empty: the defaults.
    pub text: String,
    /// Where it was read: the variable's name, "inferred" (a trace from before settings were
    /// kept, whose expandable segments show in its records), or "unset".
    pub source: String,
}

#[derive(Debug)]
pub enum ReplayError {
    Read(ReadError),
    NoTensors {
        why: Option<String>,
    },
    /// A filter other than `--device`: the replay needs every tensor.
    Filtered,
    /// The run's failure is older than the records its ring trace still holds: only the
    /// checkpoint's summary of it is left.
    FailureSummarized {
        records: u64,
        trace_max_needed: u64,
    },
    /// The ring holds none of the run's tensor requests: its checkpoint summarized them all.
    Summarized {
        records: u64,
        trace_max_needed: u64,
    },
    Setting {
        text: String,
        reason: String,
    },
    /// Room for more of the run's tensor events could not be had: `events` were held
    /// (`bytes`), under `most` where `GPUSHIM_REPLAY_MEMORY` set it.
    Memory {
        events: u64,
        bytes: u64,
        most: Option<u64>,
    },
    /// `GPUSHIM_REPLAY_MEMORY` is not a size.
    MemorySetting {
        text: String,
    },
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Read(e) => e.fmt(f),
            ReplayError::NoTensors { why } => write!(
                f,
                "the trace holds no tensors of PyTorch's caching allocator{}; record a PyTorch \
                 run with tensors on (the default) to replay it",
                why.as_ref().map(|w| format!(" ({w})")).unwrap_or_default()
            ),
            // The reason quotes the text's words (a run's setting is the trace's text): what a
            // terminal would obey is escaped, as the text itself is by `{:?}`.
            ReplayError::Setting { text, reason } => write!(
                f,
                "--torch {text:?}: {}",
                crate::fixedfmt::Escaped(reason.as_bytes())
            ),
            ReplayError::Filtered => write!(
                f,
                "the replay of PyTorch's allocator needs every tensor in order (what a setting \
                 does depends on all that came before): of the filters it takes only --device"
            ),
            ReplayError::FailureSummarized {
                records,
                trace_max_needed,
            } => write!(
                f,
                "the failure is older than the records the trace's ring still holds (the run \
                 made {records} records; its checkpoint keeps the failure and what was live, \
                 not the requests before it); record with GPUSHIM_CONF=trace_max:{}MiB or more \
                 to replay it",
                trace_max_needed.div_ceil(1 << 20)
            ),
            // The text is the user's environment's: escaped, as any text for a terminal.
            ReplayError::MemorySetting { text } => write!(
                f,
                "GPUSHIM_REPLAY_MEMORY={}: not a size; give one as trace_max takes it (512MiB, \
                 4GiB), or unset it to gather as many of the run's tensor events as the process \
                 may have",
                crate::fixedfmt::Escaped(text.as_bytes())
            ),
            ReplayError::Memory {
                events,
                bytes,
                most,
            } => write!(
                f,
                "the run's tensor events do not fit in {}: {events} of them were held ({}) \
                 when room for as many again could not be had; run it where it may have more \
                 memory{}",
                match most {
                    Some(_) => "the memory GPUSHIM_REPLAY_MEMORY allows",
                    None => "the memory this process may have",
                },
                crate::report::units::human_bytes(*bytes),
                match most {
                    Some(m) => format!(
                        " (GPUSHIM_REPLAY_MEMORY={} now; each event takes {} bytes)",
                        crate::report::units::human_bytes(*m),
                        std::mem::size_of::<Event>()
                    ),
                    None => " (a higher `ulimit -v`, or fewer other programs beside it)".into(),
                },
            ),
            ReplayError::Summarized {
                records,
                trace_max_needed,
            } => write!(
                f,
                "the trace's ring holds none of the run's tensor requests (the run made \
                 {records} records; its checkpoint summarized them): record with \
                 GPUSHIM_CONF=trace_max:{}MiB or more to replay them",
                trace_max_needed.div_ceil(1 << 20)
            ),
        }
    }
}

impl std::error::Error for ReplayError {}

impl From<ReadError> for ReplayError {
    fn from(e: ReadError) -> Self {
        ReplayError::Read(e)
    }
}

/// What the replay is allowed: `--limit`, `--fraction`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bounds {
    /// Bytes PyTorch may hold on each device (None: what the trace says the device had).
    pub limit: Option<u64>,
    /// `set_per_process_memory_fraction`'s value, if the program set one.
    pub fraction: Option<f64>,
    /// Stop after the run's first failed tensor (what a setting would have done there).
    pub stop_at_oom: bool,
    /// From a ring's checkpoint, a setting other than the run's starts from the tensors the
    /// checkpoint kept live, asked for again in a cache of its own (as a run under it would
    /// hold them: `fit`'s peaks), not from the run's cache. Off (the post-mortem's advice): what
    /// serves a failure from the run's cache, fragments and all, would have served it in the run.
    pub afresh: bool,
    /// Stop at the replay's own first failed request: whether the requests fit is all that is
    /// asked (`fit`'s search for the largest batch), not how many failed.
    pub stop_at_failure: bool,
}

/// A request the replay could not serve.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub device: u8,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
    pub time_ns: u64,
    /// Where the request was made (its Python line), when the trace has its stack.
    pub site: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceOutcome {
    pub device: u8,
    pub limit_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// Reserved but not allocated when reserved peaked (the fragmentation PyTorch's OOM message
    /// calls "reserved but unallocated").
    pub unallocated_at_peak_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub retries: u64,
    pub failures: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The setting replayed, as `PYTORCH_CUDA_ALLOC_CONF` takes it ("" for the defaults).
    pub setting: String,
    /// Of the device with the highest peak reserved.
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub unallocated_at_peak_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub failures: u64,
    /// Requests the program can do without (a convolution's workspace) that the replay could
    /// not serve: cuDNN would run an algorithm needing less, which the replay takes as none.
    #[serde(skip_serializing_if = "is_zero")]
    pub done_without: u64,
    pub first_failure: Option<Failure>,
    /// For a run that failed a tensor: whether this setting served that request.
    pub serves_recorded_oom: Option<bool>,
    pub devices: Vec<DeviceOutcome>,
    /// For a ring that began after the run's first tensors: why the cache the replay starts
    /// from is not PyTorch's to the byte (absent: it is, or the trace holds the whole run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_not_exact: Option<String>,
    /// What PyTorch's private pools (CUDA graphs' pools, `torch.cuda.MemPool`s) held at the
    /// run's failure, as the run held them: the replay counts it against the device and the
    /// fraction and gives the default pools none of it.
    #[serde(skip_serializing_if = "is_zero")]
    pub private_pool_bytes_at_oom: u64,
    /// The run's failed request was in a private pool, which the replay keeps as the run had
    /// it rather than model: no setting is judged on it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub oom_in_private_pool: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How the replay of the recorded setting compares with the run, device by device.
#[derive(Clone, Debug, Serialize)]
pub struct Fidelity {
    pub device: u8,
    /// Segments taken and given back (or pages mapped and unmapped), in the run and replayed.
    pub recorded_segment_events: usize,
    pub replayed_segment_events: usize,
    /// The first that differ (index, the run's, the replay's), if any.
    pub first_difference: Option<(usize, String, String)>,
    pub recorded_peak_reserved_bytes: u64,
    pub replayed_peak_reserved_bytes: u64,
    pub tensors: u64,
    /// Tensors the replay put at the address the run put them.
    pub tensors_at_recorded_address: u64,
}

impl Fidelity {
    pub fn exact(&self) -> bool {
        self.first_difference.is_none()
            && self.recorded_peak_reserved_bytes == self.replayed_peak_reserved_bytes
    }
}

/// The high bits of a placeholder's address (see [`Input::with_placeholders_after`]): apart
/// from the run's addresses, a checkpoint's copies' (bit 63) and the sharding's (bit 62).
const PLACEHOLDER: u64 = 1 << 61;

impl Input {
    /// After each of `requests` (places among the requests, ascending), two requests of no
    /// bytes and their frees, in the order PyTorch's reduction kernel asks a staging buffer
    /// and its semaphore after the output it sums into, and lets both go once it is launched:
    /// the request's line, sequence number and stream. At the run's sizes they change nothing
    /// (a request of no bytes takes no block, and its free finds none); `fit` sizes them at
    /// other batches. Made before anything is found of the events (each look kept is dropped).
    /// The places of the placeholders' staging buffers among the requests, each semaphore
    /// the next.
    pub fn with_placeholders_after(&mut self, requests: &[usize]) -> Vec<usize> {
        if requests.is_empty() {
            return Vec::new();
        }
        let mut placed = Vec::with_capacity(requests.len());
        let mut wanted = requests.iter().copied().peekable();
        let mut events = Vec::with_capacity(self.events.len() + 4 * requests.len());
        let (mut n, mut made) = (0usize, 0usize);
        for e in self.events.drain(..) {
            events.push(e);
            if e.ev != Ev::Alloc {
                continue;
            }
            let this = n;
            n += 1;
            while wanted.next_if(|&w| w < this).is_some() {}
            if wanted.next_if_eq(&this).is_none() {
                continue;
            }
            placed.push(this + 1 + 2 * made);
            let mut one = |ev: Ev, k: u64| {
                let mut p = e;
                (p.ev, p.ptr, p.size) = (ev, PLACEHOLDER | k, 0);
                (p.optional, p.private) = (false, false);
                p.kind = crate::report::kinds::Kind::Temporary;
                events.push(p);
            };
            let (staging, semaphore) = (2 * made as u64, 2 * made as u64 + 1);
            one(Ev::Alloc, staging);
            one(Ev::Alloc, semaphore);
            one(Ev::Free, semaphore);
            one(Ev::Free, staging);
            made += 1;
        }
        self.events = events;
        self.period = std::sync::OnceLock::new();
        self.last_before_free = std::sync::OnceLock::new();
        placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A setting refused for a key it does not know says why with the key quoted, and the key
    /// is the setting's text, which a run (and so a trace) chooses: nothing in the line is a
    /// control character a terminal would obey.
    #[test]
    fn a_refused_settings_reason_escapes_what_a_terminal_would_obey() {
        let text = "key\x1b[2J:1";
        let e = model::TorchConf::parse(text).expect_err("an unknown key is refused");
        let line = ReplayError::Setting {
            text: text.into(),
            reason: e.to_string(),
        }
        .to_string();
        assert!(
            e.to_string().contains('\x1b'),
            "the reason quotes the key: {e:?}"
        );
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("'key\\x1b'"), "{line:?}");
    }
}
