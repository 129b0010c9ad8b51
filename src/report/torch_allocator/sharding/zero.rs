//! A run that keeps the whole model on every rank (DDP, or one GPU) replayed as if DeepSpeed's
//! ZeRO-1 or ZeRO-2 held it over `N` ranks (`gpushim fit --shard zero1|zero2`), DeepSpeed's
//! defaults (`contiguous_gradients`, no `overlap_comm`, `reduce_bucket_size` 5e8 elements),
//! fp32. What that changes in one rank's requests, in the order DeepSpeed's
//! `DeepSpeedZeroOptimizer` (`runtime/zero/stage_1_and_2.py`, 0.19) makes them, read from
//! traces of ZeRO-1 and ZeRO-2 on an H200 (the two make nearly the same requests; ZeRO-1 held
//! a few MiB more at some peaks):
//!
//! - **At its start** (where the model's parameters are all made): one flat buffer of them
//!   all, whole on every rank (aligned to `2 N` elements), then each parameter let go (they
//!   are views of it from then on); the fp32 master copy of the rank's partition (`1/N` of
//!   the flat buffer), kept; a zeroed gradient of the partition's size, let go at once.
//! - **Each backward**: at the first gradient's hook, the gradient bucket
//!   (`reduce_bucket_size` elements); every gradient copied into it and let go as its hook
//!   runs (once the node that made it has returned and let go of its inputs); where the
//!   bucket would overflow, and after the frees that follow the last gradient, the bucket's
//!   gradients flattened (a temporary of their bytes) and the rank's part copied into the
//!   partition's gradients (made at the first such copy: every parameter that reaches into
//!   the partition, whole); the bucket let go at the backward's end.
//! - **Each step**: the gradients' norm, a parameter of the partition at a time in fp64 (twice
//!   its bytes in the partition); the partition's fp32 gradient made (`1/N`) and the
//!   partition's gradients let go; the client optimizer's step on the one master tensor, so
//!   each state and each temporary of a line of the optimizer is one tensor of `1/N` of what
//!   the run's optimizer made at that line over all the parameters; the fp32 gradient let go
//!   after the optimizer's last free.
//!
//! DDP's buckets, and its broadcast of the parameters at its start, are not made. The
//! partition is the run's rank's (its header's, else 0). ZeRO-3 (`--shard zero3`) goes the same
//! walk with its own start, gathers and backward (`zero/stage3.rs`).

use super::{Act, BUCKET, Edits, PARAMETER, SHARD, STATE, Sharding, TEMPORARY, ZeroSaid};
use crate::fasthash::FastMap;
use crate::report::kinds::{Kind, Phase};
use crate::report::torch_allocator::checkpoint::Stacks;
use crate::report::torch_allocator::{Ev, Input};

mod stage3;

/// The flat buffer's and the partition's gradients' addresses (the rest take a tag of
/// `super`'s and a serial number).
const FLAT: u64 = PARAMETER | 0xff_ffff_ffff_ffff;
const PARTITION_GRADS: u64 = SHARD | 0xff_ffff_ffff_ffff;

/// DeepSpeed's default `reduce_bucket_size` (elements), fp32's 4 bytes each.
pub const BUCKET_ELEMENTS: u64 = 500_000_000;
const ELEMENT: u64 = 4;
/// The most gathers of a parameter (parameters times steps) a ZeRO-3 what-if makes (each
/// is an edit held for the replay).
const GATHERS_MOST: usize = 1 << 22;
/// The most parameters whose norms a step's edits take one at a time (each step's requests
/// would otherwise grow with the steps times the parameters).
const NORMS_MOST: usize = 1024;

/// The walk over the run's events: where ZeRO's requests and frees go.
struct Zero<'a> {
    input: &'a Input,
    frees: &'a FastMap<usize, Vec<usize>>,
    edits: Edits,
    said: ZeroSaid,
    serial: u64,
    /// The gradients' norm a step takes, a parameter of the partition at a time: the bytes of
    /// each there (past [`NORMS_MOST`] parameters, the largest alone).
    norms: Vec<u64>,
    /// The partition's gradients, while made.
    partition_grads: bool,
}

impl Zero<'_> {
    fn next(&mut self, tag: u64) -> u64 {
        self.serial += 1;
        tag | self.serial
    }

    /// A request (`free`: a free) of `ptr` before event `at`, like event `like`.
    fn put(&mut self, (at, like): (usize, usize), free: bool, ptr: u64, size: u64) {
        let stream = self.input.events[like].stream;
        self.edits.put((at, like), free, ptr, size, stream);
    }

    /// A request and its free at once, before event `at`.
    fn passing(&mut self, at: (usize, usize), tag: u64, size: u64) {
        let ptr = self.next(tag);
        self.put(at, false, ptr, size);
        self.put(at, true, ptr, 0);
    }

    /// Event `a`'s frees not made; the first, if `to`, lets go of `to` instead.
    fn frees_to(&mut self, a: usize, to: Option<u64>) {
        let frees = self.frees;
        for (k, &f) in frees.get(&a).into_iter().flatten().enumerate() {
            match to.filter(|_| k == 0) {
                Some(ptr) => {
                    self.edits.frees_shard.insert(f, ptr);
                }
                None => self.edits.act[f] = Act::Skip,
            }
        }
    }

    /// Where DeepSpeed takes the model (after its parameters, `initial`, are made).
    fn start(&mut self, initial: &[usize]) {
        let Some(&last) = initial.iter().max() else {
            return;
        };
        let at = (last + 1, last);
        self.put(at, false, FLAT, self.said.flat_bytes);
        for (k, &a) in initial.iter().enumerate() {
            self.put((last + 1, a), true, self.input.events[a].ptr, 0);
            self.frees_to(a, (k == 0).then_some(FLAT));
        }
        let master = self.next(STATE);
        self.put(at, false, master, self.said.partition_bytes);
        self.passing(at, STATE, self.said.partition_bytes);
    }

    /// The bucket's gradients (`bytes`) reduced: flattened, and the rank's part copied into
    /// the partition's gradients, made at the first copy.
    fn reduce(&mut self, at: (usize, usize), bytes: u64) {
        if bytes > 0 {
            self.passing(at, TEMPORARY, bytes);
        }
        if !self.partition_grads {
            self.put(
                at,
                false,
                PARTITION_GRADS,
                self.said.partition_gradient_bytes,
            );
            self.partition_grads = true;
        }
    }

    /// One backward's gradients (their requests, in order, each with where its hook runs):
    /// each let go into the bucket as its hook runs; the bucket reduced and let go after the
    /// last.
    fn backward(&mut self, grads: &[(usize, usize)]) {
        let bucket_bytes = self.said.bucket_bytes;
        let bucket = self.next(BUCKET);
        let mut held = 0u64;
        for (k, &(g, hook)) in grads.iter().enumerate() {
            let e = self.input.events[g];
            let at = (hook, g);
            if k == 0 {
                self.put(at, false, bucket, bucket_bytes);
            }
            if held > 0 && held.saturating_add(e.size) > bucket_bytes {
                self.reduce(at, held);
                held = 0;
            }
            held = held.saturating_add(e.size);
            self.put(at, true, e.ptr, 0);
            self.frees_to(g, None);
            self.said.gradients += 1;
        }
        if let Some(&(g, hook)) = grads.last() {
            let at = (hook, g);
            self.reduce(at, held);
            self.put(at, true, bucket, 0);
        }
    }

    /// The optimizer's step beginning at event `begin`, over before event `end`: the norm, the
    /// partition's fp32 gradient made, the partition's gradients let go; the fp32 gradient let
    /// go at `end`.
    fn step(&mut self, begin: usize, end: usize) {
        let at = (begin, begin);
        for k in 0..self.norms.len() {
            let fp64 = self.norms[k].saturating_mul(2);
            self.passing(at, TEMPORARY, fp64);
        }
        let fp32 = self.next(TEMPORARY);
        self.put(at, false, fp32, self.said.partition_bytes);
        if self.partition_grads {
            self.put(at, true, PARTITION_GRADS, 0);
            self.partition_grads = false;
        }
        let like = end.min(self.input.events.len() - 1);
        self.put((end, like), true, fp32, 0);
    }

    /// The optimizer's requests of one line (`members`, in order; state or temporaries) made
    /// one tensor of `1/N` of their bytes, where the first was made and let go where the first
    /// was let go.
    fn one_of(&mut self, members: &[usize], tag: u64) {
        let Some(&first) = members.first() else {
            return;
        };
        let bytes = members
            .iter()
            .fold(0u64, |a, &m| a.saturating_add(self.input.events[m].size));
        let ptr = self.next(tag);
        self.put((first, first), false, ptr, bytes.div_ceil(self.said.world));
        for &m in members {
            self.edits.act[m] = Act::Skip;
            self.frees_to(m, (m == first).then_some(ptr));
        }
        if tag == STATE {
            self.said.states += 1;
        }
    }
}

impl Input {
    /// What DeepSpeed's ZeRO-1 or ZeRO-2 (`stage`, its gradient bucket `bucket` elements) over
    /// `world` ranks changes for rank `rank`; `Err` says why it cannot be told.
    pub fn zero_sharding(
        &self,
        world: u64,
        rank: u64,
        (stage, bucket): (u8, u64),
    ) -> Result<Sharding, String> {
        if world < 2 {
            return Err("sharding over fewer than two ranks changes nothing".into());
        }
        let mut stacks = Stacks::new(&self.tables);
        let steps = self.steps(&mut stacks);
        let frees = self.frees();
        let first_forward = steps.first().map_or(0, |s| s.forward);
        let initial = self.parameters(first_forward, &frees);
        if initial.is_empty() {
            return Err(match self.from_checkpoint {
                true => "the trace is a ring whose records begin after the model was built: \
                         its parameters, which DeepSpeed flattens, are not in them (a run with \
                         a larger trace_max, or a shorter run, keeps them)"
                    .into(),
                false => "no parameter was made before the first forward: the parameters \
                          DeepSpeed flattens cannot be told"
                    .into(),
            });
        }
        let sizes: Vec<u64> = initial.iter().map(|&i| self.events[i].size).collect();
        let rank = rank.min(world - 1);
        let (flat, part, in_partition, whole) =
            partition(&sizes, steps.len(), stage, (world, rank))?;
        let said = ZeroSaid {
            stage,
            rank,
            world,
            flat_bytes: flat,
            partition_bytes: part,
            partition_gradient_bytes: whole,
            bucket_elements: bucket,
            bucket_bytes: bucket.saturating_mul(ELEMENT),
            gradients: 0,
            states: 0,
        };
        let mut z = Zero {
            input: self,
            frees: &frees,
            edits: Edits::over(world),
            said,
            serial: 0,
            norms: match in_partition.len() {
                n if n <= NORMS_MOST => in_partition,
                _ => in_partition.iter().max().copied().into_iter().collect(),
            },
            partition_grads: false,
        };
        z.edits.act = vec![Act::Keep; self.events.len()];
        let mut sharding = Sharding::of_zero(world, stage);
        self.drop_buckets(&frees, &mut z.edits.act, &mut sharding.said);
        match stage {
            3 => z.start3(&initial),
            _ => z.start(&initial),
        }
        self.drop_broadcast(&initial, first_forward, &frees, &mut z.edits.act);
        let hooks = self.hooks();
        let gather_stream = self.events.iter().map(|e| e.stream).max().unwrap_or(0);
        let gather_stream = gather_stream.saturating_add(1);
        let streams = (gather_stream, gather_stream.saturating_add(1));
        for (s, step) in steps.iter().enumerate() {
            let forward_end = step.backward.unwrap_or(step.end);
            let copies =
                (stage == 3).then(|| z.gather(step.forward, forward_end, &initial, gather_stream));
            let Some(backward) = step.backward else {
                if let Some(copies) = copies {
                    z.backward3(&[], copies, step.end, streams);
                }
                continue;
            };
            let grads: Vec<(usize, usize)> = (backward..step.end)
                .filter(|&i| {
                    let e = &self.events[i];
                    e.ev == Ev::Alloc && !e.private && e.kind == Kind::Gradient
                })
                .map(|g| (g, hooks.get(&g).copied().unwrap_or(self.events.len())))
                .collect();
            match copies {
                Some(copies) => {
                    let end = grads.last().map_or(step.end, |&(_, hook)| hook);
                    z.backward3(&grads, copies, end, streams);
                }
                None => z.backward(&grads),
            }
            let next = steps.get(s + 1).map_or(self.events.len(), |n| n.forward);
            if step.end < next && self.phase_of(step.end, &mut stacks) == Phase::Optimizer {
                let end = self.optimizer_end(step.end, next, &frees, &mut stacks);
                z.step(step.end, end);
            }
        }
        // The optimizer's lines after the step's own requests at the same event (the norm and
        // the fp32 gradient come before the client optimizer's step).
        let (states, temporaries) = self.optimizer_lines(first_forward, &steps, &mut stacks);
        for members in states.values() {
            z.one_of(members, STATE);
        }
        for members in temporaries.values() {
            z.one_of(members, TEMPORARY);
        }
        z.edits.inserts.sort_by_key(|(i, _)| *i);
        sharding.edits = z.edits;
        sharding.said.gradients = z.said.gradients;
        sharding.said.zero = Some(z.said);
        Ok(sharding)
    }

    /// Where the hook of each gradient runs (by its request's index; the events' length where
    /// none comes): once the node that made it is done (its inputs let go), before the next
    /// request of another node (another autograd sequence number, or stack where there is
    /// none). One walk back over the events, holding the answer for gradients alone.
    fn hooks(&self) -> FastMap<usize, usize> {
        let n = self.events.len();
        let key = |e: &super::super::Event| match e.sequence {
            0 => (false, e.stack),
            s => (true, s),
        };
        let mut hooks = FastMap::default();
        // The next request after the one at hand, and where the hook of a tensor it made runs.
        let mut next: Option<(usize, usize)> = None;
        for i in (0..n).rev() {
            let e = &self.events[i];
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            let hook = match next {
                Some((j, _)) if key(&self.events[j]) != key(e) => j,
                Some((_, h)) => h,
                None => n,
            };
            if e.kind == Kind::Gradient {
                hooks.insert(i, hook);
            }
            next = Some((i, hook));
        }
        hooks
    }

    /// Where the optimizer's step that begins at request `begin` is over: after its last
    /// request and the last free of one, before the first request of another phase (or
    /// `next`, the next step's forward).
    fn optimizer_end(
        &self,
        begin: usize,
        next: usize,
        frees: &FastMap<usize, Vec<usize>>,
        stacks: &mut Stacks<'_>,
    ) -> usize {
        let mut end = begin + 1;
        for i in begin..next {
            let e = &self.events[i];
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            if self.phase_of(i, stacks) != Phase::Optimizer {
                break;
            }
            end = end.max(i + 1);
            let freed = frees.get(&i).into_iter().flatten().filter(|&&f| f < next);
            end = freed.fold(end, |a, &f| a.max(f + 1));
        }
        end.min(next)
    }

    /// Request `i`'s phase, by its stack.
    fn phase_of(&self, i: usize, stacks: &mut Stacks<'_>) -> Phase {
        stacks.of(self.events[i].stack).0
    }

    /// The optimizer's requests by line: its state made after the first forward (by stack),
    /// and its temporaries (by step and stack), each in order.
    #[allow(clippy::type_complexity)]
    fn optimizer_lines(
        &self,
        first_forward: usize,
        steps: &[super::units::Step],
        stacks: &mut Stacks<'_>,
    ) -> (FastMap<u64, Vec<usize>>, FastMap<(usize, u64), Vec<usize>>) {
        let (mut states, mut temporaries): (FastMap<u64, Vec<usize>>, FastMap<_, Vec<usize>>) =
            Default::default();
        for (i, e) in self.events.iter().enumerate().skip(first_forward) {
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            match e.kind {
                Kind::OptimizerState => states.entry(e.stack).or_default().push(i),
                Kind::Temporary if stacks.of(e.stack).0 == Phase::Optimizer => {
                    let s = steps.partition_point(|s| s.forward <= i);
                    temporaries.entry((s, e.stack)).or_default().push(i);
                }
                _ => {}
            }
        }
        (states, temporaries)
    }
}

/// ZeRO-`stage`'s flat buffer over `world` ranks, rank `rank`'s partition of it, the bytes of
/// each parameter in the partition (its norms) and of those reaching into it, whole, from the
/// parameters' `sizes`; `Err` for a ZeRO-3 model past what is modelled (over `steps` steps).
fn partition(
    sizes: &[u64],
    steps: usize,
    stage: u8,
    (world, rank): (u64, u64),
) -> Result<(u64, u64, Vec<u64>, u64), String> {
    let total = sizes.iter().fold(0u64, |a, &s| a.saturating_add(s));
    Ok(match stage {
        3 => {
            let gathers = sizes.len().saturating_mul(steps);
            if total / ELEMENT > stage3::LIVE_MOST || gathers > GATHERS_MOST {
                return Err(format!(
                    "ZeRO-3 is modelled for a model of at most {} elements gathered at \
                     most {GATHERS_MOST} times over the run (this one: {} elements, {} \
                     parameters over {} steps): past DeepSpeed's live-parameter limit it \
                     gathers each module's parameters again in the backward, which is not \
                     modelled; trace the job under ZeRO-3 once (a shorter run for the \
                     count) and ask that run with --world-size",
                    stage3::LIVE_MOST,
                    total / ELEMENT,
                    sizes.len(),
                    steps
                ));
            }
            let parts: Vec<u64> = sizes.iter().map(|&s| stage3::part_of(s, world)).collect();
            let part = parts.iter().fold(0u64, |a, &p| a.saturating_add(p));
            (part.saturating_mul(world), part, parts, part)
        }
        _ => {
            let align = ELEMENT.saturating_mul(2).saturating_mul(world);
            let flat = total.div_ceil(align).saturating_mul(align);
            let part = flat / world;
            let (lo, hi) = (part.saturating_mul(rank), part.saturating_mul(rank + 1));
            let (mut in_partition, mut whole, mut offset) = (Vec::new(), 0u64, 0u64);
            for &s in sizes {
                let (a, b) = (offset, offset.saturating_add(s));
                if b > lo && a < hi {
                    in_partition.push(b.min(hi) - a.max(lo));
                    whole = whole.saturating_add(s);
                }
                offset = b;
            }
            (flat, part, in_partition, whole)
        }
    })
}
