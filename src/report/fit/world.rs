//! `fit --world-size M`: one rank of a data-parallel job at another world size, from a run of
//! the job at N. What a rank holds of a sharded framework's states is its shard, `1/N` of the
//! model; at `M` ranks it is `1/M`. The rest stays: the gathered parameters are a unit's whole
//! (whatever the world), the activations follow the per-rank batch (the rows' axis), DDP keeps
//! the whole model and its buckets on every rank.
//!
//! Which requests are shards, from the kinds and the frames, under FSDP (either API):
//! parameters made by FSDP's own code (the shards it cuts; a parameter built before wrapping
//! is whole, and so is FSDP1's whole flat parameter it makes to cut the shards from), every
//! gradient that outlives its backward made by no autograd node (FSDP's reduce-scatter output:
//! the unsharded gradient is let go) and, from FSDP's code outside a forward and by no autograd
//! node, a temporary of such a gradient's size (a later step's reduce-scatter output, added
//! into the kept one), every optimizer state and the optimizer's temporaries (they are made
//! like the shards they update). FSDP1 runs the whole forward and backward inside its own
//! code, so its frames alone do not make a request a shard. A shard's size is the run's times
//! `N/M`, rounded up: FSDP pads a parameter (FSDP2: its first dimension; FSDP1: the flat
//! parameter) to a multiple of the world, so the figure is within a row of the padded one (a
//! first dimension below the world is the exception: FSDP2 keeps a row of it on every rank,
//! which sizes do not show; docs/fit.md).
//!
//! Under DeepSpeed's ZeRO: the parameters its runtime cut (ZeRO-3's partitions; ZeRO-1 and 2
//! keep the whole 16-bit parameters on every rank), the gradients its runtime keeps (ZeRO-2's
//! partition of them, the fp32 gradient a step makes, ZeRO-3's flat buffer; autograd's whole
//! gradients are reduced into them), every optimizer state (the fp32 master partition among
//! them) and the optimizer's temporaries. Its gradient buckets and gathered parameters stay.
//!
//! What FSDP's shards say of the batch axis is in `unsharded.rs`: the whole parameters' sizes,
//! whose gradients before reduce-scatter do not follow the batch.

use super::{Ask, FitError, Requests};
use crate::report::kinds::{
    DEEPSPEED_ZERO_1_2, DEEPSPEED_ZERO_3, Kind, Phase, backward_node_of, phase_of_stack,
    world_size_text,
};
use crate::report::torch_allocator::Input;
use crate::report::torch_allocator::{Bucket, Role};
use crate::trace::format;
use crate::trace::reader::TraceTables;
use serde::Serialize;
use std::collections::BTreeSet;

mod unsharded;
pub(super) use unsharded::{Unsharded, whole_parameter_sizes};

/// The frameworks whose states are sharded, as `parallel_frameworks` names them.
const SHARDING: [&str; 4] = [FSDP2, FSDP1, DEEPSPEED_ZERO_1_2, DEEPSPEED_ZERO_3];
/// FSDP2, as `parallel_frameworks` names it.
const FSDP2: &str = "FSDP2 (fully_shard)";
/// FSDP1, as `parallel_frameworks` names it.
const FSDP1: &str = "FSDP1 (FullyShardedDataParallel)";
/// Where DDP's code lies.
const DDP_CODE: &str = "/torch/nn/parallel/";
/// Where FSDP's code lies (either API).
pub(super) const FSDP_CODE: &str = "/torch/distributed/fsdp/";
/// FSDP's functions that cast a unit's shards to its mixed precision's parameter dtype before
/// gathering them (a request of half a shard's bytes, a shard's all the same): FSDP2's
/// all-gather inputs, FSDP1's low-precision shard (`_mp_shard`).
const LOW_PRECISION_SHARDS: [&str; 3] = [
    "_get_param_all_gather_inputs",
    "_use_low_precision_shard",
    // At one rank FSDP2 casts each parameter's shard on its own as it makes the parameter
    // whole (`wait_for_unshard`), gathering nothing.
    "all_gather_inputs",
];

/// Whether `stack` casts a unit's shards to gather them ([`LOW_PRECISION_SHARDS`]).
pub(super) fn casts_shards(tables: &TraceTables, stack: u64) -> bool {
    LOW_PRECISION_SHARDS
        .iter()
        .any(|f| runs(tables, stack, FSDP_CODE, Some(f)))
}

/// Where DeepSpeed's runtime lies (its ZeRO optimizers, partitions, and `defragment`).
pub(super) const DEEPSPEED_CODE: &str = "/deepspeed/runtime/";

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
    /// From a run at one rank under FSDP2, which all-gathers nothing there: the all-gather
    /// outputs added as FSDP2 makes them at more ranks (one a unit's gathering).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_gathers_added: Option<u64>,
    /// Under DDP: the bytes of the buckets the run's rank made as it wrapped the model still
    /// live when the rebuilt ones are made. Ranks of a job let them go before or after, some
    /// on into the next step, as NCCL's stream completes (a run at one rank holds them the
    /// longest); the rows hold them as the run did, and another rank peaks up to these bytes
    /// lower (or, from a run of two ranks or more, higher).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_buckets_bytes: Option<u64>,
    /// Under DDP: the bytes of those first buckets the run's rank had let go before the
    /// rebuilt ones were made; another rank peaks up to their bytes higher or lower.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_buckets_let_go_bytes: Option<u64>,
    /// The run's frees that waited on work of other streams (asked for, completed later: as
    /// after `record_stream`, how FSDP1 lets its gathered flat parameters go). How many are
    /// still pending at a later request follows the GPU's timing: the ranks of a job, and runs
    /// of one program, peak apart for it.
    #[serde(skip_serializing_if = "is_zero")]
    pub deferred_frees: u64,
}

/// Whether `n` is 0 (a count `--json` leaves out).
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Which of the run's requests are shards, and the world sizes to resize them between.
pub(super) struct World {
    pub(super) said: WorldSize,
    sharded: Vec<bool>,
    /// Shards' sizes that are not `run/asked` of themselves at the world asked, with their
    /// size there (FSDP2's rows kept on every rank: `padded.rs`).
    sizes: std::collections::BTreeMap<u64, u64>,
    /// What a run at one rank does not show of more, edited into its events: FSDP2's
    /// all-gather outputs ([`WorldSize::all_gathers_added`]).
    pub(super) edits: Option<crate::report::torch_allocator::Edits>,
}

impl World {
    /// Whether request `n` is a shard.
    pub(super) fn sharded(&self, n: usize) -> bool {
        self.sharded.get(n).copied().unwrap_or(false)
    }

    /// A shard of `size` bytes at the run's world size, at the one asked (rounded up).
    pub(super) fn resize(&self, size: u64) -> u64 {
        if let Some(&at) = self.sizes.get(&size) {
            return at;
        }
        let v = u128::from(size) * u128::from(self.said.run);
        u64::try_from(v.div_ceil(u128::from(self.said.asked.max(1)))).unwrap_or(u64::MAX)
    }
}

/// Which requests are shards, where another world size is asked (`None`: none is).
pub(super) fn asked(input: &Input, req: &Requests, ask: &Ask) -> Result<Option<World>, FitError> {
    let Some(m) = ask.world_size else {
        return Ok(None);
    };
    let n = run_world(&input.tables().info().env, ask.run_world_size)?;
    of(input, req, n, m).map(Some)
}

/// The sharding what-if of a run that keeps the whole model on each rank (DDP, or one process):
/// over the world size asked, else the run's.
pub(super) fn sharding(
    input: &Input,
    ask: &Ask,
    way: crate::report::torch_allocator::ShardWay,
) -> Result<crate::report::torch_allocator::Sharding, FitError> {
    let frameworks = crate::report::kinds::parallel_frameworks(input.tables());
    if let Some(f) = frameworks.iter().find(|f| SHARDING.contains(f)) {
        return Err(FitError::Shard(format!(
            "the run is already sharded ({f}): --world-size answers it at another world size"
        )));
    }
    let world = match ask.world_size {
        Some(m) => m,
        None => {
            let env = &input.tables().info().env;
            match run_world(env, None) {
                Ok(n) => n,
                Err(_) => {
                    let why = match world_size_text(env) {
                        Some(t) => format!(
                            "the run's WORLD_SIZE ({:?}) is not a world size",
                            t.chars().take(40).collect::<String>()
                        ),
                        None => "the trace does not say its world size (no WORLD_SIZE in the \
                                 run's environment)"
                            .into(),
                    };
                    return Err(FitError::Shard(format!(
                        "{why}: give the ranks to shard over with --world-size N"
                    )));
                }
            }
        }
    };
    use crate::report::torch_allocator::ShardWay;
    match way {
        ShardWay::Fsdp2 { reshard } => input.sharding(world, reshard),
        ShardWay::Zero { stage, bucket } => {
            input.zero_sharding(world, run_rank(input), (stage, bucket))
        }
    }
    .map_err(FitError::Shard)
}

/// The run's rank, as its trace's header keeps it (0 where it says none).
fn run_rank(input: &Input) -> u64 {
    u64::try_from(input.tables().info().rank).unwrap_or(0)
}

/// The run's world size: given, else its `WORLD_SIZE` as the trace's header kept it; never
/// guessed.
fn run_world(env: &[String], given: Option<u64>) -> Result<u64, FitError> {
    if let Some(n) = given {
        return Ok(n);
    }
    let kept = world_size_text(env);
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
fn of(input: &Input, req: &Requests, run: u64, asked: u64) -> Result<World, FitError> {
    if asked == 0 || run == 0 {
        return Err(FitError::World("a world size is at least 1".into()));
    }
    let reader = input.tables();
    let framework = framework_of(reader, run)?;
    let sharding = SHARDING.contains(&framework);
    // FSDP's gradients that outlive their backward are all its shards; DeepSpeed's are those its
    // own code keeps (autograd's whole gradients are reduced into them); ZeRO-1 and 2 keep the
    // whole 16-bit parameters on every rank.
    let deepspeed = framework.starts_with("DeepSpeed");
    let code = if deepspeed { DEEPSPEED_CODE } else { FSDP_CODE };
    let whole_parameters = framework == DEEPSPEED_ZERO_1_2;
    // Per stack: whether it runs the framework's code, its phase, and whether an autograd node
    // of the backward made it (FSDP's own requests in its hooks are made by none).
    let mut by_stack: crate::fasthash::FastMap<u64, (bool, Phase, bool)> = Default::default();
    let mut said = WorldSize {
        run,
        asked,
        framework: framework.to_string(),
        sharded_requests: 0,
        sharded_bytes: 0,
        all_gathers_added: None,
        first_buckets_bytes: None,
        first_buckets_let_go_bytes: None,
        deferred_frees: 0,
    };
    let mut of = |stack: u64| {
        *by_stack.entry(stack).or_insert_with(|| {
            (
                runs_code(reader, stack, code),
                phase_of_stack(reader, stack),
                backward_node_of(reader, stack).is_some(),
            )
        })
    };
    let mut inputs: crate::fasthash::FastMap<u64, bool> = Default::default();
    let mut gather_input = |stack: u64| {
        *inputs
            .entry(stack)
            .or_insert_with(|| casts_shards(reader, stack))
    };
    let streams: Vec<u16> = input.request_streams().collect();
    let (shard_sizes, shard_streams, gathered) = if sharding {
        own_sizes(input, req, &streams, &mut of, deepspeed)
    } else {
        Default::default()
    };
    let sizes = if framework == FSDP2 {
        rows_kept(input, req, &gathered, &mut of, (run, asked))
    } else {
        Default::default()
    };
    let sharded: Vec<bool> = input
        .requests()
        .zip(&req.kinds)
        .zip(&streams)
        .map(|(((size, stack), kind), stream)| {
            if !sharding {
                return false;
            }
            let (own_code, phase, by_node) = of(stack);
            // FSDP2's own buffers that hold a row kept on every rank follow it.
            let holds_row = own_code && !by_node && sizes.contains_key(&size);
            let shard = match kind {
                // Not FSDP1's whole flat parameter (at a world of one FSDP2's gathered copy
                // is a shard's size: it makes no whole parameter of its own).
                Kind::Parameter => {
                    own_code
                        && !whole_parameters
                        && !(framework == FSDP1 && gathered.contains(&size))
                }
                // FSDP's gradients are the reduce-scatter's outputs its hooks make; one an
                // autograd node made is whole.
                Kind::Gradient if deepspeed => own_code,
                Kind::Gradient => !by_node,
                Kind::OptimizerState => true,
                // A framework's buffer in a step is whole (ZeRO-3's persistent parameters,
                // gathered again after it); the step's temporaries are the partition's.
                Kind::Temporary if phase == Phase::Optimizer => true,
                // FSDP's shards cast to its mixed precision's dtype to be gathered: shards.
                Kind::Communication if !deepspeed && gather_input(stack) => true,
                Kind::Temporary | Kind::Communication => {
                    holds_row
                        || own_code
                            && !deepspeed
                            && !by_node
                            && phase != Phase::Forward
                            && shard_sizes.contains(&size)
                            && shard_streams.contains(stream)
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
    let edits = one_rank_edits(input, framework, &mut said);
    said.deferred_frees = input.deferred_frees();
    if framework.starts_with("DDP") {
        let reader = input.tables();
        if let Some(b) = input.first_buckets(&|stack| bucket_role(reader, stack)) {
            said.first_buckets_bytes = (b.held > 0).then_some(b.held);
            let let_go = b.made.saturating_sub(b.held);
            said.first_buckets_let_go_bytes = (let_go > 0).then_some(let_go);
        }
    }
    Ok(World {
        said,
        sharded,
        sizes,
        edits,
    })
}

/// From a sharding framework's own requests: the sizes of the gradients' shards it keeps and
/// the streams it made them on, and FSDP1's whole flat parameters (`of` says of a stack whether
/// it runs the framework's code, its phase, and whether an autograd node made it).
fn own_sizes(
    input: &Input,
    req: &Requests,
    streams: &[u16],
    of: &mut dyn FnMut(u64) -> (bool, Phase, bool),
    deepspeed: bool,
) -> (BTreeSet<u64>, BTreeSet<u16>, BTreeSet<u64>) {
    // The sizes of the gradients' shards FSDP keeps: in later steps its reduce-scatter makes
    // one of each again in its backward hook, added into the kept one and let go (a temporary
    // of a shard's size, made by no autograd node, not in a forward). DeepSpeed reduces into
    // the partition it keeps, making none. (FSDP1 runs the whole forward and backward inside
    // its own code: an activation's gradient or a temporary of a shard's size by chance is
    // made by a node.)
    // And the streams its reduce-scatter made them on: a later step's output is made there
    // too, where the reduce-scatter's input (the unit's whole gradients) and the all-gather's
    // output are not. At a world of one those are of a shard's size, so the size alone would
    // take them for shards.
    let (shard_sizes, shard_streams): (BTreeSet<u64>, BTreeSet<u16>) = input
        .requests()
        .zip(&req.kinds)
        .zip(streams)
        .filter(|(((_, stack), k), _)| {
            let (own, _, by_node) = of(*stack);
            **k == Kind::Gradient && own && !by_node
        })
        .map(|(((size, _), _), &stream)| (size, stream))
        .unzip();
    // FSDP1's flat parameters whole, as its own code gathers them: at wrapping it makes each
    // whole first (its module's parameters joined) and cuts the shard from it, and a whole is
    // whole at any world. (Not a later step's reduce-scatter output, of a shard's size.)
    let gathered: BTreeSet<u64> = if deepspeed {
        Default::default()
    } else {
        input
            .requests()
            .zip(&req.kinds)
            .filter(|((size, stack), k)| {
                **k == Kind::Communication && of(*stack).0 && !shard_sizes.contains(size)
            })
            .map(|((size, _), _)| size)
            .collect()
    };
    (shard_sizes, shard_streams, gathered)
}

/// The data-parallel framework the frames show, where its memory per rank can be scaled from
/// a run at `run` ranks; else why not.
fn framework_of(reader: &TraceTables, run: u64) -> Result<&'static str, FitError> {
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
            "the frames show no framework whose memory per rank this can scale (DDP, FSDP2, \
             FSDP1 or DeepSpeed's ZeRO; seen: {seen}): another world size is not answered \
             (tensor and pipeline parallel layouts and a framework not named are not modelled)"
        )));
    };
    if framework == FSDP1 && run == 1 {
        // `FullyShardedDataParallel` switches to NO_SHARD at a world of one.
        return Err(FitError::World(
            "FSDP1 at a world size of 1 runs as NO_SHARD (PyTorch switches to it there): the run \
             holds the whole model and shows no sharding to scale; trace the job at 2 ranks or \
             more (FSDP2's fully_shard shards at 1)"
                .into(),
        ));
    }
    if framework.starts_with("DeepSpeed") && run == 1 {
        // Its partitions are the whole parameters there, and it gathers nothing.
        return Err(FitError::World(
            "DeepSpeed's ZeRO at a world size of 1 gathers nothing (each partition is the \
             whole parameter): the buffers it gathers and reduces into at more ranks are not in \
             the run (ZeRO-3 on two GPUs: 2% to 7% low); trace the job at 2 ranks or more"
                .into(),
        ));
    }
    Ok(framework)
}

/// What a run at one rank does not show of more, edited into its events and counted in
/// `said`: FSDP2 gathers each unit's parameters straight from its shards there (at more, out
/// of an all-gather output the run never made). (DDP's first buckets, which ranks let go
/// before or after the rebuild, are left as the run held them, and said.)
fn one_rank_edits(
    input: &Input,
    framework: &str,
    said: &mut WorldSize,
) -> Option<crate::report::torch_allocator::Edits> {
    if said.run != 1 || said.asked < 2 {
        return None;
    }
    let reader = input.tables();
    if framework == FSDP2 {
        let (added, edits) =
            input.all_gather_outputs(said.asked, &|stack| gather_role(reader, stack))?;
        said.all_gathers_added = Some(added);
        Some(edits)
    } else {
        None
    }
}

/// FSDP2's rows kept on every rank, from the run's shards in the order it cut them, the whole
/// parameters made before it, and its own requests' sizes (see `padded.rs`).
fn rows_kept(
    input: &Input,
    req: &Requests,
    gathered: &std::collections::BTreeSet<u64>,
    of: &mut dyn FnMut(u64) -> (bool, Phase, bool),
    (run, asked): (u64, u64),
) -> std::collections::BTreeMap<u64, u64> {
    let mut cut = super::padded::Cut {
        shards: Vec::new(),
        wholes: Vec::new(),
        own_sizes: Default::default(),
    };
    for ((size, stack), kind) in input.requests().zip(&req.kinds) {
        let (own, _, by_node) = of(stack);
        match kind {
            Kind::Parameter if own && !gathered.contains(&size) => cut.shards.push(size),
            Kind::Parameter if !own => cut.wholes.push(size),
            Kind::Communication | Kind::Gradient | Kind::Temporary if own && !by_node => {
                cut.own_sizes.insert(size);
            }
            _ => {}
        }
    }
    super::padded::kept_rows(&cut, run, asked)
}

/// Whether any Python frame of `stack` runs code under `part` of its file's path.
pub(super) fn runs_code(tables: &TraceTables, stack: u64, part: &str) -> bool {
    runs(tables, stack, part, None)
}

/// Whether any Python frame of `stack` runs code under `part` of its file's path, in a
/// function of that name (a method's too: `Class.name`) where one is given.
fn runs(tables: &TraceTables, stack: u64, part: &str, function: Option<&str>) -> bool {
    let Some(frames) = tables.stack(stack) else {
        return false;
    };
    frames.iter().any(|&f| {
        format::as_py_frame(f)
            .and_then(|(id, _)| tables.string(id))
            .and_then(|s| s.split_once('\0'))
            .is_some_and(|(file, named)| {
                file.replace('\\', "/").contains(part)
                    && function.is_none_or(|want| {
                        named
                            .strip_suffix(want)
                            .is_some_and(|before| before.is_empty() || before.ends_with('.'))
                    })
            })
    })
}

/// What a request is to DDP's buckets: made as DDP wraps the model, made again as it rebuilds
/// them before the second step's forward, or neither.
fn bucket_role(tables: &TraceTables, stack: u64) -> Bucket {
    let ddp = |function| runs(tables, stack, DDP_CODE, Some(function));
    if ddp("_ddp_init_helper") {
        Bucket::Made
    } else if ddp("_pre_forward") {
        Bucket::Rebuilt
    } else {
        Bucket::Other
    }
}

/// What a request is to FSDP2's all-gathers at more ranks than a run's one: a unit's
/// parameters gathered before its forward or its backward (FSDP2's `wait_for_unshard`, under
/// its `pre_backward` or a backward prefetch for the latter), a request of the backward or
/// the optimizer, or neither.
fn gather_role(tables: &TraceTables, stack: u64) -> Role {
    let fsdp = |function| runs(tables, stack, FSDP_CODE, Some(function));
    if fsdp("wait_for_unshard") {
        // A shard cast to the mixed precision's dtype: what an all-gather's input holds, not a
        // parameter gathered.
        if fsdp("all_gather_inputs") {
            return Role::GatherInput;
        }
        return if fsdp("pre_backward") || fsdp("_prefetch_unshard") {
            Role::GatheredBackward
        } else {
            Role::GatheredForward
        };
    }
    match phase_of_stack(tables, stack) {
        Phase::Backward | Phase::Optimizer => Role::AfterForward,
        _ => Role::Other,
    }
}
