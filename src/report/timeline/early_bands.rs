//! The bands taken in the first pass, beside the columns: what the second pass ([`super::bands`])
//! adds at each allocation's end (its life `[made, freed)` to every column whose moment falls in
//! it, under its kind and line), done as the columns are found.
//!
//! A column before the last is closed: its moment is final but for the merging of columns two by
//! two, which keeps one of each pair's moments, so a pair's additions keep the kept one's. The
//! last column is open, its moment still rising: the lives that ended after its moment and
//! began before it are gathered apart, and let go when the moment moves (they ended before the
//! new one); when a column begins, the open one's gathering joins its additions. So each column
//! ends with exactly the lives whose span holds its final moment, as the second pass adds them.
//! Past [`MAX_KEYS`] kinds and lines on a lane the second pass lumps new lines in the order of its
//! own additions; there the first pass gives up, and the second pass takes the bands.

use super::Lane;
use super::bands::{Adds, Lives, MAX_KEYS, lanes_of, slot_of};
use super::columns::{Found, LaneFound, changed};
use crate::fasthash::FastMap;
use crate::report::kinds::{Kind, KindTracker};
use crate::report::live::{Change, Replay, site_key};
use crate::trace::by_device::ByDevice;
use crate::trace::format::Record;
use crate::trace::reader::TraceTables;
use std::collections::BTreeMap;

type Key = (u8, u64);

/// One lane's additions so far.
#[derive(Default)]
struct LaneBands {
    /// By (slot, site): a difference array over the columns (grown as they come).
    diffs: FastMap<Key, Vec<i64>>,
    /// The open column's moment when `open` began to be gathered, and what it gathered.
    open_best: u64,
    open: FastMap<Key, u64>,
    changes: u64,
}

impl LaneBands {
    /// `bytes` of `key` added to columns `a..b`.
    fn add(&mut self, key: Key, bytes: u64, a: usize, b: usize) {
        if a >= b {
            return;
        }
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
            self.add(key, bytes, i, i + 1);
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

/// The first pass's bands: per device, and each live allocation's first change and kind.
#[derive(Default)]
pub struct EarlyBands {
    lanes: ByDevice<LaneBands>,
    lives: Lives,
    /// Too many kinds and lines: the second pass takes the bands.
    pub given_up: bool,
}

impl EarlyBands {
    /// One record, after `rp` applied it (making change `c`), the kinds observed it (deciding
    /// `decided`) and the columns (`lanes`) took it.
    pub(super) fn see_parts(
        &mut self,
        lanes: &ByDevice<LaneFound>,
        rp: &Replay,
        r: &Record,
        c: Change,
        decided: Option<(u64, Kind)>,
    ) {
        if self.given_up {
            return;
        }
        self.lives.decided(decided);
        let counted = changed(rp, r, c);
        if let Some(d) = counted
            && let Some(f) = lanes.get(d)
        {
            let b = self.lanes.or_default(d);
            b.changes += 1;
            follow(b, f);
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
                    lanes.get(live.device),
                ) {
                    let key = (slot_of(live, kind) as u8, site_key(live));
                    let to = b.changes;
                    // The closed columns whose moments the life spans, and the open one's.
                    let closed = &f.cols[..f.cols.len().saturating_sub(1)];
                    // Most lives begin after the last closed column's moment: none of those.
                    if closed.last().is_some_and(|c| c.best >= from) {
                        let a = closed.partition_point(|c| c.best < from);
                        let e = closed.partition_point(|c| c.best < to);
                        b.add(key, live.size, a, e);
                    }
                    if from <= b.open_best && b.open_best < to {
                        let o = b.open.entry(key).or_default();
                        *o = o.saturating_add(live.size);
                    }
                    if b.diffs.len() + b.open.len() >= MAX_KEYS {
                        self.give_up();
                    }
                }
            }
            _ => {}
        }
    }

    fn give_up(&mut self) {
        *self = EarlyBands {
            given_up: true,
            ..EarlyBands::default()
        };
    }

    /// The lanes, once the first pass read the whole trace (`found` its columns, `rp` and
    /// `kinds` as it left them); the lines of `keep` drawn on their own.
    pub fn finish(
        mut self,
        found: &Found,
        tables: &TraceTables,
        rp: &Replay,
        kinds: &KindTracker,
        keep: &[&str],
    ) -> Vec<Lane> {
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
                b.add(
                    (slot_of(l, kind) as u8, site_key(l)),
                    l.size,
                    a,
                    f.cols.len(),
                );
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
            let a = Adds {
                found: f,
                best: f.cols.iter().map(|c| c.best).collect(),
                diffs,
                changes: b.changes,
            };
            adds.insert(d, a);
        }
        lanes_of(found, adds, tables, keep)
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
