//! A record applied to the replay: memory calls, VMM physical memory, the framework's and the
//! pool's segments, what the device said, contexts and device resets.

use super::*;

impl Replay {
    /// Applies one record; what it changed. The records of nearly every step (an allocation,
    /// its stack, a free, each a call that succeeded) take a short road of their own: the
    /// replay is the hot path of every report, and each record asked five appliers in turn.
    #[inline]
    pub fn apply(&mut self, r: &Record) -> Change {
        use RecordKind::*;
        if !self.restored.active && r.status == 0 && r.ptr != 0 {
            let f = match r.kind {
                Alloc | TensorAlloc => Self::allocated,
                Free | TensorFree => Self::freed,
                StackRef => Self::stack_ref,
                Caller => Self::caller,
                _ => return self.apply_any(r),
            };
            self.index += 1;
            self.time_ns = self.time_ns.max(r.time_ns);
            return f(self, r);
        }
        self.apply_any(r)
    }

    /// [`Replay::apply`] for any record.
    #[inline(never)]
    fn apply_any(&mut self, r: &Record) -> Change {
        self.index += 1;
        use RecordKind::*;
        // A checkpoint's own records carry figures, not times, in `time_ns`.
        if r.kind == Restore {
            self.restore(r);
            return Change::Other;
        }
        if !matches!(r.kind, Holding | StringData | StackData) {
            self.time_ns = self.time_ns.max(r.time_ns);
        }
        if self.restored.active {
            match r.kind {
                Holding => {
                    self.restore_holding(r);
                    return Change::Other;
                }
                Caller => {
                    self.restored.site.2 = [r.ptr, r.size];
                    return Change::Other;
                }
                _ => {}
            }
        }
        let change = self
            .apply_memory(r)
            .or_else(|| self.apply_physical(r))
            .or_else(|| self.apply_segments(r))
            .or_else(|| self.apply_facts(r))
            .or_else(|| self.apply_context(r));
        change.unwrap_or_else(|| {
            // Any other record of the thread ends the window in which a StackRef belongs to
            // its allocation.
            if !r.kind.is_definition() {
                take_last(&mut self.threads.last_alloc, r.thread);
            }
            Change::Other
        })
    }

    /// Device and pinned host memory handed out and given back (the program's calls and the
    /// framework's tensors).
    pub(super) fn apply_memory(&mut self, r: &Record) -> Option<Change> {
        use RecordKind::*;
        Some(match r.kind {
            Alloc | AllocAsync | ManagedAlloc | TensorAlloc if r.status == 0 && r.ptr != 0 => {
                self.allocated(r)
            }
            Free | FreeAsync | TensorFree if r.status == 0 && r.ptr != 0 => self.freed(r),
            HostAlloc if r.status == 0 && r.ptr != 0 => {
                take_last(&mut self.threads.last_alloc, r.thread);
                if let Some(old) = self.pinned.by_address.insert(r.ptr, r.size) {
                    self.pinned.live = self.pinned.live.saturating_sub(old);
                }
                self.pinned.live = self.pinned.live.saturating_add(r.size);
                self.pinned.peak = self.pinned.peak.max(self.pinned.live);
                Change::Other
            }
            HostFree if r.status == 0 && r.ptr != 0 => {
                take_last(&mut self.threads.last_alloc, r.thread);
                match self.pinned.by_address.remove(&r.ptr) {
                    Some(size) => self.pinned.live = self.pinned.live.saturating_sub(size),
                    None => self.unmatched_frees += 1,
                }
                Change::Other
            }
            _ => return None,
        })
    }

    /// An allocation that succeeded (device, managed, stream-ordered, a tensor).
    #[inline]
    fn allocated(&mut self, r: &Record) -> Change {
        use RecordKind::*;
        if r.kind == TensorAlloc {
            self.tensors.allocated(device_or_0(r.device), r.size);
        }
        let l = self.live_of(r);
        let device = l.device;
        if let Some(old) = self.live.insert(r.ptr, l) {
            // Freed by a route the trace did not see.
            self.sub_bytes(old.device, old.size);
        }
        let before = self.add_bytes(device, r.size, r.time_ns);
        if r.kind == TensorAlloc {
            if before.is_some() {
                self.peak_by = None;
            }
        } else {
            self.note_peak_by(before, device, r.ptr, false);
        }
        if !self.restored.active {
            *slot(&mut self.threads.last_alloc, r.thread) = r.ptr;
            // A `Caller` follows only the program's own allocations (the shim names no
            // caller of the framework's tensors, whose owner is the framework), so a
            // tensor leaves none awaited: a thread whose last allocation was a tensor
            // holds nothing a checkpoint must carry (threads come and go by thousands).
            let names_caller = r.kind != TensorAlloc
                && !matches!(
                    r.api,
                    crate::trace::format::Api::Torch | crate::trace::format::Api::Pluggable
                );
            *slot(&mut self.threads.awaiting_caller, r.thread) =
                names_caller.then_some((false, r.ptr));
        }
        Change::Alloc { ptr: r.ptr, device }
    }

    /// A free that succeeded (device, stream-ordered, a tensor).
    #[inline]
    fn freed(&mut self, r: &Record) -> Change {
        use RecordKind::*;
        take_last(&mut self.threads.last_alloc, r.thread);
        // Copied into place: the value a removal hands back comes through memory
        // written piecewise, and reading it whole stalled the replay at every free.
        if self.live.remove_into(&r.ptr, &mut self.freed) {
            let (device, size) = (self.freed.device, self.freed.size);
            self.sub_bytes(device, size);
            if r.kind == TensorFree {
                self.tensors.freed(device, size);
            }
            Change::Free { ptr: r.ptr }
        } else if self.tensors.recorded() && self.segments.contains_key(&r.ptr) {
            // The framework giving a segment back: its release follows.
            Change::Other
        } else {
            self.unmatched_frees += 1;
            Change::Other
        }
    }

    /// Who called the shim for the thread's latest allocation.
    #[inline]
    fn caller(&mut self, r: &Record) -> Change {
        let owner = self
            .threads
            .awaiting_caller
            .get_mut(r.thread as usize)
            .and_then(Option::take);
        let l = match owner {
            Some((false, p)) => self.live.get_mut(&p),
            Some((true, h)) => self.physical.get_mut(&h),
            None => None,
        };
        if let Some(l) = l {
            l.caller = [r.ptr, r.size];
        }
        Change::Other
    }

    /// The stack of the thread's latest allocation.
    #[inline]
    fn stack_ref(&mut self, r: &Record) -> Change {
        let mut change = Change::Other;
        let counted = self
            .threads
            .counted_raw
            .get_mut(r.thread as usize)
            .and_then(Option::take);
        if let Some(p) = take_last(&mut self.threads.last_alloc, r.thread)
            && let Some(l) = self.live.get_mut(&p)
        {
            l.stack = r.ptr;
            if l.kind == RecordKind::Alloc as u8 && self.tensors.recorded() {
                change = Change::StackOfRaw;
            } else if l.kind == RecordKind::Alloc as u8 && !self.restored.active {
                // Counted as its call site's own: a segment the framework may yet
                // claim, the tensor's stack (the same) following.
                *slot(&mut self.threads.counted_raw, r.thread) = Some(CountedRaw::Made(p));
            } else if l.kind == RecordKind::TensorAlloc as u8
                && counted == Some(CountedRaw::Claimed(r.ptr))
            {
                change = Change::StackOfRaw;
            }
        }
        change
    }

    /// VMM physical memory created and released (an expandable segment's claimed as reserved).
    pub(super) fn apply_physical(&mut self, r: &Record) -> Option<Change> {
        use RecordKind::*;
        Some(match r.kind {
            PhysCreate if r.status == 0 => {
                let l = Live {
                    stream: 0,
                    ..self.live_of(r)
                };
                let device = l.device;
                if let Some(old) = self.physical.insert(r.ptr, l) {
                    self.sub_bytes(old.device, old.size);
                    self.add_physical(old.device, old.size, false);
                }
                let before = self.add_bytes(device, r.size, r.time_ns);
                self.note_peak_by(before, device, r.ptr, true);
                self.add_physical(device, r.size, true);
                if !self.restored.active {
                    slot(&mut self.threads.pending_physical, r.thread).push(r.ptr);
                    *slot(&mut self.threads.awaiting_caller, r.thread) = Some((true, r.ptr));
                }
                Change::Physical { device }
            }
            PhysRelease if r.status == 0 && self.framework_physical.remove(&r.ptr).is_some() => {
                Change::Other
            }
            PhysRelease if r.status == 0 => match self.physical.remove(&r.ptr) {
                Some(l) => {
                    self.sub_bytes(l.device, l.size);
                    self.add_physical(l.device, l.size, false);
                    Change::Physical { device: l.device }
                }
                None => {
                    self.unmatched_frees += 1;
                    Change::Other
                }
            },
            _ => return None,
        })
    }

    /// Segments taken and given back: the framework's (reserved memory; its `cudaMalloc` is no
    /// longer the program's) and the shim's pool's.
    pub(super) fn apply_segments(&mut self, r: &Record) -> Option<Change> {
        use RecordKind::*;
        Some(match r.kind {
            // A framework segment: the allocation the shim saw (a `cudaMalloc`) is reserved
            // memory, not something the program holds; an expandable segment's mapping claims
            // the physical memory the thread just created.
            SegmentReserve if r.api == Api::Torch => {
                let device = device_or_0(r.device);
                let change = match self.live.remove(&r.ptr) {
                    Some(l) => {
                        if let Some(c) = self.threads.counted_raw.get_mut(r.thread as usize)
                            && *c == Some(CountedRaw::Made(r.ptr))
                        {
                            *c = Some(CountedRaw::Claimed(l.stack));
                        }
                        self.sub_bytes(l.device, l.size);
                        self.undo_peak_of(r.ptr, false);
                        self.freed = l;
                        Change::Free { ptr: r.ptr }
                    }
                    None => {
                        let pending = self
                            .threads
                            .pending_physical
                            .get_mut(r.thread as usize)
                            .map(core::mem::take)
                            .unwrap_or_default();
                        for h in pending {
                            if let Some(l) = self.physical.remove(&h) {
                                self.sub_bytes(l.device, l.size);
                                self.undo_peak_of(h, true);
                                self.add_physical(l.device, l.size, false);
                                self.framework_physical.insert(h, (l.size, l.device));
                            }
                        }
                        Change::Physical { device }
                    }
                };
                let s = self.segments.entry(r.ptr).or_insert(Segment {
                    device,
                    framework: true,
                    pages: r.mapped_pages(),
                    ..Segment::default()
                });
                s.size = s.size.saturating_add(r.size);
                let v = self.reserved.entry(device).or_default();
                *v = v.saturating_add(r.size);
                change
            }
            SegmentRelease if r.api == Api::Torch => {
                let device = device_or_0(r.device);
                if let Some(seg) = self.segments.get_mut(&r.ptr) {
                    seg.size = seg.size.saturating_sub(r.size);
                    if seg.size == 0 {
                        self.segments.remove(&r.ptr);
                    }
                }
                let v = self.reserved.entry(device).or_default();
                *v = v.saturating_sub(r.size);
                Change::Other
            }
            SegmentReserve => {
                self.pooled.insert(r.device);
                self.segments.insert(
                    r.ptr,
                    Segment {
                        size: r.size,
                        device: r.device,
                        framework: false,
                        pages: false,
                    },
                );
                {
                    let v = self.reserved.entry(r.device).or_default();
                    *v = v.saturating_add(r.size);
                }
                Change::Other
            }
            SegmentRelease => {
                self.segments.remove(&r.ptr);
                let v = self.reserved.entry(r.device).or_default();
                *v = v.saturating_sub(r.size);
                Change::Other
            }
            _ => return None,
        })
    }

    /// What the device and the framework said: NVML's figure, CUDA's pools, `cudaMemGetInfo`
    /// (the facts tracker's), whether tensors are recorded.
    pub(super) fn apply_facts(&mut self, r: &Record) -> Option<Change> {
        match r.kind {
            RecordKind::Tensors => {
                if r.size == 0 {
                    self.tensors.off = Some(r.ptr);
                }
                Some(Change::Other)
            }
            _ => self.facts.apply(r).then_some(Change::Other),
        }
    }

    /// What follows an allocation on its thread (its caller, its stack) and NVTX ranges.
    pub(super) fn apply_context(&mut self, r: &Record) -> Option<Change> {
        use RecordKind::*;
        Some(match r.kind {
            Caller => self.caller(r),
            StackRef => self.stack_ref(r),
            _ if self.ranges.apply(r, self.index) => Change::Other,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(kind: RecordKind, api: Api, ptr: u64, size: u64) -> Record {
        Record {
            kind,
            api,
            device: 0,
            status: 0,
            thread: 0,
            time_ns: 1,
            ptr,
            size,
            stream: 0,
        }
    }

    /// The framework's first segment, taken before the record that says its tensors are
    /// recorded, counts its call site; the tensor's own stack after it is the same call, and
    /// says so (`StackOfRaw`), as a later segment's stack does.
    #[test]
    fn a_call_is_counted_once_though_its_segment_came_before_the_tensors_were_known() {
        use Api::{CudaMalloc, Shim, Torch};
        use RecordKind::*;
        let (p, q, stack, other) = (0x7f00_0000_0000, 0x7f00_1000_0000, 0x18d, 0x2041);
        let mut rp = Replay::default();
        let mut changes = Vec::new();
        for r in [
            record(Alloc, CudaMalloc, p, 1 << 21),
            record(StackRef, Shim, stack, 3),
            record(Tensors, Torch, 0, 1),
            record(SegmentReserve, Torch, p, 1 << 21),
            record(TensorAlloc, Torch, p, 1 << 21),
            record(StackRef, Shim, stack, 3),
            // A later segment: its stack is the segment's, the tensor's counts.
            record(Alloc, CudaMalloc, q, 1 << 21),
            record(StackRef, Shim, other, 3),
            record(SegmentReserve, Torch, q, 1 << 21),
            record(TensorAlloc, Torch, q, 1 << 20),
            record(StackRef, Shim, other, 3),
            // The first call again, from the cache: counted.
            record(TensorAlloc, Torch, p + (1 << 20), 1 << 20),
            record(StackRef, Shim, stack, 3),
        ] {
            if r.kind == StackRef {
                changes.push(rp.apply(&r) == Change::StackOfRaw);
            } else {
                rp.apply(&r);
            }
        }
        assert_eq!(changes, [false, true, true, false, false]);
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// The VMM bytes kept per device are what the physical allocations live sum to, as
        /// handles are created, released, replaced and claimed by the framework's segments.
        #[test]
        fn the_physical_bytes_kept_are_the_sum_of_the_handles_live(
            ops in proptest::collection::vec((0u8..4, 0u64..8, 0u8..2, 1u64..1 << 40), 0..300),
        ) {
            let mut rp = Replay::default();
            for (n, &(op, handle, device, size)) in ops.iter().enumerate() {
                let (kind, api, ptr) = match op {
                    0 => (RecordKind::PhysCreate, Api::CuMemCreate, handle),
                    1 => (RecordKind::PhysRelease, Api::CuMemRelease, handle),
                    2 => (RecordKind::SegmentReserve, Api::Torch, 0x7f00_0000_0000 + handle),
                    _ => (RecordKind::Alloc, Api::CudaMalloc, 0x7e00_0000_0000 + handle),
                };
                rp.apply(&Record {
                    kind,
                    api,
                    device,
                    status: 0,
                    thread: 0,
                    time_ns: n as u64,
                    ptr,
                    size,
                    stream: 0,
                });
                for d in 0..2u8 {
                    let sum = rp
                        .physical
                        .values()
                        .filter(|l| l.device == d)
                        .fold(0u64, |a, l| a.saturating_add(l.size));
                    prop_assert_eq!(rp.physical_bytes.get(&d).copied().unwrap_or(0), sum);
                }
            }
        }
    }
}
