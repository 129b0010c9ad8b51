//! The global reductions a run at a small batch never showed: a bias's gradient is the sum
//! of its output's gradient over the batch's rows (`AddmmBackward0`: batch x sequence rows;
//! `ConvolutionBackward0`: batch x height x width). Over few rows each thread block sums its
//! outputs alone and PyTorch asks nothing; past about a thousand rows (each thread summing 256
//! values) the kernel sums across blocks through a staging buffer and a semaphore it asks of
//! the allocator (`reduce.rs`). A ViT-Base at batch 4 (788 rows) asks none; at 16, 32 of them
//! a step, 19 to 75 MiB each, which a replay resized from batch 4 lacked: peak reserved 4.8%
//! low on an H200 (docs/gpu-checks.md).
//!
//! Each such sum is found from what the run recorded: a request of a parameter's size (fp32:
//! the bias's own; or half of one, autocast's 16-bit gradient of the bias's cast) made by one
//! of those nodes after one of the weight's size, a whole number of
//! times it (the weight's gradient: a convolution without a bias makes only that one), and the
//! forward output of the same op (the same autograd sequence number), whose size over the
//! bias's is the rows. Where PyTorch's
//! sizing says the run needed no staging buffer at those rows, two requests of no bytes are
//! put after the bias's gradient (`Input::with_placeholders_after`), sized at each batch as
//! PyTorch would size them.

use super::reduce::Latent;
use super::{Requests, Scale};
use crate::fasthash::FastMap;
use crate::report::kinds::{Kind, Phase, backward_node_of, phase_of_stack};
use crate::report::torch_allocator::Input;
use serde::Serialize;

/// The nodes whose backward sums a bias's gradient over the rows with PyTorch's reduction
/// kernel: a linear map's (`addmm`) and a convolution's.
const BIAS_NODES: [&str; 2] = ["AddmmBackward", "ConvolutionBackward"];

/// The run's latent reductions, each after its bias's gradient: placeholders put into
/// `input`, each with how it grows (the place of its staging buffer among the requests; its
/// semaphore is the next).
pub(super) fn placed(input: &mut Input) -> Vec<(usize, Latent)> {
    let found = find(input);
    let after: Vec<usize> = found.iter().map(|&(n, _)| n).collect();
    let places = input.with_placeholders_after(&after);
    places
        .into_iter()
        .zip(found)
        .map(|(p, (_, l))| (p, l))
        .collect()
}

/// The placeholders' scales in `req`: each staging buffer's and semaphore's growth.
pub(super) fn mark(latent: &[(usize, Latent)], req: &mut Requests) {
    for &(p, l) in latent {
        req.scale.set(p, Scale::Latent(l));
        req.scale.set(p + 1, Scale::Latent(l.semaphore()));
    }
}

/// The reductions a run summed within thread blocks, and the least batch from which one of
/// them asks a staging buffer.
#[derive(Clone, Debug, Serialize)]
pub struct LatentReductions {
    pub count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_batch: Option<u64>,
}

/// What [`LatentReductions`] says of the run's, for a run at batch `at` (none: `None`).
pub(super) fn said(latent: &[(usize, Latent)], at: u64) -> Option<LatentReductions> {
    (!latent.is_empty()).then(|| LatentReductions {
        count: latent.len() as u64,
        from_batch: latent.iter().filter_map(|(_, l)| l.first_batch(at)).min(),
    })
}

/// Each request that is a bias's gradient summed within thread blocks (its place among the
/// requests), with the sum it is.
fn find(input: &Input) -> Vec<(usize, Latent)> {
    let Some(make) = super::reduce::device_make(input) else {
        return Vec::new();
    };
    let kinds = input.request_kinds();
    // Scratch buffers (freed before anything else is asked: a convolution's workspace of the
    // same op) are no op's output.
    let scratch = input.scratch();
    // Whole fp32 parameters' sizes (not a framework's shards or 16-bit copies): a bias's
    // gradient of its own size is fp32 too.
    let parameters = super::world::whole_parameter_sizes(input, &kinds);
    let reader = input.tables();
    // Each line's phase and whether its node sums a bias, found once a line.
    let mut of_stack: FastMap<u64, (Phase, bool)> = FastMap::default();
    // The forward's outputs, by sequence number: the first of each,
    // this step's only (cleared as a forward begins after a backward).
    let mut outputs: FastMap<u64, u64> = FastMap::default();
    let mut last = Phase::Unknown;
    // The backward node making requests now (its sequence number) and its requests of a
    // parameter's size (or half of one) so far.
    let mut node_now: (u64, Vec<u64>) = (0, Vec::new());
    let mut found = Vec::new();
    for (n, ((size, stack, sequence), k)) in input.request_fields().zip(&kinds).enumerate() {
        let (phase, sums) = *of_stack.entry(stack).or_insert_with(|| {
            let node = backward_node_of(reader, stack).unwrap_or_default();
            let sums = BIAS_NODES.iter().any(|b| node.starts_with(b));
            (phase_of_stack(reader, stack), sums)
        });
        let after_backward = last == Phase::Backward;
        if phase != Phase::Unknown {
            last = phase;
        }
        match phase {
            Phase::Forward => {
                if after_backward {
                    outputs.clear();
                }
                // The op's output, kept for the backward or not (a linear map's is not).
                let output = !scratch.get(n).copied().unwrap_or(true);
                if output && matches!(k, Kind::Activation | Kind::Temporary) && sequence != 0 {
                    outputs.entry(sequence).or_insert(size);
                }
            }
            Phase::Backward if sums && sequence != 0 => {
                // A gradient of an fp32 parameter's size (4 bytes an element), or of half of
                // one (autocast's 16-bit gradient of a parameter's cast: 2 bytes).
                let half = size.checked_mul(2).is_some_and(|d| parameters.contains(&d));
                let element = match (parameters.contains(&size), half) {
                    (true, _) => 4,
                    (false, true) => 2,
                    (false, false) => continue,
                };
                // The node's parameter-sized requests so far: a bias's gradient follows its
                // weight's, a whole number of times its size (a convolution without a bias
                // makes only the weight's).
                if node_now.0 != sequence {
                    node_now = (sequence, Vec::new());
                }
                // (No request of 0 bytes divides another: a forged trace may hold one.)
                let bias = size > 0 && node_now.1.iter().any(|&w| w > size && w % size == 0);
                node_now.1.push(size);
                let rows = outputs
                    .get(&sequence)
                    .filter(|&&out| bias && out % size == 0)
                    .map(|&out| out / size);
                let latent = rows
                    .filter(|&r| r >= 2 && size % element == 0)
                    .and_then(|r| Latent::new(r, size / element, make));
                if let Some(l) = latent {
                    found.push((n, l));
                }
            }
            _ => {}
        }
    }
    found
}
