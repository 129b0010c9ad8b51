//! A parameter of a first dimension below the world, which FSDP2 keeps whole on every rank.
//! FSDP2 cuts a parameter along its first dimension, padded to a multiple of the world: one
//! whose first dimension is 1 (a class token of shape `(1, 1, D)`, a position table of
//! `(1, T, D)`) keeps a whole row, its whole, on every rank, and gathers the world times it.
//! A run that keeps the whole model holds sizes, not shapes. What it does show is a parameter
//! used through a broadcast over the batch: its gradient is made by the broadcast's backward,
//! which sums it over the dimensions the broadcast made (`ExpandBackward0`, `AddBackward0`;
//! traces of a ViT under DDP on an H200 show its class token's and position table's so, and no
//! other parameter's). Such a gradient of a root parameter's size (where a model's embeddings
//! are) keeps that parameter whole as FSDP2 keeps one of first dimension 1: its shard its
//! whole, its gathered copy and its share of the unit's all-gather output and reduce-scatter
//! input the world times it.
//! Where its first dimension is not below the world after all (a bias added by hand) that is
//! too much by at most its bytes times the world; `fit` says which were kept so.

use super::{Params, Window};
use crate::report::kinds::{Kind, backward_node_of};
use crate::report::torch_allocator::{Ev, Input};
use std::collections::BTreeSet;

/// The backward nodes of a broadcast a parameter takes part in: an expand, an add.
const BROADCASTS: [&str; 2] = ["ExpandBackward0", "AddBackward0"];

/// The root's parameters kept whole, as their gradients say a broadcast used them.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Broadcast {
    pub parameters: u64,
    pub bytes: u64,
    /// The nodes that made their gradients, each once, in the order met.
    pub nodes: Vec<String>,
}

impl Broadcast {
    /// Whether none was found (`--json` leaves it out).
    pub fn is_none(&self) -> bool {
        self.parameters == 0
    }
}

impl Input {
    /// Keeps whole in `params` the root's parameters whose gradients a broadcast's backward
    /// made (`grads`: each window's gradients, `windows` the units' backwards): matched by size
    /// to the root's parameters from the first backward that made any, each such gradient of
    /// every step taken the world times its size into its reduce-scatter.
    pub(super) fn keep_broadcast_whole(
        &self,
        params: &mut Params,
        (grads, windows): (&[Vec<usize>], &[Window]),
        world: u64,
    ) -> Broadcast {
        let mut out = Broadcast::default();
        let root_sizes: BTreeSet<u64> = params.root.iter().copied().collect();
        let mut first: Option<(usize, Vec<usize>)> = None;
        for (w, &(begin, _, _)) in windows.iter().enumerate() {
            let mut made = Vec::new();
            for &g in grads.get(w).into_iter().flatten() {
                let e = &self.events[g];
                if e.ev != Ev::Alloc || e.kind != Kind::Gradient || !root_sizes.contains(&e.size) {
                    continue;
                }
                let Some(node) = backward_node_of(&self.tables, e.stack) else {
                    continue;
                };
                if !BROADCASTS.contains(&node) {
                    continue;
                }
                params.whole_grads.insert(g);
                made.push(g);
                if !out.nodes.iter().any(|n| n == node) {
                    out.nodes.push(node.to_string());
                }
            }
            if !made.is_empty() && first.as_ref().is_none_or(|(b, _)| begin < *b) {
                first = Some((begin, made));
            }
        }
        // Each of the first backward's such gradients keeps one root parameter of its size
        // whole (parameters of one size are alike to the replay).
        // The root's parameters are the last of those cut, in the order of its sizes.
        let blocks = params.cut.len().saturating_sub(params.root.len());
        for g in first.map(|(_, made)| made).unwrap_or_default() {
            let size = self.events[g].size;
            let found = (0..params.root.len()).find_map(|j| {
                let at = *params.cut.get(blocks + j)?;
                (params.root[j] == size && !params.whole.contains(&at)).then_some((j, at))
            });
            let Some((j, at)) = found else {
                continue;
            };
            params.whole.insert(at);
            params.root[j] = size.saturating_mul(world);
            out.parameters += 1;
            out.bytes = out.bytes.saturating_add(size);
        }
        if out.parameters == 0 {
            params.whole_grads.clear();
            out.nodes.clear();
        }
        out
    }
}
