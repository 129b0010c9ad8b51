//! The framework's tensors, a tracker of the replay ([`super::live`]): whether the trace holds
//! any (PyTorch's allocator trace), why not where the shim said, and per device the bytes of
//! live tensors and their peak, as PyTorch's `memory_allocated` and `max_memory_allocated`
//! read.

#[derive(Clone, Default)]
pub struct Tensors {
    /// Why tensors are not recorded, if the shim said (`tensors_off` codes).
    pub off: Option<u64>,
    /// By device ordinal: bytes of live tensors, and their peak (`None`: none seen there).
    /// Indexed, not an ordered map: every tensor made and freed asks it (a real model's trace
    /// is two records in three of these), and a map's search was a tenth of the replay's
    /// work a tensor.
    bytes: Vec<Option<(u64, u64)>>,
}

impl Tensors {
    /// Device `device`'s entry, made if it has none.
    #[inline]
    fn entry(&mut self, device: u8) -> &mut (u64, u64) {
        let i = usize::from(device);
        if self.bytes.len() <= i {
            self.bytes.resize(i + 1, None);
        }
        self.bytes[i].get_or_insert_default()
    }

    /// A tensor of `size` bytes allocated on `device`.
    #[inline]
    pub fn allocated(&mut self, device: u8, size: u64) {
        let t = self.entry(device);
        t.0 = t.0.saturating_add(size);
        t.1 = t.1.max(t.0);
    }

    /// A tensor of `size` bytes freed on `device`.
    #[inline]
    pub fn freed(&mut self, device: u8, size: u64) {
        let t = self.entry(device);
        t.0 = t.0.saturating_sub(size);
    }

    /// What a checkpoint kept of `device`: live tensor bytes and their peak.
    pub fn restore(&mut self, device: u8, live: u64, peak: u64) {
        *self.entry(device) = (live, peak);
    }

    /// Each device with an entry, in order: (device, (live bytes, peak)).
    pub fn by_device(&self) -> impl Iterator<Item = (u8, (u64, u64))> + '_ {
        let devices = self.bytes.iter().zip(0..=u8::MAX);
        devices.filter_map(|(b, d)| b.map(|b| (d, b)))
    }

    /// Whether the trace holds the framework's tensors (one was allocated, or a checkpoint
    /// kept some): then the replay's live allocations are tensors (and what other libraries
    /// allocate), and the framework's segments are reserved memory.
    pub fn recorded(&self) -> bool {
        // Entries are made, never taken out: one there means one was made.
        !self.bytes.is_empty()
    }

    /// Bytes of live tensors on `device`.
    #[inline]
    pub fn live_on(&self, device: u8) -> u64 {
        self.bytes
            .get(usize::from(device))
            .copied()
            .flatten()
            .map_or(0, |t| t.0)
    }
}
