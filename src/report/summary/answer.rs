//! What `gpushim summary` answers: the run, the trace's health, each device's figures, the
//! framework's memory by kind, and what owners held at exit.

use serde::Serialize;

/// Allocations with Python frames against all successful allocations.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct PythonFrames {
    pub allocations_with: u64,
    pub allocations: u64,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ApiStats {
    pub api: String,
    pub calls: u64,
    pub failed: u64,
    /// Of the failures, those for other reasons than memory (the code first met, named), as
    /// a missing driver: they send the reader to the code, not to `oom`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_otherwise: Option<(u64, String)>,
    /// Bytes obtained by the successful allocating calls.
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct DeviceSummary {
    /// CUDA device ordinal, or null when the shim could not tell.
    pub device: Option<u8>,
    pub peak_live_bytes: u64,
    pub peak_time_ns: u64,
    pub live_bytes_at_end: u64,
    pub live_allocations_at_end: u64,
    /// The shim pool's segments at their high-water mark (equal to live without a pool).
    pub peak_reserved_bytes: u64,
    /// Live bytes at the moment reserved peaked.
    pub live_at_reserved_peak_bytes: u64,
    /// Fragmentation at the peak of reserved memory: the share of reserved bytes that held no
    /// live allocation at that moment, 1 - live / reserved (`docs/internals.md`).
    pub fragmentation_at_peak: f64,
    /// Allocations that failed for lack of memory on this device.
    pub ooms: u64,
}

/// The framework's own caching allocator on one device, from its allocator trace (PyTorch):
/// what `torch.cuda.memory_allocated` and `memory_reserved` read, at their peaks and at exit.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct FrameworkMemory {
    pub device: u8,
    /// Bytes of live tensors: at their peak, and at exit.
    pub allocated_peak_bytes: u64,
    pub allocated_at_end_bytes: u64,
    pub tensors_at_end: u64,
    /// Bytes of the framework's segments (its cache): at their peak, and at exit.
    pub reserved_peak_bytes: u64,
    pub reserved_at_end_bytes: u64,
    /// Reserved at exit that no tensor used: what the cache holds unused.
    pub cached_unused_at_end_bytes: u64,
    pub segments_taken: u64,
    pub segments_given_back: u64,
    /// Requests the framework's allocator could not serve for lack of memory.
    pub ooms: u64,
    /// The live tensors by kind at their peak (`allocated_peak_bytes`), and at exit; empty
    /// where the kinds cannot be told (the peak lay before a ring's records).
    pub kinds_at_peak: crate::report::kinds::ByKind,
    pub kinds_at_exit: crate::report::kinds::ByKind,
    /// The most bytes of activations live at once (as a backward began: what the forward left
    /// for it), which may come before or after the tensors' peak; 0 with no backward.
    pub activations_peak_bytes: u64,
    /// The live tensors by kind as the program's own code ended, before Python's shutdown freed
    /// what its last lines still held (after a clean exit, when the two differ): at the last
    /// allocation made with Python frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds_before_shutdown: Option<BeforeShutdown>,
}

/// The live tensors by kind at a moment before Python's shutdown.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct BeforeShutdown {
    pub time_ns: u64,
    pub kinds: crate::report::kinds::ByKind,
}

/// What the shim's pool did on one device (its own records): how often it went to the device
/// for memory and gave it back, split blocks, and waited for the GPU.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PoolActivity {
    pub device: u8,
    pub segments_reserved: u64,
    pub bytes_reserved: u64,
    pub segments_released: u64,
    pub splits: u64,
    /// Waits for the device so that freed blocks could be reused (memory pressure or `limit`).
    pub waits: u64,
    /// Out-of-memory answers turned into success by giving the idle cache back.
    pub oom_retries: u64,
    /// Checkpoints made to prove fenced blocks free, and how long they took to pass (from
    /// made to passed: how far the GPU ran behind the host), median and longest.
    pub checkpoints: u64,
    pub checkpoint_pass_median_ns: u64,
    pub checkpoint_pass_max_ns: u64,
}

/// When the process left the legacy stream, which ends the pool's single-stream rule.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct StreamsLeft {
    pub time_ns: u64,
    /// The call that created or used the other stream.
    pub api: String,
    pub stream: u64,
    /// Where it was called from, when the trace has its stack.
    pub site: Option<String>,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct TraceHealth {
    pub committed: u64,
    pub torn: u64,
    /// Claimed slots never written (block tails); not lost records.
    pub unused: u64,
    pub lost: u64,
    pub truncated: u64,
    /// A trace of any length: records its checkpoint summarizes (the detail before the ring),
    /// and records that left the ring before they were summarized.
    pub summarized: u64,
    pub unsummarized: u64,
    /// Records the summarizer read after it had passed their slot (a writer held up between
    /// claiming it and writing it): summarized, after records that followed them.
    pub summarized_late: u64,
    /// Live allocations the checkpoint summed by call site (no room to list them).
    pub summed: u64,
    pub summed_bytes: u64,
    /// Checkpoints that could not be written (did not fit their slot even summed).
    pub checkpoints_failed: u64,
    /// The header's checkpoint layout is not a writer's: no checkpoint was read (why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_refused: Option<String>,
    /// How far live figures hold when records are missing (`None`: exact).
    pub live_figures: Option<String>,
    pub damage: Option<String>,
    pub clean_exit: bool,
    /// The process still runs (what is "at exit" is then "now").
    pub running: bool,
}

/// Which run a summary is of: the trace, the program, its process and host, and its place in a
/// job (the frameworks the frames show, the sharding, the world size and the rank).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct RunIdentity {
    pub path: String,
    pub program: String,
    /// The data-parallel or sharded frameworks the trace's frames show (DDP, FSDP2, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parallel: Vec<String>,
    /// How the framework shards, where the frames show it (FSDP2's resharding after the
    /// forward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharding: Option<String>,
    /// The job's world size, as the run's `WORLD_SIZE` said it (kept in the trace's header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
    pub pid: u32,
    pub host: String,
    pub rank: Option<i32>,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Which run: the trace, the program, its process and its place in a job.
    #[serde(flatten)]
    pub run: RunIdentity,
    pub duration_ns: u64,
    pub events: u64,
    pub apis: Vec<ApiStats>,
    pub devices: Vec<DeviceSummary>,
    pub pinned_host_peak_bytes: u64,
    /// Frees of pointers this trace never saw allocated (allocated before tracing, or by a
    /// route the trace missed).
    pub unmatched_frees: u64,
    /// How many successful allocations carry Python frames, when any does.
    pub python_frames: Option<PythonFrames>,
    /// Per device whose memory the shim's pool served.
    pub pool: Vec<PoolActivity>,
    /// Under a pool: when the single-stream rule ended (null while it held throughout).
    pub streams_left_legacy: Option<StreamsLeft>,
    /// Per device: the framework's tensors and cache, when the trace holds its tensors.
    pub framework: Vec<FrameworkMemory>,
    /// Why the trace holds no tensors of the framework, when the shim said.
    pub tensors_off: Option<String>,
    /// What each owner (the library that asked CUDA, or the framework for its tensors and
    /// cache) held at exit, per device.
    pub held_at_exit: Vec<crate::report::owners::OwnerBytes>,
    /// Per device, what NVML said this process used, against what the trace explains.
    pub device_memory: Vec<crate::report::device_memory::DeviceMemory>,
    pub health: TraceHealth,
}
