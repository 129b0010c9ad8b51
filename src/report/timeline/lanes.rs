//! A lane drawn from its bands: each device's columns, the difference arrays the bands tracker
//! ([`super::bands`]) added each allocation's life to summed into the kinds' series and the
//! lines that held most, with a checkpoint's coarse series in front of them.

use super::columns::{Found, LaneFound};
use super::{Columns, FailureMark, Lane, Line, MAX_COLUMNS, Mark, TOP_LINES};
use crate::fasthash::FastMap;
use crate::report::kinds::Kind;
use crate::trace::reader::TraceTables;
use std::collections::BTreeMap;

/// Points of a checkpoint's coarse series shown per lane at most (evenly thinned past it).
const MAX_BEFORE: usize = 300;

/// One lane's additions: its columns, and by (slot, site) a difference array over them (one
/// more entry than columns).
pub(super) struct Adds<'a> {
    pub(super) found: &'a LaneFound,
    pub(super) diffs: FastMap<(u8, u64), Vec<i64>>,
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
