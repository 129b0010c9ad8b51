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
/// Passes whose batches a second reader read too, on another thread ([`super::TraceReader::pair`]).
pub(super) static PAIRED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Passes read by two readers at once ([`super::TraceReader::pair`]) by this process so far.
pub fn paired() -> u64 {
    PAIRED.load(std::sync::atomic::Ordering::Relaxed)
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
