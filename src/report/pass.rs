//! The shape every tracker of the analysis's passes has: a record seen with its context (the
//! reader, the replay of live memory after it, the tensors' kinds and what they decided of
//! it: [`Seen`]), and what the trackers before it said of the moments they follow ([`Said`]),
//! through one method, [`Tracker::see`]. The passes (`analysis`) hand every record to each
//! tracker they run this way; what a tracker makes of its records at the end is its own.

use crate::report::kinds::{Kind, KindTracker};
use crate::report::live::{Change, Replay};
use crate::trace::format::Record;
use crate::trace::reader::TraceReader;

/// One record of a pass, as every tracker sees it. Every record builds one, so a tracker hands
/// a function kept apart (a slow road, not inlined) the parts it needs, never the `Seen`
/// itself: one whose address escapes is written to memory at every record (10% of `peak`'s
/// time on a loop's trace), where one that does not stays in registers.
pub struct Seen<'a> {
    /// The pass's reader (definitions so far, stacks, the trace's header).
    pub reader: &'a TraceReader,
    /// The replay of live memory, after it applied the record.
    pub rp: &'a Replay,
    /// The tensors' kinds, after they observed the record.
    pub kinds: &'a KindTracker,
    pub record: &'a Record,
    /// What the record changed in the replay.
    pub change: Change,
    /// A tensor's kind the record decided (its id and kind), if any.
    pub decided: Option<(u64, Kind)>,
    /// The kinds' run before the record (a new run began at it where they differ).
    pub run_before: u64,
}

/// A tracker of a pass: every record, in order, once.
pub trait Tracker {
    /// One record (`seen`); `said` holds what the trackers before this one said of their
    /// moments at this record, and takes what this one says.
    fn see(&mut self, seen: &Seen<'_>, said: &mut Vec<Said>);
}

/// Which moment a candidate is, and of which device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Slot {
    /// The device's peak of live memory (`peak`).
    Peak(u8),
    /// The device's peak before an allocation the framework's segment may yet claim.
    BeforeRaw(u8),
    /// The most bytes of the framework's tensors (`summary`).
    TensorPeak(u8),
    /// NVML's highest figure (`summary`).
    Nvml(u8),
    /// The program's last allocation with Python frames (`summary`).
    BeforeShutdown(u8),
    /// A moment wanted at a record known before the pass (a second pass's: the `n`-th wanted).
    Wanted(u8, u32),
}

impl Slot {
    pub fn device(self) -> u8 {
        match self {
            Slot::Peak(d)
            | Slot::BeforeRaw(d)
            | Slot::TensorPeak(d)
            | Slot::Nvml(d)
            | Slot::BeforeShutdown(d)
            | Slot::Wanted(d, _) => d,
        }
    }
}

/// What a tracker says of its moment as it reads, after the record that moved it.
#[derive(Clone, Copy, Debug)]
pub enum Said {
    /// The record just read is the slot's moment now.
    Here(Slot),
    /// Slot `from`'s candidate becomes slot `to`'s (`from` is left empty).
    Move { from: Slot, to: Slot },
    /// The slot has no candidate.
    Forget(Slot),
}
