//! What a checkpoint what-if reads of the run's backward: each request's frees, where each
//! block's backward begins, where a backward node returned, and which way (reentrant or not)
//! the blocks would be checkpointed.

use super::Checkpointed;
use super::blocks::Stacks;
use crate::fasthash::FastMap;
use crate::report::kinds::Phase;
use crate::report::torch_allocator::{Ev, Input};
use crate::trace::format;

/// The sizes of a global reduction's staging buffer and of its semaphore requested at once
/// after it, as PyTorch's reduction kernel (`aten/src/ATen/native/cuda/Reduce.cuh`) makes
/// them: `4 x outputs x blocks_per_output x 128` bytes of partial sums and 4 bytes per block
/// across the outputs. Their shape as (bytes per block of each output, blocks per output), or
/// `None` where the two are not such a pair.
pub fn staging_shape(size: u64, next: u64) -> Option<(u64, u64)> {
    // 4-byte partial sums x 128 outputs a block x 128 (32 threads x 4 outputs), over a
    // 4-byte semaphore; at most CUDA's grid limit in y blocks across the outputs.
    const UNIT_PER_SEMAPHORE_BYTE: u64 = 16_384;
    const MAX_SEMAPHORE_BYTES: u64 = 4 * 65_535;
    if next == 0 || next % 4 != 0 || next > MAX_SEMAPHORE_BYTES {
        return None;
    }
    let unit = next.checked_mul(UNIT_PER_SEMAPHORE_BYTE)?;
    if size == 0 || size % unit != 0 {
        return None;
    }
    Some((unit, size / unit))
}

/// Events before a saved tensor's free in which its node's return is looked for.
const NODE_RETURN_WALK: usize = 64;

impl Input {
    /// Where the backward node that let go of a saved tensor at event `f` returned, in the
    /// run (an event index): autograd lets go of what a node saved only after the engine has
    /// reduced the node's gradients to their inputs' shapes (each a sum: its result, then a
    /// staging buffer and its semaphore, both freed at once), and after the gradients handed
    /// to the node (made by another node: `made` names each free's request) were let go as
    /// it returned. A copy made again goes as the node's function returns: before both.
    pub(super) fn node_returned(&self, f: usize, made: &FastMap<usize, usize>) -> usize {
        let ev = &self.events;
        let mut at = f.min(ev.len());
        // A node's return lies among the few events before the free: looked for there alone,
        // so that a forged trace's long runs of frees cost each saved tensor no more.
        let lo = at.saturating_sub(NODE_RETURN_WALK);
        // The request before event `i`, past frees and segments' events.
        let before = |i: usize| {
            ev[lo..i.max(lo)]
                .iter()
                .rposition(|e| e.ev == Ev::Alloc)
                .map(|j| lo + j)
        };
        loop {
            let reduced = (|| {
                let semaphore = before(at)?;
                let staging = before(semaphore)?;
                let result = before(staging)?;
                let sequence = ev[staging].sequence;
                let of_the_node = [result, staging, semaphore]
                    .iter()
                    .all(|&i| sequence != 0 && ev[i].sequence == sequence);
                let freed = |p: usize| {
                    ev[semaphore + 1..at]
                        .iter()
                        .any(|e| e.ev == Ev::Free && e.ptr == ev[p].ptr && e.device == ev[p].device)
                };
                (of_the_node
                    && staging_shape(ev[staging].size, ev[semaphore].size).is_some()
                    && freed(staging)
                    && freed(semaphore))
                .then_some(result)
            })();
            match reduced {
                Some(result) => at = result,
                None => break,
            }
        }
        // The gradients handed to the node, let go as it returned: frees just before, of
        // requests another node made.
        let node = before(at).map_or(0, |i| ev[i].sequence);
        while let Some(i) = at.checked_sub(1).filter(|&i| i >= lo) {
            let handed = ev[i].ev == Ev::Free
                && made
                    .get(&i)
                    .is_some_and(|&a| node != 0 && ev[a].sequence != node && ev[a].sequence != 0);
            if !handed {
                break;
            }
            at = i;
        }
        at
    }

    /// Whether the blocks of `class` would be checkpointed reentrant: a class of
    /// transformers' own, whose `gradient_checkpointing_enable()` asks `use_reentrant=True`
    /// unless told otherwise; any other as PyTorch asks, `use_reentrant=False`.
    pub(super) fn reentrant(&self, class: &str, blocks: &[Checkpointed]) -> bool {
        let Some(&a) = blocks.first().and_then(|b| b.allocs.first()) else {
            return false;
        };
        let Some(frames) = self.tables.stack(self.events[a].stack) else {
            return false;
        };
        frames
            .iter()
            .filter_map(|&f| format::as_py_frame(f))
            .any(|(id, _)| {
                let Some(text) = self.tables.string(id) else {
                    return false;
                };
                let (file, function) = text.split_once('\0').unwrap_or(("", text));
                let own = function
                    .strip_suffix(".forward")
                    .is_some_and(|q| q.rsplit('.').next() == Some(class));
                own && file.contains("/transformers/")
            })
    }
}

impl Input {
    /// Each request's frees (a free asked, then done), by event index.
    pub(in crate::report::torch_allocator) fn frees(&self) -> FastMap<usize, Vec<usize>> {
        let mut frees: FastMap<usize, Vec<usize>> = FastMap::default();
        let mut live: FastMap<(u8, u64), usize> = FastMap::default();
        for (i, e) in self.events.iter().enumerate() {
            match e.ev {
                Ev::Alloc => {
                    live.insert((e.device, e.ptr), i);
                }
                Ev::FreeRequested => {
                    if let Some(&a) = live.get(&(e.device, e.ptr)) {
                        frees.entry(a).or_default().push(i);
                    }
                }
                Ev::Free => {
                    if let Some(a) = live.remove(&(e.device, e.ptr)) {
                        frees.entry(a).or_default().push(i);
                    }
                }
                _ => {}
            }
        }
        frees
    }

    /// Where each block's backward begins: the first backward request (an event index) of one
    /// of its ops, by autograd sequence number; `None` where none is found.
    pub(in crate::report::torch_allocator) fn backward_begins(
        &self,
        blocks: &[Checkpointed],
        stacks: &mut Stacks<'_>,
    ) -> Vec<Option<usize>> {
        let mut begins: Vec<Option<usize>> = vec![None; blocks.len()];
        // The blocks' ranges of numbers, in order (numbers grow through a forward).
        let ranged: Vec<(u64, u64, usize)> = blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.seq.0 != 0)
            .map(|(k, b)| (b.seq.0, b.seq.1, k))
            .collect();
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private || e.sequence == 0 {
                continue;
            }
            if stacks.of(e.stack).0 != Phase::Backward {
                continue;
            }
            // A block's first request can carry the number of the block before's last op
            // (made before the block's first node): where two ranges meet, the earlier block
            // whose forward is over and whose backward has not begun.
            let at = ranged.partition_point(|r| r.0 <= e.sequence);
            let owner = ranged[..at]
                .iter()
                .rev()
                .take_while(|r| e.sequence <= r.1)
                .take(2)
                .find(|r| i >= blocks[r.2].end && begins[r.2].is_none());
            if let Some(&(_, _, k)) = owner {
                begins[k] = Some(i);
            }
        }
        begins
    }
}
