//! `oom`: each failed allocation, with what the device held at that moment.

use super::kinds::{ByKind, KindTracker};
use super::live::Replay;
use super::pass::{Said, Seen, Tracker};
use super::sites::{Holder, holders, site_label};
use crate::fasthash::{FastMap, remove_if_any};
use crate::trace::format::Api;
use crate::trace::format::DEVICE_UNKNOWN;
use crate::trace::format::Record;
use crate::trace::format::RecordKind;
use crate::trace::reader::TraceTables;
use serde::Serialize;

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Oom {
    pub time_ns: u64,
    pub api: String,
    pub status: u8,
    pub device: u8,
    pub requested_bytes: u64,
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    /// Reserved by the pool and not live: cached.
    pub cached_bytes: u64,
    pub largest_free_block: u64,
    /// The pool refused because of `limit`, not the device.
    pub limit_hit: bool,
    /// The device's own free memory at the last `cudaMemGetInfo` before, if any (or, for a
    /// tensor the framework could not get, what CUDA reported to it).
    pub device_free_bytes: Option<u64>,
    /// Where the failed request was made (its stack: the Python line of a tensor), when the
    /// trace has it.
    pub request_site: Option<String>,
    /// PyTorch's tensors live at the failure, by kind (a tensor of the phase still running
    /// counts as what that phase keeps: at an out-of-memory nothing more of it is known).
    pub by_kind: ByKind,
    pub holders: Vec<Holder>,
    /// The steps of one failure, in order, where it took more than one: PyTorch's `cudaMalloc`
    /// before it gives back its cache, the one after, and the tensor it could not make.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
}

/// One call of a failure.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Step {
    pub time_ns: u64,
    pub api: String,
    pub requested_bytes: u64,
    /// What was reserved then (PyTorch gives back its cache between its two attempts).
    pub reserved_bytes: u64,
}

/// A CUDA error code as its name says it (the runtime's and the driver's agree on these).
pub fn error_name(code: u8) -> String {
    error_name_of(code, "cuda")
}

/// The code a call of `api` failed with, named as that API names it (the runtime's `cuda*`
/// and the driver's `cu*` number their errors apart), with what it usually means. The trace
/// keeps codes up to 254; 255 stands for any above.
pub fn error_name_of(code: u8, api: &str) -> String {
    let driver = api.starts_with("cu") && !api.starts_with("cuda");
    let (name, means) = match (code, driver) {
        (1, false) => ("cudaErrorInvalidValue", "an argument CUDA refuses"),
        (1, true) => ("CUDA_ERROR_INVALID_VALUE", "an argument CUDA refuses"),
        (2, false) => ("cudaErrorMemoryAllocation", "out of memory"),
        (2, true) => ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
        (3, false) => ("cudaErrorInitializationError", "CUDA could not start"),
        (3, true) => ("CUDA_ERROR_NOT_INITIALIZED", "cuInit was not called"),
        (4, false) => ("cudaErrorCudartUnloading", "the runtime is shutting down"),
        (4, true) => ("CUDA_ERROR_DEINITIALIZED", "the driver is shutting down"),
        (34, _) => (
            "cudaErrorStubLibrary",
            "a stub of the driver library was loaded, not the driver",
        ),
        (35, false) => (
            "cudaErrorInsufficientDriver",
            "no CUDA driver, or one older than this runtime: see nvidia-smi",
        ),
        (100, false) => (
            "cudaErrorNoDevice",
            "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)",
        ),
        (100, true) => (
            "CUDA_ERROR_NO_DEVICE",
            "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)",
        ),
        (101, false) => ("cudaErrorInvalidDevice", "no such device"),
        (101, true) => ("CUDA_ERROR_INVALID_DEVICE", "no such device"),
        (201, _) => (
            "CUDA_ERROR_INVALID_CONTEXT",
            "no current context on the calling thread",
        ),
        (255, _) => ("a CUDA error above 254", "the trace keeps codes up to 254"),
        _ => ("", ""),
    };
    if name.is_empty() {
        format!("CUDA error {code}")
    } else {
        format!("{name} ({code}, {means})")
    }
}

/// Whether a failure with this code is the device (or a limit) out of memory.
pub fn is_out_of_memory(code: u8) -> bool {
    code == 2
}

fn step_of(rp: &Replay, r: &Record, device: u8) -> Step {
    Step {
        time_ns: r.time_ns,
        api: r.api.name().to_string(),
        requested_bytes: r.size,
        reserved_bytes: rp.reserved_on(device),
    }
}

/// A failed request of record `r`, with what device `r.device` held at that moment.
fn failed_request(tables: &TraceTables, rp: &Replay, kinds: &KindTracker, r: &Record) -> Oom {
    let device = if r.device == DEVICE_UNKNOWN {
        0
    } else {
        r.device
    };
    let live = rp.live_on(device);
    let reserved = rp.reserved_on(device);
    let mut h = holders(
        rp.all_live(),
        Some(device),
        |l| l.stack,
        |k| site_label(tables, k),
    );
    h.truncate(10);
    let by_kind = ByKind::of(
        rp.live
            .iter()
            .filter(|(_, l)| l.device == device && l.api == Api::Torch as u8)
            .map(|(&p, l)| {
                let k = kinds
                    .so_far(p)
                    .unwrap_or_else(|| kinds.lasting(tables, p, l.stack));
                (k, l.size)
            }),
    );
    Oom {
        time_ns: r.time_ns,
        api: r.api.name().to_string(),
        status: if r.status == 0 { 2 } else { r.status },
        device,
        requested_bytes: r.size,
        live_bytes: live,
        reserved_bytes: reserved,
        cached_bytes: reserved.saturating_sub(live),
        largest_free_block: rp.largest_free_block(device),
        limit_hit: false,
        // What CUDA last said was free may be long before the failure: a tensor's failure
        // carries its own figure (below); a bare call's has none as of the failure.
        device_free_bytes: None,
        request_site: None,
        by_kind,
        holders: h,
        steps: Vec::new(),
    }
}

/// The failed allocations of a trace, record by record (a part of the analysis's first pass).
#[derive(Default)]
pub struct OomPass {
    out: Vec<Oom>,
    limit_pending: FastMap<u16, bool>,
    /// Per thread: the entry whose request's stack comes next; and its latest failed
    /// allocation, which a framework's out-of-memory event right after explains.
    site_for: FastMap<u16, usize>,
    failed_on: FastMap<u16, usize>,
}

impl OomPass {
    /// One record, after `rp` applied it and `kinds` observed it.
    fn see_parts(&mut self, tables: &TraceTables, rp: &Replay, kinds: &KindTracker, r: &Record) {
        match r.kind {
            RecordKind::Restore => {}
            // A failure the checkpoint of a ring trace kept, with what was live then.
            _ if rp.restored.active => {
                if crate::trace::summary::is_failure(r)
                    && let Some(s) = rp.restored.snapshots.last().filter(|s| s.failure)
                {
                    let mut holders = super::sites::snapshot_holders(
                        &s.holdings,
                        |h| h.stack,
                        |k| site_label(tables, k),
                    );
                    holders.truncate(10);
                    self.out.push(Oom {
                        time_ns: r.time_ns,
                        api: r.api.name().to_string(),
                        status: if r.status == 0 { 2 } else { r.status },
                        device: s.device,
                        requested_bytes: r.size,
                        live_bytes: s.live,
                        reserved_bytes: s.reserved,
                        cached_bytes: s.reserved.saturating_sub(s.live),
                        largest_free_block: s.largest_free_block,
                        limit_hit: false,
                        device_free_bytes: if r.kind == RecordKind::TensorOom {
                            Some(r.ptr)
                        } else {
                            s.device_free
                        },
                        request_site: None,
                        by_kind: ByKind::default(),
                        holders,
                        steps: Vec::new(),
                    });
                    self.site_for.insert(r.thread, self.out.len() - 1);
                } else if r.kind == RecordKind::StackRef
                    && let Some(i) = remove_if_any(&mut self.site_for, &r.thread)
                {
                    self.out[i].request_site = Some(site_label(tables, r.ptr));
                }
            }
            RecordKind::LimitHit => {
                self.limit_pending.insert(r.thread, true);
            }
            RecordKind::StackRef => {
                if let Some(i) = remove_if_any(&mut self.site_for, &r.thread) {
                    self.out[i].request_site = Some(site_label(tables, r.ptr));
                }
            }
            // The framework could not get memory for a tensor: the failed segment request just
            // before on the thread (if the trace has it) becomes this request, with its line.
            RecordKind::TensorOom => {
                let i = remove_if_any(&mut self.failed_on, &r.thread).unwrap_or_else(|| {
                    self.out.push(failed_request(tables, rp, kinds, r));
                    self.out.len() - 1
                });
                let o = &mut self.out[i];
                if !o.steps.is_empty() {
                    o.steps.push(step_of(rp, r, o.device));
                }
                o.api = r.api.name().to_string();
                o.requested_bytes = r.size;
                o.device_free_bytes = Some(r.ptr);
                self.site_for.insert(r.thread, i);
            }
            RecordKind::Alloc
            | RecordKind::AllocAsync
            | RecordKind::ManagedAlloc
            | RecordKind::TensorAlloc
                if r.status == 0 =>
            {
                remove_if_any(&mut self.failed_on, &r.thread);
                remove_if_any(&mut self.site_for, &r.thread);
            }
            // A second failed call on the thread with no success between (PyTorch's attempt
            // after giving back its cache) is a step of the same failure.
            RecordKind::Alloc | RecordKind::AllocAsync | RecordKind::ManagedAlloc
                if r.status != 0 && r.size > 0 =>
            {
                if let Some(&i) = self.failed_on.get(&r.thread) {
                    let o = &mut self.out[i];
                    if o.steps.is_empty() {
                        o.steps.push(Step {
                            time_ns: o.time_ns,
                            api: o.api.clone(),
                            requested_bytes: o.requested_bytes,
                            reserved_bytes: o.reserved_bytes,
                        });
                    }
                    o.steps.push(step_of(rp, r, o.device));
                    o.limit_hit |=
                        remove_if_any(&mut self.limit_pending, &r.thread).unwrap_or(false);
                    self.site_for.insert(r.thread, i);
                    return;
                }
                let mut o = failed_request(tables, rp, kinds, r);
                o.limit_hit = remove_if_any(&mut self.limit_pending, &r.thread).unwrap_or(false);
                self.out.push(o);
                self.site_for.insert(r.thread, self.out.len() - 1);
                self.failed_on.insert(r.thread, self.out.len() - 1);
            }
            _ => {
                if !r.kind.is_definition() {
                    remove_if_any(&mut self.site_for, &r.thread);
                }
            }
        }
    }

    pub fn finish(self) -> Vec<Oom> {
        self.out
    }
}

impl Tracker for OomPass {
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, _said: &mut Vec<Said>) {
        self.see_parts(seen.reader, seen.rp, seen.kinds, seen.record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render::oom::render_ooms;

    fn failed(requested: u64, largest_free: u64) -> Oom {
        Oom {
            time_ns: 0,
            api: "cudaMalloc".into(),
            status: 2,
            device: 0,
            requested_bytes: requested,
            live_bytes: 6 << 20,
            reserved_bytes: 8 << 20,
            cached_bytes: 2 << 20,
            largest_free_block: largest_free,
            limit_hit: true,
            device_free_bytes: None,
            request_site: None,
            by_kind: ByKind::default(),
            holders: Vec::new(),
            steps: Vec::new(),
        }
    }

    #[test]
    fn a_request_the_free_room_could_hold_says_why_it_was_not_served() {
        let text = render_ooms("t", &[failed(3 << 19, 1_992_294)]);
        assert!(
            text.contains("the pool held a free block of 1.90 MiB but a request above 1 MiB"),
            "{text}"
        );
        assert!(text.contains("medium:20MiB"), "{text}");
        // Too large for the free room, or a request the pool cuts from shared segments anyway:
        // nothing to explain.
        for o in [
            failed(3 << 19, 1 << 20),
            failed(512 << 10, 1 << 20),
            failed(64 << 20, 128 << 20),
        ] {
            assert!(!render_ooms("t", &[o]).contains("the pool held"));
        }
    }
}
