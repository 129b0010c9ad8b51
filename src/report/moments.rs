//! Moments: what one device held at chosen records (its peak, its tensors' peak, NVML's peak),
//! with the kind of each tensor then, taken during a pass that reads on without stopping.
//!
//! A moment is the state after its record, plus the call stacks of the records just after it
//! (a stack is written just after its allocation; other threads may come between), as
//! [`crate::report::live::replay_until`] makes it; the kinds of its tensors are settled by
//! reading on, as [`Kinds::settle`] does, from the same records the pass reads for everything
//! else. Many moments cost one pass; each keeps its own device's live set only.

use super::kinds::{Kind, Kinds, Settling};
use super::live::Replay;
use crate::fasthash::FastMap;
use crate::trace::format::{Api, Record, RecordKind};
use crate::trace::reader::TraceReader;
use std::collections::BTreeMap;

/// Records read after a moment for the call stacks of its last allocations.
const STACK_WINDOW: u32 = 64;

/// A device at one record: the replay then (its allocations only) and its tensors' kinds.
pub struct Moment {
    pub index: u64,
    pub device: u8,
    pub replay: Replay,
    pub kinds: FastMap<u64, Kind>,
}

/// A moment being taken: still reading its stack window, then settling its kinds.
struct Taking {
    moment: Moment,
    window_left: u32,
    /// The first kind decided at each address in the window.
    freed: FastMap<u64, Kind>,
    settling: Option<Settling>,
}

/// The moments a pass is to take, and those taken.
#[derive(Default)]
pub struct Moments {
    wanted: BTreeMap<u64, Vec<u8>>,
    taking: Vec<Taking>,
    taken: Vec<Moment>,
}

impl Moments {
    /// Take device `device` after record `index` (counted from 1, as [`Replay::index`]).
    pub fn want(&mut self, index: u64, device: u8) {
        let at = self.wanted.entry(index).or_default();
        if !at.contains(&device) {
            at.push(device);
        }
    }

    /// Whether any moment is wanted.
    pub fn is_empty(&self) -> bool {
        self.wanted.is_empty() && self.taking.is_empty() && self.taken.is_empty()
    }

    /// Whether every wanted moment is taken and settled: a pass only for them may stop.
    pub fn done(&self) -> bool {
        self.wanted.is_empty() && self.taking.is_empty()
    }

    /// One record of the pass, after `rp` applied it and `kinds` observed it (`decided` is
    /// what the kinds said of it; `run_before` their run before it).
    pub fn see(
        &mut self,
        reader: &TraceReader,
        rp: &Replay,
        kinds: &Kinds,
        r: &Record,
        decided: Option<(u64, Kind)>,
        run_before: u64,
    ) {
        for t in &mut self.taking {
            match &mut t.settling {
                None => {
                    if r.kind == RecordKind::StackRef {
                        let index = t.moment.replay.index;
                        t.moment.replay.apply(r);
                        t.moment.replay.index = index;
                    }
                    if let Some((ptr, k)) = decided {
                        t.freed.entry(ptr).or_insert(k);
                    }
                    t.window_left -= 1;
                    if t.window_left == 0 {
                        t.settling = Some(start(reader, kinds, &t.moment, &t.freed));
                        t.freed = FastMap::default();
                    }
                }
                Some(s) => kinds.settle_on(s, decided, run_before),
            }
        }
        let mut i = 0;
        while i < self.taking.len() {
            if self.taking[i]
                .settling
                .as_ref()
                .is_some_and(|s| s.open.is_empty())
            {
                let t = self.taking.swap_remove(i);
                self.taken.push(finish(reader, kinds, t));
            } else {
                i += 1;
            }
        }
        if let Some(devices) = self.wanted.remove(&rp.index) {
            for device in devices {
                self.taking.push(Taking {
                    moment: Moment {
                        index: rp.index,
                        device,
                        replay: rp.for_device(device),
                        kinds: FastMap::default(),
                    },
                    window_left: STACK_WINDOW,
                    freed: FastMap::default(),
                    settling: None,
                });
            }
        }
    }

    /// The moments taken, once the pass has read what it reads: those still settling take what
    /// the records so far say. Moments past the records read are not taken.
    pub fn finish(mut self, reader: &TraceReader, kinds: &Kinds) -> Vec<Moment> {
        for mut t in std::mem::take(&mut self.taking) {
            if t.settling.is_none() {
                t.settling = Some(start(reader, kinds, &t.moment, &t.freed));
            }
            self.taken.push(finish(reader, kinds, t));
        }
        self.taken
    }
}

/// The tensors of a moment, once its stack window is read: those known, and those to settle.
fn start(reader: &TraceReader, kinds: &Kinds, m: &Moment, freed: &FastMap<u64, Kind>) -> Settling {
    let tensors = m
        .replay
        .live
        .iter()
        .filter(|(_, l)| l.api == Api::Torch as u8)
        .map(|(&p, l)| (p, l.stack));
    kinds.settling(reader, tensors, freed)
}

fn finish(reader: &TraceReader, kinds: &Kinds, mut t: Taking) -> Moment {
    if let Some(s) = t.settling.take() {
        t.moment.kinds = kinds.settled(reader, s);
    }
    t.moment
}

/// The moment of `device` after record `index`, if taken.
pub fn of(moments: &[Moment], index: u64, device: u8) -> Option<&Moment> {
    moments
        .iter()
        .find(|m| m.index == index && m.device == device)
}
