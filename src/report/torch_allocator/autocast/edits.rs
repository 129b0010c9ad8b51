//! The what-if's edits: the copies autocast makes, the 32-bit outputs no longer kept, the
//! backward's 16-bit gradients; and how the replay applies them.

use super::ops::{self, Cast};
use super::{Added, Autocast, Ev, Event, Insert, Model, Req, copy_ptr, storage};
use crate::trace::graph::Source;
use std::collections::BTreeMap;

/// A parameter's copy in one step: made before an event, let go before another.
struct ParamCopy {
    made: usize,
    gone: usize,
    bytes: u64,
    at: Req,
}

impl Model<'_> {
    /// Whether node `node`'s input `i` is kept for its backward.
    fn keeps(&self, node: u64, i: usize) -> bool {
        let Some(g) = self.walk.nodes.get(&node) else {
            return false;
        };
        let other = g.inputs.len() == 2 && g.inputs.get(1 - i.min(1)) != Some(&Source::None);
        ops::saves(&g.class, i, other)
    }

    /// What node `node` casts its input `i` to: `Some(true)` 16 bits, `Some(false)` 32.
    fn cast_to(&self, node: u64, i: usize) -> Option<bool> {
        let g = self.walk.nodes.get(&node)?;
        let from_sixteen = match g.inputs.get(i)? {
            Source::Node { sequence, .. } => self.sixteen.get(sequence).copied().unwrap_or(false),
            Source::Leaf(_) => false,
            Source::None => return None,
        };
        match ops::cast_of(&g.class) {
            Cast::Sixteen if !from_sixteen => Some(true),
            Cast::ThirtyTwo if from_sixteen => Some(false),
            Cast::Follows
                if self.sixteen.get(&node) == Some(&true)
                    && matches!(g.inputs[i], Source::Leaf(_)) =>
            {
                Some(true)
            }
            _ => None,
        }
    }

    /// The copies each op makes of its inputs, and how long each lives; `Err` where the graph
    /// would have them outnumber the run's events [`super::COPIES_PER_EVENT`] times over (a
    /// node of thousands of inputs in each of thousands of steps: the replays would hold their
    /// product, quadratic in the trace).
    pub(super) fn copies(&mut self) -> Result<(), String> {
        let mut param_sizes: BTreeMap<(i64, u64), Vec<u64>> = BTreeMap::new();
        let mut backward_end: BTreeMap<(i64, u64), usize> = BTreeMap::new();
        for r in self.reqs.iter().filter(|r| r.backward) {
            let Some((k, node)) = r.place else { continue };
            let end = backward_end.entry((k, node)).or_insert(0);
            *end = (*end).max(r.event + 1);
            if self.outlives(r, k) {
                param_sizes.entry((k, node)).or_default().push(r.size);
            }
        }
        let mut params: BTreeMap<(i64, u64), ParamCopy> = BTreeMap::new();
        let outputs: Vec<((i64, u64), usize)> =
            self.anchors.iter().map(|(&a, &b)| (a, b)).collect();
        for ((k, node), out) in outputs {
            let Some(g) = self.walk.nodes.get(&node) else {
                continue;
            };
            let at = self.reqs[out];
            let forward_end = self.spans.get(&k).map_or(at.event + 1, |s| s.0);
            let kept_until = backward_end
                .get(&(k, node))
                .copied()
                .unwrap_or_else(|| self.spans.get(&k).map_or(at.event + 1, |s| s.1 + 1));
            // A parameter's size from its gradient: the larger ones go to the inputs kept
            // (weights), the smaller to the others (biases).
            let mut sizes = param_sizes.get(&(k, node)).cloned().unwrap_or_default();
            sizes.sort_unstable();
            let mut order: Vec<usize> = (0..g.inputs.len()).collect();
            order.sort_by_key(|&i| !self.keeps(node, i));
            for i in order {
                let Some(to_sixteen) = self.cast_to(node, i) else {
                    continue;
                };
                let keep = self.keeps(node, i);
                let source = match g.inputs[i] {
                    Source::Node { sequence, .. } => storage(self.walk, sequence),
                    Source::Leaf(a) => Some((a, true)),
                    Source::None => None,
                };
                match source {
                    Some((leaf, true)) if to_sixteen => {
                        let Some(size) = sizes.pop() else { continue };
                        let gone = if keep { kept_until } else { forward_end };
                        let c = params.entry((k, leaf)).or_insert(ParamCopy {
                            made: at.event,
                            gone,
                            bytes: size / 2,
                            at,
                        });
                        c.gone = c.gone.max(gone);
                        self.within_bound(params.len())?;
                    }
                    Some((s, false)) => {
                        let Some(&src) = self.outputs.get(&(k, s)) else {
                            continue;
                        };
                        let run = self.reqs[src].size;
                        let bytes = if to_sixteen { run / 2 } else { run };
                        let gone = if keep { kept_until } else { at.event + 1 };
                        self.copy(at, bytes, Some(src), at.event, gone);
                        self.count(k, false, bytes);
                        self.within_bound(params.len())?;
                        if to_sixteen {
                            self.copied.entry((k, node)).or_default().push(run);
                        }
                    }
                    _ => {}
                }
            }
        }
        for ((k, _), c) in params {
            self.copy(c.at, c.bytes, None, c.made, c.gone.max(c.made + 1));
            self.count(k, true, c.bytes);
        }
        Ok(())
    }

    /// `Err` once the copies made and `more` to come outnumber the run's events
    /// [`super::COPIES_PER_EVENT`] times over (and 4,096).
    fn within_bound(&self, more: usize) -> Result<(), String> {
        let events = self.input.events.len();
        let most = events
            .saturating_mul(super::COPIES_PER_EVENT)
            .saturating_add(4096);
        if self.ac.copies.len().saturating_add(more) > most {
            return Err(format!(
                "the autograd graph would have autocast make more than {most} copies of \
                 inputs ({} per event of the run's {events}): no run's ops take so many \
                 inputs each step, so the trace's graph records look damaged; the what-if is \
                 not made",
                super::COPIES_PER_EVENT
            ));
        }
        Ok(())
    }

    /// A copy of `bytes` (following request `like`'s scale) made before event `made` and let
    /// go before event `gone`, on the device and stream of request `at`.
    fn copy(&mut self, at: Req, bytes: u64, like: Option<usize>, made: usize, gone: usize) {
        let e = &self.input.events[at.event];
        let id = self.ac.copies.len() as u32;
        self.ac.copies.push(Added {
            bytes,
            like,
            device: e.device,
            stream: e.stream,
        });
        if let Some(v) = self.ac.inserts.get_mut(made) {
            v.push(Insert::Alloc(id));
        }
        let gone = gone.min(self.ac.inserts.len() - 1);
        self.ac.inserts[gone].push(Insert::Free(id));
    }

    /// Counts a copy in step `k`'s figures (the summary keeps the largest step's).
    fn count(&mut self, k: i64, parameter: bool, bytes: u64) {
        let step = self.step_counts.entry(k).or_default();
        if parameter {
            step.0 += 1;
            step.1 += bytes;
        } else {
            step.2 += 1;
            step.3 += bytes;
        }
        let s = &mut self.ac.summary;
        if step.1 + step.3 >= s.parameter_copy_bytes + s.activation_copy_bytes {
            (s.parameter_copies, s.parameter_copy_bytes) = (step.0, step.1);
            (s.activation_copies, s.activation_copy_bytes) = (step.2, step.3);
        }
    }

    /// A 32-bit output that every op keeping it now keeps a copy of instead goes once the
    /// last op that took it has run.
    pub(super) fn free_earlier(&mut self) {
        let mut consumers: BTreeMap<u64, Vec<(u64, usize)>> = BTreeMap::new();
        for (&c, g) in &self.walk.nodes {
            if ops::is_view(&g.class) {
                continue;
            }
            for (i, s) in g.inputs.iter().enumerate() {
                if let Source::Node { sequence, .. } = s
                    && let Some((node, false)) = storage(self.walk, *sequence)
                {
                    consumers.entry(node).or_default().push((c, i));
                }
            }
        }
        let outputs: Vec<((i64, u64), usize)> =
            self.outputs.iter().map(|(&a, &b)| (a, b)).collect();
        for ((k, s), out) in outputs {
            let r = self.reqs[out];
            let forward_end = self.spans.get(&k).map_or(0, |x| x.0);
            let Some(free) = r.free.filter(|&f| f >= forward_end) else {
                continue;
            };
            let Some(cons) = consumers.get(&s) else {
                continue;
            };
            let keepers: Vec<&(u64, usize)> =
                cons.iter().filter(|(c, i)| self.keeps(*c, *i)).collect();
            if keepers.is_empty() || !keepers.iter().all(|(c, i)| self.cast_to(*c, *i).is_some()) {
                continue;
            }
            let last = cons
                .iter()
                .filter_map(|(c, _)| self.outputs.get(&(k, *c)).map(|&o| self.reqs[o].event))
                .max();
            let Some(last) = last.filter(|&l| l + 1 < free) else {
                continue;
            };
            self.ac.inserts[last + 1].push(Insert::FreeOf(r.event));
            self.ac.skip[free] = true;
            if let Some(q) = r.free_requested {
                self.ac.skip[q] = true;
            }
            self.ac.summary.freed_earlier += 1;
        }
    }

    /// The backward of an op that ran in 16 bits: its temporaries halve; the gradient of an
    /// input it copied from 32 bits (a parameter's, an activation's of that size) is made in
    /// 16 bits and cast back to 32 (both live for a moment).
    pub(super) fn backward(&mut self) {
        let reqs = self.reqs;
        for (n, r) in reqs.iter().enumerate() {
            let Some((k, node)) = r.place.filter(|_| r.backward) else {
                continue;
            };
            let Some(g) = self.walk.nodes.get(&node) else {
                continue;
            };
            let sixteen =
                self.sixteen.get(&node) == Some(&true) || ops::cast_of(&g.class) == Cast::Sixteen;
            if !sixteen {
                continue;
            }
            let copied = self.copied.get_mut(&(k, node)).and_then(|sizes| {
                let at = sizes.iter().position(|&s| s == r.size)?;
                Some(sizes.swap_remove(at))
            });
            if self.outlives(r, k) {
                self.copy(*r, r.size / 2, None, r.event, r.event + 1);
            } else if copied.is_some() {
                self.copy(*r, r.size / 2, Some(n), r.event, r.event + 1);
            } else {
                self.ac.half[n] = true;
            }
        }
    }
}

impl Autocast {
    /// Whether request `n` is made in 16 bits (half its size at any batch).
    pub fn half(&self, n: usize) -> bool {
        self.half.get(n).copied().unwrap_or(false)
    }

    /// Whether event `i` (a free moved earlier) is left out at its place.
    pub(in crate::report::torch_allocator) fn skips(&self, i: usize) -> bool {
        self.skip.get(i).copied().unwrap_or(false)
    }

    /// What goes before event `i` of `events` (or at the end for `events.len()`): copies made
    /// (sized by `sized(bytes, like)`) and let go, tensors let go earlier; appended to `out`.
    pub(in crate::report::torch_allocator) fn insert_before(
        &self,
        events: &[Event],
        i: usize,
        at: u64,
        sized: &impl Fn(u64, Option<usize>) -> u64,
        out: &mut Vec<Event>,
    ) {
        let Some(list) = self.inserts.get(i) else {
            return;
        };
        for x in list {
            let (ev, ptr, size, device, stream) = match *x {
                Insert::Alloc(id) | Insert::Free(id) => {
                    let Some(c) = self.copies.get(id as usize) else {
                        continue;
                    };
                    let alloc = matches!(x, Insert::Alloc(_));
                    let size = if alloc { sized(c.bytes, c.like) } else { 0 };
                    let ev = if alloc { Ev::Alloc } else { Ev::Free };
                    (ev, copy_ptr(id), size, c.device, c.stream)
                }
                Insert::FreeOf(a) => {
                    let Some(e) = events.get(a) else { continue };
                    (Ev::Free, e.ptr, 0, e.device, e.stream)
                }
            };
            let Some(model) = events.get(i.min(events.len().saturating_sub(1))) else {
                continue;
            };
            let mut e = *model;
            (e.ev, e.ptr, e.size, e.device, e.stream, e.time_ns) =
                (ev, ptr, size, device, stream, at);
            (e.stack, e.sequence, e.private, e.optional) = (0, 0, false, false);
            out.push(e);
        }
    }
}
