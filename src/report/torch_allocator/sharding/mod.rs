//! A run that keeps the whole model on every rank (DDP, or one GPU) replayed as if its model
//! were sharded over `N` ranks as FSDP2 shards it (`gpushim fit --shard full|grad-op`):
//! `fully_shard` on each repeated block (a unit) and on the model (the root's unit: the
//! parameters outside the blocks). What that changes in one rank's requests, in the order
//! FSDP2's hooks make them (read from traces of FSDP2 on an H200, `docs/fit.md`):
//!
//! - **Shards.** Where `fully_shard` is applied (after the model's parameters are made) each
//!   block's parameters are cut, then the root's: a unit's shards made (`1/N` of each, rounded
//!   up; FSDP pads a parameter's first dimension to a multiple of `N`), then its whole
//!   parameters let go. Every optimizer state and optimizer temporary is a shard too. DDP's
//!   gradient buckets are not made.
//! - **Gathering.** Before a unit's forward its parameters are gathered whole (a request of
//!   each parameter's size) out of an all-gather output of the unit's bytes, made on a stream
//!   of its own. In the forward that output is held until the next unit's parameters are gathered
//!   (FSDP2 keeps the last all-gather's result), the last one's until the forward ends; in the
//!   backward it goes once copied out, and the next unit's all-gather is issued at once
//!   (FSDP2's backward prefetch), its output held until that unit gathers. `full`
//!   (`reshard_after_forward=True`) lets the gathered parameters go at the unit's forward end
//!   and gathers them again as its backward begins; `grad-op` keeps them.
//! - **Reduce-scatter.** Where a unit's backward ends, its gathered parameters go, a
//!   reduce-scatter input of its gradients' bytes is made (kept until the next unit's), its
//!   gradients go (they went at `zero_grad` in the run), and the rank's shard of them, `1/N`,
//!   is made on the reduce-scatter's stream: the rank's gradient, let go where the run let go
//!   of the unit's first gradient.
//!
//! A block's backward ends at the first request of an op made earlier in the forward (a lower
//! autograd sequence number), or of the optimizer; the root's where the step's backward ends.

mod units;

use super::checkpoint::Stacks;
use super::{Ev, Event, Input};
use crate::fasthash::FastMap;
use crate::report::kinds::{Kind, Phase};
use serde::Serialize;

/// What a `--shard` what-if sharded, said before the rows.
#[derive(Clone, Debug, Serialize)]
pub struct Sharded {
    /// `full` (resharded after the forward) or `grad-op` (kept to the backward).
    pub way: &'static str,
    /// The ranks the model is sharded over.
    pub world: u64,
    /// The block class whose blocks are units, the blocks a step, and those whose backward was
    /// found (the others are not gathered).
    pub class: String,
    pub per_step: usize,
    pub blocks: usize,
    pub with_backward: usize,
    /// A block's parameters, whole, and the rest (the root's unit).
    pub unit_bytes: u64,
    pub root_bytes: u64,
    /// The requests cut to `1/N` (parameters, optimizer state and temporaries) and their bytes
    /// in the run.
    pub sharded_requests: u64,
    pub sharded_bytes: u64,
    /// DDP's buckets, not made.
    pub dropped_requests: u64,
    pub dropped_bytes: u64,
    /// The gradients let go at their unit's reduce-scatter.
    pub gradients: u64,
}

/// What an event becomes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Keep,
    /// A request cut to `1/N`.
    Shard,
    /// Not made (a bucket, or a free that went before).
    Skip,
}

/// A request or free the what-if makes.
#[derive(Clone, Copy, Debug)]
struct Put {
    free: bool,
    ptr: u64,
    size: u64,
    stream: u16,
    /// The event whose device and stack it takes.
    like: usize,
}

/// What sharding changes in a run's events.
#[derive(Debug)]
pub struct Sharding {
    pub said: Sharded,
    act: Vec<Act>,
    /// Frees that let go of a unit's shard of the gradients instead: its address.
    frees_shard: FastMap<usize, u64>,
    /// What goes before an event (its index; the events' length for the end), in order.
    inserts: Vec<(usize, Put)>,
    /// The run's events so edited, made at the first replay and held for the rest.
    pub(super) edited: std::sync::OnceLock<Option<std::sync::Arc<super::replayer::Edited>>>,
}

/// The addresses the what-if's tensors take: no address CUDA gives.
const GATHERED: u64 = 1 << 62;

/// The address of unit `u`'s gathered parameter `p`.
fn gathered(u: u64, p: usize) -> u64 {
    GATHERED | (u & 0xff_ffff_ffff) << 16 | (p as u64 & 0xffff)
}

/// Each unit's parameters' sizes, as FSDP2 gathers them (one request each): a block's, and the
/// root's for units from `roots` up.
struct Params {
    block: Vec<u64>,
    root: Vec<u64>,
    roots: u64,
    /// The model's parameters' requests, in the order fully_shard cuts them.
    cut: Vec<usize>,
}

impl Params {
    fn of(&self, u: u64) -> &[u64] {
        if u >= self.roots {
            &self.root
        } else {
            &self.block
        }
    }
}
const ALL_GATHER: u64 = 1 << 62 | 1 << 56;
const SCATTER_INPUT: u64 = 1 << 62 | 2 << 56;
const SHARD: u64 = 1 << 62 | 3 << 56;
const PARAMETER: u64 = 1 << 62 | 4 << 56;

/// What happens at a place, in the order FSDP2's hooks do it (`rank` orders places at one
/// event).
#[derive(Clone, Copy, Debug)]
enum Hook {
    /// The unit's gathered parameters let go after its forward (`full`).
    Reshard(u64),
    /// A unit's backward over: its reduce-scatter (unit, its size, its gradients' list).
    PostBackward(u64, u64, usize),
    /// Where fully_shard is applied: the model's parameters cut to their shards.
    Cut,
    /// A step's forward over: the last all-gather's output let go.
    ForwardEnd,
    /// A step's backward over: what FSDP2 held of its last all-gather and reduce-scatter.
    StepEnd,
    /// A unit's parameters gathered (unit, its size, the pass it is in: the step's forward
    /// or backward, as `2 x step + 1` for a backward).
    Gather(u64, u64, usize),
}

impl Hook {
    fn rank(&self) -> u8 {
        match self {
            Hook::Cut | Hook::Reshard(_) | Hook::ForwardEnd => 0,
            Hook::PostBackward(..) => 1,
            Hook::StepEnd => 2,
            Hook::Gather(..) => 3,
        }
    }
}

impl Input {
    /// What sharding the run's model over `world` ranks changes (`reshard`: after the forward,
    /// as `full`); `Err` says why it cannot be told.
    pub fn sharding(&self, world: u64, reshard: bool) -> Result<Sharding, String> {
        if world < 2 {
            return Err("sharding over fewer than two ranks changes nothing".into());
        }
        let mut stacks = Stacks::new(&self.reader);
        let class = self.repeated_class(&mut stacks).map_err(|_| {
            "no module's forward runs more than once in a step among the run's frames (a run \
             without Python frames, or a model of no repeated blocks): the blocks fully_shard \
             would wrap cannot be told"
                .to_string()
        })?;
        let (blocks, per_step) = self.blocks_of(&class, &mut stacks);
        let steps = self.steps(&mut stacks);
        let frees = self.frees();
        let first_forward = steps.first().map_or(0, |s| s.forward);
        let initial = self.parameters(first_forward, &frees);
        let sizes: Vec<u64> = initial.iter().map(|&i| self.events[i].size).collect();
        let Some(found) = units::unit_sizes(&sizes, per_step) else {
            if self.from_checkpoint && sizes.is_empty() {
                return Err(
                    "the trace is a ring whose records begin after the model was \
                     built: the order its parameters were made in, which says a block's, is \
                     not in them (a run with a larger trace_max, or a shorter run, keeps it)"
                        .into(),
                );
            }
            return Err(format!(
                "the run's {} parameters do not repeat {per_step} times as its blocks of {} do \
                 (parameters made in one piece, or more than {} of them): a block's parameters \
                 cannot be told",
                sizes.len(),
                crate::fixedfmt::Escaped(class.as_bytes()),
                units::PARAMETERS_MOST
            ));
        };
        let (unit, root) = (units::total(&found.block), units::total(&found.root));
        let begins = self.backward_begins(&blocks, &mut stacks);
        let ends = self.backward_ends(&blocks, &begins, &mut stacks);
        let n = self.events.len();
        let mut said = Sharded {
            way: if reshard { "full" } else { "grad-op" },
            world,
            class,
            per_step,
            blocks: blocks.len(),
            with_backward: begins.iter().flatten().count(),
            unit_bytes: unit,
            root_bytes: root,
            sharded_requests: 0,
            sharded_bytes: 0,
            dropped_requests: 0,
            dropped_bytes: 0,
            gradients: 0,
        };
        let mut act = vec![Act::Keep; n];
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            match e.kind {
                Kind::Communication => {
                    act[i] = Act::Skip;
                    for &f in frees.get(&i).into_iter().flatten() {
                        act[f] = Act::Skip;
                    }
                    said.dropped_requests += 1;
                    said.dropped_bytes = said.dropped_bytes.saturating_add(e.size);
                }
                // The model's parameters are cut where FSDP2 is applied (below); one made later
                // is made a shard.
                Kind::Parameter if i < first_forward => {}
                Kind::Parameter | Kind::OptimizerState => act[i] = Act::Shard,
                Kind::Temporary if stacks.of(e.stack).0 == Phase::Optimizer => act[i] = Act::Shard,
                _ => {}
            }
            if act[i] == Act::Shard {
                said.sharded_requests += 1;
                said.sharded_bytes = said.sharded_bytes.saturating_add(e.size);
            }
        }
        // Each unit's backward: (begin, end, unit); blocks first, then each step's root.
        let mut windows: Vec<(usize, usize, u64)> = Vec::new();
        let mut hooks: Vec<(usize, Hook)> = Vec::new();
        let roots = blocks.len() as u64;
        for (s, step) in steps.iter().enumerate() {
            let Some(backward) = step.backward.filter(|_| root > 0) else {
                continue;
            };
            let u = roots + s as u64;
            hooks.push((step.forward, Hook::Gather(u, root, 2 * s)));
            if reshard {
                hooks.push((backward, Hook::Reshard(u)));
                hooks.push((backward, Hook::Gather(u, root, 2 * s + 1)));
            }
            windows.push((backward, step.end, u));
        }
        for (k, b) in blocks.iter().enumerate() {
            let (Some(begin), Some(&first)) = (begins[k], b.allocs.first()) else {
                continue;
            };
            let s = steps
                .partition_point(|s| s.forward <= first)
                .saturating_sub(1);
            hooks.push((first, Hook::Gather(k as u64, unit, 2 * s)));
            if reshard {
                hooks.push((b.end, Hook::Reshard(k as u64)));
                hooks.push((begin, Hook::Gather(k as u64, unit, 2 * s + 1)));
            }
            windows.push((begin, ends[k], k as u64));
        }
        // Each gradient of the backward to the innermost unit whose backward holds it: the
        // block whose backward last began before it, if not yet over, else its step's root.
        // Blocks' backwards do not overlap, and each lies in its step's: two searches.
        let mut grads: Vec<Vec<usize>> = vec![Vec::new(); windows.len()];
        let (mut blocks_by_begin, mut roots_by_begin): (Vec<usize>, Vec<usize>) =
            (0..windows.len()).partition(|&w| windows[w].2 < roots);
        blocks_by_begin.sort_by_key(|&w| windows[w].0);
        roots_by_begin.sort_by_key(|&w| windows[w].0);
        let last_begun = |by: &[usize], i: usize| {
            let at = by.partition_point(|&w| windows[w].0 <= i);
            at.checked_sub(1)
                .map(|a| by[a])
                .filter(|&w| i < windows[w].1)
        };
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private || e.kind != Kind::Gradient {
                continue;
            }
            let owner = last_begun(&blocks_by_begin, i).or_else(|| last_begun(&roots_by_begin, i));
            if let Some(w) = owner {
                grads[w].push(i);
            }
        }
        for (w, &(_, end, u)) in windows.iter().enumerate() {
            let size = if u >= roots { root } else { unit };
            hooks.push((end, Hook::PostBackward(u, size, w)));
        }
        for step in steps.iter().filter(|s| s.backward.is_some()) {
            hooks.push((step.end, Hook::StepEnd));
            if let Some(b) = step.backward {
                hooks.push((b, Hook::ForwardEnd));
            }
        }
        // At one event: a block's reduce-scatter before its root's (the root's backward holds
        // the blocks').
        hooks.sort_by_key(|(i, h)| {
            let root = matches!(h, Hook::PostBackward(u, ..) if *u >= roots);
            (*i, h.rank(), root)
        });
        let mut sharding = Sharding {
            said,
            act,
            frees_shard: FastMap::default(),
            inserts: Vec::new(),
            edited: Default::default(),
        };
        // Where fully_shard is applied (after the model's parameters are made): each block's
        // parameters cut, then the root's, each shard made and the whole let go.
        let mut cut: Vec<usize> = found.blocks.clone().map(|j| initial[j]).collect();
        cut.extend(
            (0..initial.len())
                .filter(|j| !found.blocks.contains(j))
                .map(|j| initial[j]),
        );
        if let Some(&last) = initial.iter().max() {
            hooks.push((last + 1, Hook::Cut));
            hooks.sort_by_key(|(i, h)| {
                let root = matches!(h, Hook::PostBackward(u, ..) if *u >= roots);
                (*i, h.rank(), root)
            });
        }
        for &i in &cut {
            sharding.said.sharded_requests += 1;
            sharding.said.sharded_bytes = sharding
                .said
                .sharded_bytes
                .saturating_add(self.events[i].size);
        }
        let params = Params {
            block: found.block,
            root: found.root,
            roots,
            cut,
        };
        sharding.place(self, &hooks, (&grads, &params), &frees);
        Ok(sharding)
    }
}

impl Sharding {
    /// The what-if's requests and frees for `hooks` (in order), each unit's gradients `grads`.
    fn place(
        &mut self,
        input: &Input,
        hooks: &[(usize, Hook)],
        (grads, params): (&[Vec<usize>], &Params),
        frees: &FastMap<usize, Vec<usize>>,
    ) {
        let events = &input.events;
        let top = events.iter().map(|e| e.stream).max().unwrap_or(0);
        let (gather_stream, scatter_stream) = (top.saturating_add(1), top.saturating_add(2));
        let world = self.said.world;
        // The all-gather output and the reduce-scatter input FSDP2 holds (their addresses).
        let (mut all_gather, mut scatter): (Option<u64>, Option<u64>) = (None, None);
        let mut serial = 0u64;
        let like_at = |i: usize| i.min(events.len().saturating_sub(1));
        for (h, &(i, hook)) in hooks.iter().enumerate() {
            let like = like_at(i);
            let stream = events.get(like).map_or(0, |e| e.stream);
            let mut put = |free: bool, ptr: u64, size: u64, stream: u16| {
                self.inserts.push((
                    i,
                    Put {
                        free,
                        ptr,
                        size,
                        stream,
                        like,
                    },
                ))
            };
            match hook {
                Hook::Cut => {
                    // A unit at a time (each block's, then the root's): its shards made, then
                    // its whole parameters let go.
                    let per_unit = params.block.len().max(1);
                    let blocks = params.cut.len() - params.root.len();
                    let mut units: Vec<&[usize]> = params.cut[..blocks].chunks(per_unit).collect();
                    units.push(&params.cut[blocks..]);
                    for unit in units {
                        for &a in unit {
                            let e = &events[a];
                            let ptr = PARAMETER | (a as u64 & 0xff_ffff_ffff_ffff);
                            put(false, ptr, e.size.div_ceil(world), e.stream);
                            // The whole parameter's own free lets go of its shard.
                            for &f in frees.get(&a).into_iter().flatten() {
                                self.frees_shard.insert(f, ptr);
                            }
                        }
                        for &a in unit {
                            put(true, events[a].ptr, 0, events[a].stream);
                        }
                    }
                }
                Hook::Reshard(u) => {
                    for p in 0..params.of(u).len() {
                        put(true, gathered(u, p), 0, stream);
                    }
                }
                Hook::Gather(u, size, pass) => {
                    let backward = pass % 2 == 1;
                    // Its all-gather's output: issued before (prefetched in the backward), or
                    // now.
                    let output = match all_gather.take() {
                        Some(ptr) if backward => ptr,
                        held => {
                            serial += 1;
                            put(false, ALL_GATHER | serial, size, gather_stream);
                            all_gather = held;
                            ALL_GATHER | serial
                        }
                    };
                    for (p, &bytes) in params.of(u).iter().enumerate() {
                        put(false, gathered(u, p), bytes, stream);
                    }
                    if !backward {
                        // The forward: the unit before's output goes, this one's is held.
                        if let Some(ptr) = all_gather.replace(output) {
                            put(true, ptr, 0, gather_stream);
                        }
                        continue;
                    }
                    put(true, output, 0, gather_stream);
                    // The next unit's all-gather issued, where it is in the same backward.
                    let next = hooks[h + 1..].iter().find_map(|(_, h)| match h {
                        Hook::Gather(_, size, p) => Some((*size, *p)),
                        _ => None,
                    });
                    if let Some((size, _)) = next.filter(|n| n.1 == pass) {
                        serial += 1;
                        put(false, ALL_GATHER | serial, size, gather_stream);
                        all_gather = Some(ALL_GATHER | serial);
                    }
                }
                Hook::ForwardEnd => {
                    if let Some(ptr) = all_gather.take() {
                        put(true, ptr, 0, gather_stream);
                    }
                }
                Hook::StepEnd => {
                    if let Some(ptr) = all_gather.take() {
                        put(true, ptr, 0, gather_stream);
                    }
                    if let Some(ptr) = scatter.take() {
                        put(true, ptr, 0, stream);
                    }
                }
                Hook::PostBackward(u, size, w) => {
                    for p in 0..params.of(u).len() {
                        put(true, gathered(u, p), 0, stream);
                    }
                    // The gradients whose free comes after: let go here, their frees moved.
                    let moved: Vec<usize> = grads[w]
                        .iter()
                        .copied()
                        .filter(|g| frees.get(g).and_then(|f| f.first()).is_none_or(|&f| f >= i))
                        .collect();
                    let bytes = moved
                        .iter()
                        .fold(0u64, |a, &g| a.saturating_add(events[g].size));
                    if let Some(ptr) = scatter.take() {
                        put(true, ptr, 0, stream);
                    }
                    serial += 1;
                    let input_bytes = if moved.is_empty() { size } else { bytes };
                    put(false, SCATTER_INPUT | serial, input_bytes, stream);
                    scatter = Some(SCATTER_INPUT | serial);
                    for &g in &moved {
                        put(true, events[g].ptr, 0, events[g].stream);
                    }
                    if moved.is_empty() {
                        continue;
                    }
                    let shard = bytes.div_ceil(world);
                    put(false, SHARD | u, shard, scatter_stream);
                    self.said.gradients += moved.len() as u64;
                    // The shard goes where the run let go of the first of them; the others'
                    // frees are gone (they went here).
                    let first = moved
                        .iter()
                        .copied()
                        .min_by_key(|g| frees.get(g).and_then(|f| f.first()).copied());
                    for &g in &moved {
                        for &f in frees.get(&g).into_iter().flatten() {
                            if Some(g) == first {
                                self.frees_shard.insert(f, SHARD | u);
                            } else {
                                self.act[f] = Act::Skip;
                            }
                        }
                    }
                }
            }
        }
    }

    /// A shard's bytes of a whole request's `size` (rounded up).
    fn shard_size(&self, size: u64) -> u64 {
        size.div_ceil(self.said.world.max(1))
    }

    /// What goes before event `i` of `events` (at `at`; `events.len()` for the end), appended
    /// to `out`.
    pub(super) fn insert_before(&self, events: &[Event], i: usize, at: u64, out: &mut Vec<Event>) {
        let from = self.inserts.partition_point(|(j, _)| *j < i);
        for (_, p) in self.inserts[from..].iter().take_while(|(j, _)| *j == i) {
            let Some(like) = events.get(p.like) else {
                continue;
            };
            let mut e = *like;
            (e.ptr, e.size, e.stream, e.time_ns) = (p.ptr, p.size, p.stream, at);
            (e.sequence, e.optional, e.private) = (0, false, false);
            if p.free {
                e.ev = Ev::Free;
                e.size = 0;
            } else {
                e.ev = Ev::Alloc;
                // The rank's shard of the gradients is a gradient, a parameter's shard a
                // parameter; the rest FSDP's own buffers.
                e.kind = match p.ptr >> 56 {
                    t if t == SHARD >> 56 => Kind::Gradient,
                    t if t == PARAMETER >> 56 => Kind::Parameter,
                    _ => Kind::Communication,
                };
            }
            out.push(e);
        }
    }

    /// Event `i` as the what-if makes it: `None` where it is not made; a request cut to its
    /// shard; a gradient's free that lets go of its unit's shard instead.
    pub(super) fn edit(&self, i: usize, e: &Event) -> Option<Event> {
        let mut e = *e;
        match self.act.get(i).copied().unwrap_or(Act::Keep) {
            Act::Skip => return None,
            Act::Shard if e.ev == Ev::Alloc => e.size = self.shard_size(e.size),
            _ => {}
        }
        if let Some(&ptr) = self.frees_shard.get(&i) {
            e.ptr = ptr;
        }
        Some(e)
    }
}
