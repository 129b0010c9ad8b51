//! What this process read: traces opened, passes begun, records decoded (`GPUSHIM_READS=1`
//! has the command say them; the tests and the benchmark count them).

/// Traces opened, and passes begun over them (an opening's first included), by this process:
/// a command reads its trace in a known number of passes (`GPUSHIM_READS=1` has the command
/// say them; the tests count them).
pub(super) static OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(super) static PASSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Records a whole pass over each trace opened decodes (counted when its first pass ends), and
/// records decoded by every pass (one that stops early, or reads only the first part again,
/// decodes fewer).
pub(super) static HELD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(super) static DECODED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Passes whose batches more readers read too, each on a thread of its own
/// ([`super::TraceReader::pairs`]), and the most readers one such pass had.
pub(super) static PAIRED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(super) static READERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// (passes read by several readers at once, the most readers of one) by this process so far
/// ([`super::TraceReader::pairs`]).
pub fn paired() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (PAIRED.load(Relaxed), READERS.load(Relaxed))
}

/// (traces opened, passes read) by this process so far.
pub fn reads() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (OPENED.load(Relaxed), PASSES.load(Relaxed))
}

/// (records a whole pass over the traces opened decodes, records decoded from them) by this
/// process so far.
pub fn records_read() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (HELD.load(Relaxed), DECODED.load(Relaxed))
}
