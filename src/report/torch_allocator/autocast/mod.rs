//! A run in 32 bits replayed as if its forward ran under `torch.autocast` to 16 bits
//! (`gpushim fit --autocast bf16`), from the run's requests and the autograd graph the shim
//! recorded when a backward pass began (`trace::graph`: each node's class and where each of its
//! inputs came from). What changes, step by step (`docs/fit.md`, "Autocast as a what-if"):
//!
//! - **Which ops run in 16 bits.** Matrix products, convolutions and attention do ([`ops`]);
//!   powers, exponentials, normalizations, softmax, sums and losses run in 32; every other op
//!   in 16 bits only where every input that takes a gradient is 16-bit (a parameter is 32). A
//!   linear's bias added after its product is cast with the linear's inputs.
//! - **Outputs.** Each forward op's output (its largest request that does not outlive the
//!   step) is half its size where the op runs in 16 bits; what else it asks for (a
//!   normalization's statistics, a dropout's mask) is not.
//! - **Casts.** A 16-bit op makes a 16-bit copy of each 32-bit input, a 32-bit op a 32-bit copy
//!   of each 16-bit one, just before it runs. A copy the op keeps for its backward ([`ops`]
//!   says which inputs each op keeps) lives until that op's backward has run; another goes
//!   once the op has run. A parameter's copy is made once a step (autocast's cache), lives
//!   through the forward, and as long as an op keeps it. A parameter's size is that of the
//!   gradient the run made for it (a gradient that outlives the backward).
//! - **What is no longer kept.** A 32-bit output every op keeping it now keeps a copy of
//!   instead goes once the last op that took it has run.
//! - **Backward.** An op that ran in 16 bits makes 16-bit gradients: its temporaries halve;
//!   the gradient of an input it copied from 32 bits (a parameter's, an activation's) is made
//!   in 16 bits, then cast to 32 (both live for a moment).
//!
//! Steps are matched to the graph by sequence number: the graph of one step numbers its nodes
//! `lo..=hi`, and each step's ops take the same numbers shifted by a whole number of steps.

mod ops;

use super::{Ev, Event, Input};
use crate::fasthash::FastMap;
use crate::report::kinds::backward_node_of;
use crate::trace::graph::{Source, Walk};
use ops::Cast;
use std::collections::{BTreeMap, BTreeSet};

/// What the what-if changed, at the run's batch, for the output.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct AutocastSummary {
    /// The 16-bit type asked ("bf16" or "fp16": the same sizes).
    pub dtype: String,
    /// The graph's nodes in a step, and the steps matched to it.
    pub graph_nodes: usize,
    pub steps: usize,
    /// Outputs halved, bytes at the run's batch (all steps).
    pub halved_bytes: u64,
    /// Copies made in one step (the largest step): of parameters, and of activations.
    pub parameter_copies: usize,
    pub parameter_copy_bytes: u64,
    pub activation_copies: usize,
    pub activation_copy_bytes: u64,
    /// 32-bit outputs no longer kept for the backward (all steps).
    pub freed_earlier: usize,
    /// Copies of attention's output into order that 16-bit attention makes needless.
    pub copies_not_made: usize,
}

/// The what-if, as edits to the run's events (see [`Input::resized_optional`]).
#[derive(Clone, Debug)]
pub struct Autocast {
    pub summary: AutocastSummary,
    /// Per request: made in 16 bits (half its size).
    half: Vec<bool>,
    /// Per event: a free moved before its place (left out there).
    skip: Vec<bool>,
    /// Before each event (and at the end): what to insert.
    inserts: Vec<Vec<Insert>>,
    copies: Vec<Added>,
    /// The run's events so edited, made at the first replay and held for the rest.
    pub(in crate::report::torch_allocator) edited:
        std::sync::OnceLock<Option<std::sync::Arc<super::replayer::Edited>>>,
}

#[derive(Clone, Copy, Debug)]
enum Insert {
    /// A copy made.
    Alloc(u32),
    /// A copy let go.
    Free(u32),
    /// The tensor of this request (an event index) let go here, earlier than in the run.
    FreeOf(usize),
}

/// A tensor the what-if adds: its bytes at the run's batch, and the request whose scale it
/// follows (`None`: fixed, a parameter's copy).
#[derive(Clone, Copy, Debug)]
struct Added {
    bytes: u64,
    like: Option<usize>,
    device: u8,
    stream: u16,
}

/// Copies' addresses: out of the way of any the run used.
fn copy_ptr(k: u32) -> u64 {
    0xfe00_0000_0000_0000 | (u64::from(k) << 4)
}

/// One request of the run, as the what-if sees it.
#[derive(Clone, Copy, Debug)]
struct Req {
    event: usize,
    size: u64,
    /// Its step (relative to the graph's) and its op's node in the graph.
    place: Option<(i64, u64)>,
    backward: bool,
    /// Where it was let go: its free, and the request of it if any (event indices).
    free: Option<usize>,
    free_requested: Option<usize>,
}

/// Why a walk cannot be matched to the run's steps when its nodes are numbered across every
/// sequence number there is.
const SPAN_TOO_WIDE: &str = "the autograd graph's nodes are numbered from 0 to the largest \
    sequence number there is, which no step of a run makes: the trace's graph records are \
    damaged";

/// The most copies the what-if makes per event of the run: an op copies each of its inputs
/// it casts, a few per op, where each op asks for its output and its backward's gradients.
const COPIES_PER_EVENT: usize = 4;

/// Where each step's backward ran: its first and last request (event indices).
type Spans = BTreeMap<i64, (usize, usize)>;

impl Input {
    /// The what-if of `torch.autocast` to `dtype` over this run (see the module's notes).
    pub fn autocast(&self, dtype: &str) -> Result<Autocast, String> {
        let walk = self.template()?;
        let (lo, hi) = walk.span();
        // Sequence numbers are the trace's: a walk numbered from 0 to the last u64 is refused
        // (its period would not fit), never divided by.
        let period = (hi - lo).checked_add(1).ok_or(SPAN_TOO_WIDE)?;
        let reqs = self.requests_placed(lo, period);
        let mut spans = Spans::new();
        for r in reqs.iter().filter(|r| r.backward) {
            if let Some((k, _)) = r.place {
                let s = spans.entry(k).or_insert((r.event, r.event));
                s.0 = s.0.min(r.event);
                s.1 = s.1.max(r.event);
            }
        }
        let mut m = Model::new(self, walk, &reqs, &spans);
        m.outputs();
        m.copies()?;
        m.free_earlier();
        m.backward();
        m.ac.summary.dtype = dtype.to_string();
        m.ac.summary.graph_nodes = walk.nodes.len();
        m.ac.summary.steps = spans.len();
        Ok(m.ac)
    }

    /// The graph the steps are matched to: the latest whole walk, refused where the run
    /// already casts its parameters (it ran under autocast) or where walks disagree.
    fn template(&self) -> Result<&Walk, String> {
        let walks: Vec<&Walk> = self.graph.walks.iter().filter(|w| !w.cut).collect();
        let Some(&walk) = walks.last() else {
            return Err(match self.graph.refused {
                Some(code) => format!(
                    "the shim could not read the run's autograd graph ({}), which the what-if needs",
                    crate::trace::format::graph::outcome(code)
                ),
                None => "the trace holds no autograd graph, which the what-if needs: record the \
                         run with this version's shim (it reads the graph when a backward pass \
                         begins; a program whose backward allocates nothing on the GPU shows none)"
                    .into(),
            });
        };
        let casts = walk.nodes.values().any(|n| {
            n.class == "ToCopyBackward0" && matches!(n.inputs.first(), Some(Source::Leaf(_)))
        });
        if casts {
            return Err(
                "the run already casts its parameters (it ran under autocast, or a \
                        16-bit copy of the model): the what-if starts from a run in 32 bits"
                    .into(),
            );
        }
        let (lo, hi) = walk.span();
        // At least 1, in an integer as wide as it can be.
        let period = i128::from(hi - lo) + 1;
        for w in &walks {
            let shift = i128::from(w.span().0) - i128::from(lo);
            let same = w.nodes.len() == walk.nodes.len()
                && shift.rem_euclid(period) == 0
                && w.nodes
                    .values()
                    .zip(walk.nodes.values())
                    .all(|(a, b)| a.class == b.class);
            if !same {
                return Err(
                    "the run's steps do not make the same autograd graph (its walks \
                            differ), so its steps cannot be matched to one graph"
                        .into(),
                );
            }
        }
        Ok(walk)
    }

    /// Every request, placed in its step and at its op's node, with its frees.
    fn requests_placed(&self, lo: u64, period: u64) -> Vec<Req> {
        let frees = self.frees();
        let mut backward: FastMap<u64, bool> = FastMap::default();
        let mut reqs: Vec<Req> = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc {
                continue;
            }
            let b = *backward
                .entry(e.stack)
                .or_insert_with(|| backward_node_of(&self.tables, e.stack).is_some());
            let place = e.sequence.checked_sub(1).map(|s| {
                let d = i128::from(s) - i128::from(lo);
                let p = i128::from(period);
                let node = lo + u64::try_from(d.rem_euclid(p)).unwrap_or(0);
                (i64::try_from(d.div_euclid(p)).unwrap_or(i64::MIN), node)
            });
            let of = frees.get(&i).map_or(&[][..], Vec::as_slice);
            let find = |ev: Ev| of.iter().copied().find(|&f| self.events[f].ev == ev);
            reqs.push(Req {
                event: i,
                size: e.size,
                place,
                backward: b,
                free: find(Ev::Free),
                free_requested: find(Ev::FreeRequested),
            });
        }
        reqs
    }
}

/// The what-if being built.
struct Model<'a> {
    input: &'a Input,
    walk: &'a Walk,
    reqs: &'a [Req],
    spans: &'a Spans,
    /// Each node's type under autocast: 16 bits or not.
    sixteen: BTreeMap<u64, bool>,
    /// Each step's forward output of each node (a request index), and the request each
    /// node's copies are made before (its output, however small).
    outputs: BTreeMap<(i64, u64), usize>,
    anchors: BTreeMap<(i64, u64), usize>,
    /// Per step: parameter copies and their bytes, activation copies and theirs.
    step_counts: BTreeMap<i64, (usize, u64, usize, u64)>,
    /// Per step and node: the run's sizes of the 32-bit inputs it copied to 16 bits (their
    /// gradients come back to 32 bits).
    copied: BTreeMap<(i64, u64), Vec<u64>>,
    ac: Autocast,
}

impl<'a> Model<'a> {
    fn new(input: &'a Input, walk: &'a Walk, reqs: &'a [Req], spans: &'a Spans) -> Self {
        let events = input.events.len();
        Model {
            input,
            walk,
            reqs,
            spans,
            sixteen: types(walk, &cross_entropies(input, walk, reqs)),
            outputs: BTreeMap::new(),
            anchors: BTreeMap::new(),
            step_counts: BTreeMap::new(),
            copied: BTreeMap::new(),
            ac: Autocast {
                summary: AutocastSummary::default(),
                half: vec![false; reqs.len()],
                skip: vec![false; events],
                inserts: vec![Vec::new(); events + 1],
                copies: Vec::new(),
                edited: Default::default(),
            },
        }
    }

    /// Whether a request outlives its step's backward (a parameter's gradient, a workspace).
    fn outlives(&self, r: &Req, k: i64) -> bool {
        let last = self.spans.get(&k).map_or(0, |s| s.1);
        r.free.is_none_or(|f| f > last)
    }

    /// Each step's forward outputs, halved where their op runs in 16 bits.
    fn outputs(&mut self) {
        let mut by_node: BTreeMap<(i64, u64), Vec<usize>> = BTreeMap::new();
        for (n, r) in self.reqs.iter().enumerate() {
            let Some((k, node)) = r.place else { continue };
            let before = self.spans.get(&k).is_some_and(|s| r.event < s.0);
            if r.backward || !before || self.outlives(r, k) {
                continue;
            }
            by_node.entry((k, node)).or_default().push(n);
        }
        for ((k, node), ns) in by_node {
            let Some(g) = self.walk.nodes.get(&node) else {
                continue;
            };
            if ops::is_view(&g.class) {
                continue;
            }
            // Not a temporary of the op (a workspace, a copy of an input), let go before
            // anything else is asked for; then the largest (the first, for an op that makes
            // its output before larger indices), and of those the one kept longest.
            let last = ns.iter().map(|&n| self.reqs[n].event).max().unwrap_or(0);
            let next = self.next_request(last);
            let kept: Vec<usize> = ns
                .iter()
                .copied()
                .filter(|&n| self.reqs[n].free.is_none_or(|f| f > next))
                .collect();
            let ns = if kept.is_empty() { ns } else { kept };
            let key = |n: &usize| (self.reqs[*n].size, self.reqs[*n].free.unwrap_or(usize::MAX));
            let out = if ops::output_first(&g.class) {
                ns.first().copied()
            } else {
                ns.iter().copied().max_by_key(key)
            };
            let Some(out) = out else {
                continue;
            };
            // A scalar (a loss) is no output to halve, but its op still copies its inputs.
            self.anchors.insert((k, node), out);
            if self.reqs[out].size < 512 {
                continue;
            }
            if self.layout_copy(node) {
                // 16-bit attention (cuDNN's) lays its output out as its query was: the copy
                // that put fp32 attention's output back in order is not made.
                let r = self.reqs[out];
                for e in [Some(r.event), r.free, r.free_requested]
                    .into_iter()
                    .flatten()
                {
                    self.ac.skip[e] = true;
                }
                self.ac.summary.copies_not_made += 1;
                continue;
            }
            self.outputs.insert((k, node), out);
            if self.sixteen.get(&node) == Some(&true) {
                self.ac.half[out] = true;
                self.ac.summary.halved_bytes += self.reqs[out].size / 2;
            }
        }
    }
}

impl Model<'_> {
    /// The event of the first request made after event `i` (the end: none).
    fn next_request(&self, i: usize) -> usize {
        let at = self.reqs.partition_point(|r| r.event <= i);
        self.reqs.get(at).map_or(usize::MAX, |r| r.event)
    }

    /// Whether `node` copies an attention's output into order (`.contiguous()` after a
    /// permute), which 16-bit attention makes needless.
    fn layout_copy(&self, node: u64) -> bool {
        let Some(g) = self.walk.nodes.get(&node) else {
            return false;
        };
        let Some(Source::Node { sequence, .. }) = g.inputs.first() else {
            return false;
        };
        g.class == "CloneBackward0"
            && storage(self.walk, *sequence).is_some_and(|(s, _)| {
                self.walk.nodes.get(&s).is_some_and(|a| {
                    a.class.contains("Attention") && ops::cast_of(&a.class) == Cast::Sixteen
                })
            })
    }
}

/// The log-softmaxes of cross entropies (one whose output a negative log-likelihood takes),
/// which run in their input's type: `cross_entropy` asks `log_softmax` for its input's type,
/// which autocast leaves as it is, and `nll_loss` copies the result to 32 bits. Not those
/// that transformers' loss functions (`transformers/loss/loss_utils.py`) make, which cast the
/// logits to 32 bits first (a copy a 32-bit run does not show).
fn cross_entropies(input: &Input, walk: &Walk, reqs: &[Req]) -> BTreeSet<u64> {
    // What the losses take (through views), and each node's first forward request: once each.
    let taken_by_loss: BTreeSet<u64> = walk
        .nodes
        .values()
        .filter(|n| n.class.starts_with("NllLoss"))
        .flat_map(|n| n.inputs.iter())
        .filter_map(|i| match i {
            Source::Node { sequence, .. } => storage(walk, *sequence).map(|(x, _)| x),
            _ => None,
        })
        .collect();
    let mut first: BTreeMap<u64, usize> = BTreeMap::new();
    for r in reqs.iter().filter(|r| !r.backward) {
        if let Some((_, n)) = r.place {
            first.entry(n).or_insert(r.event);
        }
    }
    let upcast = |s: u64| {
        first
            .get(&s)
            .is_some_and(|&e| frames_mention(input, input.events[e].stack, "transformers/loss/"))
    };
    walk.nodes
        .iter()
        .filter(|(s, n)| {
            n.class == "LogSoftmaxBackward0" && taken_by_loss.contains(s) && !upcast(**s)
        })
        .map(|(&s, _)| s)
        .collect()
}

/// Whether a Python frame of `stack` lies in a file whose path holds `part`.
fn frames_mention(input: &Input, stack: u64, part: &str) -> bool {
    let reader = &input.tables;
    reader.stack(stack).is_some_and(|frames| {
        frames.iter().any(|&f| {
            crate::trace::format::as_py_frame(f)
                .and_then(|(id, _)| reader.string(id))
                .is_some_and(|t| {
                    t.split_once('\0')
                        .map_or(t, |(file, _)| file)
                        .contains(part)
                })
        })
    })
}

/// Each node's type under autocast, in the order the forward made them.
fn types(walk: &Walk, as_input: &BTreeSet<u64>) -> BTreeMap<u64, bool> {
    let mut sixteen: BTreeMap<u64, bool> = BTreeMap::new();
    for (&s, n) in &walk.nodes {
        let cast = if as_input.contains(&s) {
            Cast::AsInput
        } else {
            ops::cast_of(&n.class)
        };
        let t = match cast {
            Cast::Sixteen => true,
            Cast::ThirtyTwo => false,
            Cast::AsInput => match n.inputs.first() {
                Some(Source::Node { sequence, .. }) => sixteen.get(sequence) == Some(&true),
                _ => false,
            },
            Cast::Follows if is_bias_add(walk, n) => true,
            Cast::Follows => {
                let mut any = false;
                let mut all = true;
                for src in &n.inputs {
                    match src {
                        Source::Node { sequence, .. } => {
                            any = true;
                            all &= sixteen.get(sequence).copied().unwrap_or(false);
                        }
                        Source::Leaf(_) => (any, all) = (true, false),
                        Source::None => {}
                    }
                }
                any && all
            }
        };
        sixteen.insert(s, t);
    }
    sixteen
}

/// An add of a parameter to a matrix product's output (through views): a linear's bias,
/// which autocast cast with the linear's inputs.
fn is_bias_add(walk: &Walk, n: &crate::trace::graph::Node) -> bool {
    n.class == "AddBackward0"
        && n.inputs.iter().any(|s| matches!(s, Source::Leaf(_)))
        && n.inputs.iter().any(|s| match s {
            Source::Node { sequence, .. } => storage(walk, *sequence).is_some_and(|(node, _)| {
                walk.nodes
                    .get(&node)
                    .is_some_and(|g| ops::cast_of(&g.class) == Cast::Sixteen)
            }),
            _ => false,
        })
}

/// The most views one after the other that [`storage`] follows.
const VIEW_CHAIN_MAX: usize = 64;

/// The node whose memory a node's output is (through views), or the parameter it views: the
/// node and `false`, or the leaf's address and `true`; `None` where a view's input takes no
/// gradient.
fn storage(walk: &Walk, mut s: u64) -> Option<(u64, bool)> {
    // Chains of views are short; a graph that claims one longer is taken for none, so that
    // no graph makes this more than a bounded walk.
    for _ in 0..VIEW_CHAIN_MAX {
        let n = walk.nodes.get(&s)?;
        if !ops::is_view(&n.class) {
            return Some((s, false));
        }
        match n.inputs.first()? {
            Source::Node { sequence, .. } => s = *sequence,
            Source::Leaf(a) => return Some((*a, true)),
            Source::None => return None,
        }
    }
    None
}

mod edits;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::graph::Node;

    fn view_chain(n: u64) -> Walk {
        let mut w = Walk::default();
        w.nodes.insert(
            0,
            Node {
                class: "MmBackward0".into(),
                inputs: vec![Source::Leaf(0x1000)],
            },
        );
        for s in 1..=n {
            let input = Source::Node {
                sequence: s - 1,
                output: 0,
            };
            w.nodes.insert(
                s,
                Node {
                    class: "ViewBackward0".into(),
                    inputs: vec![input],
                },
            );
        }
        w
    }

    /// A view's memory is its base's, through a chain of views; a chain longer than any
    /// model makes (a trace that claims one) is taken for none, so no graph makes the
    /// what-if walk it for every node.
    #[test]
    fn a_chain_of_views_leads_to_its_base_within_a_bound() {
        assert_eq!(storage(&view_chain(10), 10), Some((0, false)));
        assert_eq!(storage(&view_chain(10_000), 10_000), None);
        assert_eq!(types(&view_chain(3), &BTreeSet::new()).get(&3), Some(&true));
    }
}
