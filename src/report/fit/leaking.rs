//! A run that leaks, as `fit` says it before its answers: the growth `leaks` found in the same
//! read, and how soon it alone would fill the room the run's batch leaves.

use super::SettingFit;
use crate::report::leaks::{Growth, Leaks};
use serde::Serialize;

/// A run whose memory grows every iteration: the replays hold what it had grown to by the
/// trace's end, so their peaks are the leak's as much as the batch's.
#[derive(Clone, Debug, Serialize)]
pub struct Leaking {
    /// The growing lines' growth per iteration, summed, and the iterations the run had.
    pub bytes_per_iteration: u64,
    pub iterations: u64,
    /// What the growing lines held at the last boundary, summed.
    pub grown_bytes: u64,
    /// The line that grows most, and its kind's name.
    pub line: String,
    pub kind: Option<String>,
    /// Of the room the run's own batch leaves under the limit (the recorded setting), the
    /// iterations until the growth alone fills it (`None`: the run's batch does not fit).
    pub iterations_until_full: Option<u64>,
}

impl Leaking {
    /// The growth `leaks` found, if any line grows.
    pub(super) fn of(l: &Leaks) -> Option<Leaking> {
        let it = l.iterations.as_ref()?;
        let top = it.growing.iter().max_by_key(|g| g.bytes_per_iteration)?;
        let sum = |f: fn(&Growth) -> u64| it.growing.iter().map(f).fold(0u64, u64::saturating_add);
        Some(Leaking {
            bytes_per_iteration: sum(|g| g.bytes_per_iteration),
            iterations: it.count,
            grown_bytes: sum(|g| g.live_at_last_boundary),
            line: top.call_site.clone(),
            kind: top.kind.map(|k| k.name().to_string()),
            iterations_until_full: None,
        })
    }

    /// With the iterations until the growth alone fills the room the run's own batch leaves
    /// under `limit` under the run's setting (none where that batch does not fit).
    pub(super) fn at_run(mut self, settings: &[SettingFit], at: u64, limit: u64) -> Leaking {
        let row = settings
            .iter()
            .find(|s| s.recorded)
            .and_then(|s| s.rows.iter().find(|r| r.batch == at));
        self.iterations_until_full = row
            .filter(|r| r.failures == 0)
            .map(|r| limit.saturating_sub(r.peak_reserved_bytes) / self.bytes_per_iteration.max(1));
        self
    }
}
