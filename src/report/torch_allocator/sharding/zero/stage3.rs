//! ZeRO-3 (`gpushim fit --shard zero3`): what DeepSpeed's `DeepSpeedZeroOptimizer_Stage3`
//! (`runtime/zero/stage3.py`, `partition_parameters.py`, 0.19) changes in one rank's requests
//! beyond ZeRO-2's, DeepSpeed's defaults, fp32, read from traces of ZeRO-3 on an H200:
//!
//! - **At its start**: every parameter of more than `stage3_param_persistence_threshold`
//!   (1e5) elements let go (the smaller ones are kept whole on every rank); each parameter's
//!   partition (`ceil(numel / N)` elements) in one flat buffer, the fp32 master copy of it and
//!   a zeroed copy let go at once; the gradient bucket (`reduce_bucket_size` elements, made
//!   once and kept for the run); the partition's gradients (the partition's size), kept;
//!   then every parameter gathered whole and let go, one at a time.
//! - **Each forward**: once the first step has recorded the order of the modules, DeepSpeed
//!   prefetches every parameter at the forward's start (the live-parameter limit and the
//!   reuse distance, 1e9 elements each, are above the whole model): flat buffers of about
//!   `stage3_prefetch_bucket_size` (5e7) elements gathered on a stream of their own, each
//!   parameter made whole out of its own, each flat buffer but the last let go once its
//!   parameters are out, the last at the forward's end.
//! - **Each backward**: each gradient copied into the bucket and let go as its hook runs, and
//!   the gathered parameter of its size let go there too (the module's backward is over);
//!   where the bucket would overflow, and after the last gradient, DeepSpeed's post-scaling
//!   copy of the bucket's gradients (`mul` by 1) on its reduce stream; the parameters no
//!   gradient matched let go at the backward's end.
//! - **Each step**: as ZeRO-2's, the partition's gradients kept.
//!
//! A model of more than 1e9 elements is refused: DeepSpeed then lets each module's parameters
//! go after its forward and gathers them again in the backward, which is not modelled.

use super::{ELEMENT, Zero};
use crate::fasthash::{FastMap, FastSet};
use crate::report::torch_allocator::sharding::{PARAMETER, SHARD};

/// DeepSpeed's `stage3_param_persistence_threshold`, `stage3_prefetch_bucket_size` and
/// `stage3_max_live_parameters` defaults (elements).
pub(super) const PERSISTENCE: u64 = 100_000;
const PREFETCH: u64 = 50_000_000;
pub(super) const LIVE_MOST: u64 = 1_000_000_000;

/// The partition's gradients (kept for the run).
const GRADS: u64 = SHARD | 0xff_ffff_ffff_fffe;

/// A parameter's partition over `world` ranks: `ceil(numel / world)` elements, in bytes.
pub(super) fn part_of(bytes: u64, world: u64) -> u64 {
    bytes
        .div_ceil(ELEMENT)
        .div_ceil(world.max(1))
        .saturating_mul(ELEMENT)
}

impl Zero<'_> {
    /// Whether parameter request `a` stays whole on every rank.
    fn persistent(&self, a: usize) -> bool {
        self.input.events[a].size <= PERSISTENCE.saturating_mul(ELEMENT)
    }

    /// Where DeepSpeed takes the model (after its parameters, `initial`, are made).
    pub(super) fn start3(&mut self, initial: &[usize]) {
        let Some(&last) = initial.iter().max() else {
            return;
        };
        let at = (last + 1, last);
        for &a in initial {
            if !self.persistent(a) {
                self.put((last + 1, a), true, self.input.events[a].ptr, 0);
                self.frees_to(a, None);
            }
        }
        let part = self.said.partition_bytes;
        let flat = self.next(PARAMETER);
        self.put(at, false, flat, part);
        let master = self.next(super::STATE);
        self.put(at, false, master, part);
        self.passing(at, super::STATE, part);
        let bucket = self.next(super::BUCKET);
        self.put(at, false, bucket, self.said.bucket_bytes);
        self.put(at, false, GRADS, part);
        for &a in initial {
            self.passing(at, PARAMETER, self.input.events[a].size);
        }
    }

    /// The parameters (`initial`, the persistent ones passed over) gathered on `stream` for
    /// the forward that begins at event `forward`, its backward beginning at `backward`: the
    /// addresses of their whole copies, by parameter. The flat buffers are all made at the
    /// forward's start; each parameter is copied out of its own, and each flat buffer but the
    /// last let go once its parameters are (the next ones take its place), the last at the
    /// forward's end.
    pub(super) fn gather(
        &mut self,
        forward: usize,
        backward: usize,
        initial: &[usize],
        stream: u16,
    ) -> Vec<(usize, u64)> {
        let at = (forward, forward);
        let world = self.said.world;
        let mut chunks: Vec<(u64, Vec<usize>)> = vec![(0, Vec::new())];
        for &a in initial.iter().filter(|&&a| !self.persistent(a)) {
            if chunks
                .last()
                .is_some_and(|c| c.0 >= PREFETCH.saturating_mul(ELEMENT))
            {
                chunks.push((0, Vec::new()));
            }
            if let Some(c) = chunks.last_mut() {
                let padded = part_of(self.input.events[a].size, world).saturating_mul(world);
                c.0 = c.0.saturating_add(padded);
                c.1.push(a);
            }
        }
        chunks.retain(|c| c.0 > 0);
        let flats: Vec<u64> = chunks
            .iter()
            .map(|&(bytes, _)| {
                let ptr = self.next(PARAMETER);
                self.edits.put(at, false, ptr, bytes, stream);
                ptr
            })
            .collect();
        let mut copies = Vec::new();
        for (k, (_, members)) in chunks.iter().enumerate() {
            for &a in members {
                let ptr = self.next(PARAMETER);
                self.edits
                    .put(at, false, ptr, self.input.events[a].size, stream);
                copies.push((a, ptr));
            }
            let last = k + 1 == chunks.len();
            let free_at = if last { (backward, backward) } else { at };
            self.edits.put(free_at, true, flats[k], 0, stream);
        }
        copies
    }

    /// One backward's gradients (each with where its hook runs): each copied into the bucket
    /// and let go, and the gathered parameter of its size (the latest made) let go with it;
    /// the rest of `copies` let go at `end`. Where the bucket would overflow, and after the
    /// last gradient, the bucket's gradients reduced: DeepSpeed's post-scaling copies them
    /// (`mul` by a factor of 1) on its reduce stream, `streams.1`; the copies are on
    /// `streams.0`.
    pub(super) fn backward3(
        &mut self,
        grads: &[(usize, usize)],
        copies: Vec<(usize, u64)>,
        end: usize,
        (gather, reduce): (u16, u16),
    ) {
        let mut by_size: FastMap<u64, Vec<u64>> = FastMap::default();
        for &(a, ptr) in &copies {
            by_size
                .entry(self.input.events[a].size)
                .or_default()
                .push(ptr);
        }
        let n = self.input.events.len();
        let mut held = 0u64;
        for &(g, hook) in grads {
            let e = self.input.events[g];
            let at = (hook.min(n), g);
            if held > 0 && held.saturating_add(e.size) > self.said.bucket_bytes {
                self.post_scale(at, held, reduce);
                held = 0;
            }
            held = held.saturating_add(e.size);
            self.put(at, true, e.ptr, 0);
            self.frees_to(g, None);
            self.said.gradients += 1;
            if let Some(ptr) = by_size.get_mut(&e.size).and_then(Vec::pop) {
                self.edits.put(at, true, ptr, 0, gather);
            }
        }
        if let Some(&(g, hook)) = grads.last() {
            self.post_scale((hook.min(n), g), held, reduce);
        }
        let left: FastSet<u64> = by_size.into_values().flatten().collect();
        let like = end.min(n.saturating_sub(1));
        for (_, ptr) in copies {
            if left.contains(&ptr) {
                self.edits.put((end, like), true, ptr, 0, gather);
            }
        }
    }

    /// The copy DeepSpeed's post-scaling makes of `bytes` of the bucket, on `stream`.
    fn post_scale(&mut self, at: (usize, usize), bytes: u64, stream: u16) {
        if bytes > 0 {
            let ptr = self.next(super::TEMPORARY);
            self.edits.put(at, false, ptr, bytes, stream);
            self.edits.put(at, true, ptr, 0, stream);
        }
    }
}
