//! The second pass of `leaks` (or the first pass's, begun part way): the live bytes per call
//! site at each iteration boundary, the kinds the lines' tensors turned out to be, and the
//! report made of them.

use super::*;
use crate::report::pass::{Said, Seen, Tracker};

/// The analysis's second pass for `leaks`: live bytes per call site at each boundary, from the
/// live set (the stacks of earlier allocations are all in by then); past MAX_BOUNDARIES, every
/// other one is let go and then only every `stride`-th kept, so the samples stay spread over
/// the whole run.
pub struct LeaksSampler {
    pub(super) chosen: Option<Chosen>,
    /// The short road taken (`ReadMode::short_roads`).
    pub(super) short: bool,
    pub(super) boundary_not_found: Option<Vec<String>>,
    pub(super) restored_matches: bool,
    pub(super) samples: Thinned<Boundary>,
    pub(super) seen: u64,
    pub(super) together: FreedTogether,
    /// The kinds decided for tensors not yet freed.
    pub(super) decided: crate::report::kinds::Decided,
    /// Per call site: the bytes of its tensors by the kind each turned out to be, freed or live
    /// at the end (for the kind of a growing line).
    pub(super) site_kinds: crate::fasthash::FastMap<u64, BTreeMap<crate::report::kinds::Kind, u64>>,
}

impl LeaksSampler {
    /// Whether `other` samples at the same boundaries, numbered alike (the same choice).
    pub fn same_choice(&self, other: &LeaksSampler) -> bool {
        self.chosen == other.chosen
            && self.restored_matches == other.restored_matches
            && self.boundary_not_found == other.boundary_not_found
    }

    /// One record, after `rp` applied it (making change `c`) and the kinds observed it
    /// (deciding `decided`).
    #[inline]
    fn see_parts(
        &mut self,
        rp: &Replay,
        r: &Record,
        c: Change,
        decided: Option<(u64, crate::report::kinds::Kind)>,
    ) {
        // Most records that neither make nor free (a call's caller, its stack) change nothing
        // here: no kind decided now or at the record before, and no boundary.
        if self.short
            && c == Change::Other
            && decided.is_none()
            && self.decided.idle()
            && !self.is_boundary(r, c)
        {
            return;
        }
        self.see_any(rp, r, c, decided);
    }

    /// Whether record `r` (whose replay made change `c`) is a boundary of the mark chosen.
    #[inline]
    fn is_boundary(&self, r: &Record, c: Change) -> bool {
        self.chosen
            .as_ref()
            .is_some_and(|(_, m)| m.is_boundary(r, c))
    }

    /// [`LeaksSampler::see`], any record.
    #[inline(never)]
    fn see_any(
        &mut self,
        rp: &Replay,
        r: &Record,
        c: Change,
        decided: Option<(u64, crate::report::kinds::Kind)>,
    ) {
        // A tensor's kind is decided as it is freed (most), or as its free is asked for (then
        // kept until the free); a new allocation at an address drops a kind left there.
        self.decided.note(decided);
        match &c {
            crate::trace::live::Change::Free { ptr } => {
                if let Some(k) = self.decided.take(*ptr) {
                    let e = self
                        .site_kinds
                        .entry(site_key(&rp.freed))
                        .or_default()
                        .entry(k)
                        .or_default();
                    *e = e.saturating_add(rp.freed.size);
                }
            }
            crate::trace::live::Change::Alloc { ptr, .. } => {
                self.decided.take(*ptr);
            }
            _ => {}
        }
        if rp.restored.active || r.kind == RecordKind::Restore {
            return;
        }
        match &c {
            crate::trace::live::Change::Free { .. } => self.together.free(r.thread, &rp.freed),
            crate::trace::live::Change::Alloc { .. } => self.together.allocated(r.thread),
            _ => {}
        }
        if self.is_boundary(r, c) {
            self.seen += 1;
            self.together.boundary(r.time_ns);
            if self.samples.wants() {
                let base = if self.restored_matches {
                    rp.restored.boundary_count
                } else {
                    0
                };
                self.samples.push(Boundary {
                    ordinal: base + self.seen,
                    time_ns: r.time_ns,
                    total: rp.total_live(),
                    by_site: rp.live_by_site(),
                });
            }
        }
    }

    /// The report, once the second pass read the whole trace (`rp`, `kinds` and `reader` as it
    /// left them).
    pub fn finish(
        self,
        reader: &TraceReader,
        rp: &Replay,
        kinds: &crate::report::kinds::KindTracker,
    ) -> Leaks {
        let mut seen = self.seen;
        let kept: Vec<Boundary> = if self.restored_matches && !rp.restored.boundaries.is_empty() {
            // The checkpoint's boundaries, then the ring's, thinned together.
            let mut all: Thinned<Boundary> = Thinned::new(MAX_BOUNDARIES);
            for b in rp
                .restored
                .boundaries
                .iter()
                .cloned()
                .chain(self.samples.into_items())
            {
                if all.wants() {
                    all.push(b);
                }
            }
            seen = seen.saturating_add(rp.restored.boundary_count);
            all.into_items()
        } else {
            self.samples.into_items()
        };
        let ordinals: Vec<u64> = kept.iter().map(|b| b.ordinal).collect();
        let totals: Vec<u64> = kept.iter().map(|b| b.total).collect();
        let times: Vec<u64> = kept.iter().map(|b| b.time_ns).collect();
        let series: Vec<crate::fasthash::FastMap<u64, u64>> =
            kept.into_iter().map(|b| b.by_site).collect();
        let mut iterations = self.chosen.map(|(boundary, _)| Iterations {
            boundary,
            count: seen,
            live_at_boundaries: totals,
            boundary_times_ns: times,
            growing: growing_sites(
                reader,
                &series,
                &ordinals,
                &self.together,
                rp.tensors.recorded(),
            ),
        });
        let tensors: Vec<(crate::report::kinds::Kind, &crate::trace::live::Live)> = rp
            .live
            .iter()
            .filter(|(_, l)| l.api == crate::trace::format::Api::Torch as u8)
            .map(|(&p, l)| (kinds.lasting(reader, p, l.stack), l))
            .collect();
        let live_at_exit_by_kind =
            crate::report::kinds::by_kind_and_site(&tensors, |k| site_label(reader, k));
        if let Some(it) = iterations.as_mut() {
            name_kinds(reader, &mut it.growing, self.site_kinds, &tensors);
        }
        Leaks {
            boundary_not_found: self.boundary_not_found,
            live_at_exit_bytes: rp.total_live(),
            live_at_exit_by_kind,
            live_at_exit: holders(rp.all_live(), None, site_key, |k| site_label(reader, k)),
            iterations,
            clean_exit: reader.info().clean_exit,
            running: reader.info().running_here(),
            trace_cut: reader.stats().cut(),
            live_figures: reader
                .stats()
                .live_figures(rp.unmatched_frees - rp.restored.unmatched_frees)
                .map(str::to_string),
        }
    }
}

/// A growing line's kind is what its tensors turned out to be, as the kinds' tracker tells
/// them (freed, `site_kinds`, or live at the end, `tensors`): a metric computed between a
/// forward and its backward keeps the forward's graph, an activation, where its phase alone
/// would say less. What grows is kept: a temporary of the same line does not name it.
fn name_kinds(
    tables: &TraceTables,
    growing: &mut [Growth],
    mut site_kinds: crate::fasthash::FastMap<u64, BTreeMap<crate::report::kinds::Kind, u64>>,
    tensors: &[(crate::report::kinds::Kind, &crate::trace::live::Live)],
) {
    if growing.is_empty() {
        return;
    }
    for (k, l) in tensors {
        let e = site_kinds
            .entry(site_key(l))
            .or_default()
            .entry(*k)
            .or_default();
        *e = e.saturating_add(l.size);
    }
    let mut by_line: HashMap<String, BTreeMap<crate::report::kinds::Kind, u64>> = HashMap::new();
    for (site, kinds) in site_kinds {
        let line = by_line.entry(site_label(tables, site)).or_default();
        for (k, b) in kinds {
            let e = line.entry(k).or_default();
            *e = e.saturating_add(b);
        }
    }
    for g in growing {
        if let Some(kinds) = by_line.get(&g.call_site)
            && let Some((&k, _)) = kinds
                .iter()
                .filter(|&(k, _)| *k != crate::report::kinds::Kind::Temporary)
                .max_by_key(|&(k, b)| (*b, std::cmp::Reverse(*k)))
        {
            g.kind = Some(k);
        }
    }
}

impl Tracker for LeaksSampler {
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, _said: &mut Vec<Said>) {
        self.see_parts(seen.rp, seen.record, seen.change, seen.decided);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::kinds::Kind;
    use crate::trace::format::Api;

    fn sampler() -> LeaksSampler {
        LeaksSampler {
            chosen: None,
            short: true,
            boundary_not_found: None,
            restored_matches: false,
            samples: Thinned::new(MAX_BOUNDARIES),
            seen: 0,
            together: FreedTogether::default(),
            decided: Default::default(),
            site_kinds: Default::default(),
        }
    }

    /// A successful call of thread 1 on device 0; each record below changes what it names.
    const CALL: Record = Record {
        kind: RecordKind::Alloc,
        api: Api::CudaMalloc,
        device: 0,
        status: 0,
        thread: 1,
        time_ns: 1,
        ptr: 0,
        size: 0,
        stream: 0,
    };

    /// Each record applied to the replay, then seen by the sampler with the kind decided there.
    fn read(records: &[(Record, Option<(u64, Kind)>)]) -> LeaksSampler {
        let (mut rp, mut s) = (Replay::default(), sampler());
        for (r, decided) in records {
            let c = rp.apply(r);
            s.see_parts(&rp, r, c, *decided);
        }
        s
    }

    #[test]
    fn a_kind_left_at_an_address_goes_to_no_later_allocation_there() {
        let alloc = |ptr, size| (Record { ptr, size, ..CALL }, None);
        let free = |ptr| {
            let (kind, api) = (RecordKind::Free, Api::CudaFree);
            (
                Record {
                    kind,
                    api,
                    ptr,
                    ..CALL
                },
                None,
            )
        };
        let asked = |ptr, k| {
            let (kind, api) = (RecordKind::TensorFreeRequested, Api::Torch);
            (
                Record {
                    kind,
                    api,
                    ptr,
                    ..CALL
                },
                Some((ptr, k)),
            )
        };
        // A tensor's kind decided as its free was asked for, and the free never seen: the
        // address is handed out again (freed by a route the trace did not see), and that
        // allocation, freed, has no kind of its own. Then a second address whose kind is
        // decided the same way and whose free is seen.
        let s = read(&[
            alloc(0x10, 100),
            asked(0x10, Kind::Activation),
            alloc(0x10, 200),
            free(0x10),
            alloc(0x20, 300),
            asked(0x20, Kind::Temporary),
            free(0x20),
        ]);
        // Only the second address's line has a kind: the first's kind did not go to the
        // allocation of 200 bytes made at its address after it.
        let kinds: Vec<&BTreeMap<Kind, u64>> = s.site_kinds.values().collect();
        assert_eq!(kinds, vec![&BTreeMap::from([(Kind::Temporary, 300)])]);
    }
}
