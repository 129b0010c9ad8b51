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
//!   gradient buckets are not made, nor the buffer it broadcasts the model's states through
//!   as it wraps the model (FSDP2 makes neither).
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

mod broadcast;
mod buckets;
mod buffers;
mod gathers;
mod place;
mod units;
mod zero;

pub use broadcast::Broadcast;
pub use buckets::Bucket;
pub use gathers::Role;
pub use zero::BUCKET_ELEMENTS;

use units::Params;

use super::checkpoint::{Checkpointed, Stacks};
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
    /// DDP's own buffers (its gradient buckets, its broadcast of the model's states as it
    /// wraps it), not made.
    pub dropped_requests: u64,
    pub dropped_bytes: u64,
    /// The gradients let go at their unit's reduce-scatter (ZeRO: into its bucket).
    pub gradients: u64,
    /// Buffers made among the parameters (taking no gradient: a batch norm's running
    /// statistics), left whole as FSDP2 leaves them, and their bytes; 0 where the blocks were
    /// told without passing over any.
    #[serde(skip_serializing_if = "is_zero")]
    pub buffers: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub buffer_bytes: u64,
    /// The root's parameters whose gradients a broadcast's backward made, kept whole on every
    /// rank as FSDP2 keeps one of first dimension 1 (`broadcast.rs`).
    #[serde(skip_serializing_if = "Broadcast::is_none")]
    pub broadcast: Broadcast,
    /// DeepSpeed's ZeRO-1 or ZeRO-2 (`--shard zero1|zero2`), not FSDP2: what it made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero: Option<ZeroSaid>,
}

/// What a `--shard zero1|zero2` what-if made of the run (`zero.rs`).
#[derive(Clone, Debug, Serialize)]
pub struct ZeroSaid {
    pub stage: u8,
    /// The rank whose partition it is, of `world`.
    pub rank: u64,
    pub world: u64,
    /// The flat buffer of the parameters (whole), the rank's partition of it (the fp32 master
    /// copy's bytes, and each optimizer state's), and the partition's gradients (every
    /// parameter reaching into the partition, whole).
    pub flat_bytes: u64,
    pub partition_bytes: u64,
    pub partition_gradient_bytes: u64,
    /// The gradient bucket made in each backward: `reduce_bucket_size` (elements) and bytes.
    pub bucket_elements: u64,
    pub bucket_bytes: u64,
    /// The gradients let go into the bucket as made, and the optimizer's lines of state made
    /// one tensor of the partition.
    pub gradients: u64,
    pub states: u64,
}

/// How `--shard` shards: FSDP2 (resharding after the forward or not), or DeepSpeed's ZeRO-1 or
/// ZeRO-2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    Fsdp2 {
        reshard: bool,
    },
    /// ZeRO's stage, and its `reduce_bucket_size` (elements).
    Zero {
        stage: u8,
        bucket: u64,
    },
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

/// What a what-if does to a run's events before they are replayed: requests cut to a shard or
/// not made, frees moved to a shard, requests and frees put in.
#[derive(Debug, Default)]
pub struct Edits {
    /// The ranks a request cut to its shard is cut over.
    world: u64,
    act: Vec<Act>,
    /// Frees that let go of a unit's shard of the gradients instead: its address.
    frees_shard: FastMap<usize, u64>,
    /// What goes before an event (its index; the events' length for the end), in order.
    inserts: Vec<(usize, Put)>,
    /// The run's events so edited, made at the first replay and held for the rest.
    pub(super) edited: std::sync::OnceLock<Option<std::sync::Arc<super::replayer::Edited>>>,
}

/// A `--shard` what-if: what it sharded, and its edits of the run's events.
#[derive(Debug)]
pub struct Sharding {
    pub said: Sharded,
    pub edits: Edits,
}

/// The addresses the what-if's tensors take: no address CUDA gives, a tag in bits 56 to 62.
const GATHERED: u64 = 1 << 62;
const ALL_GATHER: u64 = 1 << 62 | 1 << 56;
const SCATTER_INPUT: u64 = 1 << 62 | 2 << 56;
const SHARD: u64 = 1 << 62 | 3 << 56;
const PARAMETER: u64 = 1 << 62 | 4 << 56;
/// ZeRO's (`zero.rs`): an optimizer state, a temporary, its gradient bucket.
const STATE: u64 = 1 << 62 | 5 << 56;
const TEMPORARY: u64 = 1 << 62 | 6 << 56;
const BUCKET: u64 = 1 << 62 | 7 << 56;
/// A 16-bit cast of a shard moved to its unit's all-gather (`gathers.rs`).
const CAST: u64 = 1 << 62 | 8 << 56;

/// The address of unit `u`'s gathered parameter `p`.
fn gathered(u: u64, p: usize) -> u64 {
    GATHERED | (u & 0xff_ffff_ffff) << 16 | (p as u64 & 0xffff)
}

/// What happens at a place, in the order FSDP2's hooks do it (`rank` orders places at one
/// event).
#[derive(Clone, Copy, Debug)]
enum Hook {
    /// The unit's gathered parameters let go after its forward (`full`).
    Reshard(u64),
    /// A unit's backward over: its reduce-scatter (unit, its backward's place among the
    /// backwards, whose gradients it reduces).
    PostBackward(u64, usize),
    /// Where fully_shard is applied: the model's parameters cut to their shards.
    Cut,
    /// A step's forward over: the last all-gather's output let go.
    ForwardEnd,
    /// A step's backward over: what FSDP2 held of its last all-gather and reduce-scatter.
    StepEnd,
    /// A unit's parameters gathered (unit, the pass it is in: the step's forward or backward,
    /// as `2 x step + 1` for a backward).
    Gather(u64, usize),
}

impl Hook {
    /// Its order among the hooks at one event; a block's reduce-scatter before its root's (the
    /// root's backward holds the blocks').
    fn rank(&self, roots: u64) -> (u8, bool) {
        match self {
            Hook::Cut | Hook::Reshard(_) | Hook::ForwardEnd => (0, false),
            Hook::PostBackward(u, _) => (1, *u >= roots),
            Hook::StepEnd => (2, false),
            Hook::Gather(..) => (3, false),
        }
    }
}

/// Each unit's backward: (where it begins, where it ends, the unit).
type Window = (usize, usize, u64);

impl Input {
    /// What sharding the run's model over `world` ranks changes (`reshard`: after the forward,
    /// as `full`); `Err` says why it cannot be told.
    pub fn sharding(&self, world: u64, reshard: bool) -> Result<Sharding, String> {
        if world < 2 {
            return Err("sharding over fewer than two ranks changes nothing".into());
        }
        let mut stacks = Stacks::new(&self.tables);
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
        let begins = self.backward_begins(&blocks, &mut stacks);
        let ends = self.backward_ends(&blocks, &begins, &mut stacks);
        let first = steps.first().and_then(|s| Some((s.backward?, s.end)));
        let found =
            self.block_units(&sizes, (&class, per_step), (&blocks, &begins, &ends), first)?;
        // Where fully_shard is applied (after the model's parameters are made): each block's
        // parameters cut, then the root's.
        let mut cut: Vec<usize> = found.places.iter().map(|&j| initial[j]).collect();
        cut.extend(found.root_places.iter().map(|&j| initial[j]));
        let mut params = Params {
            roots: blocks.len() as u64,
            cut,
            block: found.block,
            root: found.root,
            whole: Default::default(),
            whole_grads: Default::default(),
        };
        let mut sharding = Sharding::of(
            if reshard { "full" } else { "grad-op" },
            world,
            (class, per_step),
            (blocks.len(), begins.iter().flatten().count()),
            (
                params
                    .block
                    .iter()
                    .map(|b| units::total(b))
                    .max()
                    .unwrap_or(0),
                units::total(&params.root),
            ),
        );
        // The places in no unit: the buffers passed over.
        let cut_bytes = params
            .cut
            .iter()
            .fold(0u64, |a, &i| a.saturating_add(self.events[i].size));
        sharding.said.buffers = initial.len().saturating_sub(params.cut.len()) as u64;
        sharding.said.buffer_bytes = units::total(&sizes).saturating_sub(cut_bytes);
        sharding.edits.act = self.acts(first_forward, &frees, &mut stacks, &mut sharding.said);
        self.drop_broadcast(&initial, first_forward, &frees, &mut sharding.edits.act);
        for &i in &params.cut {
            let said = &mut sharding.said;
            said.sharded_requests += 1;
            said.sharded_bytes = said.sharded_bytes.saturating_add(self.events[i].size);
        }
        let (mut hooks, windows) = hooks_of(&steps, (&blocks, &begins, &ends), &params, reshard);
        if let Some(&last) = initial.iter().max() {
            hooks.push((last + 1, Hook::Cut));
        }
        hooks.sort_by_key(|(i, h)| (*i, h.rank(params.roots)));
        let grads = self.gradients_of(&windows, params.roots);
        let whole = self.keep_broadcast_whole(&mut params, (&grads, &windows), world);
        sharding.said.broadcast = whole;
        sharding.place(self, &hooks, (&grads, &params), &frees);
        Ok(sharding)
    }

    /// What each event of the run becomes: DDP's buckets (and their frees) not made; the
    /// optimizer's state and temporaries, and a parameter made after the first forward, cut to
    /// shards; counted in `said`.
    fn acts(
        &self,
        first_forward: usize,
        frees: &FastMap<usize, Vec<usize>>,
        stacks: &mut Stacks<'_>,
        said: &mut Sharded,
    ) -> Vec<Act> {
        let mut act = vec![Act::Keep; self.events.len()];
        self.drop_buckets(frees, &mut act, said);
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            match e.kind {
                // The model's parameters are cut where FSDP2 is applied; one made later is
                // made a shard.
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
        act
    }

    /// DDP's buckets (and their frees) not made, counted in `said`.
    fn drop_buckets(
        &self,
        frees: &FastMap<usize, Vec<usize>>,
        act: &mut [Act],
        said: &mut Sharded,
    ) {
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private || e.kind != Kind::Communication {
                continue;
            }
            act[i] = Act::Skip;
            for &f in frees.get(&i).into_iter().flatten() {
                act[f] = Act::Skip;
            }
            said.dropped_requests += 1;
            said.dropped_bytes = said.dropped_bytes.saturating_add(e.size);
        }
    }

    /// What DDP makes of the parameters at its start (its broadcast of them, made after they
    /// are and let go before the first forward), where its frames did not tell it for DDP's
    /// own buffer: not made.
    fn drop_broadcast(
        &self,
        initial: &[usize],
        first_forward: usize,
        frees: &FastMap<usize, Vec<usize>>,
        act: &mut [Act],
    ) {
        let after = initial.iter().max().map_or(0, |&i| i + 1);
        for i in after..first_forward.min(self.events.len()) {
            let e = &self.events[i];
            let gone = frees.get(&i).and_then(|f| f.first()).copied();
            if e.ev != Ev::Alloc || e.private || e.kind != Kind::Parameter {
                continue;
            }
            if gone.is_some_and(|f| f < first_forward) {
                act[i] = Act::Skip;
                for &f in frees.get(&i).into_iter().flatten() {
                    act[f] = Act::Skip;
                }
            }
        }
    }

    /// Each gradient of the backward to the innermost unit whose backward holds it (by its
    /// window's place in `windows`): the block whose backward last began before it, if not yet
    /// over, else its step's root. Blocks' backwards do not overlap, and each lies in its
    /// step's: two searches.
    fn gradients_of(&self, windows: &[Window], roots: u64) -> Vec<Vec<usize>> {
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
        grads
    }
}

/// The hooks of FSDP2 on each step's root and each block whose backward was found, and each
/// unit's backward (its window), unsorted.
fn hooks_of(
    steps: &[units::Step],
    (blocks, begins, ends): (&[Checkpointed], &[Option<usize>], &[usize]),
    params: &Params,
    reshard: bool,
) -> (Vec<(usize, Hook)>, Vec<Window>) {
    let (mut hooks, mut windows) = (Vec::new(), Vec::new());
    let root = !params.root.is_empty();
    for (s, step) in steps.iter().enumerate() {
        let Some(backward) = step.backward.filter(|_| root) else {
            continue;
        };
        let u = params.roots + s as u64;
        hooks.push((step.forward, Hook::Gather(u, 2 * s)));
        if reshard {
            hooks.push((backward, Hook::Reshard(u)));
            hooks.push((backward, Hook::Gather(u, 2 * s + 1)));
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
        hooks.push((first, Hook::Gather(k as u64, 2 * s)));
        if reshard {
            hooks.push((b.end, Hook::Reshard(k as u64)));
            hooks.push((begin, Hook::Gather(k as u64, 2 * s + 1)));
        }
        windows.push((begin, ends[k], k as u64));
    }
    for (w, &(_, end, u)) in windows.iter().enumerate() {
        hooks.push((end, Hook::PostBackward(u, w)));
    }
    for step in steps {
        if let Some(backward) = step.backward {
            hooks.push((step.end, Hook::StepEnd));
            hooks.push((backward, Hook::ForwardEnd));
        }
    }
    (hooks, windows)
}

impl Sharding {
    /// A what-if that edits nothing yet: `way` over `world` ranks, of the block class and the
    /// blocks a step, the blocks and those whose backward was found, a block's and the root's
    /// bytes.
    fn of(
        way: &'static str,
        world: u64,
        (class, per_step): (String, usize),
        (blocks, with_backward): (usize, usize),
        (unit_bytes, root_bytes): (u64, u64),
    ) -> Sharding {
        Sharding {
            said: Sharded {
                way,
                world,
                class,
                per_step,
                blocks,
                with_backward,
                unit_bytes,
                root_bytes,
                sharded_requests: 0,
                sharded_bytes: 0,
                dropped_requests: 0,
                dropped_bytes: 0,
                gradients: 0,
                buffers: 0,
                buffer_bytes: 0,
                broadcast: Broadcast::default(),
                zero: None,
            },
            edits: Edits::over(world),
        }
    }

    /// A ZeRO what-if over `world` ranks that edits nothing yet (no blocks: ZeRO gathers
    /// nothing at stages 1 and 2).
    fn of_zero(world: u64, stage: u8) -> Sharding {
        let way = match stage {
            1 => "zero1",
            2 => "zero2",
            _ => "zero3",
        };
        Sharding::of(way, world, (String::new(), 0), (0, 0), (0, 0))
    }
}

impl Edits {
    /// Edits of requests cut over `world` ranks (1: none cut).
    fn over(world: u64) -> Edits {
        Edits {
            world,
            ..Edits::default()
        }
    }

    /// A request of `ptr` (`size` bytes) or its free, put before event `at` on `stream`, with
    /// the device and stack of event `like`.
    fn put(&mut self, (at, like): (usize, usize), free: bool, ptr: u64, size: u64, stream: u16) {
        let put = Put {
            free,
            ptr,
            size,
            stream,
            like,
        };
        self.inserts.push((at, put));
    }

    /// A shard's bytes of a whole request's `size` (rounded up).
    fn shard_size(&self, size: u64) -> u64 {
        size.div_ceil(self.world.max(1))
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
                    t if t == STATE >> 56 => Kind::OptimizerState,
                    t if t == TEMPORARY >> 56 => Kind::Temporary,
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

/// Whether `n` is 0 (a count `--json` leaves out).
fn is_zero(n: &u64) -> bool {
    *n == 0
}
