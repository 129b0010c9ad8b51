//! A run without activation checkpointing replayed as if its repeated blocks were checkpointed
//! (`gpushim fit --checkpoint`): what `torch.utils.checkpoint` (and transformers'
//! `gradient_checkpointing_enable()`, which calls it per block) changes in the requests.
//!
//! - **Forward.** A checkpointed block runs without keeping what its backward needs: each
//!   tensor the block made that outlived the block's forward (saved for the backward) lives as
//!   long as the block's own temporaries did (their mean lifetime, in the block's requests made
//!   meanwhile: the run says how soon this block's ops let go of what they used), and at the
//!   latest to the block's end; but the block's output (the last such tensor it made: the next
//!   block's input, which the next checkpoint keeps).
//! - **Backward.** Before the block's backward begins, its forward runs again: the block's
//!   requests, in their order, with their frees inside the block, are made once more; what
//!   outlived the block is then freed where the run freed it in that backward, the output's
//!   copy once made (the gradients flow through it at once). So a reentrant checkpoint runs
//!   (`use_reentrant=True`, transformers' `gradient_checkpointing_enable()` by default): it
//!   runs the block's forward again whole and its backward as a graph of its own.
//! - **Non-reentrant** (`torch.utils.checkpoint(use_reentrant=False)`, as PyTorch asks): the
//!   forward made again stops once it has made the block's last saved tensor (PyTorch's early
//!   stop; what it made and did not keep is let go there), and a saved tensor's copy is let
//!   go as soon as the backward node that used it returns, where the run's saved tensor (held
//!   by the node) lived on while the engine reduced the node's gradients to their inputs'
//!   shapes (a bias's gradient: a sum, with its staging buffer). Which of the two: the first,
//!   for a block class of transformers' own; else the second.
//!
//! Blocks are found from the frames: a request of the forward made under `CLASS.forward` belongs
//! to a block, and a new block begins where the line in `CLASS.forward` goes back up, or where
//! the block's first line comes again after another, or after a request made outside it. A
//! block's backward begins at the first backward request whose autograd sequence number is one
//! of the block's forward ops' (the shim records both). Without `CLASS`, the repeated blocks are
//! the outermost module class whose `forward` runs more than once in one step (containers
//! aside).

mod backward;
mod blocks;

pub use backward::staging_shape;
pub(super) use blocks::Stacks;

use super::{Ev, Event, Input};
use crate::fasthash::FastMap;

/// The blocks a `--checkpoint` what-if checkpointed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Blocks {
    /// The module class whose blocks are checkpointed, and whether it was found from the
    /// frames (not named).
    pub class: String,
    pub found: bool,
    /// Blocks in the run, the most in one step, and those whose backward was found (the
    /// others run as they did).
    pub blocks: usize,
    pub per_step: usize,
    pub checkpointed: usize,
    /// What the checkpointed blocks kept for their backward in the run, at its batch: gone
    /// once used in the forward, made again one block at a time in the backward.
    pub saved_bytes: u64,
    /// Made again as a reentrant checkpoint does (see the module's comment), else as
    /// `use_reentrant=False` does.
    pub reentrant: bool,
    /// The way asked (`--checkpoint-way`), not taken from the frames.
    pub way_asked: bool,
}

/// What checkpointing the blocks of a class changes in a run's events.
#[derive(Clone, Debug)]
pub struct Checkpointing {
    pub blocks: Blocks,
    /// Before each event (and at the end): what to insert.
    inserts: Vec<Vec<Insert>>,
    /// Each block's forward as made again: its requests and their frees inside it (event
    /// indices, in order).
    recompute: Vec<Vec<usize>>,
    /// Each event: what it does instead, a saved tensor's free (see [`Remap`]).
    remap: Vec<Option<Remap>>,
    /// The run's events so edited, made at the first replay and held for the rest.
    pub(super) edited: std::sync::OnceLock<Option<std::sync::Arc<super::replayer::Edited>>>,
}

/// A saved tensor's free in the backward, under checkpointing.
#[derive(Clone, Copy, Debug)]
enum Remap {
    /// It frees block `k`'s recomputed copy instead.
    Copy(u32),
    /// Nothing: the copy went before it (non-reentrant).
    Gone,
}

#[derive(Clone, Copy, Debug)]
enum Insert {
    /// Free the tensor of this request (an event index): a saved tensor at its block's end.
    Free(usize),
    /// Checkpointed `k`'s forward once more: its requests and their frees inside the block.
    Recompute(u32),
    /// Free block `k`'s copy of this request.
    FreeCopy(usize, u32),
}

/// One block's run of the forward.
#[derive(Clone, Debug, Default)]
pub(super) struct Checkpointed {
    /// Its requests (event indices), in order.
    pub(super) allocs: Vec<usize>,
    /// Where its forward ends: the next request's event index.
    pub(super) end: usize,
    /// Its ops' autograd sequence numbers, lowest and highest (0, 0: none).
    pub(super) seq: (u64, u64),
}

/// The address of block `k`'s recomputed copy of a tensor at `ptr`: no address CUDA gives.
fn copy_ptr(ptr: u64, k: u32) -> u64 {
    ptr | 1 << 63 | ((u64::from(k) & 0x7fff) << 48)
}

impl Input {
    /// What checkpointing `blocks` changes: where each saved tensor is freed, where each
    /// block's forward is made again.
    fn plan(
        &self,
        (class, found): (String, bool),
        blocks: Vec<Checkpointed>,
        per_step: usize,
        asked: Option<bool>,
        stacks: &mut Stacks<'_>,
    ) -> Checkpointing {
        let n = self.events.len();
        let frees = self.frees();
        // Each free's request (an event index).
        let made: FastMap<usize, usize> = frees
            .iter()
            .flat_map(|(&a, fs)| fs.iter().map(move |&f| (f, a)))
            .collect();
        let begins = self.backward_begins(&blocks, stacks);
        let reentrant = asked.unwrap_or_else(|| self.reentrant(&class, &blocks));
        let mut ck = Checkpointing {
            blocks: Blocks {
                class,
                found,
                blocks: blocks.len(),
                per_step,
                checkpointed: 0,
                saved_bytes: 0,
                reentrant,
                way_asked: asked.is_some(),
            },
            inserts: vec![Vec::new(); n + 1],
            recompute: vec![Vec::new(); blocks.len()],
            remap: vec![None; n],
            edited: Default::default(),
        };
        for (k, (b, begin)) in blocks.iter().zip(begins).enumerate() {
            let Some(begin) = begin else {
                continue;
            };
            let k32 = k as u32;
            let first_free = |a: usize| frees.get(&a).and_then(|f| f.first().copied());
            let survivors: Vec<usize> = b
                .allocs
                .iter()
                .copied()
                .filter(|&a| first_free(a).is_none_or(|f| f >= b.end))
                .collect();
            let output = survivors.last().copied();
            // How long the block's own temporaries lived, in the block's requests made
            // meanwhile (their mean, rounded): a tensor no longer kept for the backward lives
            // as long.
            let lags: Vec<usize> = b
                .allocs
                .iter()
                .enumerate()
                .filter_map(|(p, &a)| {
                    let f = first_free(a).filter(|&f| f < b.end)?;
                    // The block's requests are in the order made: a search, not a walk (a
                    // block of many requests made this quadratic).
                    Some(b.allocs[p + 1..].partition_point(|&x| x < f))
                })
                .collect();
            let lag = match lags.len() {
                0 => usize::MAX,
                n => (lags.iter().sum::<usize>() + n / 2) / n,
            }
            .max(1);
            let saved = |a: usize| Some(a) != output && first_free(a).is_some_and(|f| f > begin);
            // Where the forward made again stops (an event index): the block's end, or
            // (non-reentrant) just past its last saved tensor.
            let stop = match reentrant {
                true => b.end,
                false => survivors
                    .iter()
                    .rev()
                    .find(|&&a| saved(a))
                    .map_or(0, |&a| a + 1),
            };
            let mut span = Vec::new();
            for &a in b.allocs.iter().take_while(|&&a| a < stop) {
                span.push(a);
                span.extend(frees.get(&a).into_iter().flatten().filter(|&&f| f < stop));
            }
            span.sort_unstable();
            ck.recompute[k] = span;
            ck.inserts[begin].push(Insert::Recompute(k32));
            for &a in b.allocs.iter().take_while(|&&a| a < stop) {
                if first_free(a).is_some_and(|f| f < stop) {
                    continue; // made and let go inside the forward made again
                }
                if !saved(a) {
                    ck.inserts[begin].push(Insert::FreeCopy(a, k32));
                    continue;
                }
                let pos = b.allocs.binary_search(&a).unwrap_or(0);
                let at = (b.allocs.get(pos.saturating_add(lag)))
                    .map_or(b.end, |&x| x + 1)
                    .min(b.end);
                ck.inserts[at].push(Insert::Free(a));
                let remap = match reentrant {
                    true => Remap::Copy(k32),
                    false => {
                        let f = first_free(a).unwrap_or(begin);
                        let at = self.node_returned(f, &made).max(begin);
                        ck.inserts[at].push(Insert::FreeCopy(a, k32));
                        Remap::Gone
                    }
                };
                for &f in frees.get(&a).into_iter().flatten() {
                    ck.remap[f] = Some(remap);
                }
                ck.blocks.saved_bytes = ck.blocks.saved_bytes.saturating_add(self.events[a].size);
            }
            ck.blocks.checkpointed += 1;
        }
        ck
    }
}

impl Checkpointing {
    /// What goes before event `i` of `events` (at `at`, or at the end for `events.len()`):
    /// saved tensors freed, a block's forward made again (its requests sized by `sized`, as
    /// their originals), copies freed; appended to `out`.
    pub(super) fn insert_before(
        &self,
        events: &[Event],
        i: usize,
        at: u64,
        sized: impl Fn(usize) -> Event,
        out: &mut Vec<Event>,
    ) {
        let freed = |a: usize, ptr: u64| -> Event {
            let mut e = events[a];
            (e.ev, e.ptr, e.size, e.time_ns) = (Ev::Free, ptr, 0, at);
            e
        };
        for x in self.inserts.get(i).into_iter().flatten() {
            match *x {
                Insert::Free(a) => out.push(freed(a, events[a].ptr)),
                Insert::FreeCopy(a, k) => out.push(freed(a, copy_ptr(events[a].ptr, k))),
                Insert::Recompute(k) => {
                    for &j in self.recompute.get(k as usize).into_iter().flatten() {
                        let mut e = if events[j].ev == Ev::Alloc {
                            sized(j)
                        } else {
                            events[j]
                        };
                        (e.ptr, e.time_ns) = (copy_ptr(e.ptr, k), at);
                        out.push(e);
                    }
                }
            }
        }
    }

    /// Event `i`, a saved tensor's free, frees its block's recomputed copy instead, or
    /// nothing (`Ev::Skip`: the copy went before it).
    pub(super) fn remap(&self, i: usize, e: &mut Event) {
        match self.remap.get(i) {
            Some(Some(Remap::Copy(k))) => e.ptr = copy_ptr(e.ptr, *k),
            Some(Some(Remap::Gone)) => e.ev = Ev::Skip,
            _ => {}
        }
    }
}
