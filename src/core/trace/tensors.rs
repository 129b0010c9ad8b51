//! The framework's tensors, a tracker of the replay ([`super::live`]): whether the trace holds
//! any (PyTorch's allocator trace), why not where the shim said, and per device the bytes of
//! live tensors and their peak, as PyTorch's `memory_allocated` and `max_memory_allocated`
//! read.

use std::collections::BTreeMap;

#[derive(Clone, Default)]
pub struct Tensors {
    /// Why tensors are not recorded, if the shim said (`tensors_off` codes).
    pub off: Option<u64>,
    /// Per device: bytes of live tensors, and their peak.
    pub bytes: BTreeMap<u8, (u64, u64)>,
}

impl Tensors {
    /// A tensor of `size` bytes allocated on `device`.
    pub fn allocated(&mut self, device: u8, size: u64) {
        let t = self.bytes.entry(device).or_default();
        t.0 = t.0.saturating_add(size);
        t.1 = t.1.max(t.0);
    }

    /// A tensor of `size` bytes freed on `device`.
    pub fn freed(&mut self, device: u8, size: u64) {
        let t = self.bytes.entry(device).or_default();
        t.0 = t.0.saturating_sub(size);
    }

    /// What a checkpoint kept of `device`: live tensor bytes and their peak.
    pub fn restore(&mut self, device: u8, live: u64, peak: u64) {
        self.bytes.insert(device, (live, peak));
    }

    /// Whether the trace holds the framework's tensors (one was allocated, or a checkpoint
    /// kept some): then the replay's live allocations are tensors (and what other libraries
    /// allocate), and the framework's segments are reserved memory.
    pub fn recorded(&self) -> bool {
        !self.bytes.is_empty()
    }

    /// Bytes of live tensors on `device`.
    pub fn live_on(&self, device: u8) -> u64 {
        self.bytes.get(&device).map_or(0, |t| t.0)
    }
}
