//! Whether a model goes on as another: a replay that finds its models as they were some
//! events before, with the same events ahead, knows what comes next without replaying it (see
//! the replayer's `repeat`).

use super::{Model, Stats};

impl Model {
    /// Whether every request and free from here on gets from `self` what it gets from `other`:
    /// the same blocks in the same places and states, the same free sets, segments, pending
    /// frees, hints, limits, setting and bytes held, and the collector's clock. Left out are
    /// what only counts (the peaks and the calls, [`Model::counted_since`]), the segment log
    /// and the lists that only spare a release or the collector a look through every free
    /// block (`fresh`, `gc_whole`, `gc_fresh`: what they find is what a look through every
    /// block finds, held by the model's tests). Every field is named, so a field added to
    /// the model is a decision here, not an omission.
    pub fn goes_on_as(&self, other: &Model) -> bool {
        let Model {
            conf,
            limits,
            blocks,
            free,
            fresh: _,
            gc_whole: _,
            gc_fresh: _,
            unmapped,
            segments,
            pending,
            searches,
            stats,
            hints,
            next_synthetic,
            log: _,
            outside,
        } = self;
        stats.reserved == other.stats.reserved
            && stats.allocated == other.stats.allocated
            && blocks.len() == other.blocks.len()
            && *outside == other.outside
            && *next_synthetic == other.next_synthetic
            && *searches == other.searches
            && *limits == other.limits
            && *hints == other.hints
            && *pending == other.pending
            && *free == other.free
            && *unmapped == other.unmapped
            && *segments == other.segments
            && *blocks == other.blocks
            && *conf == other.conf
    }

    /// How many blocks the model keeps (what comparing it costs).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// What the model counted since `before` (its stats then) was counted `times` more: the
    /// calls, retries and failures of a stretch of events that repeats. The peaks stay: a
    /// stretch that repeats from the same state reaches the same peaks again.
    pub fn counted_since(&mut self, before: &Stats, times: u64) {
        let s = &mut self.stats;
        let more = |now: u64, then: u64| now.saturating_sub(then).saturating_mul(times);
        s.device_allocs = s
            .device_allocs
            .saturating_add(more(s.device_allocs, before.device_allocs));
        s.device_frees = s
            .device_frees
            .saturating_add(more(s.device_frees, before.device_frees));
        s.retries = s.retries.saturating_add(more(s.retries, before.retries));
        s.failures = s.failures.saturating_add(more(s.failures, before.failures));
    }
}
