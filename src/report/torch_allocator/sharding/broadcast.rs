//! What `--shard` cannot know of a parameter's shape, said. FSDP2 cuts a parameter along its
//! first dimension, padded to a multiple of the world: one whose first dimension is below the
//! world (a class token of shape `(1, 1, D)`, a position table of `(1, T, D)`) keeps a whole
//! row, its whole, on every rank, and gathers the world times it. A run that keeps the whole
//! model holds sizes, not shapes, so `--shard` cuts every parameter to `1/N`. What a run does
//! show is a parameter used through a broadcast over the batch: its gradient is made by the
//! broadcast's backward, which sums it over the dimensions the broadcast made
//! (`ExpandBackward0`, `AddBackward0`; traces of a ViT under DDP on an H200 show its class
//! token's and position table's so, and no other parameter's). Such a parameter's first
//! dimension may be 1 (or it has no batch dimension at all, as a bias added by hand); those
//! are counted, for `fit` to say.

use super::Input;
use crate::report::kinds::{Kind, backward_node_of};
use crate::report::torch_allocator::Ev;

/// The backward nodes of a broadcast a parameter takes part in: an expand, an add.
const BROADCASTS: [&str; 2] = ["ExpandBackward0", "AddBackward0"];

/// A run's parameters whose gradients a broadcast's backward made.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Broadcast {
    pub parameters: u64,
    pub bytes: u64,
    /// The nodes that made them, each once, in the order met.
    pub nodes: Vec<String>,
}

impl Broadcast {
    /// Whether none was found (`--json` leaves it out).
    pub fn is_none(&self) -> bool {
        self.parameters == 0
    }
}

impl Input {
    /// The gradients of the first step's backward (`first`: its first event and the step's
    /// end) that a broadcast's backward made, each the size of one of the model's parameters
    /// (`sizes`).
    pub(super) fn broadcast_parameters(
        &self,
        sizes: &[u64],
        first: Option<(usize, usize)>,
    ) -> Broadcast {
        let mut out = Broadcast::default();
        let Some((from, to)) = first else {
            return out;
        };
        let sizes: std::collections::BTreeSet<u64> = sizes.iter().copied().collect();
        for e in self.events.get(from..to).unwrap_or(&[]) {
            if e.ev != Ev::Alloc || e.private || e.kind != Kind::Gradient {
                continue;
            }
            if !sizes.contains(&e.size) {
                continue;
            }
            let Some(node) = backward_node_of(&self.tables, e.stack) else {
                continue;
            };
            if !BROADCASTS.contains(&node) {
                continue;
            }
            out.parameters += 1;
            out.bytes = out.bytes.saturating_add(e.size);
            if !out.nodes.iter().any(|n| n == node) {
                out.nodes.push(node.to_string());
            }
        }
        out
    }
}
