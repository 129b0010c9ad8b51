//! The second pass: every allocation's life, `[made, freed)` in changes, added to the columns
//! whose moment falls inside it, under its kind and line. A column's moments rise with the
//! columns, so a life covers a run of them: one addition where it begins and one subtraction
//! where it ends (a difference array per kind and line), summed once at the end.

use super::columns::{Found, LaneFound, changed};
use super::{Columns, FailureMark, Lane, Line, MAX_COLUMNS, Mark, NOT_A_TENSOR, TOP_LINES};
use crate::fasthash::FastMap;
use crate::report::kinds::{Decided, Kind, KindTracker};
use crate::report::live::{Change, Live, Replay, site_key};
use crate::report::pass::{Said, Seen, Tracker};
use crate::trace::format::Api;
use crate::trace::format::Record;
use crate::trace::reader::TraceTables;
use std::collections::BTreeMap;

/// Distinct (kind, line) pairs followed per lane; past it, a kind's new lines are summed as
/// one (a hostile or enormous trace costs no more than this).
pub(super) const MAX_KEYS: usize = 8192;
/// Points of a checkpoint's coarse series shown per lane at most (evenly thinned past it).
const MAX_BEFORE: usize = 300;

/// One lane's additions: by (slot, site), a difference array over its columns.
pub(super) struct Adds<'a> {
    pub(super) found: &'a LaneFound,
    /// Each column's moment, rising.
    pub(super) best: Vec<u64>,
    pub(super) diffs: FastMap<(u8, u64), Vec<i64>>,
    /// Changes so far.
    pub(super) changes: u64,
}

impl Adds<'_> {
    /// Adds `bytes` of `(slot, site)` to every column whose moment is in `[from, to)`.
    fn add(&mut self, slot: usize, site: u64, bytes: u64, from: u64, to: u64) {
        let a = self.best.partition_point(|&m| m < from);
        let b = self.best.partition_point(|&m| m < to);
        if a >= b {
            return;
        }
        let n = self.best.len() + 1;
        let key = if self.diffs.len() >= MAX_KEYS && !self.diffs.contains_key(&(slot as u8, site)) {
            (slot as u8, 0)
        } else {
            (slot as u8, site)
        };
        let d = self.diffs.entry(key).or_insert_with(|| vec![0; n]);
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        d[a] = d[a].saturating_add(bytes);
        d[b] = d[b].saturating_sub(bytes);
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

/// The second pass: the lanes, each column split by kind and line, record by record.
pub struct BandsPass<'a> {
    found: &'a Found,
    adds: BTreeMap<u8, Adds<'a>>,
    lives: Lives,
}

impl<'a> BandsPass<'a> {
    pub fn new(found: &'a Found) -> BandsPass<'a> {
        let adds = found
            .lanes
            .iter()
            .map(|(d, f)| {
                let adds = Adds {
                    found: f,
                    best: f.cols.iter().map(|c| c.best).collect(),
                    diffs: FastMap::default(),
                    changes: 0,
                };
                (d, adds)
            })
            .collect();
        BandsPass {
            found,
            adds,
            lives: Lives::default(),
        }
    }

    /// One record, after `rp` applied it (making change `c`) and the kinds observed it
    /// (deciding `decided`).
    fn see_parts(&mut self, rp: &Replay, r: &Record, c: Change, decided: Option<(u64, Kind)>) {
        self.lives.decided(decided);
        let counted = changed(rp, r, c);
        if let Some(d) = counted
            && let Some(a) = self.adds.get_mut(&d)
        {
            a.changes += 1;
        }
        match c {
            Change::Alloc { ptr, device } => {
                let now = self.adds.get(&device).map_or(0, |a| a.changes);
                self.lives
                    .made(ptr, rp.live.last_put(), now, counted.is_some());
            }
            Change::Free { ptr } => {
                let live = &rp.freed;
                if let (Some((from, kind)), Some(a)) = (
                    self.lives.freed(ptr, rp.live.last_taken()),
                    self.adds.get_mut(&live.device),
                ) {
                    let to = a.changes;
                    let slot = slot_of(live, kind);
                    a.add(slot, site_key(live), live.size, from, to);
                }
            }
            _ => {}
        }
    }

    /// The lanes, once the pass read the whole trace (`rp`, `kinds` and `reader` as it left
    /// them); the lines of `keep` are drawn on their own however little they hold.
    pub fn finish(
        mut self,
        tables: &TraceTables,
        rp: &Replay,
        kinds: &KindTracker,
        keep: &[&str],
    ) -> Vec<Lane> {
        // What is live at the end stays to the last column.
        for (place, ptr, l) in rp.live.iter_placed() {
            let Some(from) = self.lives.first_change(place) else {
                continue;
            };
            if let Some(a) = self.adds.get_mut(&l.device) {
                let kind = kinds.lasting(tables, *ptr, l.stack);
                a.add(slot_of(l, kind), site_key(l), l.size, from, u64::MAX);
            }
        }
        lanes_of(self.found, self.adds, tables, keep)
    }
}

/// The lanes from each device's additions, with the checkpoint's series before them.
pub(super) fn lanes_of(
    found: &Found,
    adds: BTreeMap<u8, Adds>,
    tables: &TraceTables,
    keep: &[&str],
) -> Vec<Lane> {
    let mut lanes = Vec::new();
    for (d, a) in adds {
        let before: Vec<(u64, u64, u64)> = found
            .series
            .iter()
            .filter(|s| s.1 == d)
            .map(|&(t, _, live, reserved)| (t, live, reserved))
            .collect();
        let mut l = lane(tables, d, a, &thin(&before), found.tensors_recorded, keep);
        if let Some(&(bytes, time_ns)) = found.peak_before.get(&d) {
            peak_before_ring(&mut l, bytes, time_ns);
        }
        lanes.push(l);
    }
    lanes
}

/// A peak before the ring's detail, higher than any the detail shows: marked in the column of
/// the checkpoint's series where its time falls, which the coarse series may have drawn lower.
fn peak_before_ring(lane: &mut Lane, bytes: u64, time_ns: u64) {
    let pre = lane.before_ring;
    if pre == 0 || lane.peak.is_some_and(|p| p.bytes >= bytes) {
        return;
    }
    let c = &mut lane.columns;
    let i = c.time_ns[..pre]
        .partition_point(|&t| t <= time_ns)
        .saturating_sub(1);
    c.live[i] = c.live[i].max(bytes);
    c.reserved[i] = c.reserved[i].max(bytes);
    lane.other_lines[i] = lane.other_lines[i].max(bytes);
    lane.peak = Some(Mark {
        column: i,
        bytes,
        time_ns,
    });
}

/// The slot of an allocation in the difference arrays: its kind, or not a tensor.
pub(super) fn slot_of(l: &Live, kind: Kind) -> usize {
    if l.api == Api::Torch as u8 {
        kind as usize
    } else {
        NOT_A_TENSOR
    }
}

/// `points`, evenly thinned to at most [`MAX_BEFORE`].
fn thin(points: &[(u64, u64, u64)]) -> Vec<(u64, u64, u64)> {
    if points.len() <= MAX_BEFORE {
        return points.to_vec();
    }
    (0..MAX_BEFORE)
        .map(|i| points[i * points.len() / MAX_BEFORE])
        .collect()
}

/// One lane from its additions, with `before` (a checkpoint's series) in front.
fn lane(
    tables: &TraceTables,
    device: u8,
    a: Adds,
    before: &[(u64, u64, u64)],
    tensors_recorded: bool,
    keep: &[&str],
) -> Lane {
    let f = a.found;
    let n = f.cols.len();
    let pre = before.len();
    let mut columns = Columns {
        kinds: vec![vec![0; pre + n]; Kind::ALL.len()],
        ..Columns::default()
    };
    for &(t, live, reserved) in before {
        columns.change.push(0);
        columns.time_ns.push(t);
        columns.live.push(live);
        columns.reserved.push(reserved.max(live));
        columns.nvml.push(0);
    }
    for c in &f.cols {
        columns.change.push(c.best);
        columns.time_ns.push(c.time_ns);
        columns.live.push(c.live);
        columns.reserved.push(c.reserved.max(c.live));
        columns.nvml.push(c.nvml);
    }
    // Sum each difference array into its series, kinds by slot, lines by (slot, site).
    let mut series: Vec<((u8, u64), Vec<u64>)> = Vec::with_capacity(a.diffs.len());
    for (key, diff) in a.diffs {
        let mut run = 0i64;
        let mut s = vec![0u64; pre + n];
        for i in 0..n {
            run = run.saturating_add(diff[i]);
            let v = u64::try_from(run).unwrap_or(0);
            s[pre + i] = v;
            if let Some(k) = columns.kinds.get_mut(key.0 as usize) {
                k[pre + i] = k[pre + i].saturating_add(v);
            }
        }
        series.push((key, s));
    }
    series.sort_by(|x, y| {
        let mx = x.1.iter().max();
        let my = y.1.iter().max();
        my.cmp(&mx).then(x.0.cmp(&y.0))
    });
    // The lines that held most, and every line named in `keep` (the growing ones: a leak of a
    // few bytes a step is drawn even where it never holds much).
    let mut lines: Vec<Line> = Vec::new();
    for (k, ((slot, site), bytes)) in series.into_iter().enumerate() {
        if k < TOP_LINES {
            lines.push(line(tables, slot as usize, site, bytes));
        } else if !keep.is_empty() && site != 0 {
            let label = crate::report::sites::site_label(tables, site);
            if keep.contains(&label.as_str()) {
                lines.push(line(tables, slot as usize, site, bytes));
            }
        }
    }
    let other_lines = (0..pre + n)
        .map(|i| {
            let top = lines.iter().fold(0u64, |s, l| s.saturating_add(l.bytes[i]));
            columns.live[i].saturating_sub(top)
        })
        .collect();
    let peak = f.peak.map(|(bytes, change, time_ns)| Mark {
        column: pre + f.column_of(change),
        bytes,
        time_ns,
    });
    let failures = f
        .failures
        .iter()
        .map(|&(changes, size, api, time_ns)| FailureMark {
            column: pre + f.column_of(changes.max(1)).min(n.saturating_sub(1)),
            requested_bytes: size,
            api: api.to_string(),
            time_ns,
        })
        .collect();
    debug_assert!(n <= MAX_COLUMNS);
    Lane {
        trace: String::new(),
        device,
        device_total_bytes: f.device_total,
        tensors_recorded,
        before_ring: pre,
        columns,
        lines,
        other_lines,
        peak,
        failures,
        steps: Vec::new(),
        step_name: None,
    }
}

/// A line's series, named.
fn line(tables: &TraceTables, slot: usize, site: u64, bytes: Vec<u64>) -> Line {
    use crate::report::sites::{shown_frames, site_label};
    let (label, frames) = if site == 0 {
        ("(other lines)".to_string(), Vec::new())
    } else {
        let frames = match tables.stack(site) {
            Some(f) => shown_frames(tables, f)
                .iter()
                .map(|&ip| crate::report::symbolize::describe(tables, ip))
                .collect(),
            None => Vec::new(),
        };
        (site_label(tables, site), frames)
    };
    Line {
        label,
        kind: Kind::ALL.get(slot).copied(),
        frames,
        bytes,
    }
}

impl Tracker for BandsPass<'_> {
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, _said: &mut Vec<Said>) {
        self.see_parts(seen.rp, seen.record, seen.change, seen.decided);
    }
}
