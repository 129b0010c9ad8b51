//! What the engine counts: totals ([`Stats`]) and, per device, the running figures PyTorch's
//! caching allocator keeps of its own ([`DeviceStats`]).

/// What the engine counts. Bytes are block sizes (after rounding) unless named `requested`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub live_bytes: u64,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_live_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub live_blocks: u64,
    /// Segments obtained from the device (cudaMalloc-like calls) and given back.
    pub segment_reserves: u64,
    pub segment_releases: u64,
    /// Requests served from cached memory.
    pub cache_hits: u64,
    pub splits: u64,
    /// Waits for the device to make fenced blocks reusable.
    pub synchronizations: u64,
    /// Out-of-memory answers that a retry after releasing the cache turned into success.
    pub oom_retries: u64,
    pub ooms: u64,
    pub limit_hits: u64,
}

/// One running figure per device, kept the way PyTorch's caching allocator keeps each of its
/// own: the value now, its highest since the last peak reset, and the totals added and taken
/// since the last reset of totals. `torch.cuda.memory_stats` shows these under `gpushim run
/// --pluggable` and `--per-tensor` (see `DeviceStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

impl Counter {
    pub(super) fn add(&mut self, n: u64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.allocated += n;
    }

    pub(super) fn sub(&mut self, n: u64) {
        self.current -= n;
        self.freed += n;
    }
}

/// How many figures `DeviceStats::to_array` gives.
pub const DEVICE_STATS_LEN: usize = 22;

/// One device's figures: what the pool holds for it, whoever asked (a framework's pluggable
/// allocator or the program's own `cudaMalloc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Live blocks' sizes (after rounding).
    pub allocated_bytes: Counter,
    /// Live blocks' sizes as asked for.
    pub requested_bytes: Counter,
    /// Memory reserved from the device: segments, and the mapped pages of expandable ones.
    pub reserved_bytes: Counter,
    /// Live blocks.
    pub allocations: Counter,
    /// Segments (an expandable segment counts once, however much of it is mapped).
    pub segments: Counter,
    /// Requests refused for lack of device memory (or past `limit`).
    pub ooms: u64,
    /// Requests that succeeded only after the idle cache was given back.
    pub oom_retries: u64,
}

impl DeviceStats {
    /// Each figure's peak becomes its value now.
    pub fn reset_peaks(&mut self) {
        for c in self.counters_mut() {
            c.peak = c.current;
        }
    }

    /// The totals added and taken start again from 0, as do the refusal counts.
    pub fn reset_totals(&mut self) {
        for c in self.counters_mut() {
            c.allocated = 0;
            c.freed = 0;
        }
        self.ooms = 0;
        self.oom_retries = 0;
    }

    /// Adds another context's figures on the same device. Peaks add up too: exact when one
    /// of the two never held memory (one context per device, as PyTorch uses), an upper bound
    /// otherwise.
    pub fn add(&mut self, other: &DeviceStats) {
        for (c, o) in self.counters_mut().into_iter().zip(other.counters()) {
            c.current += o.current;
            c.peak += o.peak;
            c.allocated += o.allocated;
            c.freed += o.freed;
        }
        self.ooms += other.ooms;
        self.oom_retries += other.oom_retries;
    }

    /// The figures in the order `gpushim_device_stats` writes them: each counter's current,
    /// peak, allocated and freed (allocated bytes, requested bytes, reserved bytes, allocations,
    /// segments), then out-of-memory answers and retries.
    pub fn to_array(&self) -> [u64; DEVICE_STATS_LEN] {
        let mut out = [0; DEVICE_STATS_LEN];
        for (i, c) in self.counters().iter().enumerate() {
            out[4 * i..4 * i + 4].copy_from_slice(&[c.current, c.peak, c.allocated, c.freed]);
        }
        out[20] = self.ooms;
        out[21] = self.oom_retries;
        out
    }

    /// The five counters, in the order of `to_array`.
    fn counters(&self) -> [Counter; 5] {
        [
            self.allocated_bytes,
            self.requested_bytes,
            self.reserved_bytes,
            self.allocations,
            self.segments,
        ]
    }

    fn counters_mut(&mut self) -> [&mut Counter; 5] {
        [
            &mut self.allocated_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.allocations,
            &mut self.segments,
        ]
    }
}
