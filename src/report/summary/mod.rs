//! `gpushim summary`: calls, bytes and failures per API, peak live memory per device, and the
//! health of the trace itself (torn, lost, truncated, damaged).

use super::kinds::Kind;
use super::live::Replay;
use super::pass::{Said, Seen, Slot, Tracker};
use crate::trace::format::{Api, Record, RecordKind};
use crate::trace::reader::{DecodeStats, TraceInfo, TraceReader, TraceTables};
use crate::trace::summary::is_allocating;
use std::collections::BTreeMap;

mod answer;
mod tally;

pub use answer::*;
use tally::Tally;

fn health(info: &TraceInfo, stats: &DecodeStats, unmatched_since: u64) -> TraceHealth {
    TraceHealth {
        committed: stats.committed,
        torn: stats.torn,
        unused: stats.unused,
        lost: stats.lost,
        truncated: stats.truncated,
        summarized: info.summarized,
        unsummarized: stats.unsummarized,
        summarized_late: stats.summarized_late,
        summed: stats.summed,
        summed_bytes: stats.summed_bytes,
        checkpoints_failed: info.checkpoints_failed,
        checkpoint_refused: info.checkpoint_refused.clone(),
        live_figures: stats.live_figures(unmatched_since).map(str::to_string),
        damage: stats.damage.as_ref().map(|d| {
            format!(
                "offset {} (record {}): {}; {} later records not decoded",
                d.offset, d.index, d.reason, d.skipped
            )
        }),
        clean_exit: info.clean_exit,
        running: info.running_here(),
    }
}

/// The summary, record by record (a part of the analysis's first pass).
pub struct SummaryPass {
    t: Tally,
    /// Per device (indexed by it: a lookup at every tensor made): the tensors' peak so far and
    /// the record that reached it.
    tensor_peaks: Vec<Option<(u64, u64)>>,
    read: u64,
    /// The short road taken (`ReadMode::short_roads`).
    short: bool,
    /// The first record at which the last allocation with Python frames is proposed to the
    /// moments ([`crate::report::early::shutdown_from`]; 0: at every one).
    shutdown_from: u64,
}

/// The summary once the first pass is read, but for what it says of two moments of each
/// device: its tensors' peak and NVML's (their records, to take in the second pass).
pub struct SummaryFound {
    summary: Summary,
    /// (device, record) of the tensors' peak, where the ring's records reach it.
    tensor_peaks: Vec<(u8, u64)>,
    /// (device, where NVML's figure peaked)
    nvml_peaks: Vec<(u8, super::device_memory::NvmlPeak)>,
    /// After a clean exit with Python frames: (record, time) of the last allocation with them.
    before_shutdown: Option<(u64, u64)>,
    /// Tensors let go of at exit whose memory other streams still used: in no kind.
    in_use_elsewhere: crate::fasthash::FastSet<u64>,
}

impl SummaryFound {
    /// The moments the summary needs: (record, device).
    pub fn moments(&self) -> impl Iterator<Item = (u64, u8)> + '_ {
        self.tensor_peaks
            .iter()
            .map(|&(d, at)| (at, d))
            .chain(self.nvml_peaks.iter().map(|&(d, p)| (p.record, d)))
            .chain(
                self.before_shutdown.iter().flat_map(|&(at, _)| {
                    self.summary.framework.iter().map(move |f| (at, f.device))
                }),
            )
    }

    /// The summary, with the kinds at each device's tensor peak and the owners at NVML's, from
    /// the moments the second pass took.
    pub fn finish(mut self, tables: &TraceTables, moments: &[super::moments::Moment]) -> Summary {
        for (d, at) in self.tensor_peaks {
            let (Some(m), Some(f)) = (
                super::moments::of(moments, at, d),
                self.summary.framework.iter_mut().find(|f| f.device == d),
            ) else {
                continue;
            };
            f.kinds_at_peak = super::kinds::ByKind::of(
                m.replay
                    .live
                    .iter()
                    .filter(|(_, l)| l.device == d && l.api == Api::Torch as u8)
                    .map(|(p, l)| (m.kinds.get(p).copied().unwrap_or(Kind::Unknown), l.size)),
            );
        }
        if let Some((at, time_ns)) = self.before_shutdown {
            for f in &mut self.summary.framework {
                let Some(m) = super::moments::of(moments, at, f.device) else {
                    continue;
                };
                // As at exit, without the tensors let go of then whose memory other streams
                // still used.
                let kinds = super::kinds::ByKind::of(
                    m.replay
                        .live
                        .iter()
                        .filter(|(_, l)| l.device == f.device && l.api == Api::Torch as u8)
                        .filter(|(p, _)| !self.in_use_elsewhere.contains(*p))
                        .map(|(p, l)| (m.kinds.get(p).copied().unwrap_or(Kind::Unknown), l.size)),
                );
                // Only where the shutdown freed what outlives a step: the last step's own
                // tensors the program freed after its last allocation are not the shutdown's.
                let lasting = [Kind::Parameter, Kind::Gradient, Kind::OptimizerState];
                if lasting
                    .iter()
                    .any(|&k| kinds.bytes(k) != f.kinds_at_exit.bytes(k))
                {
                    f.kinds_before_shutdown = Some(BeforeShutdown { time_ns, kinds });
                }
            }
        }
        super::device_memory::at_peaks(
            &mut self.summary.device_memory,
            &self.nvml_peaks,
            tables,
            moments,
        );
        self.summary
    }
}

impl Default for SummaryPass {
    fn default() -> SummaryPass {
        SummaryPass {
            t: Tally::new(),
            tensor_peaks: Vec::new(),
            read: 0,
            short: true,
            shutdown_from: 0,
        }
    }
}

impl SummaryPass {
    /// The summary's pass over the trace `reader` reads: the last allocation with Python
    /// frames proposed to the moments only where they would take it (a real model's stack
    /// names Python frames at nearly every allocation, and naming each device at each one was
    /// a twentieth of its `summary`).
    pub fn reading(reader: &TraceReader) -> SummaryPass {
        SummaryPass {
            shutdown_from: crate::report::early::shutdown_from(reader),
            short: reader.mode().short_roads,
            ..SummaryPass::default()
        }
    }

    /// What the records read so far say, the pass going on (a live view: `top`): the time
    /// since the trace began, the events (those a ring's checkpoint counted too) and each
    /// device's figures, as [`SummaryPass::finish`] would give them at this record.
    pub fn so_far(&self, rp: &Replay) -> (u64, u64, Vec<DeviceSummary>) {
        let t = &self.t;
        let restored = rp.restored.api_totals.values().map(|&(calls, _, _)| calls);
        let events = restored.fold(t.events, u64::saturating_add);
        let duration_ns = if events > 0 { t.span_ns(rp) } else { 0 };
        (duration_ns, events, t.devices(rp))
    }

    /// One record of the first pass, after `rp` (the analysis's replay) applied it.
    #[inline]
    pub fn see_parts(
        &mut self,
        tables: &TraceTables,
        rp: &Replay,
        r: &Record,
        said: &mut Vec<Said>,
    ) {
        if !(self.short && self.plain(tables, rp, r, said)) {
            self.see_any(tables, rp, r, said);
        }
    }

    /// The records of nearly every step, taken on a short road: a call of the program's that
    /// succeeded (made or freed), its caller, and its stack; a tensor of PyTorch's made or
    /// freed, and its stack (a real model's trace is these three records, each a third).
    /// What [`SummaryPass::see_any`] does with them, without its questions for the rest
    /// (checkpoints, pools, NVML, PyTorch's segments, the stack a pool's note waits for):
    /// `false` for any other record, nothing done.
    #[inline]
    fn plain(
        &mut self,
        tables: &TraceTables,
        rp: &Replay,
        r: &Record,
        said: &mut Vec<Said>,
    ) -> bool {
        use RecordKind::*;
        let t = &mut self.t;
        if rp.restored.active || r.status != 0 || t.site_of.is_some() {
            return false;
        }
        let allocated = match (r.kind, r.api) {
            (Caller, Api::Shim) => None,
            (StackRef, Api::Shim) if !tables.has_python_frames() => Some(false),
            (StackRef, Api::Shim) => {
                self.read += 1;
                t.nth += 1;
                t.python_frames(tables, r);
                self.before_shutdown(tables, rp, said);
                return true;
            }
            (TensorAlloc, Api::Torch) => {
                self.read += 1;
                t.nth += 1;
                t.python_frames(tables, r);
                t.call(rp, r, true);
                self.tensor_peak(rp, r, said);
                return true;
            }
            (Alloc, api) if api != Api::Shim => Some(r.ptr != 0),
            (Free | TensorFree, api) if api != Api::Shim => Some(false),
            _ => return false,
        };
        self.read += 1;
        t.nth += 1;
        if let Some(allocated) = allocated {
            let i = usize::from(r.thread);
            if t.allocated_last.len() <= i {
                t.allocated_last.resize(i + 1, false);
            }
            t.allocated_last[i] = allocated;
            if r.api != Api::Shim {
                t.call(rp, r, r.api == Api::Torch);
            }
        }
        true
    }

    /// [`SummaryPass::see`], any record.
    #[inline(never)]
    fn see_any(&mut self, tables: &TraceTables, rp: &Replay, r: &Record, said: &mut Vec<Said>) {
        let t = &mut self.t;
        self.read += 1;
        t.take(tables, rp, r);
        if r.kind == RecordKind::DeviceMemory
            && t.nvml_peaks
                .get(&r.device)
                .is_some_and(|p| p.record == t.nth)
        {
            said.push(Said::Here(Slot::Nvml(r.device)));
        }
        self.before_shutdown(tables, rp, said);
        if r.kind == RecordKind::TensorAlloc && !rp.restored.active {
            self.tensor_peak(rp, r, said);
        }
    }

    /// The program's last allocation with Python frames so far was this record's: where the
    /// run ended cleanly and its shutdown is near, a moment of every device the summary will
    /// name the framework's (those it has, and those its tensors are on).
    #[inline]
    fn before_shutdown(&self, tables: &TraceTables, rp: &Replay, said: &mut Vec<Said>) {
        let t = &self.t;
        if tables.info().clean_exit
            && rp.index >= self.shutdown_from
            && t.last_python.is_some_and(|(at, _)| at == t.nth)
        {
            let more = rp.tensors.by_device().map(|(d, _)| d);
            let more = more.filter(|d| !t.framework.contains_key(d));
            for d in t.framework.keys().copied().chain(more) {
                said.push(Said::Here(Slot::BeforeShutdown(d)));
            }
        }
    }

    /// A tensor made (`r`, applied): its device's tensors at a new peak?
    #[inline]
    fn tensor_peak(&mut self, rp: &Replay, r: &Record, said: &mut Vec<Said>) {
        let d = if r.device == crate::trace::format::DEVICE_UNKNOWN {
            0
        } else {
            r.device
        };
        let live = rp.tensors.live_on(d);
        let i = usize::from(d);
        if self.tensor_peaks.len() <= i {
            self.tensor_peaks.resize(i + 1, None);
        }
        let e = self.tensor_peaks[i].get_or_insert_default();
        if live > e.0 {
            *e = (live, self.read);
            said.push(Said::Here(Slot::TensorPeak(d)));
        }
    }

    /// The summary once the first pass has read the whole trace (`reader` and `kinds` as it
    /// left them).
    pub fn finish(
        self,
        reader: &TraceReader,
        rp: &Replay,
        kinds: &super::kinds::KindTracker,
    ) -> SummaryFound {
        let SummaryPass {
            mut t,
            tensor_peaks,
            ..
        } = self;
        t.add_checkpoint_counts(rp);
        t.framework_at_end(rp);
        let lasting = |p: u64, l: &super::live::Live| Some(kinds.lasting(reader, p, l.stack));
        let mut peaks_wanted = Vec::new();
        for f in t.framework.values_mut() {
            f.activations_peak_bytes = kinds.activation_peaks().get(&f.device).map_or(0, |p| p.0);
            // The tensors the program holds: not those it let go of whose memory other
            // streams still use (their frees wait on events at exit).
            f.kinds_at_exit = super::kinds::ByKind::of(
                rp.live
                    .iter()
                    .filter(|(_, l)| l.device == f.device && l.api == Api::Torch as u8)
                    .filter(|(p, _)| !kinds.in_use_elsewhere(**p))
                    .filter_map(|(&p, l)| Some((lasting(p, l)?, l.size))),
            );
            // The peak as the ring's records show it (not one a checkpoint kept from before).
            if let Some(&Some((bytes, at))) = tensor_peaks.get(usize::from(f.device))
                && bytes == f.allocated_peak_bytes
            {
                peaks_wanted.push((f.device, at));
            }
        }
        // Tensors let go of whose memory other streams still use are held, by no kind.
        let let_go = |p: u64| kinds.in_use_elsewhere(p);
        let held_at_exit = super::owners::held_by_owner_kinds(reader, rp, &lasting, &let_go);
        let device_memory =
            super::device_memory::reckon(rp, &held_at_exit, &t.nvml_peaks, &t.nvml_last);
        let nvml_peaks = t.nvml_peaks.iter().map(|(&d, &p)| (d, p)).collect();
        let info = reader.info();
        let stats: DecodeStats = reader.stats().clone();
        let devices = t.devices(rp);
        let summary = Summary {
            run: RunIdentity {
                path: crate::files::shown(&info.path).to_string(),
                program: info.program.clone(),
                parallel: super::kinds::parallel_frameworks(reader)
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
                world_size: super::kinds::kept_world_size(&info.env),
                sharding: super::kinds::fsdp_resharding(reader),
                pid: info.pid,
                host: info.host.clone(),
                rank: (info.rank >= 0).then_some(info.rank),
            },
            // Since the trace started (times are relative to its start).
            duration_ns: if t.events > 0 { t.span_ns(rp) } else { 0 },
            events: t.events,
            apis: std::mem::take(&mut t.apis).into_iter().flatten().collect(),
            devices,
            pinned_host_peak_bytes: rp.pinned.peak,
            unmatched_frees: rp.unmatched_frees,
            python_frames: (t.with_python > 0).then_some(PythonFrames {
                allocations_with: t.with_python,
                allocations: t.allocations,
            }),
            pool: t.pool_activity(),
            streams_left_legacy: t.streams_left.take(),
            framework: std::mem::take(&mut t.framework).into_values().collect(),
            held_at_exit,
            device_memory,
            tensors_off: rp
                .tensors
                .off
                .map(|c| crate::trace::format::tensors_off::reason(c).to_string()),
            health: health(
                info,
                &stats,
                rp.unmatched_frees - rp.restored.unmatched_frees,
            ),
        };
        // Python's shutdown frees what the program's last lines held: after a clean exit, the
        // kinds as its code ended are those at its last allocation with Python frames.
        let before_shutdown = t.last_python.filter(|_| info.clean_exit);
        let in_use_elsewhere = rp
            .live
            .iter()
            .map(|(&p, _)| p)
            .filter(|&p| kinds.in_use_elsewhere(p))
            .collect();
        SummaryFound {
            summary,
            tensor_peaks: peaks_wanted,
            nvml_peaks,
            before_shutdown,
            in_use_elsewhere,
        }
    }
}

impl Tracker for SummaryPass {
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, said: &mut Vec<Said>) {
        self.see_parts(seen.reader, seen.rp, seen.record, said);
    }
}
