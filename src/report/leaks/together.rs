//! Which call sites' long-lived allocations are freed next to each other: what keeps one
//! alive keeps the other.

use crate::fasthash::FastMap;
use crate::report::live::site_key;
use std::collections::HashMap;

/// Pairs of call sites counted at most; past it, only the pairs already counted go on.
const MAX_PAIRS: usize = 1 << 16;

/// Which call sites' long-lived allocations are freed next to each other. When the value that
/// keeps a leak alive is finally released (a list cleared, a function's locals at its return,
/// the interpreter's exit), everything it kept goes with it in one chain of frees: a metric,
/// then the activation its autograd graph saved, then the next metric. Only allocations that
/// outlived an iteration count, so the frees of every step's temporaries pair nothing.
/// Two frees are next to each other when the thread allocated nothing between them and no
/// iteration ended between them: what the records say, never how long the frees took (a
/// program descheduled for milliseconds in the middle of a chain frees the same chain).
#[derive(Default)]
pub(super) struct FreedTogether {
    /// The times of the two latest iteration boundaries (older first) and how many were seen.
    boundaries: [u64; 2],
    seen: u64,
    /// Per thread: the call site of its latest free of a long-lived allocation, since the
    /// thread last allocated and the latest boundary.
    last: FastMap<u16, u64>,
    /// Per call site: its long-lived allocations freed.
    freed: FastMap<u64, u64>,
    /// Per pair of call sites (smaller key first): frees of one right after the other's.
    pairs: FastMap<(u64, u64), u64>,
}

impl FreedTogether {
    pub(super) fn boundary(&mut self, time_ns: u64) {
        self.boundaries = [self.boundaries[1], time_ns];
        self.seen = self.seen.saturating_add(1);
        self.last.clear();
    }

    /// `thread` allocated: a chain of frees it was in has ended.
    pub(super) fn allocated(&mut self, thread: u16) {
        crate::fasthash::remove_if_any(&mut self.last, &thread);
    }

    pub(super) fn free(&mut self, thread: u16, live: &crate::trace::live::Live) {
        // Long-lived: made before the boundary before the latest.
        if self.seen < 2 || live.time_ns >= self.boundaries[0] {
            return;
        }
        let site = site_key(live);
        if self.freed.len() < MAX_PAIRS || self.freed.contains_key(&site) {
            *self.freed.entry(site).or_default() += 1;
        }
        let Some(prev) = self.last.insert(thread, site) else {
            return;
        };
        if prev == site {
            return;
        }
        let key = (prev.min(site), prev.max(site));
        if self.pairs.len() < MAX_PAIRS || self.pairs.contains_key(&key) {
            *self.pairs.entry(key).or_default() += 1;
        }
    }

    /// The same frees counted by line: `line` names each call site's line (sites of one line
    /// are one; a site without a line drops out). Pairs within one line count nothing.
    pub(super) fn by_line(&self, line: impl Fn(u64) -> Option<u64>) -> FreedTogether {
        let mut out = FreedTogether::default();
        for (&k, &n) in &self.freed {
            if let Some(l) = line(k) {
                *out.freed.entry(l).or_default() += n;
            }
        }
        for (&(a, b), &n) in &self.pairs {
            if let (Some(a), Some(b)) = (line(a), line(b))
                && a != b
            {
                *out.pairs.entry((a.min(b), a.max(b))).or_default() += n;
            }
        }
        out
    }

    /// How often allocations of `a` and `b` were freed next to each other, when that makes them
    /// live and die together: at least twice, and next to at least half of the long-lived
    /// allocations freed of each.
    pub(super) fn together(&self, a: u64, b: u64) -> Option<u64> {
        let n = *self.pairs.get(&(a.min(b), a.max(b)))?;
        let freed = |k| self.freed.get(&k).copied().unwrap_or(0);
        (a != b && n >= 2 && n.saturating_mul(2) >= freed(a).max(freed(b))).then_some(n)
    }

    /// For each of `growing`, the others freed in one chain with it: joined by frees next to
    /// each other, directly or through other sites of the list (an autograd graph kept by a
    /// metric frees the metric and each activation it saved one after another), each with how
    /// often the two were freed next to each other (0: only through others). At most
    /// [`MAX_KEPT_WITH`] each, the direct neighbours most often freed with it first. Linear in
    /// the pairs counted and the lines, so that a trace of 100,000 growing lines is answered.
    pub(super) fn chains(&self, growing: &[u64]) -> Vec<Vec<(usize, u64)>> {
        let n = growing.len();
        let index: HashMap<u64, usize> = growing.iter().enumerate().map(|(i, &k)| (k, i)).collect();
        // Union-find over the list's indices, joined by the pairs that hold together.
        let mut parent: Vec<usize> = (0..n).collect();
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        let mut direct: Vec<Vec<(usize, u64)>> = vec![Vec::new(); n];
        for &(a, b) in self.pairs.keys() {
            let (Some(&i), Some(&j)) = (index.get(&a), index.get(&b)) else {
                continue;
            };
            if let Some(count) = self.together(a, b) {
                direct[i].push((j, count));
                direct[j].push((i, count));
                let (ra, rb) = (root(&mut parent, i), root(&mut parent, j));
                parent[ra] = rb;
            }
        }
        let mut members: HashMap<usize, Vec<usize>> = HashMap::new();
        for i in 0..n {
            let r = root(&mut parent, i);
            members.entry(r).or_default().push(i);
        }
        (0..n)
            .map(|i| {
                let mut with = std::mem::take(&mut direct[i]);
                with.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                with.truncate(MAX_KEPT_WITH);
                let r = root(&mut parent, i);
                for &j in members.get(&r).map_or(&[][..], |m| m.as_slice()) {
                    if with.len() >= MAX_KEPT_WITH {
                        break;
                    }
                    if j != i && !with.iter().any(|&(k, _)| k == j) {
                        with.push((j, 0));
                    }
                }
                with.sort_by_key(|&(j, _)| j);
                with
            })
            .collect()
    }
}

/// The most lines said to be kept alive with one growing line.
pub(super) const MAX_KEPT_WITH: usize = 32;
