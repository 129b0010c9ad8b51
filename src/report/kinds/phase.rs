//! The phase a tensor's Python frames say (building the model, a forward, a backward, an
//! optimizer step, the program's own lines), and which sizes and phases make cuBLAS's workspaces.

use super::Kind;
use super::maker::{Maker, maker_of};
use crate::trace::format;
use crate::trace::reader::TraceTables;

/// The sizes of the workspaces PyTorch allocates for cuBLAS and cuBLASLt through its own
/// allocator (one per handle and stream), from the run's settings kept in the trace's header
/// (`env`, `NAME=value`): `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KiB:COUNT` pairs) else PyTorch's
/// defaults (32 MiB on Hopper, 8 MiB + 128 KiB on earlier GPUs), and `CUBLASLT_WORKSPACE_SIZE`
/// (KiB) else its default of 1 MiB.
pub fn workspace_sizes(env: &[String]) -> Vec<u64> {
    let get = |name: &str| {
        env.iter()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
    };
    const KIB: u64 = 1024;
    let mut sizes = match get("CUBLAS_WORKSPACE_CONFIG").and_then(parse_cublas_config) {
        Some(s) => vec![s],
        None => vec![32 * KIB * KIB, 8 * KIB * KIB + 128 * KIB],
    };
    sizes.push(
        get("CUBLASLT_WORKSPACE_SIZE")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .and_then(|k| k.checked_mul(KIB))
            .unwrap_or(KIB * KIB),
    );
    sizes.retain(|&s| s > 0);
    sizes
}

/// `:4096:8` (8 buffers of 4096 KiB) or `:4096:2:16:8` as bytes; `None` if it does not parse.
fn parse_cublas_config(v: &str) -> Option<u64> {
    let nums: Vec<u64> = v
        .split(':')
        .filter(|p| !p.is_empty())
        .map(|p| p.trim().parse().ok())
        .collect::<Option<_>>()?;
    if nums.is_empty() || nums.len() % 2 != 0 {
        return None;
    }
    nums.chunks(2).try_fold(0u64, |a, c| {
        a.checked_add(c[0].checked_mul(c[1])?.checked_mul(1024)?)
    })
}

/// The part of a step that made a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Building or moving the model: its parameters and buffers.
    Build,
    Forward,
    Backward,
    Optimizer,
    /// The program's own lines outside the three (the batch, metrics).
    Program,
    /// No Python frame recorded.
    Unknown,
}

impl Phase {
    /// The kind of a tensor of this phase that outlived the run that made it.
    pub fn lasting(self) -> Kind {
        match self {
            Phase::Build => Kind::Parameter,
            Phase::Forward => Kind::Activation,
            Phase::Backward => Kind::Gradient,
            Phase::Optimizer => Kind::OptimizerState,
            Phase::Program => Kind::Input,
            Phase::Unknown => Kind::Unknown,
        }
    }

    /// Whether a tensor's lifetime decides between temporary and the lasting kind.
    pub(super) fn by_lifetime(self) -> bool {
        !matches!(self, Phase::Build | Phase::Unknown)
    }
}

/// The phase one Python frame says, if it says one.
fn phase_of_frame(file: &str, function: &str) -> Option<Phase> {
    let file = file.replace('\\', "/");
    let qualified = function;
    // Python 3.11 on names a frame by its qualified name (`Linear.__init__`).
    let function = super::maker::plain_name(function);
    let under = |dir: &str| file.contains(dir);
    if file == crate::report::symbolize::BACKWARD
        || file.ends_with("/torch/autograd/__init__.py")
        || file.ends_with("/torch/autograd/graph.py")
        // A custom Function's backward, run by the engine (its forward's `apply` is not).
        || (file.ends_with("/torch/autograd/function.py")
            && qualified.starts_with("BackwardCFunction"))
        || (file.ends_with("/torch/_tensor.py") && function == "backward")
        || (file.ends_with("/torch/utils/checkpoint.py")
            && (function.contains("unpack")
                || function.contains("recompute")
                || function == "backward"))
    {
        return Some(Phase::Backward);
    }
    if let Some(p) = data_parallel_phase(&file, function) {
        return Some(p);
    }
    if file.ends_with("/torch/amp/grad_scaler.py") {
        // `scaler.scale(loss)` belongs with the loss it scales; unscaling and stepping with
        // the optimizer.
        return (!matches!(function, "scale" | "_lazy_init_scale_growth_tracker"))
            .then_some(Phase::Optimizer);
    }
    if under("/torch/optim/") {
        return Some(Phase::Optimizer);
    }
    let module = file.ends_with("/torch/nn/modules/module.py");
    if module && matches!(function, "_call_impl" | "_wrapped_call_impl" | "__call__") {
        return Some(Phase::Forward);
    }
    if (module
        && matches!(
            function,
            "_apply" | "to" | "cuda" | "to_empty" | "_load_from_state_dict" | "load_state_dict"
        ))
        || file.ends_with("/torch/nn/init.py")
        || file.ends_with("/torch/nn/parameter.py")
        || matches!(
            function,
            "__init__" | "reset_parameters" | "_init_weights" | "post_init" | "from_pretrained"
        )
    {
        return Some(Phase::Build);
    }
    None
}

/// The phase a frame of a data-parallel or sharded framework says, where its hooks run outside
/// the frames that say one otherwise:
/// - FSDP2 (`fully_shard`): the reduce-scatter of a step's gradients (`foreach_reduce`, the
///   post-backward of each group and the root's final callback, which the autograd engine runs
///   after the backward with no frame of its own) is the backward's; its output lives on as
///   the sharded gradients. A group's pre-backward (its parameters gathered again, the next
///   group's all-gather issued), run from a hook with no frame of the engine's, is too.
/// - FSDP1 (`FullyShardedDataParallel`): the post-backward hook that reduce-scatters a flat
///   parameter's gradient (run from a hook on its `AccumulateGrad`, no frame of the engine's),
///   and the final callback, are the backward's; so is the pre-backward hook that gathers a
///   unit's flat parameter again (and prefetches the next), run from a hook on the forward's
///   outputs with no frame of the engine's. Read as the program's, it ended the backward's
///   run part way, and a weight's gradient the engine held for the flat parameter's split
///   across it (a ResNet's classifier, whose unit's backward ends at the first convolution)
///   read as a gradient kept.
/// - DDP (`DistributedDataParallel`): its gradient buckets, made when it is built and made
///   again before the second step's forward (`_pre_forward` rebuilds them), are the
///   backward's: gradients where the parameters' gradients are views of them, else its
///   buffers ([`super::maker::Maker::DdpBucket`] says which).
fn data_parallel_phase(file: &str, function: &str) -> Option<Phase> {
    if file.contains("/torch/distributed/fsdp/_fully_shard/") {
        let reduce = matches!(
            function,
            "foreach_reduce"
                | "pre_backward"
                | "post_backward"
                | "_root_post_backward_final_callback"
        ) || file.ends_with("/_fsdp_collectives.py") && function.contains("reduce");
        return reduce.then_some(Phase::Backward);
    }
    if file.ends_with("/torch/distributed/fsdp/_runtime_utils.py") {
        let backward = function.contains("post_backward")
            || function.contains("pre_backward")
            || matches!(function, "_reduce_grad" | "_get_reduce_scatter_tensors");
        return backward.then_some(Phase::Backward);
    }
    if file.ends_with("/torch/nn/parallel/distributed.py")
        && matches!(function, "_ddp_init_helper" | "_pre_forward")
    {
        return Some(Phase::Backward);
    }
    // DeepSpeed's optimizers' `step`: the work on this rank's partition around the client
    // optimizer's (the gradients' norm, the fp32 gradient, the overflow checks) is the step's.
    if DEEPSPEED_OPTIMIZERS.iter().any(|f| file.ends_with(f)) && function == "step" {
        return Some(Phase::Optimizer);
    }
    None
}

/// DeepSpeed's optimizers that wrap the program's (its client optimizer): ZeRO's, and those it
/// uses without ZeRO in 16 bits (`FP16_Optimizer`, fused and not) or for ZeRO-1 in bf16 with
/// fp32 gradient accumulation (`BF16_Optimizer`).
const DEEPSPEED_OPTIMIZERS: [&str; 5] = [
    "/deepspeed/runtime/zero/stage_1_and_2.py",
    "/deepspeed/runtime/zero/stage3.py",
    "/deepspeed/runtime/fp16/fused_optimizer.py",
    "/deepspeed/runtime/fp16/unfused_optimizer.py",
    "/deepspeed/runtime/bf16_optimizer.py",
];

/// The data-parallel or sharded frameworks whose code the trace's Python frames show, named
/// as a user knows them, in a fixed order. DeepSpeed is named by its ZeRO optimizer (stages 1
/// and 2 share one, `stage_1_and_2.py`); DeepSpeed without one is named with what that means.
pub fn parallel_frameworks(tables: &TraceTables) -> Vec<&'static str> {
    const FP16: &str = "DeepSpeed without ZeRO in 16 bits (FP16_Optimizer: fp32 master weights of the whole model)";
    const KNOWN: [(&str, &str); 9] = [
        (
            "/torch/nn/parallel/distributed.py\0",
            "DDP (DistributedDataParallel)",
        ),
        (
            "/torch/distributed/fsdp/_fully_shard/",
            "FSDP2 (fully_shard)",
        ),
        (
            "/torch/distributed/fsdp/_runtime_utils.py\0",
            "FSDP1 (FullyShardedDataParallel)",
        ),
        (
            "/deepspeed/runtime/zero/stage_1_and_2.py\0",
            DEEPSPEED_ZERO_1_2,
        ),
        ("/deepspeed/runtime/zero/stage3.py\0", DEEPSPEED_ZERO_3),
        (
            "/deepspeed/runtime/bf16_optimizer.py\0",
            "DeepSpeed BF16_Optimizer (ZeRO-1 in bf16 with fp32 gradient accumulation)",
        ),
        ("/deepspeed/runtime/fp16/fused_optimizer.py\0", FP16),
        ("/deepspeed/runtime/fp16/unfused_optimizer.py\0", FP16),
        (
            "/deepspeed/",
            "DeepSpeed without ZeRO (its tensors take the kinds their frames say)",
        ),
    ];
    let mut seen = [false; KNOWN.len()];
    for text in tables.strings() {
        let text = text.replace('\\', "/");
        for (i, (part, _)) in KNOWN.iter().enumerate() {
            if !seen[i] && text.contains(part) {
                seen[i] = true;
            }
        }
    }
    // DeepSpeed's optimizer named: not DeepSpeed without one too.
    if seen[3..8].iter().any(|&s| s) {
        seen[8] = false;
    }
    let mut names: Vec<&str> = KNOWN
        .iter()
        .zip(seen)
        .filter(|(_, s)| *s)
        .map(|((_, name), _)| *name)
        .collect();
    names.dedup();
    names
}

/// How FSDP shards, where the frames show it, for each of its APIs in the trace:
/// - FSDP2 (`fully_shard`): its parameters gathered again before each backward (the
///   all-gathers of `FSDPState._pre_backward`: resharded after the forward), or, where a
///   backward ran (its reduce-scatter, `foreach_reduce`) with none of those, kept from the
///   forward to the backward (`reshard_after_forward=False`);
/// - FSDP1 (`FullyShardedDataParallel`): the same, from the flat parameters gathered in its
///   `_pre_backward_hook` (`FULL_SHARD`, `HYBRID_SHARD`) or, where its post-backward hook
///   reduced gradients with none of those, not (`SHARD_GRAD_OP`, `_HYBRID_SHARD_ZERO2`).
pub fn fsdp_resharding(tables: &TraceTables) -> Option<String> {
    // (file, function) of the gathering before a backward, and of the reduction after it.
    const FSDP2: [(&str, &str); 2] = [
        (
            "/torch/distributed/fsdp/_fully_shard/_fsdp_state.py\0",
            "_pre_backward",
        ),
        (
            "/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py\0",
            "foreach_reduce",
        ),
    ];
    const FSDP1: [(&str, &str); 2] = [
        (
            "/torch/distributed/fsdp/_runtime_utils.py\0",
            "_pre_backward_hook",
        ),
        (
            "/torch/distributed/fsdp/_runtime_utils.py\0",
            "_post_backward_hook",
        ),
    ];
    let mut seen = [[false; 2]; 2];
    for text in tables.strings() {
        let text = text.replace('\\', "/");
        for (api, frames) in [FSDP2, FSDP1].iter().enumerate() {
            for (k, (file, function)) in frames.iter().enumerate() {
                seen[api][k] |= text.contains(file) && text.ends_with(function);
            }
        }
    }
    let says = |api: usize, again: &str, kept: &str| match seen[api] {
        [true, _] => Some(format!(
            "its parameters gathered again for each backward ({again})"
        )),
        [false, true] => Some(format!(
            "its parameters kept from the forward to the backward ({kept})"
        )),
        _ => None,
    };
    let both = seen.iter().filter(|s| s.iter().any(|&x| x)).count() > 1;
    let named =
        |api: &str, s: Option<String>| s.map(|s| if both { format!("{api} {s}") } else { s });
    let out: Vec<String> = [
        named(
            "FSDP2:",
            says(
                0,
                "resharded after the forward",
                "reshard_after_forward=False",
            ),
        ),
        named(
            "FSDP1:",
            says(
                1,
                "FULL_SHARD or HYBRID_SHARD",
                "SHARD_GRAD_OP or _HYBRID_SHARD_ZERO2",
            ),
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!out.is_empty()).then(|| out.join("; "))
}

/// The run's world size as the trace's header kept it (its `WORLD_SIZE`), where it is one.
pub fn kept_world_size(env: &[String]) -> Option<u64> {
    world_size_text(env)
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n >= 1)
}

/// The run's `WORLD_SIZE` as the trace's header kept it, as text (trimmed).
pub fn world_size_text(env: &[String]) -> Option<&str> {
    env.iter()
        .find_map(|kv| kv.strip_prefix("WORLD_SIZE="))
        .map(str::trim)
}

/// DeepSpeed's ZeRO-1 and ZeRO-2, as [`parallel_frameworks`] names them.
pub const DEEPSPEED_ZERO_1_2: &str = "DeepSpeed ZeRO-1 or ZeRO-2 (DeepSpeedZeroOptimizer)";
/// DeepSpeed's ZeRO-3, as [`parallel_frameworks`] names it.
pub const DEEPSPEED_ZERO_3: &str = "DeepSpeed ZeRO-3 (DeepSpeedZeroOptimizer_Stage3)";

/// A stack's phase, whether it is a module's call, and who made its tensors (its innermost
/// Python frame).
pub(super) fn of_stack(tables: &TraceTables, stack: u64) -> (Phase, bool, Maker) {
    let (phase, module_call) = phase_and_module_call(tables, stack);
    let maker = match maker_of(tables, stack) {
        // A ZeRO optimizer's code run by its step works on the rank's partition: its
        // temporaries are the step's, not buffers (the parameters it gathers again after the
        // step, in `partition_parameters.py`, are).
        Maker::ZeroOptimizer if phase == Phase::Optimizer => Maker::Program,
        Maker::ZeroOptimizer => Maker::Framework,
        m => m,
    };
    (phase, module_call, maker)
}

/// The phase a stack says: its innermost Python frame that says one, else the program's own
/// (any Python frame), else unknown.
pub fn phase_of_stack(tables: &TraceTables, stack: u64) -> Phase {
    phase_and_module_call(tables, stack).0
}

/// The autograd node that made a backward tensor, as its stack's engine frame names it
/// (`MmBackward0`); `None` for a tensor the engine did not make.
pub fn backward_node_of(tables: &TraceTables, stack: u64) -> Option<&str> {
    let &first = tables.stack(stack)?.first()?;
    let (id, _) = format::as_py_frame(first)?;
    let (file, function) = tables.string(id)?.split_once('\0')?;
    (file == crate::report::symbolize::BACKWARD).then_some(function)
}

/// [`phase_of_stack`], and whether a module's call is among the frames (in a backward: a
/// forward recomputed there, as activation checkpointing does).
pub(super) fn phase_and_module_call(tables: &TraceTables, stack: u64) -> (Phase, bool) {
    let Some(frames) = tables.stack(stack) else {
        return (Phase::Unknown, false);
    };
    let python: Vec<(&str, &str)> = frames
        .iter()
        .filter_map(|&f| format::as_py_frame(f))
        .map(|(id, _)| {
            let text = tables.string(id).unwrap_or("");
            text.split_once('\0').unwrap_or((text, ""))
        })
        .collect();
    // Whatever runs inside a backward is the backward's (a checkpoint's recomputed forward
    // calls modules there); else the innermost frame that says a phase.
    let says = || python.iter().filter_map(|&(f, n)| phase_of_frame(f, n));
    // A backward tensor's stack joined to its forward's line holds that forward's frames
    // after the engine's frame: no module is called there.
    let joined = python
        .iter()
        .any(|&(f, _)| f == crate::report::symbolize::BACKWARD);
    let module_call = !joined && says().any(|p| p == Phase::Forward);
    if says().any(|p| p == Phase::Backward) {
        return (Phase::Backward, module_call);
    }
    let phase = match says().next() {
        Some(p) => p,
        None if !python.is_empty() => Phase::Program,
        None => Phase::Unknown,
    };
    (phase, module_call)
}

/// Whether a tensor of workspace size `i` (an index into the run's sizes; `lt` cuBLASLt's) may
/// be a workspace, made by `phase` (`module_call`: a module is called among its frames): cuBLAS's
/// in a forward or a backward, cuBLASLt's in a forward (one recomputed in a backward too).
/// PyTorch uses cuBLASLt for a module's matrix products with a bias, plain cuBLAS for the rest.
pub(super) fn workspace_fits(lt: usize, phase: Phase, module_call: bool, i: u8) -> bool {
    phase == Phase::Forward || (phase == Phase::Backward && (usize::from(i) != lt || module_call))
}

/// Whether a tensor of `phase` that was the first of a workspace's size on its thread and
/// stream (`candidate`) is a cuBLAS workspace if it is never freed: PyTorch allocates those
/// inside a forward's or a backward's first matrix product on each thread and stream.
pub(super) fn maybe_workspace(phase: Phase, candidate: bool) -> bool {
    candidate && matches!(phase, Phase::Forward | Phase::Backward)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_say_their_phase() {
        let cases = [
            ("<backward>", "MmBackward0", Some(Phase::Backward)),
            (
                "/x/torch/autograd/__init__.py",
                "backward",
                Some(Phase::Backward),
            ),
            (
                "/x/torch/optim/adamw.py",
                "_multi_tensor_adamw",
                Some(Phase::Optimizer),
            ),
            (
                "/x/torch/optim/optimizer.py",
                "_init_group",
                Some(Phase::Optimizer),
            ),
            (
                "/x/torch/nn/modules/module.py",
                "_call_impl",
                Some(Phase::Forward),
            ),
            (
                "/x/torch/nn/modules/module.py",
                "_apply",
                Some(Phase::Build),
            ),
            (
                "/x/torch/nn/modules/linear.py",
                "__init__",
                Some(Phase::Build),
            ),
            ("/x/m.py", "Linear.__init__", Some(Phase::Build)),
            (
                "/x/torch/nn/modules/module.py",
                "Module._call_impl",
                Some(Phase::Forward),
            ),
            (
                "/x/torch/nn/init.py",
                "kaiming_uniform_",
                Some(Phase::Build),
            ),
            ("/x/torch/nn/functional.py", "linear", None),
            (
                "/x/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py",
                "foreach_reduce",
                Some(Phase::Backward),
            ),
            (
                "/x/torch/distributed/fsdp/_fully_shard/_fsdp_state.py",
                "FSDPState._root_post_backward_final_callback",
                Some(Phase::Backward),
            ),
            (
                "/x/torch/distributed/fsdp/_fully_shard/_fsdp_param.py",
                "FSDPParam.alloc_all_gather_outputs",
                None,
            ),
            (
                "/x/torch/distributed/fsdp/_runtime_utils.py",
                "_post_backward_hook",
                Some(Phase::Backward),
            ),
            (
                "/x/torch/nn/parallel/distributed.py",
                "DistributedDataParallel._pre_forward",
                Some(Phase::Backward),
            ),
            (
                "/x/torch/nn/parallel/distributed.py",
                "DistributedDataParallel.forward",
                None,
            ),
            ("train.py", "step", None),
            (
                "/x/deepspeed/runtime/zero/stage_1_and_2.py",
                "DeepSpeedZeroOptimizer.step",
                Some(Phase::Optimizer),
            ),
        ];
        for (file, function, phase) in cases {
            assert_eq!(phase_of_frame(file, function), phase, "{file} {function}");
        }
    }

    #[test]
    fn workspace_sizes_follow_the_settings() {
        const MIB: u64 = 1 << 20;
        assert_eq!(
            workspace_sizes(&[]),
            vec![32 * MIB, 8 * MIB + 128 * 1024, MIB]
        );
        let env = [
            "CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8".to_string(),
            "CUBLASLT_WORKSPACE_SIZE=2048".to_string(),
        ];
        assert_eq!(workspace_sizes(&env), vec![8 * MIB + 128 * 1024, 2 * MIB]);
        assert_eq!(parse_cublas_config(":16:8"), Some(128 * 1024));
        assert_eq!(parse_cublas_config(":16"), None);
        assert_eq!(parse_cublas_config("x"), None);
    }
}
