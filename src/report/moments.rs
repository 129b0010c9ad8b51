//! Moments: what one device held at chosen records (its peak, its tensors' peak, NVML's peak),
//! with the kind of each tensor then, taken during a pass that reads on without stopping (by
//! [`super::early::EarlyMoments`], in either pass).
//!
//! A moment is the state after its record, plus the call stacks of the records just after it
//! (a stack is written just after its allocation; other threads may come between), as
//! [`crate::report::live::replay_until`] makes it; the kinds of its tensors are settled by
//! reading on, as [`KindTracker::settle`] does, from the same records the pass reads for everything
//! else. Many moments cost one pass; each keeps its own device's live set only.

use super::kinds::{Kind, KindTracker, Settling};
use super::live::Replay;
use crate::fasthash::FastMap;
use crate::trace::format::{Api, Record, RecordKind};
use crate::trace::reader::TraceTables;

/// Records read after a moment for the call stacks of its last allocations.
pub(super) const STACK_WINDOW: u32 = 64;

/// A device at one record: the replay then (its allocations only) and its tensors' kinds.
pub struct Moment {
    pub index: u64,
    pub device: u8,
    pub replay: Replay,
    pub kinds: FastMap<u64, Kind>,
}

/// A moment being taken: still reading its stack window, then settling its kinds.
pub(super) struct Taking {
    moment: Moment,
    window_left: u32,
    /// The first kind decided at each address in the window.
    freed: FastMap<u64, Kind>,
    settling: Option<Settling>,
}

impl Taking {
    /// A moment to take after record `at` of `replay` (a replay of every device then).
    pub(super) fn new(replay: &Replay, device: u8) -> Taking {
        Taking {
            moment: Moment {
                index: replay.index,
                device,
                replay: replay.for_device(device),
                kinds: FastMap::default(),
            },
            window_left: STACK_WINDOW,
            freed: FastMap::default(),
            settling: None,
        }
    }

    /// One record read after the moment: in its stack window, a stack applied and the first
    /// kind decided at each address kept; then, its kinds settled on.
    pub(super) fn step(
        &mut self,
        tables: &TraceTables,
        kinds: &KindTracker,
        r: &Record,
        decided: Option<(u64, Kind)>,
        run_before: u64,
    ) {
        match &mut self.settling {
            None => {
                if r.kind == RecordKind::StackRef {
                    let index = self.moment.replay.index;
                    self.moment.replay.apply(r);
                    self.moment.replay.index = index;
                }
                if let Some((ptr, k)) = decided {
                    self.freed.entry(ptr).or_insert(k);
                }
                self.window_left -= 1;
                if self.window_left == 0 {
                    self.settling = Some(start(tables, kinds, &self.moment, &self.freed));
                    self.freed = FastMap::default();
                }
            }
            Some(s) => kinds.settle_on(s, decided, run_before),
        }
    }

    /// Whether it still reads its stack window (its kinds not yet being settled).
    pub(super) fn in_window(&self) -> bool {
        self.settling.is_none()
    }

    /// The addresses whose free may settle a kind still open (none while in its window).
    pub(super) fn awaiting(&self) -> impl Iterator<Item = u64> + '_ {
        self.settling.iter().flat_map(|s| s.open.keys().copied())
    }

    /// Whether every tensor's kind is known.
    pub(super) fn settled(&self) -> bool {
        self.settling.as_ref().is_some_and(|s| s.open.is_empty())
    }

    /// The moment, once the pass has read what it reads: still in its window, its kinds are
    /// settled from what the records so far say.
    pub(super) fn finish(mut self, tables: &TraceTables, kinds: &KindTracker) -> Moment {
        if self.settling.is_none() {
            self.settling = Some(start(tables, kinds, &self.moment, &self.freed));
        }
        finish(tables, kinds, self)
    }
}

/// The tensors of a moment, once its stack window is read: those known, and those to settle.
fn start(
    tables: &TraceTables,
    kinds: &KindTracker,
    m: &Moment,
    freed: &FastMap<u64, Kind>,
) -> Settling {
    let tensors = m
        .replay
        .live
        .iter()
        .filter(|(_, l)| l.api == Api::Torch as u8)
        .map(|(&p, l)| (p, l.stack));
    kinds.settling(tables, tensors, freed)
}

fn finish(tables: &TraceTables, kinds: &KindTracker, mut t: Taking) -> Moment {
    if let Some(s) = t.settling.take() {
        t.moment.kinds = kinds.settled(tables, s);
    }
    t.moment
}

/// The moment of `device` after record `index`, if taken.
pub fn of(moments: &[Moment], index: u64, device: u8) -> Option<&Moment> {
    moments
        .iter()
        .find(|m| m.index == index && m.device == device)
}
