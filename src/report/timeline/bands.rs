//! The picture's bands: every allocation's life, `[made, freed)` in changes, added to the
//! columns whose moment falls inside it, under its kind and line. A column's moments rise with
//! the columns, so a life covers a run of them: one addition where it begins and one
//! subtraction where it ends (a difference array per kind and line), summed once at the end
//! ([`super::lanes`]).
//!
//! One tracker, [`Bands`], in either pass. In the second, the columns are known
//! ([`Bands::over`]): each life is added as it ends. In the first ([`Bands::following`]) they
//! are being found as the records come: a column before the last is closed, its moment final
//! but for the merging of columns two by two, which keeps one of each pair's moments, so a
//! pair's additions keep the kept one's. The last column is open, its moment still rising: the
//! lives that ended after its moment and began before it are gathered apart, and let go when
//! the moment moves (they ended before the new one); when a column begins, the open one's
//! gathering joins its additions. So each column ends with exactly the lives whose span holds
//! its final moment, as the second pass adds them. Past [`MAX_KEYS`] kinds and lines on a lane
//! the second pass lumps new lines in the order of its own additions; there the first pass
//! gives up, and the second pass takes the bands.

use super::columns::{Found, LaneFound, changed};
use super::lanes::{Adds, lanes_of};
use super::{Lane, NOT_A_TENSOR};
use crate::fasthash::FastMap;
use crate::report::kinds::{Decided, Kind, KindTracker};
use crate::report::live::{Change, Live, Replay, site_key};
use crate::report::pass::{Said, Seen, Tracker};
use crate::trace::by_device::ByDevice;
use crate::trace::format::{Api, Record};
use crate::trace::reader::TraceTables;
use std::collections::BTreeMap;

/// Distinct (kind, line) pairs followed per lane; past it, a kind's new lines are summed as
/// one (a hostile or enormous trace costs no more than this).
pub(super) const MAX_KEYS: usize = 8192;

/// A line: its slot (the kind, or not a tensor) and its call site.
type Key = (u8, u64);

/// One lane's additions so far.
#[derive(Default)]
struct LaneBands {
    /// By (slot, site): a difference array over the columns (grown as they come).
    diffs: FastMap<Key, Vec<i64>>,
    /// The open column's moment when `open` began to be gathered, and what it gathered (the
    /// first pass only).
    open_best: u64,
    open: FastMap<Key, u64>,
    /// Changes so far.
    changes: u64,
}

impl LaneBands {
    /// `bytes` of `key` added to columns `a..b`; past [`MAX_KEYS`] lines a new one lumped with
    /// its kind's others where `lump`.
    fn add(&mut self, key: Key, bytes: u64, a: usize, b: usize, lump: bool) {
        if a >= b {
            return;
        }
        let key = if lump && self.diffs.len() >= MAX_KEYS && !self.diffs.contains_key(&key) {
            (key.0, 0)
        } else {
            key
        };
        let d = self.diffs.entry(key).or_default();
        if d.len() < b + 1 {
            d.resize(b + 1, 0);
        }
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        d[a] = d[a].saturating_add(bytes);
        d[b] = d[b].saturating_sub(bytes);
    }

    /// The open column's gathering joined to column `i`'s additions.
    fn close(&mut self, i: usize) {
        for (key, bytes) in std::mem::take(&mut self.open) {
            self.add(key, bytes, i, i + 1, false);
        }
    }

    /// The columns merged two by two, `second[j]` saying which of pair `j` was kept.
    fn merge(&mut self, second: &[bool]) {
        for d in self.diffs.values_mut() {
            let mut run = 0i64;
            let values: Vec<i64> = d
                .iter()
                .map(|&x| {
                    run = run.saturating_add(x);
                    run
                })
                .collect();
            let at = |i: usize| values.get(i).copied().unwrap_or(0);
            let mut prev = 0i64;
            let mut merged: Vec<i64> = Vec::with_capacity(second.len() + 1);
            for (j, &s) in second.iter().enumerate() {
                let v = at(2 * j + usize::from(s));
                merged.push(v.saturating_sub(prev));
                prev = v;
            }
            merged.push(0i64.saturating_sub(prev));
            *d = merged;
        }
    }
}

/// Each live allocation's first change on its lane's axis, and the kind decided for it by the
/// record asking for its free.
#[derive(Default)]
pub(super) struct Lives {
    /// By the replay's place of each live allocation (`LiveSet::last_put`): its first change,
    /// plus one (0: not made on the axis). A vector, not a map by address: every allocation
    /// and free of the trace comes here.
    made: Vec<u64>,
    /// The kinds decided for tensors not yet freed.
    decided: Decided,
}

impl Lives {
    /// What the kinds decided at the record being read.
    pub(super) fn decided(&mut self, decided: Option<(u64, Kind)>) {
        self.decided.note(decided);
    }

    /// `ptr` made (at `place`) after `now` changes of its lane; one the axis does not count
    /// (`counted` false) is live from the next change on.
    pub(super) fn made(&mut self, ptr: u64, place: u32, now: u64, counted: bool) {
        let i = place as usize;
        if self.made.len() <= i {
            self.made.resize(i + 1, 0);
        }
        self.made[i] = (if counted { now } else { now + 1 }).saturating_add(1);
        self.decided.take(ptr);
    }

    /// `ptr` freed (from `place`): its first change and its kind, if it was made on the axis.
    pub(super) fn freed(&mut self, ptr: u64, place: u32) -> Option<(u64, Kind)> {
        let kind = self.decided.take(ptr).unwrap_or(Kind::Unknown);
        let made = self.made.get_mut(place as usize).map_or(0, std::mem::take);
        made.checked_sub(1).map(|from| (from, kind))
    }

    /// The first change of the allocation live at `place`.
    pub(super) fn first_change(&self, place: u32) -> Option<u64> {
        self.made.get(place as usize)?.checked_sub(1)
    }
}

/// The bands, per device, and each live allocation's first change and kind.
#[derive(Default)]
pub struct Bands<'a> {
    /// The columns where they are known (the second pass); none while they are being found.
    over: Option<&'a Found>,
    lanes: ByDevice<LaneBands>,
    lives: Lives,
    /// Too many kinds and lines for the first pass: the second takes the bands.
    pub given_up: bool,
}

impl Bands<'static> {
    /// The first pass's, beside the columns being found.
    pub fn following() -> Bands<'static> {
        Bands::default()
    }
}

impl<'a> Bands<'a> {
    /// The second pass's, over the columns the first found.
    pub fn over(found: &'a Found) -> Bands<'a> {
        let mut lanes = ByDevice::default();
        for (d, _) in found.lanes.iter() {
            lanes.or_default(d);
        }
        Bands {
            over: Some(found),
            lanes,
            lives: Lives::default(),
            given_up: false,
        }
    }

    /// One record, after `rp` applied it (making change `c`), the kinds observed it (deciding
    /// `decided`) and the columns (`cols`, as far as they are found) took it.
    pub(super) fn see_parts(
        &mut self,
        cols: &ByDevice<LaneFound>,
        rp: &Replay,
        r: &Record,
        c: Change,
        decided: Option<(u64, Kind)>,
    ) {
        if self.given_up {
            return;
        }
        let following = self.over.is_none();
        self.lives.decided(decided);
        let counted = changed(rp, r, c);
        if let Some(d) = counted
            && let Some(f) = cols.get(d)
        {
            let b = self.lanes.or_default(d);
            b.changes += 1;
            if following {
                follow(b, f);
            }
        }
        match c {
            Change::Alloc { ptr, device } => {
                let now = self.lanes.get(device).map_or(0, |b| b.changes);
                self.lives
                    .made(ptr, rp.live.last_put(), now, counted.is_some());
            }
            Change::Free { ptr } => {
                let live = &rp.freed;
                if let (Some((from, kind)), Some(b), Some(f)) = (
                    self.lives.freed(ptr, rp.live.last_taken()),
                    self.lanes.get_mut(live.device),
                    cols.get(live.device),
                ) {
                    let key = (slot_of(live, kind) as u8, site_key(live));
                    let to = b.changes;
                    // The closed columns whose moments the life spans (every column in the
                    // second pass), and the open one's.
                    let open = usize::from(following);
                    let closed = &f.cols[..f.cols.len().saturating_sub(open)];
                    // Most lives begin after the last closed column's moment: none of those.
                    if closed.last().is_some_and(|c| c.best >= from) {
                        let a = closed.partition_point(|c| c.best < from);
                        let e = closed.partition_point(|c| c.best < to);
                        b.add(key, live.size, a, e, !following);
                    }
                    if following && from <= b.open_best && b.open_best < to {
                        let o = b.open.entry(key).or_default();
                        *o = o.saturating_add(live.size);
                    }
                    if following && b.diffs.len() + b.open.len() >= MAX_KEYS {
                        self.give_up();
                    }
                }
            }
            _ => {}
        }
    }

    fn give_up(&mut self) {
        *self = Bands {
            given_up: true,
            ..Bands::default()
        };
    }

    /// The lanes, once a pass read the whole trace (`found` the columns, `rp` and `kinds` as
    /// the pass left them); the lines of `keep` drawn on their own however little they hold.
    pub fn finish(
        mut self,
        found: &Found,
        tables: &TraceTables,
        rp: &Replay,
        kinds: &KindTracker,
        keep: &[&str],
    ) -> Vec<Lane> {
        let lump = self.over.is_some();
        for (d, b) in self.lanes.iter_mut() {
            if let Some(f) = found.lanes.get(d) {
                b.close(f.cols.len().saturating_sub(1));
            }
        }
        // What is live at the end stays to the last column.
        for (place, ptr, l) in rp.live.iter_placed() {
            let Some(from) = self.lives.first_change(place) else {
                continue;
            };
            if let (Some(b), Some(f)) = (self.lanes.get_mut(l.device), found.lanes.get(l.device)) {
                let kind = kinds.lasting(tables, *ptr, l.stack);
                let a = f.cols.partition_point(|c| c.best < from);
                let key = (slot_of(l, kind) as u8, site_key(l));
                b.add(key, l.size, a, f.cols.len(), lump);
            }
        }
        let mut adds = BTreeMap::new();
        for (d, f) in found.lanes.iter() {
            let b = self.lanes.remove(d).unwrap_or_default();
            let n = f.cols.len();
            let diffs = b
                .diffs
                .into_iter()
                .filter_map(|(key, mut diff)| {
                    diff.resize(n + 1, 0);
                    // A line whose additions all went to columns a merge let go: none.
                    let mut run = 0i64;
                    let held = diff[..n].iter().any(|&x| {
                        run = run.saturating_add(x);
                        run != 0
                    });
                    held.then_some((key, diff))
                })
                .collect();
            adds.insert(d, Adds { found: f, diffs });
        }
        lanes_of(found, adds, tables, keep)
    }
}

/// The slot of an allocation in the difference arrays: its kind, or not a tensor.
pub(super) fn slot_of(l: &Live, kind: Kind) -> usize {
    if l.api == Api::Torch as u8 {
        kind as usize
    } else {
        NOT_A_TENSOR
    }
}

/// A lane's additions after a change the columns took: the open column's gathering joined to
/// it where a column began (before the columns were merged, if they were), and let go where
/// the open column's moment moved.
fn follow(b: &mut LaneBands, f: &LaneFound) {
    if f.began {
        let n = f.cols.len();
        if !f.merged.is_empty() {
            // Before the merge the open column was the last of twice as many.
            b.close((2 * f.merged.len()).saturating_sub(1));
            b.merge(&f.merged);
        } else if n >= 2 {
            b.close(n - 2);
        }
        b.open.clear();
    }
    if let Some(last) = f.cols.last()
        && last.best != b.open_best
    {
        b.open.clear();
        b.open_best = last.best;
    }
}

impl Tracker for Bands<'_> {
    /// One record of the second pass (the first pass's are seen with the columns, by
    /// [`super::PicturePass`]).
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, _said: &mut Vec<Said>) {
        if let Some(found) = self.over {
            self.see_parts(
                &found.lanes,
                seen.rp,
                seen.record,
                seen.change,
                seen.decided,
            );
        }
    }
}
