//! Moments taken in the first pass, as the trackers find them, so that a command whose
//! moments are all taken there reads its trace once.
//!
//! A tracker says which record is its moment so far (a device's peak, its tensors' peak,
//! NVML's peak, the program's last allocation with Python frames) as it reads: each *slot*
//! holds one candidate. Taking a moment costs the device's live set, and a peak moves at every
//! allocation while memory climbs, so a candidate is taken lazily: while any candidate is in
//! its stack window, one replay of every device is kept from a record no later than it, with
//! the records read since (rolled forward past [`LOG_MIN`] of them); only when a candidate has
//! stood for its window is that replay rolled forward to it and the moment taken (candidates'
//! windows end in the order of their records, so the one replay serves them all), and once no
//! candidate waits the replay is let go, so a burst of proposals (a forward's allocations)
//! costs one copy of the live set. A moment is taken exactly as the second pass would take it
//! there ([`super::moments`]: the same window, its kinds settled by reading on with the same
//! tracker). What these copies cost is held to a budget of a few times the records read, so
//! no trace makes the first pass quadratic: a candidate the budget refuses is *missed*.
//!
//! The trackers still say at the end which moments they want; the analysis uses a moment taken
//! here only where its record and device are those wanted, and takes any other in a second
//! pass, by this same taker told their records beforehand ([`EarlyMoments::wanting`]: each a
//! candidate at its record, none refused by the budget). A candidate taken here is therefore a
//! saving, never a different answer.

use super::kinds::{Kind, KindTracker};
use super::live::Replay;
use super::moments::{Moment, STACK_WINDOW, Taking};
use super::pass::{Said, Seen, Slot, Tracker};
use crate::trace::format::Record;
use crate::trace::reader::{Counts, ReadCounts, TraceReader, TraceTables};
use std::collections::VecDeque;

/// Records the log holds before the kept replay is rolled forward to the earliest candidate
/// still in its window.
const LOG_MIN: usize = 1 << 14;

/// Work (live entries copied) allowed beyond this many per record read.
const BUDGET_PER_RECORD: u64 = 4;
/// Work allowed before any record is read (a model's parameters are many allocations).
const BUDGET_START: u64 = 1 << 22;

/// The program's last allocation with Python frames is proposed at every one of them (most of
/// a real model's allocations), and keeping a replay behind each until the next supersedes it
/// cost a third of `summary` on a real model's long trace (a log of nearly every record and a
/// copy of the live set every few hundred), though only the last is wanted. After a clean exit
/// the last lies at the trace's end (Python's shutdown follows it), so it is proposed only in
/// the trace's last sixteenth (at least this many records); one earlier (a program whose
/// Python code ended long before its process) is taken in a second pass, the same moment.
const SHUTDOWN_TAIL_MIN: u64 = 1 << 16;

/// The first record (the replay's index) of the trace `reader` reads at which the last
/// allocation with Python frames is proposed (see [`SHUTDOWN_TAIL_MIN`]): the summary says
/// none before it, which the moments would let go.
pub fn shutdown_from(reader: &TraceReader) -> u64 {
    let (first, end) = reader.progress();
    let records = end.saturating_sub(first);
    let tail = (records / 16).max(SHUTDOWN_TAIL_MIN);
    records.saturating_sub(tail)
}

/// One slot's candidate.
struct Candidate {
    /// The record proposed.
    at: u64,
    /// Once the window after `at` is read: the moment being taken.
    /// Boxed: a candidate moves at every record that proposes one (the last allocation with
    /// Python frames is every one of them), and a moment being taken holds a whole replay.
    taking: Option<Box<Taking>>,
    /// The budget refused it: it is taken in a second pass, if wanted.
    missed: bool,
}

impl Candidate {
    fn missed(at: u64) -> Candidate {
        Candidate {
            at,
            taking: None,
            missed: true,
        }
    }
}

/// The first pass's candidates.
pub struct EarlyMoments {
    /// A few per device: looked up by a scan.
    slots: Vec<(Slot, Candidate)>,
    /// A replay of every device at an earlier record (at most every waiting candidate's), and
    /// each record read since with what the kinds decided of it.
    base: Option<Replay>,
    log: VecDeque<(Record, Option<(u64, Kind)>)>,
    read: u64,
    spent: u64,
    /// Whether a moment being taken still reads on (its window or its kinds), and the record
    /// at which the earliest candidate waiting has stood for its window (`u64::MAX`: none):
    /// a record that is neither looks at no slot (a process on 8 devices has dozens, and a
    /// record visiting them all would cost each record that much).
    stepping: bool,
    due: u64,
    /// Whether a moment being taken still reads its stack window: one only settling its kinds
    /// has nothing to do at a record the kinds decided nothing of and that began no new run
    /// (most records; a moment whose tensors never all settle read every one to the end).
    windowing: bool,
    /// The addresses the moments settling their kinds wait on (sorted; a superset: one let
    /// go stays until the next run begins): a tensor's free settles a moment's kind only if
    /// the moment waits on it, and a moment holding a cuBLAS workspace waits on it to the end
    /// of the trace, so a free of any other tensor looks at no slot (a real model's moments
    /// looked at every free, two fifths of its records, a sixth of `summary`'s time).
    awaited: Vec<u64>,
    /// Records at which the slots were looked at (added to the command's counts once, at the
    /// end: a count shared by the groups' threads at every look would bounce between their
    /// cores).
    visited: u64,
    /// The first record at which the last allocation with Python frames is taken here (see
    /// [`SHUTDOWN_TAIL_MIN`]).
    shutdown_from: u64,
    /// The short road taken (`ReadMode::short_roads`).
    short: bool,
    /// What the command's reading cost: the moments taken and when, the replay's copies
    /// (`GPUSHIM_READS=1` says them, so that the tests see *when* a moment was taken, not
    /// only that it was right, and the copies bounded by their budget).
    counts: Counts,
    /// Moments wanted at records known before the pass (a second pass's), latest first, and
    /// the record of the next (`u64::MAX`: none). Such a pass takes every one, whatever the
    /// budget, and its moments are not counted as the first pass's.
    wanted: Vec<(u64, u8)>,
    next_wanted: u64,
    first_pass: bool,
}

impl EarlyMoments {
    /// The first pass's candidates for the records `reader` is to read.
    pub fn new(reader: &TraceReader) -> EarlyMoments {
        EarlyMoments {
            slots: Vec::new(),
            base: None,
            log: VecDeque::new(),
            read: 0,
            spent: 0,
            stepping: false,
            due: u64::MAX,
            windowing: false,
            awaited: Vec::new(),
            visited: 0,
            shutdown_from: shutdown_from(reader),
            short: reader.mode().short_roads,
            counts: reader.mode().counts.clone(),
            wanted: Vec::new(),
            next_wanted: u64::MAX,
            first_pass: true,
        }
    }

    /// A pass's moments at records known before it (`wanted`: the record, counted from 1 as
    /// [`Replay::index`], and the device), each taken as a first pass takes a candidate at its
    /// record, none missed.
    pub fn wanting(reader: &TraceReader, wanted: &[(u64, u8)]) -> EarlyMoments {
        let mut m = EarlyMoments::new(reader);
        m.wanted = wanted.to_vec();
        m.wanted.sort_unstable_by(|a, b| b.cmp(a));
        m.wanted.dedup();
        m.next_wanted = m.wanted.last().map_or(u64::MAX, |w| w.0);
        m.first_pass = false;
        m
    }

    /// Whether every moment wanted is taken and settled: a pass only for them may stop.
    pub fn done(&self) -> bool {
        self.next_wanted == u64::MAX
            && self
                .slots
                .iter()
                .all(|(_, c)| c.missed || c.taking.as_ref().is_some_and(|t| t.settled()))
    }

    /// The moments wanted at the record just read, said as a tracker says its candidate.
    fn propose_wanted(&mut self, said: &mut Vec<Said>) {
        while let Some(&(at, device)) = self.wanted.last()
            && at == self.read
        {
            self.wanted.pop();
            let n = u32::try_from(self.wanted.len()).unwrap_or(u32::MAX);
            said.push(Said::Here(Slot::Wanted(device, n)));
        }
        self.next_wanted = self.wanted.last().map_or(u64::MAX, |w| w.0);
    }

    /// Whether the budget allows `work` more.
    fn afford(&mut self, work: u64) -> bool {
        if !self.first_pass {
            return true;
        }
        let allowed = BUDGET_START.saturating_add(self.read.saturating_mul(BUDGET_PER_RECORD));
        let after = self.spent.saturating_add(work);
        if after > allowed {
            return false;
        }
        self.spent = after;
        true
    }

    /// [`EarlyMoments::see`], at a record where a tracker said something of its moments, a
    /// candidate waits, or a moment is due or being taken.
    #[inline(never)]
    fn see_any(
        &mut self,
        (reader, rp, kinds, r): (&TraceReader, &Replay, &KindTracker, &Record),
        (decided, run_before): (Option<(u64, Kind)>, u64),
        said: &mut Vec<Said>,
    ) {
        if self.base.is_some() {
            self.log.push_back((*r, decided));
        }
        if !said.is_empty() && self.read < self.shutdown_from {
            // Not taken here (see [`SHUTDOWN_TAIL_MIN`]): no candidate of the slot to replace.
            said.retain(|s| !matches!(s, Said::Here(Slot::BeforeShutdown(_))));
        }
        let mut changed = !said.is_empty();
        // A moment only settling its kinds has nothing to do at a record that decided nothing
        // and began no new run.
        if self.read == self.due
            || (self.stepping && self.moves_a_moment(kinds, decided, run_before))
        {
            changed |= self.visit(reader, kinds, r, decided, run_before);
        }
        for s in said.drain(..) {
            match s {
                Said::Here(slot) => self.here(slot, rp),
                Said::Move { from, to } => {
                    let c = self.remove(from);
                    self.remove(to);
                    if let Some(c) = c {
                        self.slots.push((to, c));
                    }
                }
                Said::Forget(slot) => {
                    self.remove(slot);
                }
            }
        }
        if changed {
            self.refresh();
        }
        if self.base.is_none() {
            return;
        }
        // The earliest candidate waiting stood for its window at `due`.
        let waiting =
            (self.due != u64::MAX).then(|| self.due.saturating_sub(u64::from(STACK_WINDOW)));
        match waiting {
            // Every moment is taken (or cannot be): the replay is let go until another comes.
            // The log keeps its room (some `LOG_MIN` records at most): made
            // anew, it grew again by doubling each time, the copies a tenth of a real trace's
            // first pass.
            None => {
                self.base = None;
                self.log.clear();
            }
            // The log holds no more than the records since the earliest waiting candidate
            // (fewer than its window) and a bounded batch before it.
            Some(at) if self.log.len() > LOG_MIN => self.roll_to(at),
            Some(_) => {}
        }
    }

    /// Whether the record just read can move a moment being taken: one still reading its stack
    /// window reads every record; past it, its kinds settle only as a run begins or a tensor it
    /// waits on is freed.
    #[inline]
    fn moves_a_moment(
        &self,
        kinds: &KindTracker,
        decided: Option<(u64, Kind)>,
        run_before: u64,
    ) -> bool {
        self.windowing
            || kinds.run() != run_before
            || decided.is_some_and(|(ptr, _)| self.awaited.binary_search(&ptr).is_ok())
    }

    /// The addresses every moment settling its kinds waits on, found again (see `awaited`).
    fn find_awaited(&mut self) {
        self.awaited.clear();
        for (_, c) in &self.slots {
            if let Some(t) = &c.taking {
                self.awaited.extend(t.awaiting());
            }
        }
        self.awaited.sort_unstable();
        self.awaited.dedup();
    }

    /// Each slot at the record just read: a moment being taken reads it, a candidate that has
    /// stood for its window is taken. Whether a slot changed (a candidate taken, or a moment
    /// settled).
    fn visit(
        &mut self,
        tables: &TraceTables,
        kinds: &KindTracker,
        r: &Record,
        decided: Option<(u64, Kind)>,
        run_before: u64,
    ) -> bool {
        self.visited += 1;
        let mut changed = false;
        // A moment that begins to settle its kinds waits on more addresses; a new run lets
        // some go.
        let mut awaits_other = kinds.run() != run_before;
        for i in 0..self.slots.len() {
            let (slot, c) = &mut self.slots[i];
            if let Some(t) = &mut c.taking {
                if !t.settled() {
                    let window = t.in_window();
                    t.step(tables, kinds, r, decided, run_before);
                    awaits_other |= window != t.in_window();
                    changed |= t.settled() || window != t.in_window();
                }
            } else if !c.missed && self.read == c.at + u64::from(STACK_WINDOW) {
                let (slot, mut c) = (*slot, std::mem::replace(c, Candidate::missed(0)));
                self.take(slot, &mut c, tables, kinds, run_before);
                if c.taking.is_some() {
                    if self.first_pass {
                        ReadCounts::add(&self.counts.moments_reading, 1);
                    }
                    awaits_other = true;
                }
                self.slots[i].1 = c;
                changed = true;
            }
        }
        if awaits_other {
            self.find_awaited();
        }
        changed
    }

    /// What the next records must do with the slots (see `stepping` and `due`).
    fn refresh(&mut self) {
        let slots = self.slots.iter().map(|(_, c)| c);
        self.stepping = slots
            .clone()
            .any(|c| c.taking.as_ref().is_some_and(|t| !t.settled()));
        self.windowing = slots
            .clone()
            .any(|c| c.taking.as_ref().is_some_and(|t| t.in_window()));
        self.due = slots
            .filter(|c| c.taking.is_none() && !c.missed)
            .map(|c| c.at.saturating_add(u64::from(STACK_WINDOW)))
            .min()
            .unwrap_or(u64::MAX);
    }

    /// The kept replay rolled forward to record `at` (no further than the log reaches).
    fn roll_to(&mut self, at: u64) {
        let Some(base) = &mut self.base else {
            return;
        };
        while base.index < at {
            let Some((r, _)) = self.log.pop_front() else {
                break;
            };
            base.apply(&r);
        }
    }

    /// The end of candidate `c`'s window: the replay rolled forward to its record, its moment
    /// taken there, and the window's records read through the taking (the last starts the
    /// settling of its kinds, as the second pass would at the same record).
    fn take(
        &mut self,
        slot: Slot,
        c: &mut Candidate,
        tables: &TraceTables,
        kinds: &KindTracker,
        run: u64,
    ) {
        let live = self.base.as_ref().map_or(0, |b| b.live.len()) as u64;
        if self.base.is_none() || !self.afford(live.saturating_add(self.log.len() as u64)) {
            c.missed = true;
            return;
        }
        self.roll_to(c.at);
        let Some(base) = &self.base else {
            return;
        };
        if base.index != c.at {
            c.missed = true;
            return;
        }
        let mut t = Taking::new(base, slot.device());
        for (r, decided) in &self.log {
            t.step(tables, kinds, r, *decided, run);
        }
        c.taking = Some(Box::new(t));
    }

    /// The record just read (`rp` after it) is the slot's moment now.
    fn here(&mut self, slot: Slot, rp: &Replay) {
        let at = rp.index;
        self.remove(slot);
        // What a copy costs, in live entries (the tables by thread included).
        let live = rp.copy_cost();
        // The kept replay behind by at least half as many records as it holds entries, and no
        // other candidate waiting on it: a copy of the replay here costs less than rolling it
        // forward (an entry copied costs a fraction of a record applied), and the log starts
        // over. The program's last allocation with Python frames is proposed at every
        // allocation: rolled forward, the kept replay applied nearly every record a second time.
        let others_wait = self
            .slots
            .iter()
            .any(|(_, c)| c.taking.is_none() && !c.missed);
        let renew = self.base.is_some()
            && !others_wait
            && (self.log.len() as u64).saturating_mul(2) >= live;
        if (self.base.is_none() || renew) && self.afford(live) {
            let mut b = rp.for_devices(|_| true);
            b.pinned.by_address = rp.pinned.by_address.clone();
            if self.first_pass {
                ReadCounts::add(&self.counts.replay_copies, 1);
                ReadCounts::add(&self.counts.replay_copied, live);
            }
            self.base = Some(b);
            self.log.clear();
        }
        let missed = self.base.is_none();
        self.slots.push((
            slot,
            Candidate {
                at,
                taking: None,
                missed,
            },
        ));
    }

    /// The slot's candidate, taken out.
    fn remove(&mut self, slot: Slot) -> Option<Candidate> {
        let i = self.slots.iter().position(|(s, _)| *s == slot)?;
        Some(self.slots.swap_remove(i).1)
    }

    /// The moments taken (those whose window the trace cut short taken from what was read),
    /// each once: the slots' candidates, but those missed.
    pub fn finish(mut self, tables: &TraceTables, kinds: &KindTracker) -> Vec<Moment> {
        if self.first_pass {
            ReadCounts::add(&self.counts.moments_visited, self.visited);
        }
        let mut out: Vec<Moment> = Vec::new();
        let mut waiting = std::mem::take(&mut self.slots);
        waiting.sort_by_key(|(_, c)| c.at);
        for (slot, mut c) in waiting {
            if c.taking.is_none() && !c.missed {
                self.take(slot, &mut c, tables, kinds, kinds.run());
                if c.taking.is_some() && self.first_pass {
                    ReadCounts::add(&self.counts.moments_at_end, 1);
                }
            }
            let Some(t) = c.taking.map(|t| *t) else {
                continue;
            };
            let m = t.finish(tables, kinds);
            if super::moments::of(&out, m.index, m.device).is_none() {
                out.push(m);
            }
        }
        out
    }
}

impl Tracker for EarlyMoments {
    /// One record of the first pass, after the replay applied it, the kinds observed it
    /// (`decided`, with `run_before` their run before it) and every tracker read it, saying
    /// `said` of their moments (emptied here).
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, said: &mut Vec<Said>) {
        let (kinds, decided, run_before) = (seen.kinds, seen.decided, seen.run_before);
        self.read = seen.rp.index;
        if self.read == self.next_wanted {
            self.propose_wanted(said);
        }
        // Most records: nothing said, no candidate waiting, no moment due, and none being taken
        // that this record can move (past its window, a moment's kinds move only at a new run
        // or a free of a tensor it waits on).
        if self.short
            && said.is_empty()
            && self.base.is_none()
            && self.read != self.due
            && (!self.stepping || !self.moves_a_moment(kinds, decided, run_before))
        {
            return;
        }
        // The slow road takes the parts, not the pass's `Seen` (see `Seen`).
        let parts = (seen.reader, seen.rp, seen.kinds, seen.record);
        self.see_any(parts, (decided, run_before), said);
    }
}
