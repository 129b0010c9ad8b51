//! Memory by kind: every tensor of the framework's allocator is a parameter, a gradient,
//! optimizer state, an activation, a temporary, input, or unknown, decided from what the
//! default run records, with no change to the program (`docs/kinds.md` says how, and where it
//! can be wrong).
//!
//! Two signals decide it. The *phase* that made a tensor, from its Python frames (innermost
//! first, the first frame that says): the autograd thread's backward frame or PyTorch's
//! `torch/autograd` code is the backward pass; `torch/optim` (and AMP's grad scaler) the
//! optimizer; a module's `__call__` (`torch/nn/modules/module.py`) the forward pass; building a
//! model (`__init__`, `reset_parameters`, `torch/nn/init.py`, `Module._apply` behind `.to()` and
//! `.cuda()`, loading a state dict) makes parameters; any other Python line is the program's own
//! (the batch, metrics). Then the tensor's *lifetime*: the phases follow one another in runs (a
//! forward, a backward, an optimizer step, the program's own lines between them); a tensor
//! freed within the run that made it is a temporary, one that outlives it is what its phase
//! keeps: activations (made in forward, kept for backward), gradients, optimizer state, input.

use crate::fasthash::FastMap;
use crate::trace::format::{self, Record, RecordKind};
use crate::trace::reader::TraceReader;
use serde::Serialize;

/// What a tensor is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Parameter,
    Gradient,
    OptimizerState,
    Activation,
    Temporary,
    Input,
    /// The workspaces PyTorch allocates for cuBLAS and cuBLASLt through its own allocator, one
    /// per handle and stream, kept for the whole run.
    Workspace,
    Unknown,
}

impl Kind {
    /// Every kind, in the order reports list them.
    pub const ALL: [Kind; 8] = [
        Kind::Parameter,
        Kind::Gradient,
        Kind::OptimizerState,
        Kind::Activation,
        Kind::Temporary,
        Kind::Input,
        Kind::Workspace,
        Kind::Unknown,
    ];

    /// The kind's name in a sentence or a table row ("activations").
    pub fn name(self) -> &'static str {
        match self {
            Kind::Parameter => "parameters",
            Kind::Gradient => "gradients",
            Kind::OptimizerState => "optimizer state",
            Kind::Activation => "activations",
            Kind::Temporary => "temporaries",
            Kind::Input => "input",
            Kind::Workspace => "cuBLAS workspaces",
            Kind::Unknown => "unknown",
        }
    }

    /// One tensor's kind ("activation").
    pub fn one(self) -> &'static str {
        match self {
            Kind::Parameter => "parameter",
            Kind::Gradient => "gradient",
            Kind::OptimizerState => "optimizer state",
            Kind::Activation => "activation",
            Kind::Temporary => "temporary",
            Kind::Input => "input",
            Kind::Workspace => "cuBLAS workspace",
            Kind::Unknown => "unknown",
        }
    }
}

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
    fn by_lifetime(self) -> bool {
        !matches!(self, Phase::Build | Phase::Unknown)
    }
}

/// The phase one Python frame says, if it says one.
fn phase_of_frame(file: &str, function: &str) -> Option<Phase> {
    let file = file.replace('\\', "/");
    let qualified = function;
    // Python 3.11 on names a frame by its qualified name (`Linear.__init__`).
    let function = function.rsplit('.').next().unwrap_or(function);
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

/// The phase a stack says: its innermost Python frame that says one, else the program's own
/// (any Python frame), else unknown.
pub fn phase_of_stack(reader: &TraceReader, stack: u64) -> Phase {
    phase_and_module_call(reader, stack).0
}

/// [`phase_of_stack`], and whether a module's call is among the frames (in a backward: a
/// forward recomputed there, as activation checkpointing does).
fn phase_and_module_call(reader: &TraceReader, stack: u64) -> (Phase, bool) {
    let Some(frames) = reader.stack(stack) else {
        return (Phase::Unknown, false);
    };
    let python: Vec<(&str, &str)> = frames
        .iter()
        .filter_map(|&f| format::as_py_frame(f))
        .map(|(id, _)| {
            let text = reader.string(id).unwrap_or("");
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

/// The kinds of a trace's tensors, record by record: the phase runs so far and, for each live
/// tensor, the phase and run that made it.
#[derive(Default)]
pub struct Kinds {
    by_stack: FastMap<u64, (Phase, bool)>,
    current: Option<Phase>,
    run: u64,
    /// Per thread: the tensor whose stack the thread's next `StackRef` names.
    awaiting: Vec<u64>,
    /// Live tensors, by address.
    born: FastMap<u64, Born>,
    /// The phase of the run before the current one.
    previous: Option<Phase>,
    /// Per device: the most bytes of activations live at once, reached as a backward began
    /// (what a forward leaves for its backward, the loss included), and when.
    activation_peaks: std::collections::BTreeMap<u8, (u64, u64)>,
    /// While a ring's checkpoint is read back: the stack of the tensors it restores next
    /// (`None` outside a checkpoint).
    restoring: Option<u64>,
    /// The sizes of cuBLAS's workspaces in this run ([`workspace_sizes`]), read from the
    /// trace's header at the first record.
    workspaces: Option<Vec<u64>>,
    /// Per thread and stream: which of those sizes a tensor already had (one bit each). A
    /// workspace is the first tensor of its size there: PyTorch keeps one per handle (a thread's)
    /// and stream.
    sizes_seen: FastMap<(u16, u16), u32>,
}

/// Whether a tensor of workspace size `i` (an index into the run's sizes; `lt` cuBLASLt's) may
/// be a workspace, made by `phase` (`module_call`: a module is called among its frames): cuBLAS's
/// in a forward or a backward, cuBLASLt's in a forward (one recomputed in a backward too).
/// PyTorch uses cuBLASLt for a module's matrix products with a bias, plain cuBLAS for the rest.
fn workspace_fits(lt: usize, phase: Phase, module_call: bool, i: u8) -> bool {
    phase == Phase::Forward || (phase == Phase::Backward && (usize::from(i) != lt || module_call))
}

/// The run of a tensor a ring's checkpoint restored: none the records show, long ended.
const RESTORED: u64 = u64::MAX;

/// What is known of a live tensor.
#[derive(Clone, Copy, Debug)]
struct Born {
    phase: Phase,
    /// The run that made it.
    run: u64,
    /// The first tensor of a cuBLAS workspace's size on its thread and stream made by a
    /// forward or a backward (cuBLASLt's: by a forward).
    candidate: bool,
    /// Which workspace size it has, if any (an index into `workspaces`).
    workspace_size: Option<u8>,
    thread: u16,
    stream: u16,
    size: u64,
    device: u8,
}

impl Kinds {
    /// Takes in one record of the trace, in order.
    pub fn observe(&mut self, reader: &TraceReader, r: &Record) -> Option<(u64, Kind)> {
        use crate::trace::format::restore;
        match r.kind {
            // A ring's checkpoint restores the tensors live when the ring began, each after its
            // call site: made before any run the records show, by the phase its line says.
            RecordKind::Restore => {
                self.restoring = match r.status {
                    restore::BEGIN => Some(0),
                    restore::SITE => Some(r.ptr),
                    restore::END => None,
                    _ => self.restoring,
                };
                None
            }
            RecordKind::TensorAlloc if r.ptr != 0 && self.restoring.is_some() => {
                let stack = self.restoring.unwrap_or(0);
                let (phase, module_call) = *self
                    .by_stack
                    .entry(stack)
                    .or_insert_with(|| phase_and_module_call(reader, stack));
                let workspace_size = self.workspace_size(reader, r.size);
                // Whether it was the first of its size there is lost with the older records.
                let candidate =
                    workspace_size.is_some_and(|i| self.workspace_fits(phase, module_call, i));
                self.born.insert(
                    r.ptr,
                    Born {
                        phase,
                        run: RESTORED,
                        candidate,
                        workspace_size,
                        thread: r.thread,
                        stream: r.stream,
                        size: r.size,
                        device: if r.device == format::DEVICE_UNKNOWN {
                            0
                        } else {
                            r.device
                        },
                    },
                );
                None
            }
            RecordKind::TensorAlloc if r.status == 0 && r.ptr != 0 => {
                let i = r.thread as usize;
                if self.awaiting.len() <= i {
                    self.awaiting.resize(i + 1, 0);
                }
                self.awaiting[i] = r.ptr;
                let workspace_size = self.workspace_size(reader, r.size);
                let device = if r.device == format::DEVICE_UNKNOWN {
                    0
                } else {
                    r.device
                };
                self.born.insert(
                    r.ptr,
                    Born {
                        phase: Phase::Unknown,
                        run: self.run,
                        candidate: false,
                        workspace_size,
                        thread: r.thread,
                        stream: r.stream,
                        size: r.size,
                        device,
                    },
                );
                None
            }
            RecordKind::StackRef => {
                let ptr = self
                    .awaiting
                    .get_mut(r.thread as usize)
                    .map(std::mem::take)
                    .filter(|&p| p != 0)?;
                let (phase, module_call) = *self
                    .by_stack
                    .entry(r.ptr)
                    .or_insert_with(|| phase_and_module_call(reader, r.ptr));
                if phase != Phase::Unknown && self.current != Some(phase) {
                    self.begin_run(phase, r.time_ns);
                }
                if let Some(b) = self.born.get_mut(&ptr) {
                    (b.phase, b.run) = (phase, self.run);
                    let lt = self
                        .workspaces
                        .as_ref()
                        .map_or(0, |w| w.len().saturating_sub(1));
                    let fits = |i: u8| workspace_fits(lt, phase, module_call, i);
                    if let Some(i) = b.workspace_size.filter(|&i| fits(i)) {
                        let seen = self.sizes_seen.entry((b.thread, b.stream)).or_default();
                        b.candidate = *seen & (1 << i) == 0;
                        *seen |= 1 << i;
                    }
                }
                None
            }
            RecordKind::TensorFreeRequested | RecordKind::TensorFree if r.ptr != 0 => {
                let b = self.born.remove(&r.ptr)?;
                Some((r.ptr, self.decide(b.phase, b.run, true)))
            }
            // Any other record of the thread ends the window in which a `StackRef` belongs to
            // its tensor (as the replay reads it).
            k if !k.is_definition() => {
                if let Some(p) = self.awaiting.get_mut(r.thread as usize) {
                    *p = 0;
                }
                None
            }
            _ => None,
        }
    }

    /// Which of the run's workspace sizes `size` is, if any.
    fn workspace_size(&mut self, reader: &TraceReader, size: u64) -> Option<u8> {
        self.workspaces
            .get_or_insert_with(|| workspace_sizes(&reader.info().env))
            .iter()
            .position(|&s| s == size)
            .filter(|&i| i < 32)
            .map(|i| i as u8)
    }

    /// [`workspace_fits`] with this run's sizes.
    fn workspace_fits(&self, phase: Phase, module_call: bool, i: u8) -> bool {
        let lt = self
            .workspaces
            .as_ref()
            .map_or(0, |w| w.len().saturating_sub(1));
        workspace_fits(lt, phase, module_call, i)
    }

    /// A run of `phase` begins. Where a backward follows the program's own lines that followed
    /// a forward (a loss computed outside any module, `F.cross_entropy(model(x), y)`), those
    /// lines' tensors still live belong to the forward: what it leaves for the backward. As a
    /// backward begins, the forward's tensors still live are the activations at their fullest.
    fn begin_run(&mut self, phase: Phase, time_ns: u64) {
        if phase == Phase::Backward {
            if self.current == Some(Phase::Program) && self.previous == Some(Phase::Forward) {
                let run = self.run;
                for b in self.born.values_mut() {
                    if b.run == run && b.phase == Phase::Program {
                        b.phase = Phase::Forward;
                    }
                }
            }
            let mut now: std::collections::BTreeMap<u8, u64> = Default::default();
            for b in self.born.values() {
                if b.phase == Phase::Forward && !maybe_workspace(b.phase, b.candidate) {
                    let e = now.entry(b.device).or_default();
                    *e = e.saturating_add(b.size);
                }
            }
            for (d, bytes) in now {
                let e = self.activation_peaks.entry(d).or_default();
                if bytes > e.0 {
                    *e = (bytes, time_ns);
                }
            }
        }
        self.previous = self.current;
        self.current = Some(phase);
        self.run += 1;
    }

    /// Per device: the most bytes of activations live at once (as a backward began), and when.
    pub fn activation_peaks(&self) -> &std::collections::BTreeMap<u8, (u64, u64)> {
        &self.activation_peaks
    }

    /// The kind of a tensor made in `phase` during `run`: `freed` says it was freed now.
    fn decide(&self, phase: Phase, run: u64, freed: bool) -> Kind {
        if phase.by_lifetime() && run == self.run && freed {
            Kind::Temporary
        } else {
            phase.lasting()
        }
    }

    /// The kind of live tensor `ptr` as far as the records so far tell: `None` while the run
    /// that made it goes on (it may yet be freed within it: a temporary), and, for a tensor of
    /// a forward or backward the size of a cuBLAS workspace, until it is freed (a workspace is
    /// never freed).
    pub fn so_far(&self, ptr: u64) -> Option<Kind> {
        let b = self.born.get(&ptr)?;
        if (b.phase.by_lifetime() && b.run == self.run) || maybe_workspace(b.phase, b.candidate) {
            None
        } else {
            Some(b.phase.lasting())
        }
    }

    /// The kind of live tensor `ptr` if it is never freed (at the end of a trace), or of a
    /// tensor the records never showed being made (restored from a checkpoint: by its stack).
    pub fn lasting(&self, reader: &TraceReader, ptr: u64, stack: u64) -> Kind {
        match self.born.get(&ptr) {
            Some(b) if maybe_workspace(b.phase, b.candidate) => Kind::Workspace,
            Some(b) => b.phase.lasting(),
            None if stack != 0 => phase_of_stack(reader, stack).lasting(),
            None => Kind::Unknown,
        }
    }

    /// The kinds of the live tensors `ptrs` (their stacks beside them) at a moment: `window`
    /// holds the records read just after it (where the `StackRef`s of its last tensors lie),
    /// and the reader reads on from there until each tensor is known: freed within the run
    /// that made it (a temporary) or outliving it. It reads no further than the end of the runs
    /// still going on.
    pub fn settle(
        &mut self,
        reader: &mut TraceReader,
        ptrs: impl IntoIterator<Item = (u64, u64)>,
        window: &[Record],
    ) -> FastMap<u64, Kind> {
        let mut freed = FastMap::default();
        for r in window {
            if let Some((ptr, k)) = self.observe(reader, r) {
                // The first free at an address is the live tensor's: the address may be
                // handed out again and freed again within the window.
                freed.entry(ptr).or_insert(k);
            }
        }
        let mut out = FastMap::default();
        let mut open = FastMap::default();
        for (ptr, stack) in ptrs {
            if let Some(&k) = freed.get(&ptr) {
                out.insert(ptr, k);
                continue;
            }
            match self.so_far(ptr) {
                Some(k) => {
                    out.insert(ptr, k);
                }
                None if self.born.contains_key(&ptr) => {
                    open.insert(ptr, ());
                }
                None => {
                    out.insert(ptr, self.lasting(reader, ptr, stack));
                }
            }
        }
        while !open.is_empty() {
            let Some(r) = reader.next() else {
                break;
            };
            let before = self.run;
            if let Some((ptr, k)) = self.observe(reader, &r)
                && open.remove(&ptr).is_some()
            {
                out.insert(ptr, k);
            }
            if self.run != before {
                // A new run began: every tensor of the old one still live outlived it.
                open.retain(|&ptr, _| match self.so_far(ptr) {
                    Some(k) => {
                        out.insert(ptr, k);
                        false
                    }
                    None => true,
                });
            }
        }
        for (ptr, _) in open {
            out.insert(ptr, self.lasting(reader, ptr, 0));
        }
        out
    }
}

/// Whether a tensor of `phase` that was the first of a workspace's size on its thread and
/// stream (`candidate`) is a cuBLAS workspace if it is never freed: PyTorch allocates those
/// inside a forward's or a backward's first matrix product on each thread and stream.
fn maybe_workspace(phase: Phase, candidate: bool) -> bool {
    candidate && matches!(phase, Phase::Forward | Phase::Backward)
}

/// The replay of the first `at` records of `reader` (as [`super::live::replay_until`] makes
/// it) and the kind of each live tensor then, by address.
pub fn replay_with_kinds(
    reader: &mut TraceReader,
    at: u64,
) -> (super::live::Replay, FastMap<u64, Kind>) {
    let mut kinds = Kinds::default();
    let mut window = Vec::new();
    let rp = crate::trace::live::replay_until_seeing(reader, at, |reader, r, past| {
        if past {
            window.push(*r);
        } else {
            kinds.observe(reader, r);
        }
    });
    let tensors: Vec<(u64, u64)> = rp
        .live
        .iter()
        .filter(|(_, l)| l.api == format::Api::Torch as u8)
        .map(|(&p, l)| (p, l.stack))
        .collect();
    let by_ptr = kinds.settle(reader, tensors, &window);
    (rp, by_ptr)
}

/// One kind of tensor live at a moment: its bytes and the call sites that made them.
#[derive(Clone, Debug, Serialize)]
pub struct KindHolders {
    pub kind: Kind,
    pub bytes: u64,
    pub tensors: u64,
    pub by_call_site: Vec<super::sites::Holder>,
}

/// `tensors` (each with its kind) by kind, in [`Kind::ALL`]'s order, and by call site within
/// each (`label` names a stack).
pub fn by_kind_and_site(
    tensors: &[(Kind, &super::live::Live)],
    label: impl Fn(u64) -> String,
) -> Vec<KindHolders> {
    Kind::ALL
        .iter()
        .filter_map(|&k| {
            let of: Vec<&super::live::Live> = tensors
                .iter()
                .filter(|(kk, _)| *kk == k)
                .map(|&(_, l)| l)
                .collect();
            (!of.is_empty()).then(|| KindHolders {
                kind: k,
                bytes: of.iter().fold(0u64, |a, l| a.saturating_add(l.size)),
                tensors: of.len() as u64,
                by_call_site: super::sites::holders(of.into_iter(), None, |l| l.stack, &label),
            })
        })
        .collect()
}

/// Bytes per kind, in [`Kind::ALL`]'s order, kinds with no bytes left out.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ByKind(pub Vec<KindBytes>);

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KindBytes {
    pub kind: Kind,
    pub bytes: u64,
    pub tensors: u64,
}

impl ByKind {
    /// The sums of `items` (kind, bytes).
    pub fn of(items: impl IntoIterator<Item = (Kind, u64)>) -> ByKind {
        let mut sums = [(0u64, 0u64); Kind::ALL.len()];
        for (k, b) in items {
            let s = &mut sums[k as usize];
            s.0 = s.0.saturating_add(b);
            s.1 += 1;
        }
        ByKind(
            Kind::ALL
                .iter()
                .zip(sums)
                .filter(|(_, (b, n))| *b > 0 || *n > 0)
                .map(|(&kind, (bytes, tensors))| KindBytes {
                    kind,
                    bytes,
                    tensors,
                })
                .collect(),
        )
    }

    pub fn bytes(&self, kind: Kind) -> u64 {
        self.0
            .iter()
            .find(|k| k.kind == kind)
            .map_or(0, |k| k.bytes)
    }

    pub fn total(&self) -> u64 {
        self.0.iter().fold(0, |a, k| a.saturating_add(k.bytes))
    }

    /// `parameters 1.2 GiB, gradients 1.2 GiB, ...`: the kinds in one line.
    pub fn line(&self) -> String {
        self.0
            .iter()
            .map(|k| format!("{} {}", k.kind.name(), super::units::human_bytes(k.bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    }
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
            ("train.py", "step", None),
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

    #[test]
    fn kinds_sum_in_order() {
        let b = ByKind::of([
            (Kind::Activation, 10),
            (Kind::Parameter, 5),
            (Kind::Activation, 1),
        ]);
        assert_eq!(b.0[0].kind, Kind::Parameter);
        assert_eq!(b.bytes(Kind::Activation), 11);
        assert_eq!(b.total(), 16);
        assert_eq!(b.0[1].tensors, 2);
    }
}
