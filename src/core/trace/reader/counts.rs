//! What this process read: traces opened, passes begun, records decoded (`GPUSHIM_READS=1`
//! has the command say them; the tests and the benchmark count them).

/// Files opened by their names where a trace goes (a trace, its header alone, a saved
/// analysis: a command opens each name once, see [`super::opening::pin_opened_traces`]), and
/// passes begun over traces, by this process: a command reads its trace in a known number of
/// passes (`GPUSHIM_READS=1` has the command say them; the tests count them).
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

/// (files opened by their names, passes read) by this process so far.
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

/// CPU time of the decoding threads, in nanoseconds, summed as each ends.
pub(super) static DECODING_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// CPU time the calling thread has run, in nanoseconds (0 where the clock cannot be read):
/// `GPUSHIM_READS=1` says how the work of a pass was shared between its threads.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant of the platform.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// CPU seconds the decoding threads of this process have run, as they ended.
pub fn decoding_cpu_s() -> f64 {
    DECODING_NS.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9
}
