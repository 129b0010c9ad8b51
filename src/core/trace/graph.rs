//! PyTorch's autograd graph as the shim walked it when a backward pass began (`GraphNode`,
//! `GraphEdge` and `Graph` records, `format::graph`): each node's class and where each of its
//! inputs came from. A walk is taken once its `Graph` record says it reached every node (or
//! was cut at its most nodes); a walk the shim ended for a layout it did not know is dropped.
//!
//! Bounded by the trace, not by its claims: at most [`WALKS_KEPT`] walks (the latest), at
//! most `format::graph::NODES_MAX` nodes a walk, and no more inputs a node than records.

use crate::trace::format::{Record, RecordKind, graph};
use std::collections::BTreeMap;

/// The walks kept (the latest): enough to see that a program's steps make the same graph.
pub const WALKS_KEPT: usize = 8;

/// Where one input of a node came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The output `output` of node `sequence`.
    Node { sequence: u64, output: u64 },
    /// A tensor the program made that takes a gradient (a parameter), by its node's address:
    /// the same address, the same tensor.
    Leaf(u64),
    /// A tensor that takes no gradient (a buffer, an index, a Python number).
    None,
}

/// A node: its class (`MmBackward0`; empty where the shim could not read it) and its inputs'
/// sources, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    pub class: String,
    pub inputs: Vec<Source>,
}

/// One walk: its nodes by sequence number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    pub nodes: BTreeMap<u64, Node>,
    /// The shim stopped at its most nodes: some nodes below are missing.
    pub cut: bool,
}

impl Walk {
    /// The lowest and highest sequence numbers (0, 0 for no node).
    pub fn span(&self) -> (u64, u64) {
        let lo = self.nodes.keys().next().copied().unwrap_or(0);
        let hi = self.nodes.keys().next_back().copied().unwrap_or(0);
        (lo, hi)
    }
}

/// The walks of a trace, gathered record by record.
#[derive(Clone, Debug, Default)]
pub struct Walks {
    pub walks: Vec<Walk>,
    /// The walk being read (its records come before its `Graph` record).
    reading: Walk,
    /// Walks the shim said it could not make, or ended for a layout it did not know (the
    /// latest reason, a `format::graph` code).
    pub refused: Option<u8>,
}

impl Walks {
    /// Takes one record (others are ignored); `class` names a string id.
    pub fn see(&mut self, r: &Record, class: impl Fn(u64) -> Option<String>) {
        match r.kind {
            RecordKind::GraphNode if (self.reading.nodes.len() as u64) < graph::NODES_MAX => {
                let class = class(r.size).unwrap_or_default();
                self.reading.nodes.entry(r.ptr).or_default().class = class;
            }
            RecordKind::GraphEdge => {
                let (sequence, _index) = graph::unpack(r.ptr);
                let source = match r.status {
                    graph::FROM_NODE => {
                        let (from, output) = graph::unpack(r.size);
                        Source::Node {
                            sequence: from,
                            output,
                        }
                    }
                    graph::FROM_LEAF => Source::Leaf(r.size),
                    _ => Source::None,
                };
                // The edges of a node come in order, after the node.
                if let Some(n) = self.reading.nodes.get_mut(&sequence) {
                    n.inputs.push(source);
                }
            }
            RecordKind::Graph => {
                let walk = std::mem::take(&mut self.reading);
                match r.status {
                    graph::WHOLE | graph::CUT if !walk.nodes.is_empty() => {
                        self.walks.push(Walk {
                            cut: r.status == graph::CUT,
                            ..walk
                        });
                        if self.walks.len() > WALKS_KEPT {
                            self.walks.remove(0);
                        }
                    }
                    graph::WHOLE | graph::CUT => {}
                    code => self.refused = Some(code),
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::format::{Api, DEVICE_UNKNOWN};

    fn rec(kind: RecordKind, status: u8, ptr: u64, size: u64) -> Record {
        Record {
            kind,
            api: Api::Torch,
            device: DEVICE_UNKNOWN,
            status,
            thread: 1,
            time_ns: 0,
            ptr,
            size,
            stream: 0,
        }
    }

    #[test]
    fn a_walk_is_its_nodes_and_their_inputs_in_order() {
        let mut w = Walks::default();
        let name = |id: u64| Some(format!("C{id}"));
        w.see(&rec(RecordKind::GraphNode, 0, 7, 1), name);
        w.see(&rec(RecordKind::GraphEdge, 0, 7, graph::pack(5, 1)), name);
        w.see(&rec(RecordKind::GraphEdge, 2, graph::pack(7, 1), 0), name);
        w.see(&rec(RecordKind::GraphNode, 0, 5, 2), name);
        w.see(&rec(RecordKind::GraphEdge, 1, 5, 0x7000), name);
        w.see(&rec(RecordKind::Graph, graph::WHOLE, 2, 3), name);
        assert_eq!(w.walks.len(), 1);
        let n = &w.walks[0].nodes;
        assert_eq!(n[&7].class, "C1");
        assert_eq!(
            n[&7].inputs,
            [
                Source::Node {
                    sequence: 5,
                    output: 1
                },
                Source::None
            ]
        );
        assert_eq!(n[&5].inputs, [Source::Leaf(0x7000)]);
        assert_eq!(w.walks[0].span(), (5, 7));
    }

    #[test]
    fn a_walk_the_shim_ended_for_its_layout_is_dropped_and_said() {
        let mut w = Walks::default();
        w.see(&rec(RecordKind::GraphNode, 0, 7, 1), |_| None);
        w.see(&rec(RecordKind::Graph, graph::LAYOUT, 0, 0), |_| None);
        assert!(w.walks.is_empty());
        assert_eq!(w.refused, Some(graph::LAYOUT));
        // Only the latest walks are kept.
        for s in 0..20 {
            w.see(&rec(RecordKind::GraphNode, 0, s, 1), |_| None);
            w.see(&rec(RecordKind::Graph, graph::WHOLE, 1, 0), |_| None);
        }
        assert_eq!(w.walks.len(), WALKS_KEPT);
        assert_eq!(w.walks.last().unwrap().span(), (19, 19));
    }
}
