//! The kinds decided for tensors whose free a tracker has not seen yet: kept until that free.

use super::Kind;
use crate::fasthash::FastMap;

/// The kinds decided for tensors not yet freed, as a tracker that reads the replay's frees
/// needs them: most tensors' kind is decided at their own free (the same record), some as their
/// free is asked for (kept until the free comes). The first never go through a map: the kind
/// decided at the record being read is held apart, and put in the map only when the next
/// record comes.
#[derive(Default)]
pub struct Decided {
    /// The kind decided at the record being read.
    now: Option<(u64, Kind)>,
    /// Kinds decided at earlier records, by address, until their tensor's free.
    waiting: FastMap<u64, Kind>,
}

impl Decided {
    /// What the kinds decided at the record being read; called once a record, before any
    /// [`Decided::take`] for it.
    #[inline]
    pub fn note(&mut self, decided: Option<(u64, Kind)>) {
        if let Some((ptr, k)) = std::mem::replace(&mut self.now, decided) {
            self.waiting.insert(ptr, k);
        }
    }

    /// No kind decided at the record being read: [`Decided::note`] of `None` changes nothing.
    #[inline]
    pub fn idle(&self) -> bool {
        self.now.is_none()
    }

    /// The kind decided for the tensor at `ptr`, taken out: at its free, or at a new
    /// allocation there (a tensor whose free the trace did not show leaves no kind behind).
    #[inline]
    pub fn take(&mut self, ptr: u64) -> Option<Kind> {
        let kept = crate::fasthash::remove_if_any(&mut self.waiting, &ptr);
        match self.now {
            Some((p, k)) if p == ptr => {
                self.now = None;
                Some(k)
            }
            _ => kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_decided_at_the_free_is_taken_there_and_one_decided_earlier_waits() {
        let mut d = Decided::default();
        // Decided at the record that frees it.
        d.note(Some((0x10, Kind::Temporary)));
        assert_eq!(d.take(0x10), Some(Kind::Temporary));
        assert_eq!(d.take(0x10), None);
        // Decided as its free was asked for; freed three records on.
        d.note(Some((0x20, Kind::Activation)));
        d.note(None);
        d.note(Some((0x30, Kind::Gradient)));
        d.note(None);
        assert_eq!(d.take(0x30), Some(Kind::Gradient));
        assert_eq!(d.take(0x20), Some(Kind::Activation));
        assert_eq!(d.take(0x20), None);
    }

    #[test]
    fn a_kind_decided_again_for_an_address_is_the_latest() {
        let mut d = Decided::default();
        d.note(Some((0x10, Kind::Activation)));
        d.note(Some((0x10, Kind::Temporary)));
        assert_eq!(d.take(0x10), Some(Kind::Temporary));
        // The earlier decision went with it.
        d.note(None);
        assert_eq!(d.take(0x10), None);
    }
}

/// How many forwards, backward passes and optimizer steps began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StepsBegun {
    pub forwards: u64,
    pub backwards: u64,
    pub optimizer_steps: u64,
}

impl StepsBegun {
    /// The passes a what-if replays: the backward passes of a run that trains, else its
    /// forwards.
    pub fn passes(&self) -> u64 {
        if self.backwards > 0 {
            self.backwards
        } else {
            self.forwards
        }
    }

    /// Too few passes for a replay of them to stand for the run (`fit` and `simulate` warn).
    pub fn few(&self) -> bool {
        self.passes() < 3
    }
}

impl std::fmt::Display for StepsBegun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} forward(s), {} backward pass(es) and {} optimizer step(s)",
            self.forwards, self.backwards, self.optimizer_steps
        )
    }
}
