//! The sizes of a sharded run's whole parameters, told from the shards and copies a sharding
//! framework's own code makes: a whole weight's gradient (before FSDP reduce-scatters it) does
//! not follow the batch, and a bias's gradient of a whole fp32 parameter's size is fp32
//! (`latent.rs`).

use super::{DEEPSPEED_CODE, FSDP_CODE, casts_shards, runs_code};
use crate::report::kinds::Kind;
use crate::report::kinds::kept_world_size as kept_world;
use crate::report::torch_allocator::Input;

/// The sizes of the run's whole parameters: its parameter requests but those a sharding
/// framework's own code made (FSDP's shards, DeepSpeed's partitions and the 16-bit copies its
/// engine casts the model to). At two ranks an fp32 shard is the size of its parameter's
/// 16-bit gradient under FSDP's mixed precision, which a set of every parameter's size took
/// for an fp32 gradient.
pub(in crate::report::fit) fn whole_parameter_sizes(
    input: &Input,
    kinds: &[Kind],
) -> std::collections::HashSet<u64, crate::fasthash::SeededState> {
    let reader = input.tables();
    let mut own: crate::fasthash::FastMap<u64, bool> = Default::default();
    input
        .requests()
        .zip(kinds)
        .filter(|(_, k)| **k == Kind::Parameter)
        .filter(|&((_, stack), _)| {
            !*own.entry(stack).or_insert_with(|| {
                runs_code(reader, stack, FSDP_CODE) || runs_code(reader, stack, DEEPSPEED_CODE)
            })
        })
        .map(|((size, _), _)| size)
        .collect()
}

/// Under FSDP, the sizes of the whole (unsharded) parameters, of which the run's parameters
/// are shards: a backward's temporary of such a size from a node that makes weights' gradients
/// is a weight's whole gradient before FSDP reduce-scatters it, and does not follow the batch.
/// Known exactly where the trace holds a whole one: a parameter made before FSDP wrapped it
/// (outside FSDP's code), or gathered whole by FSDP's own code (FSDP1's flat parameter, whose
/// gradient the backward of the split into its views joins: `SplitWithSizesBackward`); and from
/// a shard and the run's `WORLD_SIZE` otherwise (FSDP2 pads a parameter's first dimension to a
/// multiple of the world, so its whole lies within a row below the shard times the world:
/// within a thousandth, for the large ones that matter).
pub(in crate::report::fit) struct Unsharded {
    exact: std::collections::BTreeSet<u64>,
    /// FSDP1's flat parameters, gathered whole by its own code.
    flat: std::collections::BTreeSet<u64>,
    /// Shards times the world, sorted.
    padded: Vec<u64>,
    /// FSDP under mixed precision: it casts the shards to the parameters' 16-bit dtype to
    /// gather them, and the backward's unsharded gradients are half the whole parameters'
    /// sizes (a request of a whole fp32 parameter's size there is an activation's gradient:
    /// GPT-2's at 4 x 512 tokens in bf16 is its position table's size).
    halved: bool,
}

/// The node that joins the gradients of a flat parameter's views into the flat gradient.
const FLAT_GRADIENT_NODE: &str = "SplitWithSizesBackward";

impl Unsharded {
    pub(in crate::report::fit) fn of(input: &Input, kinds: &[Kind]) -> Unsharded {
        let mut u = Unsharded {
            exact: Default::default(),
            flat: Default::default(),
            padded: Vec::new(),
            halved: false,
        };
        let reader = input.tables();
        let fsdp = crate::report::kinds::parallel_frameworks(reader)
            .iter()
            .any(|f| f.starts_with("FSDP"));
        if !fsdp {
            return u;
        }
        let world = kept_world(&reader.info().env);
        let mut own: crate::fasthash::FastMap<u64, bool> = Default::default();
        let mut casts: crate::fasthash::FastMap<u64, bool> = Default::default();
        for ((size, stack), k) in input.requests().zip(kinds) {
            match k {
                Kind::Parameter => {
                    if !*own
                        .entry(stack)
                        .or_insert_with(|| runs_code(reader, stack, FSDP_CODE))
                    {
                        // Made before FSDP wrapped the model: whole.
                        u.exact.insert(size);
                    } else if let Some(n) = world.filter(|_| !u.exact.contains(&size)) {
                        // (A shard the size of a whole parameter is one of first dimension 1,
                        // whole on every rank: the world times it is no gradient's size, but
                        // at ViT's 4 x 197 tokens in bf16 at two ranks, an activation's.)
                        u.padded.push(size.saturating_mul(n));
                    }
                }
                // Gathered whole by FSDP's own code (FSDP1: the flat parameter); but the
                // shards' 16-bit casts of mixed precision.
                Kind::Communication => {
                    if *casts
                        .entry(stack)
                        .or_insert_with(|| casts_shards(reader, stack))
                    {
                        u.halved = true;
                    } else {
                        u.exact.insert(size);
                        u.flat.insert(size);
                    }
                }
                _ => {}
            }
        }
        u.padded.sort_unstable();
        u.padded.dedup();
        u
    }

    /// Whether a backward temporary of `size` from `node` is a whole weight's gradient.
    pub(in crate::report::fit) fn gradient(&self, size: u64, node: &str) -> bool {
        if size == 0 {
            return false;
        }
        if node.starts_with(FLAT_GRADIENT_NODE) {
            return self.flat.contains(&size);
        }
        // Under FSDP's mixed precision a whole gradient is half its fp32 parameter.
        let Some(size) = (if self.halved {
            size.checked_mul(2)
        } else {
            Some(size)
        }) else {
            return false;
        };
        if !(node.is_empty() || crate::report::fit::requests::makes_weight_gradients(node)) {
            return false;
        }
        if self.exact.contains(&size) {
            return true;
        }
        // The smallest shard-times-world at or above `size`, within a thousandth of it.
        let i = self.padded.partition_point(|&p| p < size);
        self.padded.get(i).is_some_and(|&p| p - size <= p / 1000)
    }
}
