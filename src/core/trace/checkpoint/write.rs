//! The checkpoint written: everything the summarizer holds as a stream of records a reader
//! replays before the ring's (`restore` records, see `format::restore`; what they put back:
//! `live::Replay::restore`).

use super::live_set;
use crate::trace::format::{self, Api, DEVICE_UNKNOWN, RECORD_SIZE, Record, RecordKind, restore};
use crate::trace::live::{BoundaryMark, Replay, Snapshot};
use crate::trace::summary::{Summarizer, TAIL_NS};

/// What a checkpoint leaves out so that it fits its slot.
#[derive(Default)]
pub(super) struct Fit {
    /// The oldest threads' announcements (`ThreadStart`) left out.
    thread_starts_left_out: usize,
    /// At most this many live allocations one by one, the older summed by call site.
    itemize: Option<usize>,
}

impl Summarizer {
    /// Writes the checkpoint: every record applied so far summarized, then the records still in
    /// the reorder window as they are. `covered` is the ring index up to which every record was
    /// fed; `room` the records the checkpoint's slot holds: a checkpoint that would not fit
    /// lists fewer live allocations one by one and sums the rest by call site
    /// (`live_set`), so that it fits whenever what it holds besides them does. Writes the
    /// bodies to `out` (the caller puts the commit words).
    pub fn checkpoint(&mut self, covered: u64, room: usize, out: &mut Vec<[u8; RECORD_SIZE]>) {
        // The records still waiting go into the checkpoint as they are: only the last
        // TAIL_NS of them (a writer's block is abandoned within 1 ms, so records further
        // apart than that come in time order), so a fast writer's 20 ms do not fill it.
        self.drain_older_than(Some(TAIL_NS));
        // The first checkpoint decides what marks the iterations, from the records so far.
        self.boundaries.decide();
        self.settle_peaks();
        self.window.sort_by_key(|x| (x.0, x.1));
        let start = out.len();
        // The latest walk of the autograd graph, where it takes no more than a quarter of the
        // slot (a model of thousands of layers in a small ring goes without).
        let graph = self.graph.last.len() <= room / 4;
        let mut fit = Fit::default();
        self.write_into(covered, &fit, graph, out);
        let starts = self
            .kept
            .iter()
            .filter(|r| r.kind == RecordKind::ThreadStart)
            .count();
        for _ in 0..7 {
            let written = out.len() - start;
            if written <= room {
                return;
            }
            let excess = written - room;
            let waiting = self.window.len();
            if fit.thread_starts_left_out < starts {
                // Threads' announcements first: no report reads them (a thread's records name
                // it by its index), and a program whose threads come and go by the thousand
                // would otherwise leave a small ring without checkpoints. The oldest go.
                fit.thread_starts_left_out = starts.min(fit.thread_starts_left_out + excess + 64);
            } else if waiting > 0 && (waiting >= excess || fit.itemize == Some(0)) {
                // What does not fit is the records still waiting (a fast writer's last
                // milliseconds): they are applied now, in the order they have, rather than
                // leave the ring without a checkpoint. A record another thread claimed earlier
                // and committed later can then come after one it preceded.
                self.drain_older_than(None);
            } else {
                // Each allocation left out costs a record less; the stand-ins and their sites
                // take some back, so ask for a little more than the excess each time.
                let live = self.replay.live.len() + self.replay.physical.len();
                fit.itemize = Some(
                    fit.itemize
                        .unwrap_or(live)
                        .saturating_sub(excess + excess / 8 + 64),
                );
            }
            out.truncate(start);
            self.write_into(covered, &fit, graph, out);
        }
    }

    pub(super) fn write_into(
        &self,
        covered: u64,
        fit: &Fit,
        graph: bool,
        out: &mut Vec<[u8; RECORD_SIZE]>,
    ) {
        let mut w = Writer { out };
        w.restore(restore::BEGIN, 0, covered, self.applied, self.applied_ns);
        for d in &self.defs.bodies {
            w.out.push(*d);
        }
        let mut starts_skipped = 0;
        for r in &self.kept {
            if r.kind == RecordKind::ThreadStart && starts_skipped < fit.thread_starts_left_out {
                starts_skipped += 1;
                continue;
            }
            w.record(r);
        }
        if graph {
            for r in &self.graph.last {
                w.record(r);
            }
        }
        let rp = &self.replay;
        let (threads, started) = rp.open_ranges();
        for (t, ids) in threads {
            for id in ids {
                w.push(Record {
                    thread: t,
                    ..restore_record(restore::RANGE_OPEN, 0, id, 0, 0)
                });
            }
        }
        for (name, id) in started {
            w.restore(restore::STARTED, 0, name, id, 0);
        }
        for (base, s) in rp.segments() {
            w.push(Record {
                api: if s.framework { Api::Torch } else { Api::Shim },
                thread: u16::from(s.pages),
                ..restore_record(restore::SEGMENT, s.device, base, s.size, 0)
            });
        }
        for (h, size, d) in rp.framework_physical() {
            w.restore(restore::FRAMEWORK_PHYSICAL, d, h, size, 0);
        }
        live_set::write(&mut w, rp, &self.joins.live, fit.itemize);
        self.write_figures(&mut w);
        for w_ in self.peaks.values() {
            w.snapshot(&w_.snapshot, false);
        }
        for f in &self.failures {
            w.snapshot(&f.snapshot, true);
            for r in &f.records {
                w.record(r);
            }
        }
        self.write_boundaries(&mut w);
        write_thread_pending(&mut w, &self.replay);
        w.restore(restore::END, 0, 0, 0, 0);
        // The records not yet applied, as they came (sorted by `checkpoint`).
        for (_, _, r) in &self.window {
            w.record(r);
        }
    }

    /// What the replay holds in figures: tensors, peaks, NVML's samples and figures, CUDA's
    /// pools, the series, unknown frees, `cudaMemGetInfo`, calls per API.
    pub(super) fn write_figures(&self, w: &mut Writer) {
        let rp = &self.replay;
        for (d, (now, peak)) in rp.tensors.by_device() {
            w.restore(restore::TENSOR_BYTES, d, now, peak, 0);
        }
        for (d, peak, t) in rp.peaks() {
            w.restore(restore::DEVICE_PEAK, d, peak, 0, t);
        }
        w.restore(restore::HOST_PEAK, 0, rp.pinned.peak, 0, 0);
        for r in self.nvml.items() {
            w.record(r);
        }
        // CUDA's own pools: their latest figures, as the records that said them.
        for (&(d, pool), &(reserved, used)) in &rp.facts.cuda_pools {
            w.record(&Record {
                kind: RecordKind::CudaPool,
                api: Api::Shim,
                device: d,
                status: pool,
                thread: 0,
                time_ns: 0,
                ptr: reserved,
                size: used,
                stream: 0,
            });
        }
        for (&d, f) in &rp.facts.nvml {
            w.push(Record {
                thread: u16::from(f.device_wide),
                ..restore_record(restore::NVML, d, f.bytes, f.total, f.peak)
            });
        }
        for (&d, series) in &self.series {
            for &(t, live, reserved) in &series.points {
                w.restore(restore::SERIES, d, live, reserved, t);
            }
        }
        w.restore(restore::UNMATCHED, 0, rp.unmatched_frees, 0, 0);
        for (&d, &(free, total)) in &rp.facts.mem_info {
            w.restore(restore::MEM_INFO, d, free, total, 0);
        }
        for (api, &(calls, bytes, failed)) in self.apis.iter().enumerate() {
            if calls > 0
                && let Some(a) = Api::from_u8(api as u8)
            {
                w.push(Record {
                    api: a,
                    ..restore_record(restore::API, 0, calls, failed, bytes)
                });
            }
        }
    }

    /// What marks the iterations, and live bytes by call site at each boundary kept (each
    /// boundary's changes from the one before).
    pub(super) fn write_boundaries(&self, w: &mut Writer) {
        if let Some(mark) = self.boundaries.mark {
            let (thread, key) = match mark {
                BoundaryMark::Nvtx(id) => (0, id),
                BoundaryMark::Site(k) => (1, k),
            };
            w.push(Record {
                thread,
                ..restore_record(restore::BOUNDARY_MARK, 0, key, self.boundaries.seen, 0)
            });
            let empty: crate::fasthash::FastMap<u64, u64> = Default::default();
            let mut before = &empty;
            for b in self.boundaries.kept.items() {
                let by = &b.by_site;
                w.restore(restore::BOUNDARY, 0, b.ordinal, b.total, b.time_ns);
                let mut changed: Vec<(u64, u64)> = by
                    .iter()
                    .filter(|&(k, v)| before.get(k) != Some(v))
                    .map(|(&k, &v)| (k, v))
                    .chain(
                        before
                            .keys()
                            .filter(|k| !by.contains_key(k))
                            .map(|&k| (k, 0)),
                    )
                    .collect();
                changed.sort_unstable();
                for (k, v) in changed {
                    w.push(Record {
                        kind: RecordKind::Holding,
                        api: Api::Shim,
                        device: DEVICE_UNKNOWN,
                        ptr: k,
                        time_ns: v,
                        ..blank()
                    });
                }
                before = by;
            }
        }
    }
}

/// The live allocations (and VMM handles, and pinned host memory), grouped by call site.
/// Per thread: what the replay waits for next on it (an allocation's stack, its caller, a
/// framework segment to claim physical memory).
fn write_thread_pending(w: &mut Writer, rp: &Replay) {
    for p in rp.thread_pending() {
        let on = |what, ptr, size| Record {
            thread: p.thread,
            ..restore_record(what, 0, ptr, size, 0)
        };
        if p.last_alloc != 0 {
            w.push(on(restore::LAST_ALLOC, p.last_alloc, 0));
        }
        if let Some((vmm, key)) = p.awaiting_caller {
            w.push(on(restore::AWAITING_CALLER, key, u64::from(vmm)));
        }
        for h in p.pending_physical {
            w.push(on(restore::PENDING_PHYSICAL, h, 0));
        }
    }
}

pub(super) fn blank() -> Record {
    Record {
        kind: RecordKind::Restore,
        api: Api::Shim,
        device: 0,
        status: 0,
        thread: 0,
        time_ns: 0,
        ptr: 0,
        size: 0,
        stream: 0,
    }
}

pub(super) fn restore_record(what: u8, device: u8, ptr: u64, size: u64, time_ns: u64) -> Record {
    Record {
        status: what,
        device,
        ptr,
        size,
        time_ns,
        ..blank()
    }
}

/// Encodes records into a checkpoint's bodies.
pub(super) struct Writer<'a> {
    pub(super) out: &'a mut Vec<[u8; RECORD_SIZE]>,
}

impl Writer<'_> {
    pub(super) fn push(&mut self, r: Record) {
        let mut b = [0u8; RECORD_SIZE];
        r.encode_body(&mut b);
        self.out.push(b);
    }

    pub(super) fn record(&mut self, r: &Record) {
        self.push(*r);
    }

    pub(super) fn restore(&mut self, what: u8, device: u8, ptr: u64, size: u64, time_ns: u64) {
        self.push(restore_record(what, device, ptr, size, time_ns));
    }

    pub(super) fn snapshot(&mut self, s: &Snapshot, failure: bool) {
        self.push(Record {
            thread: u16::from(failure),
            ..restore_record(restore::SNAPSHOT, s.device, s.live, s.reserved, s.time_ns)
        });
        self.restore(
            restore::SNAPSHOT_MORE,
            s.device,
            s.largest_free_block,
            s.device_free.map_or(0, |f| f.saturating_add(1)),
            0,
        );
        for h in &s.holdings {
            let (lo, hi) = restore::split_count(h.allocations);
            self.push(Record {
                kind: RecordKind::Holding,
                api: Api::Shim,
                device: s.device,
                thread: lo,
                stream: hi,
                ptr: h.stack,
                size: h.range,
                time_ns: h.bytes,
                status: 0,
            });
        }
    }
}

/// Commit words for a checkpoint's records (record `i` of the checkpoint gets the tag of `i`).
pub fn seal(bodies: &mut [[u8; RECORD_SIZE]]) {
    for (i, b) in bodies.iter_mut().enumerate() {
        b[..2].copy_from_slice(&format::commit_tag(i as u64).to_le_bytes());
    }
}
