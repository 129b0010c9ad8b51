//! Which of the run's requests follow the batch, and how: their kinds, the reductions' staging
//! buffers and semaphores, the workspaces the program can do without, and what a second run
//! says of each.

use super::{Requests, Scale, reduce};
use crate::fasthash::FastMap;
use crate::report::kinds::{Kind, Phase, backward_node_of, phase_of_stack};
use crate::report::torch_allocator::Input;

/// Each request: whether the program can do without it when memory is short. A
/// convolution's workspace (a scratch buffer of a line of convolutions, freed before anything
/// else is asked): PyTorch catches the failure and tries cuDNN's next algorithm, down to those
/// needing none (`aten/src/ATen/native/cudnn/Conv_v8.cpp`, `try_configs`).
pub(super) fn optional_requests(input: &Input, labels: &Labels) -> Vec<bool> {
    // Whether each line's innermost frame is a convolution's, once a line.
    let conv: Vec<bool> = labels
        .texts()
        .iter()
        .map(|label| {
            let innermost = label.split(" < ").next().unwrap_or_default();
            innermost.to_ascii_lowercase().contains("conv")
        })
        .collect();
    input
        .scratch()
        .into_iter()
        .zip(labels.ids())
        .map(|(scratch, &id)| scratch && conv.get(id as usize).copied().unwrap_or(false))
        .collect()
}

/// The run's requests classed by how they follow the batch, with the labels that class them.
/// What the replays and the classing ask of the events as a whole is found on a thread of its
/// own meanwhile where there are two cores.
pub(super) fn classed(input: &Input) -> (Labels, Requests) {
    let class = || {
        let labels = Labels::of(input);
        let req = classify(input, input.request_kinds(), &labels);
        (labels, req)
    };
    if super::two_cores() {
        std::thread::scope(|s| {
            s.spawn(|| input.prepare());
            class()
        })
    } else {
        class()
    }
}

/// How each request scales, from its kind and its phase; `input` gives the sizes and stacks.
pub(super) fn classify(input: &Input, kinds: Vec<Kind>, labels: &Labels) -> Requests {
    let reader = input.tables();
    // Each request's phase and the autograd node of a backward one ("" for the others: its
    // place in `names`, each node's name kept once; a request's own took 16 bytes of tens of
    // millions), each stack's found once; its size and sequence number beside them. One pass
    // over the events for all four: each is a walk of a long run's gigabyte of them.
    let mut names: Vec<&str> = Vec::new();
    let mut of_stack: FastMap<u64, (Phase, u32)> = FastMap::default();
    let (mut sizes, mut sequences) = (Vec::new(), Vec::new());
    let (phases, nodes): (Vec<Phase>, Vec<u32>) = input
        .request_fields()
        .map(|(size, stack, sequence)| {
            sizes.push(size);
            sequences.push(sequence);
            *of_stack.entry(stack).or_insert_with(|| {
                names.push(backward_node_of(reader, stack).unwrap_or_default());
                let id = u32::try_from(names.len() - 1).unwrap_or(u32::MAX);
                (phase_of_stack(reader, stack), id)
            })
        })
        .unzip();
    let node = |i: usize| -> &str {
        let id = nodes.get(i).copied().unwrap_or(u32::MAX);
        names.get(id as usize).copied().unwrap_or_default()
    };
    let weights = WeightSized::new(input, (&kinds, &sequences), &phases, node);
    let unsharded = super::world::Unsharded::of(input, &kinds);
    let ends = gradient_ends(input, &kinds, &sequences, &sizes);
    let scale = input
        .requests()
        .zip(&kinds)
        .enumerate()
        .map(|(i, ((size, stack), k))| match k {
            Kind::Activation if weights.copy(size, stack, phases[i], sequences[i]) => Scale::Fixed,
            Kind::Activation | Kind::Input => Scale::Batch,
            Kind::Temporary => {
                let phase = phases[i];
                let weight = weights.temporary(size, stack, phase, node(i), sequences[i])
                    && !weights.activation_gradient(size, phase, node(i), ends[i]);
                let whole = phase == Phase::Backward && unsharded.gradient(size, node(i));
                if phase == Phase::Optimizer || weight || whole {
                    Scale::Fixed
                } else {
                    Scale::Batch
                }
            }
            Kind::Unknown => Scale::Unknown,
            Kind::Parameter
            | Kind::Gradient
            | Kind::OptimizerState
            | Kind::Workspace
            | Kind::Communication => Scale::Fixed,
        })
        .collect();
    let mut req = Requests { scale, kinds };
    mark_reductions(input, &mut req, labels, &sizes);
    req
}

/// The autograd node of a cast (`.to(dtype)`), by the start of its name.
const CAST: &str = "ToCopyBackward";

/// The nodes whose backward makes a weight's gradient (or casts one), of all autograd's: a
/// temporary of a weight's size from any other node (a split's, a view's, a dropout's, an
/// attention kernel's) is an activation's gradient of that size by chance. Normalizations
/// have weights too (small ones); `AccumulateGrad` sums a gradient into `.grad`.
const WEIGHT_GRADIENT_NODES: [&str; 16] = [
    "Mm",
    "Bmm",
    "Addmm",
    "Baddbmm",
    "Addbmm",
    "Addmv",
    "Mv",
    "Convolution",
    "CudnnConvolution",
    "Embedding",
    "EmbeddingBag",
    "ToCopy",
    "NativeLayerNorm",
    "NativeGroupNorm",
    "NativeBatchNorm",
    "CudnnBatchNorm",
];

/// Whether `node` (a backward request's node, `MmBackward0`) makes weights' gradients.
pub(super) fn makes_weight_gradients(node: &str) -> bool {
    node == "AccumulateGrad"
        || WEIGHT_GRADIENT_NODES.iter().any(|n| {
            node.strip_prefix(n)
                .is_some_and(|rest| rest.starts_with("Backward"))
        })
}

/// Requests that are a weight's size without following the batch: a weight's gradient being
/// summed or cast in the backward, its 16-bit copy under autocast (made in the forward, kept
/// for the backward). A size alone is a poor witness: at 2 x 512 tokens GPT-2's activations of
/// the hidden width are its position table's size (fp32) or half of it (bf16), and a dropout
/// mask at 8 x 512 is too. So a line counts as making weights' copies or gradients only where
/// it makes no more of that size a step than twice the parameters of that size, and a forward
/// tensor only at half a parameter's size (the forward makes no full-size copy of a weight).
struct WeightSized {
    /// Parameters by size.
    full: FastMap<u64, u64>,
    /// Requests by (line, size), over the run.
    by_line: FastMap<(u64, u64), u64>,
    steps: u64,
    /// The autograd node of each sequence number whose backward made a tensor (the op that
    /// made a forward tensor of that number) is a cast's (`ToCopyBackward`), and whether a
    /// tensor it made became a parameter's gradient (a weight's cast hands its gradient to the
    /// weight; an activation's cast hands it on). A run numbers its nodes anew every step, so
    /// this grows with the run: two flags a number, not the node's name.
    nodes: FastMap<u64, (bool, bool)>,
    /// Whether the run makes its parameters' gradients anew each step ([`gradients_anew`]).
    gradients_made: bool,
    /// Lines whose forward ops the autograd graph names, and none of them a cast: their
    /// outputs are no weight's copy whatever their size (an add's output of half a weight's
    /// size at a small batch; an add's backward makes no tensor to say what it is).
    not_casts: std::collections::HashSet<u64, crate::fasthash::SeededState>,
}

impl WeightSized {
    /// From the run's requests: their kinds and sequence numbers (each request's, in order),
    /// their phases, and each one's autograd node (by its place).
    fn new<'a>(
        input: &Input,
        (kinds, sequences): (&[Kind], &[u64]),
        phases: &[Phase],
        node: impl Fn(usize) -> &'a str,
    ) -> WeightSized {
        let mut full: FastMap<u64, u64> = FastMap::default();
        let mut grads: FastMap<u64, u64> = FastMap::default();
        let mut by_line: FastMap<(u64, u64), u64> = FastMap::default();
        for ((size, stack), k) in input.requests().zip(kinds) {
            match k {
                Kind::Parameter => *full.entry(size).or_default() += 1,
                Kind::Gradient => *grads.entry(size).or_default() += 1,
                _ => {}
            }
            *by_line.entry((stack, size)).or_default() += 1;
        }
        // A trace that begins after the model was built has its gradients, not its parameters.
        if full.is_empty() {
            full = grads;
        }
        let mut by_sequence: FastMap<u64, (bool, bool)> = FastMap::default();
        for (i, (&sequence, k)) in sequences.iter().zip(kinds).enumerate() {
            let node = node(i);
            if sequence != 0 && !node.is_empty() {
                let e = by_sequence
                    .entry(sequence)
                    .or_insert_with(|| (node.starts_with(CAST), false));
                e.1 |= *k == Kind::Gradient;
            }
        }
        WeightSized {
            full,
            by_line,
            steps: steps_of(phases),
            gradients_made: gradients_anew(kinds, phases),
            nodes: by_sequence,
            not_casts: lines_of_no_cast(input, sequences, phases),
        }
    }

    /// Whether a line's requests of `size` are few enough a step to be `parameters`' copies or
    /// gradients (at most two for each).
    fn few(&self, size: u64, stack: u64, parameters: u64) -> bool {
        let made = self.by_line.get(&(stack, size)).copied().unwrap_or(0);
        parameters > 0 && made <= parameters.saturating_mul(2).saturating_mul(self.steps)
    }

    fn half_of(&self, size: u64) -> u64 {
        size.checked_mul(2)
            .and_then(|d| self.full.get(&d))
            .copied()
            .unwrap_or(0)
    }

    /// A forward tensor kept for the backward that is a weight's 16-bit copy: made by a cast
    /// (`ToCopyBackward0`, where its op's backward made a tensor: an activation that is half a
    /// weight's size by chance is not), few a step.
    fn copy(&self, size: u64, stack: u64, phase: Phase, sequence: u64) -> bool {
        let cast = !self.not_casts.contains(&stack)
            && self.nodes.get(&sequence).is_none_or(|&(cast, _)| cast);
        // Where the run's gradients are made anew each step (`zero_grad()` sets them to None),
        // a weight's cast hands the weight its gradient: a cast whose backward made no
        // parameter's gradient is an activation's (at 2 x 512 tokens a Llama's hidden states
        // are its projections' size, cast alike on the same line).
        let activation = self.activation_cast(sequence);
        phase == Phase::Forward && cast && !activation && self.few(size, stack, self.half_of(size))
    }

    /// Whether the cast of autograd number `sequence` is an activation's: the run makes its
    /// parameters' gradients anew each step, and the cast's backward made none of them.
    fn activation_cast(&self, sequence: u64) -> bool {
        self.gradients_made && self.nodes.get(&sequence).is_some_and(|&(_, w)| !w)
    }

    /// A backward temporary of a weight's size or half, from a node that makes weights'
    /// gradients, that is an activation's gradient. Where the run makes its gradients anew each
    /// step, a weight's gradient is the weight's `.grad` itself (a parameter's gradient, not a
    /// temporary); a temporary one is a 16-bit gradient cast to the weight's dtype and let go
    /// at once, or a tied weight's second gradient summed into its `.grad` before any other node
    /// runs. An activation's gradient of that size by chance (a Llama's at 2 x 512 tokens, its
    /// hidden size) is handed on instead.
    fn activation_gradient(&self, size: u64, phase: Phase, node: &str, end: GradientEnd) -> bool {
        let weight_node =
            !node.is_empty() && !node.starts_with(CAST) && makes_weight_gradients(node);
        if !(self.gradients_made && phase == Phase::Backward && weight_node) {
            return false;
        }
        if self.full.contains_key(&size) {
            !(end.at_home || end.copied)
        } else {
            self.half_of(size) > 0 && !end.cast_back
        }
    }

    /// A temporary that is a weight's gradient or copy (`node`: the autograd node that made
    /// it, empty outside the backward's nodes).
    fn temporary(&self, size: u64, stack: u64, phase: Phase, node: &str, sequence: u64) -> bool {
        if !node.is_empty() && !makes_weight_gradients(node) {
            return false;
        }
        // A cast's backward whose gradients went to no weight casts an activation's gradient
        // (where the run makes its gradients anew, as `copy` says).
        if node.starts_with(CAST) && self.activation_cast(sequence) {
            return false;
        }
        // In the forward, only a cast's copy, or what an op whose backward made a weight's
        // gradient looked up from it (GPT-2's position embeddings, one row a position, the
        // same at every batch): a temporary of half a weight's size made by another op (a
        // 16-bit projection's output, whose weight's gradient the cast makes, or a
        // concatenation, at a Llama's 2 x 512 tokens, its hidden size) is an activation's.
        let weighty = self
            .nodes
            .get(&sequence)
            .is_some_and(|&(cast, w)| cast || w);
        if phase == Phase::Forward && !weighty {
            return false;
        }
        let full = if phase == Phase::Forward {
            0
        } else {
            self.full.get(&size).copied().unwrap_or(0)
        };
        self.few(size, stack, full.saturating_add(self.half_of(size)))
    }
}

/// The forward's lines whose ops the walked autograd graphs name (by the request's sequence
/// number: its op's node's, plus one), none of them a cast.
fn lines_of_no_cast(
    input: &Input,
    sequences: &[u64],
    phases: &[Phase],
) -> std::collections::HashSet<u64, crate::fasthash::SeededState> {
    let mut class: FastMap<u64, bool> = FastMap::default();
    for w in &input.graph.walks {
        for (&seq, n) in &w.nodes {
            if !n.class.is_empty() {
                class.insert(seq, n.class.starts_with(CAST));
            }
        }
    }
    let mut casts: FastMap<u64, bool> = FastMap::default();
    if class.is_empty() {
        return Default::default();
    }
    for (((_, stack), &seq), &phase) in input.requests().zip(sequences).zip(phases) {
        if phase != Phase::Forward || seq == 0 {
            continue;
        }
        // A forward tensor's number is the one after its op's node (as the autocast what-if
        // reads it).
        if let Some(&cast) = class.get(&(seq - 1)) {
            *casts.entry(stack).or_default() |= cast;
        }
    }
    casts
        .into_iter()
        .filter(|&(_, cast)| !cast)
        .map(|(stack, _)| stack)
        .collect()
}

/// How a request ended, as a weight's gradient ends: let go right after a parameter's
/// gradient of twice its size was made (a 16-bit gradient cast to the weight's dtype) or of
/// its size (copied to be the weight's `.grad`: a transposed one, as a tied output layer's), or
/// before anything was asked by another autograd node (summed into the weight's `.grad` where
/// it was made). An activation's gradient is handed on: the node before asks first.
#[derive(Clone, Copy, Default)]
pub(super) struct GradientEnd {
    cast_back: bool,
    copied: bool,
    at_home: bool,
}

/// `kinds`, `sequences` and `sizes`: each request's, in order.
fn gradient_ends(
    input: &Input,
    kinds: &[Kind],
    sequences: &[u64],
    sizes: &[u64],
) -> Vec<GradientEnd> {
    input
        .last_before_free()
        .enumerate()
        .map(|(i, last)| match last {
            Some(j) if j >= i => {
                let gradient = j > i && kinds.get(j) == Some(&Kind::Gradient);
                let (own, size) = (sizes.get(i).copied(), sizes.get(j).copied());
                GradientEnd {
                    cast_back: gradient && size == own.and_then(|s| s.checked_mul(2)),
                    copied: gradient && size == own,
                    at_home: j == i || sequences.get(j) == sequences.get(i),
                }
            }
            _ => GradientEnd::default(),
        })
        .collect()
}

/// Whether the run makes its parameters' gradients anew each step (`zero_grad()` setting them
/// to None, PyTorch's default): one is made after its optimizer's first step. A run that sums
/// into `.grad` kept from step to step makes them at its first step only, and later steps'
/// casts make none; a run without an optimizer's step, whether it made any.
fn gradients_anew(kinds: &[Kind], phases: &[Phase]) -> bool {
    let mut stepped = false;
    let mut made = false;
    for (k, p) in kinds.iter().zip(phases) {
        if *p == Phase::Optimizer {
            stepped = true;
        } else if *k == Kind::Gradient {
            if stepped {
                return true;
            }
            made = true;
        }
    }
    made && !stepped
}

/// The run's steps: its optimizer's runs of requests, else its backward's, else one.
fn steps_of(phases: &[Phase]) -> u64 {
    let runs = |p: Phase| -> u64 {
        let starts = phases.windows(2).filter(|w| w[1] == p && w[0] != p).count();
        (starts + usize::from(phases.first() == Some(&p))) as u64
    };
    [Phase::Optimizer, Phase::Backward]
        .into_iter()
        .map(runs)
        .find(|&n| n > 0)
        .unwrap_or(1)
}

/// Marks the staging buffers of PyTorch's global reductions (a request that grows with the
/// batch followed at once, from the same line, by its semaphore: see [`reduce`]) to be resized
/// as PyTorch sizes them, and their semaphores as fixed, where the trace says what the device
/// is made of (a trace from before it was kept: in proportion, as any other).
pub(super) fn mark_reductions(input: &Input, req: &mut Requests, labels: &Labels, sizes: &[u64]) {
    let Some(make) = reduce::device_make(input) else {
        return;
    };
    // Both freed once the kernel is launched: before the program asks for anything else.
    let brief = input.freed_within(1);
    let scratch = input.scratch();
    for (i, pair) in sizes.windows(2).enumerate() {
        let [size, next] = [pair[0], pair[1]];
        if labels.id(i) != labels.id(i + 1)
            || req.scale.get(i) != Some(Scale::Batch)
            || !brief[i]
            || !scratch[i + 1]
        {
            continue;
        }
        if let Some(r) = reduce::Reduction::recognize(size, next, make) {
            req.scale.set(i, Scale::Reduction(r));
            req.scale.set(i + 1, Scale::Semaphore);
        }
    }
}

/// Each request's line (its frames), in order: what pairs a request with its counterpart in
/// another run of the program. Each distinct line's text is kept once and each request holds
/// its number: a long run's trace asks for tens of millions of tensors from a few hundred
/// lines, and a text a request took 1.3 GB of a 1.88 GB trace's `fit`.
pub(super) struct Labels {
    /// Each request's line, a place in `texts`.
    of: Vec<u32>,
    texts: Vec<String>,
}

impl Labels {
    pub(super) fn of(inp: &Input) -> Labels {
        let mut by_stack: FastMap<u64, u32> = FastMap::default();
        let mut by_text: FastMap<String, u32> = FastMap::default();
        let mut texts: Vec<String> = Vec::new();
        let of = inp
            .requests()
            .map(|(_, stack)| {
                *by_stack.entry(stack).or_insert_with(|| {
                    let text = crate::report::sites::site_label(inp.tables(), stack);
                    *by_text.entry(text).or_insert_with_key(|text| {
                        texts.push(text.clone());
                        // A request is an event of a `Vec` that `u32` indexes (see
                        // `made_of`), so its lines number fewer.
                        u32::try_from(texts.len() - 1).unwrap_or(u32::MAX)
                    })
                })
            })
            .collect();
        Labels { of, texts }
    }

    /// The number of the `i`-th request's line: two requests share one where their lines'
    /// texts are the same.
    pub(super) fn id(&self, i: usize) -> Option<u32> {
        self.of.get(i).copied()
    }

    /// Each request's line's text, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        self.of
            .iter()
            .map(|&i| self.texts.get(i as usize).map_or("", String::as_str))
    }

    /// Each distinct line's text, by number.
    pub(super) fn texts(&self) -> &[String] {
        &self.texts
    }

    /// Each request's line's number, in order.
    pub(super) fn ids(&self) -> &[u32] {
        &self.of
    }
}

/// What a second run of the program at another batch says of each request of this one: the
/// i-th request of a line here is the i-th of the same line there (the same program, the same
/// order; only sizes differ), and scales on the line through the two sizes. A request with no
/// counterpart (a line the second run made fewer times) gets `None`.
pub(super) fn measured(input: &Input, at: u64, second: &Input, other: u64) -> Vec<Option<Scale>> {
    let (mine, labels) = (Labels::of(input), Labels::of(second));
    let mut theirs: std::collections::HashMap<&str, Vec<u64>> = Default::default();
    for ((size, _), label) in second.requests().zip(labels.iter()) {
        theirs.entry(label).or_default().push(size);
    }
    // How many of each line's requests came so far, by its number.
    let mut taken = vec![0usize; mine.texts().len()];
    input
        .requests()
        .zip(mine.ids())
        .map(|((here, _), &id)| {
            let label = mine.texts().get(id as usize)?;
            let n = taken.get_mut(id as usize)?;
            let i = *n;
            *n += 1;
            theirs
                .get(label.as_str())
                .and_then(|v| v.get(i))
                .map(|&there| Scale::Measured {
                    here,
                    there,
                    at,
                    other,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_are_the_optimizers_runs_else_the_backwards() {
        use Phase::*;
        let run = [
            Build, Forward, Backward, Optimizer, Forward, Backward, Optimizer, Program,
        ];
        assert_eq!(steps_of(&run), 2);
        // No optimizer (a frozen model, gradients only): the backward's runs.
        assert_eq!(
            steps_of(&[Forward, Backward, Forward, Backward, Backward]),
            2
        );
        // A trace that begins in an optimizer step counts it.
        assert_eq!(steps_of(&[Optimizer, Forward, Backward, Optimizer]), 2);
        assert_eq!(steps_of(&[Forward, Forward]), 1);
        assert_eq!(steps_of(&[]), 1);
    }
}
