//! What a command's reading cost: passes begun, records decoded, readers sharing a pass, the
//! decoding threads' time, and what the passes over the records did (moments taken, replays,
//! the trackers' time). One value a command makes and passes down with how it reads
//! ([`super::ReadMode::counts`]); `GPUSHIM_READS=1` has the command say it at its end, so that
//! the tests and the benchmark see how a report read its traces.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// The tallies of one command's reading (see the module's doc). Each is added to as the work
/// is done, by whichever thread does it.
#[derive(Debug, Default)]
pub struct ReadCounts {
    /// Passes begun over traces.
    pub passes: AtomicU64,
    /// Records a whole pass over each trace opened decodes (counted when its first pass ends),
    /// and records decoded by every pass (one that stops early, or reads only the first part
    /// again, decodes fewer).
    pub held: AtomicU64,
    pub decoded: AtomicU64,
    /// Passes whose batches more readers read too, each on a thread of its own
    /// ([`super::TraceReader::pairs`]), and the most readers one such pass had.
    pub paired: AtomicU64,
    pub readers: AtomicU64,
    /// CPU time of the decoding threads, in nanoseconds, summed as each ends.
    pub decoding_ns: AtomicU64,
    /// Moments the first passes took as the trace was read, and at a pass's end (a candidate
    /// whose window the trace cut short, or one not taken when it could be).
    pub moments_reading: AtomicU64,
    pub moments_at_end: AtomicU64,
    /// Records at which moments being taken looked at their slots.
    pub moments_visited: AtomicU64,
    /// The moments' copies of the replay, and what they cost in live entries.
    pub replay_copies: AtomicU64,
    pub replay_copied: AtomicU64,
    /// Times the leaks' sampling begun in the first pass was used.
    pub leaks_sampled_reading: AtomicU64,
    /// Replays of PyTorch's allocator, the events they applied, and those they passed over as
    /// repeats of the loop.
    pub replays: AtomicU64,
    pub replay_events: AtomicU64,
    pub replay_passed: AtomicU64,
    /// First passes' wall time, their trackers' CPU time (summed over threads) and the busiest
    /// tracking thread's, in nanoseconds.
    pub first_pass_ns: AtomicU64,
    pub tracking_ns: AtomicU64,
    pub tracking_most_ns: AtomicU64,
}

impl ReadCounts {
    /// Adds `n` to `tally`.
    pub fn add(tally: &AtomicU64, n: u64) {
        tally.fetch_add(n, Relaxed);
    }

    /// Raises `tally` to `n` where it is lower.
    pub fn most(tally: &AtomicU64, n: u64) {
        tally.fetch_max(n, Relaxed);
    }

    /// `tally`'s value now.
    pub fn get(tally: &AtomicU64) -> u64 {
        tally.load(Relaxed)
    }
}

/// A command's [`ReadCounts`], shared by every reader and pass it makes. Any two compare
/// equal: how a command reads is its mode's other fields, not what reading has cost so far.
#[derive(Clone, Debug, Default)]
pub struct Counts(pub Arc<ReadCounts>);

impl PartialEq for Counts {
    fn eq(&self, _: &Counts) -> bool {
        true
    }
}

impl Eq for Counts {}

impl std::ops::Deref for Counts {
    type Target = ReadCounts;

    fn deref(&self) -> &ReadCounts {
        &self.0
    }
}

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
