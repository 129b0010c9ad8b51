//! What a sharding what-if reads of the run before it edits: the bytes of one block's
//! parameters (a unit FSDP gathers whole) from the order the parameters were made in, each
//! step's forward and backward, and where each block's backward ends.

use super::super::checkpoint::{Checkpointed, Stacks};
use super::buffers::unit_sizes_among_buffers;
use crate::fasthash::FastMap;
use crate::report::kinds::{Kind, Phase};
use crate::report::torch_allocator::{Ev, Input};
use std::collections::BTreeMap;

/// Each unit's parameters' sizes, as FSDP2 gathers them (one request each): a block's, and the
/// root's for units from `roots` up (a block's unit is its index among the blocks, a root's
/// `roots` plus its step's).
pub(super) struct Params {
    /// Each block's, by its place in a step (all alike but in a model whose blocks are made
    /// differently).
    pub(super) block: Vec<Vec<u64>>,
    pub(super) root: Vec<u64>,
    pub(super) roots: u64,
    /// The model's parameters' requests, in the order fully_shard cuts them; those kept whole
    /// on every rank, and the gradients of them (`broadcast.rs`).
    pub(super) cut: Vec<usize>,
    pub(super) whole: std::collections::BTreeSet<usize>,
    pub(super) whole_grads: std::collections::BTreeSet<usize>,
}

impl Params {
    pub(super) fn of(&self, u: u64) -> &[u64] {
        if u >= self.roots {
            &self.root
        } else {
            self.block
                .get(u as usize % self.block.len().max(1))
                .map_or(&[], Vec::as_slice)
        }
    }
}

/// Parameters whose sizes are searched for a block's at most: past it the search (quadratic in
/// them) is not made, and the what-if says why.
pub(super) const PARAMETERS_MOST: usize = 1 << 14;

/// One block's parameters' sizes and the rest's (the root's), from the parameters' sizes in
/// the order they were made: a model of `per_step` blocks of one class makes `per_step` runs
/// of the same sizes one after another (a module's parameters are made, and moved to the
/// device, in the order its modules were registered). The run's period is the shortest whose
/// copies number at least `per_step` and fewer than twice it (a shorter period of a block whose
/// sizes repeat inside it makes twice as many). `None` where no such run is.
pub(super) fn unit_sizes(sizes: &[u64], per_step: usize) -> Option<Units> {
    let n = sizes.len();
    if per_step < 2 || n < per_step || n > PARAMETERS_MOST {
        return None;
    }
    for period in 1..=n / per_step {
        // The longest run of places whose size is the one a period later.
        let (mut run, mut best, mut best_end) = (0usize, 0usize, 0usize);
        for j in 0..n - period {
            if sizes[j] == sizes[j + period] {
                run += 1;
                if run > best {
                    (best, best_end) = (run, j + 1);
                }
            } else {
                run = 0;
            }
        }
        let copies = best / period + 1;
        if copies >= per_step && copies < 2 * per_step {
            let start = best_end - best;
            return Some(Units::of(
                sizes,
                vec![sizes[start..start + period].to_vec(); per_step],
                (start..start + period * per_step).collect(),
            ));
        }
    }
    None
}

/// How many comparisons [`unit_sizes_by_gradients`] makes at most: past it, the what-if says
/// the blocks cannot be told (a forged trace cannot make it quadratic).
const COMPARISONS_MOST: u64 = 1 << 24;

/// The blocks' parameters' sizes where the blocks are not all made alike (an encoder's and a
/// decoder's, a first block with a part of its own): each block's gradients in the first
/// step's backward (`gradients[k]`, the sizes the backward of the step's block `k` made) are
/// its parameters', and a block's parameters were made one after another, the blocks in their
/// order: block by block, the first places after the block before's whose sizes are the
/// block's gradients' in some order (where the root's parameters between two blocks are of
/// the sizes of one's, which of them is the block's cannot be told, and the unit's sizes are
/// the same either way). `None` where a block's are not found.
pub(super) fn unit_sizes_by_gradients(sizes: &[u64], gradients: &[Vec<u64>]) -> Option<Units> {
    let n = sizes.len();
    if gradients.len() < 2 || gradients.iter().any(Vec::is_empty) || n > PARAMETERS_MOST {
        return None;
    }
    let mut comparisons = 0u64;
    let (mut at, mut places, mut block) = (0usize, Vec::new(), Vec::new());
    let mut part = Vec::new();
    for g in gradients {
        let mut want = g.clone();
        want.sort_unstable();
        let mut found = None;
        for s in at..=n.checked_sub(want.len())? {
            comparisons = comparisons.saturating_add(want.len() as u64);
            if comparisons > COMPARISONS_MOST {
                return None;
            }
            part.clear();
            part.extend_from_slice(&sizes[s..s + want.len()]);
            part.sort_unstable();
            if part == want {
                found = Some(s);
                break;
            }
        }
        let start = found?;
        places.extend(start..start + want.len());
        block.push(sizes[start..start + want.len()].to_vec());
        at = start + want.len();
    }
    Some(Units::of(sizes, block, places))
}

/// Each block's parameters' sizes (by the block's place in a step), the root's, and the
/// places among all of the blocks' parameters (block by block) and of the root's.
pub(super) struct Units {
    pub(super) block: Vec<Vec<u64>>,
    pub(super) root: Vec<u64>,
    pub(super) places: Vec<usize>,
    pub(super) root_places: Vec<usize>,
}

impl Units {
    /// The blocks' `places`, every other place the root's.
    fn of(sizes: &[u64], block: Vec<Vec<u64>>, places: Vec<usize>) -> Units {
        let mut theirs = vec![false; sizes.len()];
        for &p in &places {
            theirs[p] = true;
        }
        let root_places: Vec<usize> = (0..sizes.len()).filter(|&i| !theirs[i]).collect();
        Units::with_root(sizes, block, places, root_places)
    }

    /// The blocks' `places` and the root's `root_places` (a place in neither is in no unit: a
    /// buffer).
    pub(super) fn with_root(
        sizes: &[u64],
        block: Vec<Vec<u64>>,
        places: Vec<usize>,
        root_places: Vec<usize>,
    ) -> Units {
        Units {
            block,
            root: root_places.iter().map(|&i| sizes[i]).collect(),
            places,
            root_places,
        }
    }
}

/// The bytes of `sizes`.
pub(super) fn total(sizes: &[u64]) -> u64 {
    sizes.iter().fold(0u64, |a, &s| a.saturating_add(s))
}

/// One step of the run: where its forward begins (its first request of the forward), where its
/// backward begins, and where the backward is over (the optimizer's first request, or the next
/// forward's; the events' end where neither comes).
#[derive(Clone, Copy, Debug)]
pub(super) struct Step {
    pub(super) forward: usize,
    pub(super) backward: Option<usize>,
    pub(super) end: usize,
}

impl Input {
    /// The blocks' parameters among the model's (`sizes`, in the order they were made) for
    /// `per_step` blocks of `class` a step: the blocks all alike ([`unit_sizes`]) where each
    /// block's gradients in the first step agree with that, or do not describe the parameters
    /// at all (a program whose gradients are not its parameters' sizes); else each found from
    /// its gradients ([`unit_sizes_by_gradients`]; every step then has its `per_step`
    /// blocks): a period of equal sizes can be found in blocks of two makes whose parameters
    /// are all of one size. Where neither tells them, each block's found from its gradients
    /// among buffers that take none ([`unit_sizes_among_buffers`]: a batch norm's), the
    /// root's parameters from the first backward's gradients outside the blocks' (`first`,
    /// that backward's beginning and end). `Err` says why they cannot be told.
    pub(super) fn block_units(
        &self,
        sizes: &[u64],
        (class, per_step): (&str, usize),
        (blocks, begins, ends): (&[Checkpointed], &[Option<usize>], &[usize]),
        first: Option<(usize, usize)>,
    ) -> Result<Units, String> {
        if self.from_checkpoint && sizes.is_empty() {
            return Err(
                "the trace is a ring whose records begin after the model was built: \
                        the order its parameters were made in, which says a block's, is not \
                        in them (a run with a larger trace_max, or a shorter run, keeps it)"
                    .into(),
            );
        }
        let alike = unit_sizes(sizes, per_step);
        let windows: Option<Vec<(usize, usize, u64)>> = (0..per_step.min(blocks.len()))
            .map(|k| Some((begins[k]?, ends[k], k as u64)))
            .collect();
        let windows = windows.filter(|w| w.len() == per_step && blocks.len() % per_step == 0);
        let gradients: Option<Vec<Vec<u64>>> = windows.as_ref().map(|w| {
            self.gradients_of(w, per_step as u64)
                .iter()
                .map(|g| g.iter().map(|&i| self.events[i].size).collect())
                .collect()
        });
        let sorted = |v: &[u64]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v
        };
        let agrees =
            |u: &Units, g: &[Vec<u64>]| u.block.iter().zip(g).all(|(b, g)| sorted(b) == sorted(g));
        let by_gradients = gradients
            .as_deref()
            .filter(|g| alike.as_ref().is_none_or(|u| !agrees(u, g)))
            .and_then(|g| unit_sizes_by_gradients(sizes, g));
        let among_buffers = || {
            let (w, g) = (windows.as_ref()?, gradients.as_deref()?);
            let root = self.root_gradients(first?, w);
            unit_sizes_among_buffers(sizes, g, &root)
        };
        by_gradients.or(alike).or_else(among_buffers).ok_or_else(|| {
            format!(
                "the run's {} parameters do not make {per_step} runs of the same sizes, one for \
                 each of its blocks of {}, nor are each block's the sizes of its gradients in \
                 the first backward, alone or among buffers (parameters made in one piece, a \
                 block's backward not found, or more than {PARAMETERS_MOST} parameters): a \
                 block's parameters cannot be told",
                sizes.len(),
                crate::fixedfmt::Escaped(class.as_bytes()),
            )
        })
    }

    /// The sizes of the gradients made in the backward `(begin, end)` outside every block's
    /// `windows`: the root's parameters'.
    fn root_gradients(
        &self,
        (begin, end): (usize, usize),
        windows: &[(usize, usize, u64)],
    ) -> Vec<u64> {
        let mut by_begin: Vec<(usize, usize)> = windows.iter().map(|&(b, e, _)| (b, e)).collect();
        by_begin.sort_unstable();
        // Whether `i` is in a block's window: the last one begun by it, or one before that
        // reaching further (two searches where they do not overlap, as they do not).
        let in_block = |i: usize| {
            let at = by_begin.partition_point(|&(b, _)| b <= i);
            by_begin[..at].iter().rev().take(2).any(|&(_, e)| i < e)
        };
        let end = end.min(self.events.len());
        (begin.min(end)..end)
            .filter(|&i| {
                let e = &self.events[i];
                e.ev == Ev::Alloc && !e.private && e.kind == Kind::Gradient
            })
            .filter(|&i| !in_block(i))
            .map(|i| self.events[i].size)
            .collect()
    }

    /// The model's parameters in the order they were made (their requests' event indices):
    /// those still held when the first step's forward begins (`first_forward`), not what a
    /// framework made of them and let go before (DDP's broadcast of them at its start).
    pub(super) fn parameters(
        &self,
        first_forward: usize,
        frees: &FastMap<usize, Vec<usize>>,
    ) -> Vec<usize> {
        self.events[..first_forward.min(self.events.len())]
            .iter()
            .enumerate()
            .filter(|(_, e)| e.ev == Ev::Alloc && !e.private && e.kind == Kind::Parameter)
            .filter(|(i, _)| {
                frees
                    .get(i)
                    .and_then(|f| f.first())
                    .is_none_or(|&f| f >= first_forward)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The run's steps, from the phases of its requests.
    pub(super) fn steps(&self, stacks: &mut Stacks<'_>) -> Vec<Step> {
        let mut steps: Vec<Step> = Vec::new();
        #[derive(PartialEq)]
        enum In {
            Nothing,
            Forward,
            Backward,
        }
        let mut now = In::Nothing;
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            let phase = stacks.of(e.stack).0;
            match (&now, phase) {
                (In::Nothing | In::Backward, Phase::Forward) => {
                    if now == In::Backward
                        && let Some(s) = steps.last_mut()
                    {
                        s.end = i;
                    }
                    steps.push(Step {
                        forward: i,
                        backward: None,
                        end: self.events.len(),
                    });
                    now = In::Forward;
                }
                (In::Forward, Phase::Backward) => {
                    if let Some(s) = steps.last_mut() {
                        s.backward = Some(i);
                    }
                    now = In::Backward;
                }
                (In::Backward, Phase::Optimizer) => {
                    if let Some(s) = steps.last_mut() {
                        s.end = i;
                    }
                    now = In::Nothing;
                }
                _ => {}
            }
        }
        steps
    }

    /// Where each block's backward ends (an event index): where another block's backward
    /// begins, or at the first request after its beginning made by an op of an earlier place in
    /// the forward (a lower autograd sequence number than any of the block's), or of the
    /// optimizer or a forward; the events' end where none comes. One walk, the open blocks kept
    /// by their lowest number.
    pub(super) fn backward_ends(
        &self,
        blocks: &[Checkpointed],
        begins: &[Option<usize>],
        stacks: &mut Stacks<'_>,
    ) -> Vec<usize> {
        let n = self.events.len();
        let mut ends = vec![n; blocks.len()];
        let mut starting: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (k, b) in begins.iter().enumerate() {
            if let Some(b) = b {
                starting.entry(*b).or_default().push(k);
            }
        }
        let mut open: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            let closed = match stacks.of(e.stack).0 {
                Phase::Forward | Phase::Optimizer => std::mem::take(&mut open),
                Phase::Backward if e.sequence != 0 => open.split_off(&(e.sequence + 1)),
                _ => BTreeMap::new(),
            };
            for k in closed.into_values().flatten() {
                ends[k] = i;
            }
            // Another block's backward begins: the open ones are over (a block's first
            // request can carry the number of the block before's last op, so its number
            // alone does not close it).
            if let Some(begin) = starting.get(&i) {
                for k in std::mem::take(&mut open).into_values().flatten() {
                    ends[k] = i;
                }
                for &k in begin {
                    open.entry(blocks[k].seq.0).or_default().push(k);
                }
            }
        }
        ends
    }
}

#[cfg(test)]
mod tests {
    use super::{total, unit_sizes};

    /// A block's bytes and the rest's.
    fn unit_bytes(sizes: &[u64], per_step: usize) -> Option<(u64, u64)> {
        unit_sizes(sizes, per_step).map(|u| (total(&u.block[0]), total(&u.root)))
    }

    #[test]
    fn blocks_made_differently_are_found_from_their_gradients() {
        // A root's 10, two encoder blocks (the first with a part of its own, 7), a norm of 3,
        // two decoder blocks (the first with its 7), a root's 2: no period says them.
        let sizes = [10, 4, 7, 6, 4, 6, 3, 4, 7, 6, 5, 4, 6, 5, 2];
        assert!(unit_sizes(&sizes, 4).is_none());
        // Each block's gradients, in the order its backward made them.
        let grads = vec![vec![6, 7, 4], vec![6, 4], vec![5, 6, 7, 4], vec![5, 6, 4]];
        let u = super::unit_sizes_by_gradients(&sizes, &grads).unwrap();
        assert_eq!(u.places, vec![1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13]);
        assert_eq!(u.block[0], vec![4, 7, 6]);
        assert_eq!(u.block[1], vec![4, 6]);
        assert_eq!(u.block[2], vec![4, 7, 6, 5]);
        // The norm between the two sides is the root's.
        assert_eq!(u.root, vec![10, 3, 2]);
        assert_eq!(u.root_places, vec![0, 6, 14]);
        // A block whose gradients no part of the parameters matches: not told.
        let wrong = vec![vec![6, 7, 4], vec![6, 4], vec![9, 9], vec![5, 6, 4]];
        assert!(super::unit_sizes_by_gradients(&sizes, &wrong).is_none());
    }

    #[test]
    fn a_block_is_the_period_its_blocks_repeat_with() {
        // A root of 10 and 3, four blocks of (4, 1, 6, 1), a root's 2 after.
        let mut sizes = vec![10, 3];
        for _ in 0..4 {
            sizes.extend([4, 1, 6, 1]);
        }
        sizes.push(2);
        assert_eq!(unit_bytes(&sizes, 4), Some((12, 15)));
        // Blocks whose sizes repeat inside them: (4, 1, 4, 1) is one block, not two.
        let sizes: Vec<u64> = std::iter::repeat_n([4, 1, 4, 1], 3).flatten().collect();
        assert_eq!(unit_bytes(&sizes, 3), Some((10, 0)));
        // No run of as many blocks.
        assert_eq!(unit_bytes(&[1, 2, 3, 4], 2), None);
        assert_eq!(unit_bytes(&[1, 1], 1), None);
    }
}
