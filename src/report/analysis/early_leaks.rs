//! The leaks' sampling begun in the first pass (see [`EarlyLeaks`]), so that `leaks` and
//! `oom` need no second pass over the whole trace for it.

use crate::report::kinds::KindTracker;
use crate::report::live::Replay;
use crate::report::pass::{Said, Seen, Tracker};
use crate::trace::reader::{Counts, ReadCounts, TraceReader};

/// The leaks' second pass begun in the first: at record [`EarlyLeaks::at`] (a sixteenth of the
/// trace, at least 16,384 records), the boundary the finder would choose if the trace ended
/// there, the records up to it read again by a second reader of the file
/// ([`TraceReader::fork`]) into that choice's sampler, which then reads on with the first
/// pass. Used only where the finder's choice at the end is the same (for a steady loop it is);
/// otherwise the leaks are sampled in a second pass, as without it. The sampler's state at the
/// record is the second pass's there: the same records, the same replay and kinds.
pub struct EarlyLeaks {
    pub at: u64,
    counts: Counts,
    boundary: Option<String>,
    sampler: Option<crate::report::leaks::LeaksSampler>,
}

impl EarlyLeaks {
    pub fn new(reader: &TraceReader, boundary: Option<String>) -> EarlyLeaks {
        let (first, end) = reader.progress();
        let at = (end.saturating_sub(first) / 16).max(1 << 14);
        EarlyLeaks {
            at,
            counts: reader.mode().counts.clone(),
            boundary,
            sampler: None,
        }
    }

    /// At record `at` of the first pass (`rp` after it): the sampler begun and brought here.
    pub fn begin(
        &mut self,
        reader: &TraceReader,
        finder: &crate::report::leaks::LeaksFinder,
        rp: &Replay,
    ) {
        let mut sampler = finder.sampler(reader, rp, self.boundary.as_deref());
        let Ok(mut again) = reader.fork() else {
            return;
        };
        let (mut rp2, mut kinds2, mut batch) =
            (Replay::default(), KindTracker::default(), Vec::new());
        // A sampler says nothing of moments.
        let mut said = Vec::new();
        'read: while again.next_batch(&mut batch) {
            for (i, r) in batch.iter().enumerate() {
                crate::prefetch::ahead(&batch, i);
                let change = rp2.apply(r);
                let run_before = kinds2.run();
                let decided = kinds2.observe(&again, r);
                let seen = Seen {
                    reader: &again,
                    rp: &rp2,
                    kinds: &kinds2,
                    record: r,
                    change,
                    decided,
                    run_before,
                };
                sampler.see(&seen, &mut said);
                if rp2.index == self.at {
                    break 'read;
                }
            }
        }
        if rp2.index == self.at {
            self.sampler = Some(sampler);
        }
    }

    /// The sampler, if it samples what the finder chose at the end (`chosen`).
    pub fn finish(
        self,
        chosen: &crate::report::leaks::LeaksSampler,
    ) -> Option<crate::report::leaks::LeaksSampler> {
        let used = self.sampler.filter(|s| s.same_choice(chosen));
        if used.is_some() {
            // Said with `GPUSHIM_READS=1`: the tests see the sampling used whatever the
            // batches decoded.
            ReadCounts::add(&self.counts.leaks_sampled_reading, 1);
        }
        used
    }
}

impl Tracker for EarlyLeaks {
    /// One record of the first pass after `at`, to the sampler begun there.
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, said: &mut Vec<Said>) {
        if let Some(s) = &mut self.sampler {
            s.see(seen, said);
        }
    }
}
