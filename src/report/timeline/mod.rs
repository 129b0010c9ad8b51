//! Memory over a run, as the page and `plot` draw it: per trace and device, a few hundred
//! *columns*, each the moment of most live memory within its stretch of the run, split into the
//! kinds of PyTorch's tensors, other allocations, cached memory no tensor uses and what NVML saw
//! beyond the allocations; and the lines that held most, each a series over the same columns.
//!
//! The x axis counts *changes* (an allocation made or freed), not seconds: the minutes of
//! start-up before the first allocation and the pauses between steps take no width, and a step
//! takes the width of the memory it moves. [`columns`] finds each column's moment and
//! [`bands`] splits it, in the same pass where it can (else in a second pass), and [`lanes`]
//! draws each device's lane from them, memory growing with the live allocations and the lines, never with the length of the
//! trace: a ring of any size gives a page of the same size.

pub(crate) mod bands;
pub(crate) mod columns;
pub(crate) mod lanes;

/// The first pass's tracker of the picture: each device's columns, and their bands where they
/// are taken in the same pass (`early`; else the second pass takes them, [`bands::Bands::over`]).
pub struct PicturePass {
    pub columns: columns::ColumnsPass,
    pub bands: Option<bands::Bands<'static>>,
}

impl PicturePass {
    pub fn new(early: bool) -> PicturePass {
        PicturePass {
            columns: columns::ColumnsPass::default(),
            bands: early.then(bands::Bands::following),
        }
    }
}

impl super::pass::Tracker for PicturePass {
    #[inline(always)]
    fn see(&mut self, s: &super::pass::Seen<'_>, _said: &mut Vec<super::pass::Said>) {
        self.columns.see_parts(s.rp, s.record, s.change);
        if let Some(b) = &mut self.bands {
            b.see_parts(self.columns.lanes(), s.rp, s.record, s.change, s.decided);
        }
    }
}

use super::kinds::Kind;
use serde::Serialize;

/// At most this many columns per lane: a long trace's stretches are merged two by two when
/// they reach it, so a lane has between half of it and all of it.
pub const MAX_COLUMNS: usize = 1200;
/// Lines drawn on their own; the rest are summed by kind.
pub const TOP_LINES: usize = 24;

/// Where a band's bytes are not PyTorch's tensors: the slot after the kinds.
pub const NOT_A_TENSOR: usize = Kind::ALL.len();

/// One device of one trace over the run.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Lane {
    /// The trace's label (its rank, else its file name) and the device.
    pub trace: String,
    pub device: u8,
    /// The device's memory, as NVML or CUDA reported it (0: not known).
    pub device_total_bytes: u64,
    /// Whether the trace holds PyTorch's tensors (so the kinds are known).
    pub tensors_recorded: bool,
    /// Columns at the front that come from a ring's checkpoint: live and reserved memory only,
    /// from the part of the run the ring no longer holds.
    pub before_ring: usize,
    pub columns: Columns,
    /// The lines that held most, largest first.
    pub lines: Vec<Line>,
    /// Per column: tensors of the lines not in `lines`.
    pub other_lines: Vec<u64>,
    /// The column of the most live memory, and that figure.
    pub peak: Option<Mark>,
    pub failures: Vec<FailureMark>,
    /// Iteration boundaries: the column each falls in and its number (from 1; where a long run's
    /// boundaries were thinned, the number is the one its place in the run gives).
    pub steps: Vec<Step>,
    /// What marks the iterations.
    pub step_name: Option<String>,
}

/// The columns, field by field (arrays, for the page's script).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Columns {
    /// The change the column shows (its moment), counted from the first.
    pub change: Vec<u64>,
    pub time_ns: Vec<u64>,
    /// Allocations live: PyTorch's tensors and everything else.
    pub live: Vec<u64>,
    /// Live plus cached: what the allocators hold of the device.
    pub reserved: Vec<u64>,
    /// NVML's figure for the process at the latest sample (0: none yet).
    pub nvml: Vec<u64>,
    /// Per kind of [`Kind::ALL`]: the tensors' bytes.
    pub kinds: Vec<Vec<u64>>,
}

impl Columns {
    pub fn len(&self) -> usize {
        self.change.len()
    }

    pub fn is_empty(&self) -> bool {
        self.change.is_empty()
    }

    /// Live memory that is not one of PyTorch's tensors, at column `i`.
    pub fn not_tensors(&self, i: usize) -> u64 {
        let tensors = self
            .kinds
            .iter()
            .map(|k| k[i])
            .fold(0u64, u64::saturating_add);
        self.live[i].saturating_sub(tensors)
    }

    /// Held and not live (PyTorch's cache, a pool's free room), at column `i`.
    pub fn cached(&self, i: usize) -> u64 {
        self.reserved[i].saturating_sub(self.live[i])
    }

    /// NVML's figure beyond what the allocators hold (the CUDA context, module code), at `i`.
    pub fn outside(&self, i: usize) -> u64 {
        self.nvml[i].saturating_sub(self.reserved[i])
    }
}

impl Lane {
    /// The lane as its columns say, whatever a saved file claims: every array as long as the
    /// columns (cut, or filled with zeros), one array per kind, and every column a mark, step
    /// or failure names, and the columns before the ring, within them. A saved analysis may
    /// come from anyone; the page's script and the pictures loop and index on these.
    pub fn made_whole(&mut self) {
        let n = self.columns.len();
        let c = &mut self.columns;
        for a in [&mut c.time_ns, &mut c.live, &mut c.reserved, &mut c.nvml] {
            a.resize(n, 0);
        }
        c.kinds.resize(Kind::ALL.len(), Vec::new());
        for k in &mut c.kinds {
            k.resize(n, 0);
        }
        for l in &mut self.lines {
            l.bytes.resize(n, 0);
        }
        self.other_lines.resize(n, 0);
        self.before_ring = self.before_ring.min(n);
        let last = n.saturating_sub(1);
        if let Some(p) = self.peak.as_mut() {
            p.column = p.column.min(last);
        }
        self.steps.retain(|s| s.column < n);
        for f in &mut self.failures {
            f.column = f.column.min(last);
        }
        if n == 0 {
            self.peak = None;
            self.failures.clear();
        }
    }
}

/// One line (a call site) over the columns.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Line {
    pub label: String,
    /// Its tensors' kind (`None`: not PyTorch's tensors).
    pub kind: Option<Kind>,
    /// The whole stack, innermost first, each frame as reports name it.
    pub frames: Vec<String>,
    pub bytes: Vec<u64>,
}

/// A column marked: where, what, when.
#[derive(Clone, Copy, Debug, Serialize, serde::Deserialize)]
pub struct Mark {
    pub column: usize,
    pub bytes: u64,
    pub time_ns: u64,
}

/// An iteration boundary on the axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Step {
    pub column: usize,
    pub n: u64,
}

/// A failed allocation.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct FailureMark {
    pub column: usize,
    pub requested_bytes: u64,
    pub api: String,
    pub time_ns: u64,
}

/// Iteration boundaries as `leaks` found them: what marks them, how many the run had, the
/// times of those it kept (all, or an even thinning of them), and the lines it found growing
/// (drawn on their own however little they hold).
#[derive(Clone, Copy, Debug)]
pub struct Boundaries<'a> {
    pub name: &'a str,
    pub count: u64,
    pub times_ns: &'a [u64],
    pub growing: &'a [&'a str],
}

/// `lanes` named for their trace (`label`), with its iteration boundaries if known.
pub fn named(mut lanes: Vec<Lane>, label: &str, steps: Option<Boundaries>) -> Vec<Lane> {
    for lane in &mut lanes {
        lane.trace = label.to_string();
        if let Some(b) = steps {
            lane.step_name = Some(b.name.to_string());
            let kept = b.times_ns.len() as u64;
            let mut last = None;
            for (i, &t) in b.times_ns.iter().enumerate() {
                let Some(column) = column_at(&lane.columns.time_ns, t) else {
                    continue;
                };
                let n = if kept >= b.count || kept < 2 {
                    i as u64 + 1
                } else {
                    (i as u64).saturating_mul(b.count - 1) / (kept - 1) + 1
                };
                if last != Some(column) {
                    lane.steps.push(Step { column, n });
                    last = Some(column);
                }
            }
        }
    }
    lanes
}

/// The column in which time `t` falls: the last whose moment is at or before it.
fn column_at(times: &[u64], t: u64) -> Option<usize> {
    let n = times.partition_point(|&c| c <= t);
    (n > 0).then(|| n - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_falls_in_the_last_column_at_or_before_it() {
        let times = [5, 10, 20, 30];
        assert_eq!(column_at(&times, 4), None);
        assert_eq!(column_at(&times, 10), Some(1));
        assert_eq!(column_at(&times, 25), Some(2));
        assert_eq!(column_at(&times, 99), Some(3));
    }
}
