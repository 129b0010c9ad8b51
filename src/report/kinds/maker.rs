//! Whose code made a tensor, from its innermost Python frame: the program's (its phase and
//! lifetime decide its kind), a data-parallel framework's (its buffers: gathered parameters,
//! reduce-scatter's input, buckets), or a line of DeepSpeed's ZeRO whose tensor is one kind
//! whatever its phase (the fp32 master copy it keeps for the optimizer, its flat 16-bit
//! parameters, its gradients' partition).

use super::Kind;
use crate::trace::format;
use crate::trace::reader::TraceTables;

/// Who made a tensor, as far as its kind goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Maker {
    /// The program, or a library it calls: its phase and lifetime decide.
    #[default]
    Program,
    /// A data-parallel framework's own code: its buffer, where its phase would say an
    /// activation, a temporary, input or optimizer state.
    Framework,
    /// A framework's line whose tensor is this kind whatever its phase.
    Kept(Kind),
    /// A ZeRO optimizer's own code (`stage_1_and_2.py`, `stage3.py`): its buffers, but in its
    /// step (the phase decides) the step's temporaries, worked on the rank's partition.
    ZeroOptimizer,
    /// A DeepSpeed optimizer's set-up (`_setup_for_real_optimizer`, at `line`) that makes the
    /// flat buffer of this rank's gradients by its last line and tensors of kind `earlier`
    /// before it (ZeRO-3: its gradient buckets; `BF16_Optimizer`: its fp32 master weights);
    /// which is which is decided by the lines in order ([`SetupOrder`]).
    InOrder { line: u32, earlier: Kind },
    /// DDP's gradient buckets (made in `_ddp_init_helper`, made again in `_pre_forward`): the
    /// parameters' gradients where they are views of them (`gradient_as_bucket_view`), else
    /// DDP's own buffers beside the gradients, which the tracker decides once a backward shows
    /// gradients of their own ([`DDP_APART`]).
    DdpBucket,
}

/// DDP's buckets once the parameters' gradients are seen apart from them: its buffers.
pub const DDP_APART: Maker = Maker::Kept(Kind::Communication);

/// Where a data-parallel framework's own code lies: FSDP (either API), DDP, the storage
/// helper FSDP1 makes its gathered flat parameter with (`_alloc_storage`, in the package's
/// shared utilities, where other functions move a program's inputs), and DeepSpeed's ZeRO (its
/// partitioned parameters and their gathering, its collectives; its optimizers' files are
/// [`Maker::ZeroOptimizer`]; not its `linear.py`, the model's own matrix products under
/// ZeRO-3): a path part, and the function where only one of the file's is the framework's.
const FRAMEWORK_CODE: [(&str, Option<&str>); 7] = [
    ("/torch/distributed/fsdp/", None),
    ("/torch/nn/parallel/distributed.py", None),
    ("/torch/distributed/utils.py", Some("_alloc_storage")),
    ("/deepspeed/runtime/zero/partition_parameters.py", None),
    (
        "/deepspeed/runtime/zero/partitioned_param_coordinator.py",
        None,
    ),
    ("/deepspeed/runtime/zero/parameter_offload.py", None),
    ("/deepspeed/runtime/comm/", None),
];

/// Frames that only pass a tensor on: torch's storage plumbing (`TypedStorage._resize_`,
/// where FSDP1's helper has its storage grown) and DeepSpeed's NVTX wrapper (every function it
/// instruments runs inside `instrument_w_nvtx.<locals>.wrapped_fn`). Their caller says whose the
/// memory is.
const PLUMBING: [&str; 2] = ["/torch/storage.py", "/deepspeed/utils/nvtx.py"];

/// The lines of DeepSpeed whose tensor is one kind whatever its phase (file, function, kind),
/// as DeepSpeed's own accounting counts them (its model states: parameters, gradients, and the
/// optimizer's states with the fp32 master weights among them):
/// - ZeRO-1 and 2 (`stage_1_and_2.py`): the flat buffer of the 16-bit parameters
///   (`flatten_dense_tensors_aligned`, whole on every rank); the fp32 copy of this rank's
///   partition made in the optimizer's `__init__` (its master weights, the optimizer's); the
///   partition's gradients (ZeRO-2's `grads_in_partition`, the fp32 gradient a step makes);
/// - ZeRO-3 (`stage3.py`): the fp32 partitions (`_create_fp32_partitions`, master weights);
///   the 16-bit partitions packed into one buffer (`defragment`, in DeepSpeed's utilities);
/// - without ZeRO, in 16 bits (`fp16/fused_optimizer.py`, `fp16/unfused_optimizer.py`): the
///   fp32 master weights its `__init__` copies from the parameters (its 16-bit flat buffer is
///   made by torch's `_flatten_dense_tensors`, whose frame says parameters).
const DEEPSPEED_KEPT: [(&str, &str, Kind); 8] = [
    (
        "/zero/stage_1_and_2.py",
        "flatten_dense_tensors_aligned",
        Kind::Parameter,
    ),
    ("/zero/stage_1_and_2.py", "__init__", Kind::OptimizerState),
    (
        "/zero/stage_1_and_2.py",
        "copy_grads_in_partition",
        Kind::Gradient,
    ),
    (
        "/zero/stage_1_and_2.py",
        "get_flat_partition",
        Kind::Gradient,
    ),
    (
        "/zero/stage3.py",
        "_create_fp32_partitions",
        Kind::OptimizerState,
    ),
    ("/deepspeed/runtime/utils.py", "defragment", Kind::Parameter),
    (
        "/runtime/fp16/fused_optimizer.py",
        "__init__",
        Kind::OptimizerState,
    ),
    (
        "/runtime/fp16/unfused_optimizer.py",
        "__init__",
        Kind::OptimizerState,
    ),
];

/// DeepSpeed's optimizer set-ups whose last line makes the flat buffer of the rank's gradients
/// (file, and the kind of what the lines before it make): ZeRO-3's (its gradient buckets) and
/// `BF16_Optimizer`'s (ZeRO-1 in bf16 with fp32 gradient accumulation: the fp32 partition, its
/// master weights).
const SET_UPS: [(&str, Kind); 2] = [
    ("/deepspeed/runtime/zero/stage3.py", Kind::Communication),
    ("/deepspeed/runtime/bf16_optimizer.py", Kind::OptimizerState),
];

/// Who made the tensors of `stack`, from its innermost Python frame past the plumbing.
pub fn maker_of(tables: &TraceTables, stack: u64) -> Maker {
    let Some(frames) = tables.stack(stack) else {
        return Maker::Program;
    };
    let innermost = frames
        .iter()
        .filter_map(|&f| format::as_py_frame(f))
        .filter_map(|(id, line)| Some((tables.string(id)?, line)))
        .filter_map(|(s, line)| s.split_once('\0').map(|(f, n)| (f, n, line)))
        .map(|(file, function, line)| (file.replace('\\', "/"), function, line))
        .find(|(file, _, _)| !PLUMBING.iter().any(|p| file.ends_with(p)));
    let Some((file, function, line)) = innermost else {
        return Maker::Program;
    };
    let name = plain_name(function);
    if let Some(&(_, _, kind)) = DEEPSPEED_KEPT
        .iter()
        .find(|(part, f, _)| file.ends_with(part) && name == *f)
    {
        return Maker::Kept(kind);
    }
    if name == "_setup_for_real_optimizer"
        && let Some(&(_, earlier)) = SET_UPS.iter().find(|(f, _)| file.ends_with(f))
    {
        return Maker::InOrder { line, earlier };
    }
    // DDP's broadcast of the module's states as it wraps the model (FSDP1's too, with
    // `sync_module_states`): `_broadcast_coalesced` joins them into buckets of its own, as
    // large as the model up to its bucket size, let go at once. A communication buffer, not
    // parameters.
    if file.ends_with("/torch/distributed/utils.py") && name == "_sync_params_and_buffers" {
        return Maker::Kept(Kind::Communication);
    }
    if file.ends_with("/torch/nn/parallel/distributed.py")
        && matches!(name, "_ddp_init_helper" | "_pre_forward")
    {
        return Maker::DdpBucket;
    }
    if file.ends_with("/deepspeed/runtime/zero/stage_1_and_2.py")
        || file.ends_with("/deepspeed/runtime/zero/stage3.py")
    {
        return Maker::ZeroOptimizer;
    }
    // FSDP2's cast of a module's inputs (and outputs) to its mixed precision's dtypes: the
    // batch's tensors, as FSDP1's cast (in torch's shared utilities) is.
    if file.contains("/torch/distributed/fsdp/") && name == "_cast_fp_tensor" {
        return Maker::Program;
    }
    let framework = FRAMEWORK_CODE
        .iter()
        .any(|(part, only)| file.contains(part) && only.is_none_or(|f| function.ends_with(f)));
    if framework {
        Maker::Framework
    } else {
        Maker::Program
    }
}

/// A frame's function as its source names it: Python 3.11 on names a frame by its qualified
/// name (`DeepSpeedZeroOptimizer.__init__`), and a comprehension's (before 3.12, which runs
/// them in their function's frame) by its function's with `.<locals>.<listcomp>` after it.
pub(super) fn plain_name(function: &str) -> &str {
    const COMPREHENSIONS: [&str; 4] = [
        ".<locals>.<listcomp>",
        ".<locals>.<genexpr>",
        ".<locals>.<dictcomp>",
        ".<locals>.<setcomp>",
    ];
    let outer = COMPREHENSIONS
        .iter()
        .find_map(|c| function.strip_suffix(c))
        .unwrap_or(function);
    outer.rsplit('.').next().unwrap_or(outer)
}

/// A tensor's kind, given who made it: a framework's buffer rather than an activation, a
/// temporary, input or optimizer state, which its phase alone would say (its gradients and
/// parameters stay theirs); a kept line's kind whatever the phase. A set-up line not put in
/// order (a ring's checkpoint keeps lines, not their order) is taken for an earlier one; DDP's
/// buckets not yet decided are the parameters' gradients, as their phase says.
pub fn own(maker: Maker, kind: Kind) -> Kind {
    match (maker, kind) {
        (Maker::Kept(k), _) => k,
        (Maker::InOrder { earlier, .. }, _) => earlier,
        // A framework's code makes no optimizer state of its own: what it makes in a step is
        // its buffer too (ZeRO-3 gathers its persistent parameters again after the step).
        (
            Maker::Framework | Maker::ZeroOptimizer | Maker::DdpBucket,
            Kind::Activation | Kind::Temporary | Kind::Input | Kind::OptimizerState,
        ) => Kind::Communication,
        (_, k) => k,
    }
}

/// The lines of a DeepSpeed optimizer's set-up seen so far ([`SET_UPS`]): the last of them
/// made the flat buffer of this rank's gradients (ZeRO-3's `grad_partitions_flat_buffer`,
/// `BF16_Optimizer`'s `fp32_groups_gradients_flat`), those before it what the set-up makes
/// first (ZeRO-3's `ipg` buckets, `BF16_Optimizer`'s fp32 partition), as the function is
/// written in every DeepSpeed release that has both. Lines of one function are in source
/// order, so the greatest line seen is the last.
#[derive(Default)]
pub struct SetupOrder {
    /// The greatest line seen, and the tensor it made.
    last: Option<(u32, u64)>,
}

impl SetupOrder {
    /// A tensor (`ptr`) made at `line` of the set-up, whose earlier lines make `earlier`: who
    /// made it, and the tensor made by the line before, if this one is later (of `earlier`
    /// now, no longer the gradients').
    pub fn place(&mut self, ptr: u64, line: u32, earlier: Kind) -> (Maker, Option<u64>) {
        match self.last {
            Some((l, _)) if l >= line => (Maker::Kept(earlier), None),
            before => {
                self.last = Some((line, ptr));
                (Maker::Kept(Kind::Gradient), before.map(|(_, p)| p))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_line_of_the_set_up_takes_the_gradients_from_an_earlier_one() {
        let bucket = Kind::Communication;
        let mut order = SetupOrder::default();
        assert_eq!(
            order.place(10, 782, bucket),
            (Maker::Kept(Kind::Gradient), None)
        );
        assert_eq!(
            order.place(20, 791, bucket),
            (Maker::Kept(Kind::Gradient), Some(10))
        );
        assert_eq!(order.place(30, 782, bucket), (Maker::Kept(bucket), None));
    }

    #[test]
    fn a_comprehension_s_frame_is_its_function_s() {
        assert_eq!(
            plain_name("FP16_UnfusedOptimizer.__init__.<locals>.<listcomp>"),
            "__init__"
        );
        assert_eq!(plain_name("DeepSpeedZeroOptimizer.step"), "step");
        assert_eq!(plain_name("step"), "step");
        assert_eq!(plain_name("<listcomp>"), "<listcomp>");
    }

    #[test]
    fn a_kept_line_is_its_kind_and_a_framework_s_buffer_is_communication() {
        assert_eq!(
            own(Maker::Kept(Kind::OptimizerState), Kind::Parameter),
            Kind::OptimizerState
        );
        assert_eq!(own(Maker::Framework, Kind::Input), Kind::Communication);
        assert_eq!(own(Maker::Framework, Kind::Gradient), Kind::Gradient);
        assert_eq!(
            own(Maker::Framework, Kind::OptimizerState),
            Kind::Communication
        );
        assert_eq!(own(Maker::Program, Kind::Input), Kind::Input);
        let bucket = Maker::InOrder {
            line: 3,
            earlier: Kind::Communication,
        };
        assert_eq!(own(bucket, Kind::Parameter), Kind::Communication);
        // DDP's buckets not yet seen apart from the gradients are the gradients.
        assert_eq!(own(Maker::DdpBucket, Kind::Gradient), Kind::Gradient);
        assert_eq!(own(DDP_APART, Kind::Gradient), Kind::Communication);
    }
}
