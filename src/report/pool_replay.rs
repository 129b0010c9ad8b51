//! `gpushim simulate`: the allocations and frees of a trace replayed through the caching
//! engine (over memory, no GPU) under other policies, beside what the run itself had.
//!
//! A run recorded without the pool has no record of the GPU's progress: its replay assumes
//! the GPU keeps up (every fence passes at once) and shows the memory a policy needs, not the
//! waits it would cost. A run recorded under the pool carries the pool's own timeline: while
//! the process used the legacy stream only, fences passed at once (the shim's rule); from its
//! `pool_streams` record on, a fence passes where the trace says the checkpoint after it passed
//! (`pool_checkpoint`), so replaying such a run under its own policy reproduces what the pool
//! did, and other policies are replayed against the GPU's real lag.

use crate::config;
use crate::engine::front::Front;
use crate::engine::{FreeKind, MemoryBackend, Policy, SYNC_KEY};
use crate::trace::format::{Record, RecordKind};
use crate::trace::reader::{ReadError, TraceReader};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;

#[derive(Clone, Debug, Serialize)]
pub struct PoolOutcome {
    /// "recorded" for the run itself, else the policy as given.
    pub policy: String,
    pub peak_reserved_bytes: u64,
    /// Bytes the program asked for (not the blocks that served them), at their peak: the same
    /// for every policy, since the program is the same.
    pub peak_live_bytes: u64,
    /// 1 - live/reserved at the moment reserved peaked, the allocation a segment was reserved
    /// for included (as `gpushim summary` counts it).
    pub fragmentation_at_peak: f64,
    /// Device allocation calls (cudaMalloc-like) the policy makes.
    pub device_allocations: u64,
    pub failed_allocations: u64,
    /// On the run's own row, where PyTorch's allocator made the device allocations: its
    /// reserved memory (its cache) at its peak. Its segments are then the program's requests
    /// here, replayed through the shim's pool; `simulate --torch` replays PyTorch's allocator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub framework_reserved_peak_bytes: Option<u64>,
}

/// Why a simulation could not run.
#[derive(Debug)]
pub enum SimulateError {
    /// A policy text that `GPUSHIM_CONF` would refuse: the text and why, in words.
    Policy { text: String, reason: String },
    /// The trace could not be read.
    Read(ReadError),
}

impl fmt::Display for SimulateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimulateError::Policy { text, reason } => write!(f, "--conf {text}: {reason}"),
            SimulateError::Read(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SimulateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimulateError::Read(e) => Some(e),
            SimulateError::Policy { .. } => None,
        }
    }
}

impl From<ReadError> for SimulateError {
    fn from(e: ReadError) -> Self {
        SimulateError::Read(e)
    }
}

/// Each policy text (GPUSHIM_CONF syntax) parsed, for [`simulate`]: checked before the trace
/// is read.
pub fn policies(policies: &[String]) -> Result<Vec<(String, Policy)>, SimulateError> {
    policies
        .iter()
        .map(|p| {
            config::parse_strict(p)
                .map(|c| (p.clone(), Policy::from(&c)))
                .map_err(|e| SimulateError::Policy {
                    text: p.clone(),
                    reason: e.to_string(),
                })
        })
        .collect()
}

/// The records `reader` reads replayed under each of the `parsed` policies ([`policies`]):
/// the run's own row first, then one a policy.
pub fn simulate(reader: TraceReader, parsed: Vec<(String, Policy)>) -> Vec<PoolOutcome> {
    // One read of the trace, every row's tally or replay fed each record.
    let mut rows: Vec<PolicyRow> = parsed
        .into_iter()
        .map(|(text, policy)| {
            let pass_through =
                config::parse_strict(&text).is_ok_and(|c| c.pool == config::Pool::Off);
            if pass_through {
                // pool:off: every allocation is a device allocation of its own.
                PolicyRow::LiveOnly(text, LiveOnly::default())
            } else {
                PolicyRow::Replay(text, Box::new(Replaying::new(policy)))
            }
        })
        .collect();
    let mut recorded = Recorded::default();
    for r in reader {
        recorded.see(&r);
        for row in &mut rows {
            match row {
                PolicyRow::LiveOnly(_, l) => l.see(&r),
                PolicyRow::Replay(_, p) => p.see(&r),
            }
        }
    }
    let mut out = vec![recorded.finish()];
    out.extend(rows.into_iter().map(|row| match row {
        PolicyRow::LiveOnly(text, live) => PoolOutcome {
            policy: policy_name(&text),
            peak_reserved_bytes: live.peak,
            peak_live_bytes: live.peak,
            fragmentation_at_peak: 0.0,
            device_allocations: live.calls,
            failed_allocations: live.failed,
            framework_reserved_peak_bytes: None,
        },
        PolicyRow::Replay(text, p) => p.finish(&text),
    }));
    out
}

/// A row of the table other than the run's own: what it tallies or replays.
enum PolicyRow {
    LiveOnly(String, LiveOnly),
    Replay(String, Box<Replaying>),
}

/// How a policy is named in the table: its text, or for the empty one what it is.
fn policy_name(text: &str) -> String {
    if text.trim().is_empty() {
        "the defaults (nothing set)".into()
    } else {
        text.into()
    }
}

/// The program's allocations alone: peak live bytes, successful and failed calls.
#[derive(Default)]
struct LiveOnly {
    peak: u64,
    calls: u64,
    failed: u64,
    live: u64,
    sizes: HashMap<u64, u64>,
}

impl LiveOnly {
    fn see(&mut self, r: &Record) {
        match r.kind {
            RecordKind::Alloc | RecordKind::AllocAsync if r.status != 0 => self.failed += 1,
            RecordKind::Alloc | RecordKind::AllocAsync if r.ptr != 0 => {
                self.calls += 1;
                self.sizes.insert(r.ptr, r.size);
                self.live = self.live.saturating_add(r.size);
                self.peak = self.peak.max(self.live);
            }
            RecordKind::Free | RecordKind::FreeAsync if r.status == 0 => {
                let size = self.sizes.remove(&r.ptr).unwrap_or(0);
                self.live = self.live.saturating_sub(size);
            }
            _ => {}
        }
    }
}

/// What the traced run had. A run with the shim's pool has segment records: its device
/// allocations are the segments. A pass-through run's allocations were each a device
/// allocation. Live bytes here are the requests a pool serves (`cudaMalloc`, `cuMemAlloc`
/// and their stream-ordered forms, on every device together), the same input the replays
/// below feed the engine, so the rows compare like with like; the device's live memory, with
/// managed and VMM memory, is [`crate::report::live::Replay`]'s, which the other reports use.
#[derive(Default)]
struct Recorded {
    /// The program's requests, as `pool:off` counts them.
    program: LiveOnly,
    reserved: u64,
    peak_reserved: u64,
    live_at_peak: u64,
    segments: u64,
    /// PyTorch's segments (its cache): reserved now and at its peak.
    framework_reserved: u64,
    framework_peak: Option<u64>,
}

impl Recorded {
    fn see(&mut self, r: &Record) {
        let framework = r.api == crate::trace::format::Api::Torch;
        match r.kind {
            // PyTorch's segment records say which of its cudaMalloc calls made its cache: the
            // calls themselves are this run's device allocations, the shim's pool took none.
            RecordKind::SegmentReserve if framework => {
                self.framework_reserved = self.framework_reserved.saturating_add(r.size);
                let peak = self.framework_peak.get_or_insert(0);
                *peak = (*peak).max(self.framework_reserved);
            }
            RecordKind::SegmentRelease if framework => {
                self.framework_reserved = self.framework_reserved.saturating_sub(r.size)
            }
            RecordKind::SegmentReserve => {
                self.segments += 1;
                self.reserved = self.reserved.saturating_add(r.size);
                if self.reserved > self.peak_reserved {
                    self.peak_reserved = self.reserved;
                    self.live_at_peak = self.program.live;
                }
            }
            RecordKind::SegmentRelease => self.reserved = self.reserved.saturating_sub(r.size),
            _ => {
                self.program.see(r);
                let served = matches!(r.kind, RecordKind::Alloc | RecordKind::AllocAsync)
                    && r.status == 0
                    && r.ptr != 0;
                if served && self.reserved == self.peak_reserved {
                    // Still at the peak: the allocation a segment was reserved for comes
                    // just after it.
                    self.live_at_peak = self.live_at_peak.max(self.program.live);
                }
            }
        }
    }

    fn finish(self) -> PoolOutcome {
        let p = &self.program;
        if self.segments > 0 {
            return PoolOutcome {
                policy: "recorded".into(),
                peak_reserved_bytes: self.peak_reserved,
                peak_live_bytes: p.peak,
                fragmentation_at_peak: super::units::fragmentation(
                    self.live_at_peak,
                    self.peak_reserved,
                ),
                device_allocations: self.segments,
                failed_allocations: p.failed,
                framework_reserved_peak_bytes: self.framework_peak,
            };
        }
        PoolOutcome {
            policy: "recorded".into(),
            peak_reserved_bytes: p.peak,
            peak_live_bytes: p.peak,
            fragmentation_at_peak: 0.0,
            device_allocations: p.calls,
            failed_allocations: p.failed,
            framework_reserved_peak_bytes: self.framework_peak,
        }
    }
}

/// A trace's allocations and frees fed one record at a time through the shim's own front (the
/// engine plus its list of small stream-ordered blocks), so a replay makes the decisions the
/// shim would, against the fence timeline the trace recorded (see the module's note).
pub struct PoolReplayer {
    pub pool: Front<MemoryBackend>,
    /// Recorded pointer -> replayed pointer.
    map: HashMap<u64, u64>,
    /// Per checkpoint number, the fences made before it.
    cover: std::collections::BTreeMap<(u8, u64), u64>,
    pub failed: u64,
}

impl PoolReplayer {
    pub fn new(policy: Policy) -> PoolReplayer {
        let mut pool = Front::new(MemoryBackend::new(u64::MAX / 4), policy);
        // Until the trace shows the pool's timeline, fences pass as they are made.
        pool.engine.backend_mut().instant = true;
        PoolReplayer {
            pool,
            map: HashMap::new(),
            cover: Default::default(),
            failed: 0,
        }
    }

    /// Whether `r` is a request the pool serves (an allocation or a free to replay).
    pub fn is_request(r: &Record) -> bool {
        matches!(
            r.kind,
            RecordKind::Alloc | RecordKind::AllocAsync | RecordKind::Free | RecordKind::FreeAsync
        ) && r.status == 0
    }

    /// Applies one record: a request is served, the pool's timeline moves; others are ignored.
    pub fn apply(&mut self, r: &Record) {
        let pool = &mut self.pool;
        match r.kind {
            // From here on fences wait for the checkpoints the trace shows passing.
            RecordKind::PoolStreams => pool.engine.backend_mut().instant = false,
            RecordKind::PoolCheckpoint if r.size == 0 => {
                let made = pool.engine.backend().fences_made();
                self.cover.insert((r.device, r.ptr), made);
            }
            RecordKind::PoolCheckpoint => {
                // A checkpoint passed: the fences made before it. A pass with no checkpoint of
                // that number is the program's own synchronization: every fence so far.
                let b = pool.engine.backend_mut();
                let n = self
                    .cover
                    .get(&(r.device, r.ptr))
                    .copied()
                    .unwrap_or_else(|| b.fences_made());
                self.cover.retain(|&(d, id), _| d != r.device || id > r.ptr);
                b.pass_up_to(n);
            }
            RecordKind::Alloc | RecordKind::AllocAsync if r.status == 0 && r.ptr != 0 => {
                let device = if r.device == crate::trace::format::DEVICE_UNKNOWN {
                    0
                } else {
                    r.device
                };
                // The shim's keys: cudaMalloc-like allocations in a pool no stream owns,
                // stream-ordered ones by stream (0: the legacy stream).
                let stream = if r.kind == RecordKind::Alloc {
                    SYNC_KEY
                } else {
                    u64::from(r.stream)
                };
                match pool.alloc(device, r.size, stream) {
                    Ok(b) => {
                        self.map.insert(r.ptr, b.ptr);
                    }
                    Err(_) => self.failed += 1,
                }
            }
            RecordKind::Free | RecordKind::FreeAsync if r.status == 0 => {
                if let Some(p) = self.map.remove(&r.ptr) {
                    let kind = if r.kind == RecordKind::Free {
                        FreeKind::Sync
                    } else {
                        FreeKind::OnStream(u64::from(r.stream))
                    };
                    let _ = pool.free(p, kind);
                }
            }
            _ => {}
        }
    }
}

/// A policy's replay, record by record: the pool's peaks as the program's requests come.
struct Replaying {
    replayer: PoolReplayer,
    peak_reserved: u64,
    live_at_peak: u64,
    peak_requested: u64,
}

impl Replaying {
    fn new(policy: Policy) -> Replaying {
        Replaying {
            replayer: PoolReplayer::new(policy),
            peak_reserved: 0,
            live_at_peak: 0,
            peak_requested: 0,
        }
    }

    fn see(&mut self, r: &Record) {
        self.replayer.apply(r);
        // Live as the program counts it: requested bytes, as in the recorded row.
        let pool = &self.replayer.pool;
        let s = pool.engine.stats();
        let live = pool.requested_live();
        self.peak_requested = self.peak_requested.max(live);
        if s.reserved_bytes > self.peak_reserved {
            self.peak_reserved = s.reserved_bytes;
            self.live_at_peak = live;
        } else if s.reserved_bytes == self.peak_reserved {
            self.live_at_peak = self.live_at_peak.max(live);
        }
    }

    fn finish(self, text: &str) -> PoolOutcome {
        let s = self.replayer.pool.engine.stats();
        PoolOutcome {
            policy: policy_name(text),
            peak_reserved_bytes: self.peak_reserved,
            peak_live_bytes: self.peak_requested,
            fragmentation_at_peak: super::units::fragmentation(
                self.live_at_peak,
                self.peak_reserved,
            ),
            device_allocations: s.segment_reserves,
            failed_allocations: self.replayer.failed,
            framework_reserved_peak_bytes: None,
        }
    }
}
