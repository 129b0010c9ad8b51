//! `fit --world-size M`: one rank of a data-parallel job at another world size, from a run of
//! the job at N. What a rank holds of a sharded framework's states is its shard, `1/N` of the
//! model; at `M` ranks it is `1/M`. The rest stays: the gathered parameters are a unit's whole
//! (whatever the world), the activations follow the per-rank batch (the rows' axis), DDP keeps
//! the whole model and its buckets on every rank.
//!
//! Which requests are shards, from the kinds and the frames, under FSDP (either API):
//! parameters made by FSDP's own code (the shards it cuts; a parameter built before wrapping
//! is whole), every gradient that outlives its backward (FSDP's reduce-scatter output: the
//! unsharded gradient is let go) and, in FSDP's code, a temporary of such a gradient's size
//! (a later step's reduce-scatter output, added into the kept one), every optimizer state and
//! the optimizer's temporaries (they are made like the shards they update). A shard's size is the run's times `N/M`, rounded up:
//! FSDP pads a parameter (FSDP2: its first dimension; FSDP1: the flat parameter) to a multiple
//! of the world, so the figure is within a row of the padded one.

use super::{FitError, Requests};
use crate::report::kinds::{Kind, Phase, phase_of_stack};
use crate::report::torch_replay::Input;
use crate::trace::format;
use crate::trace::reader::TraceReader;
use serde::Serialize;

/// The frameworks whose states are sharded, as `parallel_frameworks` names them.
const SHARDING: [&str; 2] = ["FSDP2 (fully_shard)", "FSDP1 (FullyShardedDataParallel)"];
/// Where FSDP's code lies (either API).
const FSDP_CODE: &str = "/torch/distributed/fsdp/";

/// The world sizes, the framework, and the shards found: said before the rows.
#[derive(Clone, Debug, Serialize)]
pub struct WorldSize {
    /// The run's world size (its `WORLD_SIZE`, or as given) and the one asked.
    pub run: u64,
    pub asked: u64,
    /// The data-parallel framework the frames show.
    pub framework: String,
    /// The requests taken as shards, and their bytes in the run.
    pub sharded_requests: u64,
    pub sharded_bytes: u64,
}

/// Which of the run's requests are shards, and the world sizes to resize them between.
pub(super) struct World {
    pub(super) said: WorldSize,
    sharded: Vec<bool>,
}

impl World {
    /// Whether request `n` is a shard.
    pub(super) fn sharded(&self, n: usize) -> bool {
        self.sharded.get(n).copied().unwrap_or(false)
    }

    /// A shard of `size` bytes at the run's world size, at the one asked (rounded up).
    pub(super) fn resize(&self, size: u64) -> u64 {
        let v = u128::from(size) * u128::from(self.said.run);
        u64::try_from(v.div_ceil(u128::from(self.said.asked.max(1)))).unwrap_or(u64::MAX)
    }
}

/// The run's world size: given, else its `WORLD_SIZE` as the trace's header kept it; never
/// guessed.
pub(super) fn run_world(env: &[String], given: Option<u64>) -> Result<u64, FitError> {
    if let Some(n) = given {
        return Ok(n);
    }
    let kept = env
        .iter()
        .find_map(|kv| kv.strip_prefix("WORLD_SIZE="))
        .map(str::trim);
    match kept.map(str::parse::<u64>) {
        Some(Ok(n)) if n >= 1 => Ok(n),
        Some(_) => Err(FitError::World(format!(
            "the run's WORLD_SIZE ({:?}) is not a world size: give the run's with \
             --run-world-size N",
            kept.unwrap_or_default()
                .chars()
                .take(40)
                .collect::<String>()
        ))),
        None => Err(FitError::World(
            "the trace does not say its world size (no WORLD_SIZE in the run's environment: \
             one process, or launched without torchrun, or by a shim too old to keep it): give \
             it with --run-world-size N"
                .into(),
        )),
    }
}

/// The shards among the run's requests, for a world of `asked` from one of `run`.
pub(super) fn of(input: &Input, req: &Requests, run: u64, asked: u64) -> Result<World, FitError> {
    if asked == 0 || run == 0 {
        return Err(FitError::World("a world size is at least 1".into()));
    }
    let reader = input.reader();
    let frameworks = crate::report::kinds::parallel_frameworks(reader);
    let framework = frameworks
        .iter()
        .find(|f| SHARDING.contains(f) || f.starts_with("DDP"))
        .copied();
    let Some(framework) = framework else {
        let seen = if frameworks.is_empty() {
            "none".to_string()
        } else {
            frameworks.join(", ")
        };
        return Err(FitError::World(format!(
            "the frames show no framework whose memory per rank this can scale (DDP, FSDP2 or \
             FSDP1; seen: {seen}): another world size is not answered (tensor and pipeline \
             parallel layouts, DeepSpeed's ZeRO and a framework not named are not modelled)"
        )));
    };
    let sharding = SHARDING.contains(&framework);
    let mut fsdp_stack: crate::fasthash::FastMap<u64, (bool, Phase)> = Default::default();
    let mut said = WorldSize {
        run,
        asked,
        framework: framework.to_string(),
        sharded_requests: 0,
        sharded_bytes: 0,
    };
    let mut of = |stack: u64| {
        *fsdp_stack.entry(stack).or_insert_with(|| {
            (
                runs_code(reader, stack, FSDP_CODE),
                phase_of_stack(reader, stack),
            )
        })
    };
    // The sizes of the gradients' shards FSDP keeps: in later steps its reduce-scatter makes
    // one of each again, added into the kept one and let go (a temporary of a shard's size).
    let shard_sizes: std::collections::BTreeSet<u64> = if sharding {
        input
            .requests()
            .zip(&req.kinds)
            .filter(|((_, stack), k)| **k == Kind::Gradient && of(*stack).0)
            .map(|((size, _), _)| size)
            .collect()
    } else {
        Default::default()
    };
    let sharded: Vec<bool> = input
        .requests()
        .zip(&req.kinds)
        .map(|((size, stack), kind)| {
            if !sharding {
                return false;
            }
            let (fsdp, phase) = of(stack);
            let shard = match kind {
                Kind::Parameter => fsdp,
                Kind::Gradient | Kind::OptimizerState => true,
                Kind::Temporary | Kind::Communication => {
                    phase == Phase::Optimizer || (fsdp && shard_sizes.contains(&size))
                }
                _ => false,
            };
            if shard {
                said.sharded_requests += 1;
                said.sharded_bytes = said.sharded_bytes.saturating_add(size);
            }
            shard
        })
        .collect();
    Ok(World { said, sharded })
}

/// Whether any Python frame of `stack` runs code under `part` of its file's path.
fn runs_code(reader: &TraceReader, stack: u64, part: &str) -> bool {
    let Some(frames) = reader.stack(stack) else {
        return false;
    };
    frames.iter().any(|&f| {
        format::as_py_frame(f)
            .and_then(|(id, _)| reader.string(id))
            .and_then(|s| s.split_once('\0'))
            .is_some_and(|(file, _)| file.replace('\\', "/").contains(part))
    })
}
