//! Which of the run's requests follow the batch, and how: their kinds, the reductions' staging
//! buffers and semaphores, the workspaces the program can do without, and what a second run
//! says of each.

use super::{Requests, Scale, reduce};
use crate::fasthash::FastMap;
use crate::report::kinds::{Kind, Phase, phase_of_stack};
use crate::report::torch_replay::Input;
use std::collections::HashSet;

/// Each request: whether the program can do without it when memory is short. A
/// convolution's workspace (a scratch buffer of a line of convolutions, freed before anything
/// else is asked): PyTorch catches the failure and tries cuDNN's next algorithm, down to those
/// needing none (`aten/src/ATen/native/cudnn/Conv_v8.cpp`, `try_configs`).
pub(super) fn optional_requests(input: &Input, labels: &[String]) -> Vec<bool> {
    input
        .scratch()
        .into_iter()
        .zip(labels)
        .map(|(scratch, label)| {
            let innermost = label.split(" < ").next().unwrap_or_default();
            scratch && innermost.to_ascii_lowercase().contains("conv")
        })
        .collect()
}

/// How each request scales, from its kind and its phase; `input` gives the sizes and stacks.
pub(super) fn classify(input: &Input, kinds: Vec<Kind>, labels: &[String]) -> Requests {
    let reader = input.reader();
    // The sizes a parameter has (a weight's gradient being summed in the backward), and half
    // of each (its copy in 16 bits under autocast, made in the forward).
    let mut parameter_sizes = HashSet::new();
    let mut half_sizes = HashSet::new();
    for ((size, _), k) in input.requests().zip(&kinds) {
        if matches!(k, Kind::Parameter | Kind::Gradient) {
            parameter_sizes.insert(size);
            half_sizes.insert(size / 2);
        }
    }
    // A temporary of the forward the full size of a parameter is an activation's that happens
    // to match (GPT-2's at 2 x 512 tokens are its position table's size, a dropout mask at 8
    // x 512 too): the forward makes no full-size copy of a weight.
    let mut phases: FastMap<u64, Phase> = FastMap::default();
    let scale = input
        .requests()
        .zip(&kinds)
        .map(|((size, stack), k)| match k {
            Kind::Activation | Kind::Input => Scale::Batch,
            Kind::Temporary => {
                let phase = *phases
                    .entry(stack)
                    .or_insert_with(|| phase_of_stack(reader, stack));
                let weight_sized = half_sizes.contains(&size)
                    || (phase != Phase::Forward && parameter_sizes.contains(&size));
                if phase == Phase::Optimizer || weight_sized {
                    Scale::Fixed
                } else {
                    Scale::Batch
                }
            }
            Kind::Unknown => Scale::Unknown,
            Kind::Parameter | Kind::Gradient | Kind::OptimizerState | Kind::Workspace => {
                Scale::Fixed
            }
        })
        .collect();
    let mut req = Requests { scale, kinds };
    mark_reductions(input, &mut req, labels);
    req
}

/// Marks the staging buffers of PyTorch's global reductions (a request that grows with the
/// batch followed at once, from the same line, by its semaphore: see [`reduce`]) to be resized
/// as PyTorch sizes them, and their semaphores as fixed, where the trace says what the device
/// is made of (a trace from before it was kept: in proportion, as any other).
pub(super) fn mark_reductions(input: &Input, req: &mut Requests, labels: &[String]) {
    let Some(make) = input
        .reader()
        .info()
        .devices
        .iter()
        .flatten()
        .next()
        .copied()
    else {
        return;
    };
    let sizes: Vec<u64> = input.requests().map(|(size, _)| size).collect();
    // Both freed once the kernel is launched: before the program asks for anything else.
    let brief = input.freed_within(1);
    let scratch = input.scratch();
    for (i, pair) in sizes.windows(2).enumerate() {
        let [size, next] = [pair[0], pair[1]];
        if labels[i] != labels[i + 1]
            || req.scale[i] != Scale::Batch
            || !brief[i]
            || !scratch[i + 1]
        {
            continue;
        }
        if let Some(r) = reduce::Reduction::recognize(size, next, make) {
            req.scale[i] = Scale::Reduction(r);
            req.scale[i + 1] = Scale::Semaphore;
        }
    }
}

/// Each request's line (its frames), in order: what pairs a request with its counterpart in
/// another run of the program.
pub(super) fn request_labels(inp: &Input) -> Vec<String> {
    let mut cache: FastMap<u64, String> = FastMap::default();
    inp.requests()
        .map(|(_, stack)| {
            cache
                .entry(stack)
                .or_insert_with(|| crate::report::sites::site_label(inp.reader(), stack))
                .clone()
        })
        .collect()
}

/// What a second run of the program at another batch says of each request of this one: the
/// i-th request of a line here is the i-th of the same line there (the same program, the same
/// order; only sizes differ), and scales on the line through the two sizes. A request with no
/// counterpart (a line the second run made fewer times) gets `None`.
pub(super) fn measured(input: &Input, at: u64, second: &Input, other: u64) -> Vec<Option<Scale>> {
    let labels = request_labels;
    let mut theirs: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for ((size, _), label) in second.requests().zip(labels(second)) {
        theirs.entry(label).or_default().push(size);
    }
    let mut taken: std::collections::HashMap<String, usize> = Default::default();
    input
        .requests()
        .zip(labels(input))
        .map(|((here, _), label)| {
            let n = taken.entry(label.clone()).or_default();
            let i = *n;
            *n += 1;
            theirs
                .get(&label)
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
