//! What a `Restore` record restores (its `status` byte). A checkpoint opens with `BEGIN` and
//! closes with `END`; between them the records stand for state, not for calls the program made.

/// `ptr`: the ring index the checkpoint covers up to; `size`: records summarized;
/// `time_ns`: the time of the latest of them.
pub const BEGIN: u8 = 0;
pub const END: u8 = 1;
/// The live allocations that follow (until the next `SITE`) share this call site: `ptr`
/// the stack id, `size` the NVTX range's string id, `time_ns` the forward stack a backward
/// tensor's autograd sequence number joined it to (0: none; `trace::backward`); a `Caller`
/// record follows with who called CUDA for them.
pub const SITE: u8 = 2;
/// A VMM physical allocation backing a framework's segment: `ptr` handle, `size`, device.
pub const FRAMEWORK_PHYSICAL: u8 = 3;
/// A segment of the framework (`api` torch) or the pool: `ptr` base, `size`, device;
/// `thread` 1 for pages of an expandable segment mapped there.
pub const SEGMENT: u8 = 4;
/// The framework's tensors on `device`: `ptr` bytes live, `size` their peak.
pub const TENSOR_BYTES: u8 = 5;
/// The most live on `device` at once: `ptr` bytes, `time_ns` when first reached.
pub const DEVICE_PEAK: u8 = 6;
/// Pinned host memory: `ptr` its peak.
pub const HOST_PEAK: u8 = 7;
/// NVML's figure for `device`: `ptr` latest, `time_ns` highest, `size` total, `thread` 1
/// when it was the whole device's.
pub const NVML: u8 = 8;
/// `ptr`: frees of memory the trace never saw allocated.
pub const UNMATCHED: u8 = 9;
/// The latest `cudaMemGetInfo` of `device`: `ptr` free, `size` total.
pub const MEM_INFO: u8 = 10;
/// An open start/end NVTX range: `ptr` its string id, `size` its range id.
pub const STARTED: u8 = 11;
/// An open push/pop NVTX range of `thread`, outermost first: `ptr` its string id.
pub const RANGE_OPEN: u8 = 12;
/// Calls of `api` summarized: `ptr` calls, `time_ns` bytes allocated, `size` failures.
pub const API: u8 = 13;
/// What was live at one moment, by call site (the `Holding` records that follow): `device`,
/// `ptr` live bytes, `size` reserved bytes, `time_ns` when; `thread` 0 for the device's
/// peak, 1 for a failed allocation (whose records follow the holdings).
pub const SNAPSHOT: u8 = 14;
/// More of the snapshot before: `ptr` the largest free block, `size` the device's free
/// memory as CUDA last said plus one (0: never asked).
pub const SNAPSHOT_MORE: u8 = 15;
/// An iteration boundary: `ptr` its number in the run, `time_ns` when, `size` live bytes
/// on every device then; the
/// `Holding` records that follow give live bytes by call site (only those that changed
/// since the boundary before, `device` 0xff).
pub const BOUNDARY: u8 = 16;
/// What marks the iterations of the boundaries: `ptr` an NVTX string id (`thread` 0) or a
/// call-site key (`thread` 1); `size` boundaries seen in all.
pub const BOUNDARY_MARK: u8 = 17;
// 18: not used.
/// `thread`'s latest allocation, which a `StackRef` to come names: `ptr`.
pub const LAST_ALLOC: u8 = 19;
/// `thread`'s latest allocation, which a `Caller` to come names: `ptr`, `size` 1 for a
/// VMM handle.
pub const AWAITING_CALLER: u8 = 20;
/// A VMM handle `thread` made that a framework segment to come may claim: `ptr`.
pub const PENDING_PHYSICAL: u8 = 21;
/// One point of the coarse series of memory over time: `device`, `ptr` live bytes, `size`
/// reserved bytes, `time_ns` when (the highest live of its stretch of time).
pub const SERIES: u8 = 22;
/// Live allocations the checkpoint had no room to list one by one, summed by call site
/// into stand-ins (addresses from `SUMMED_BASE`): `device`, `ptr` allocations, `size`
/// bytes. A later free of one of them is not matched.
pub const SUMMED: u8 = 23;

/// The holding's count of allocations, kept in `thread` (low) and `stream` (high).
pub fn count_of(r: &crate::trace::format::Record) -> u64 {
    u64::from(r.thread) | (u64::from(r.stream) << 16)
}

/// `count` split into `thread` (low) and `stream` (high), saturating at 2^32 - 1.
pub fn split_count(count: u64) -> (u16, u16) {
    let c = count.min(u64::from(u32::MAX));
    (c as u16, (c >> 16) as u16)
}
