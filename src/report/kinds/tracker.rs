//! The kinds of a trace's tensors, record by record: the runs of phases so far and, for each
//! live tensor, the phase and run that made it (a moment's, read on until each is known:
//! `settle.rs`).

use super::Kind;
pub use super::decided::StepsBegun;
use super::maker::{DDP_APART, Maker, SetupOrder, own};
use super::phase::{Phase, maybe_workspace, of_stack, workspace_fits, workspace_sizes};
use crate::fasthash::FastMap;
use crate::trace::format::{self, Record, RecordKind};
use crate::trace::reader::TraceTables;

/// The kinds of a trace's tensors, record by record: the phase runs so far and, for each live
/// tensor, the phase and run that made it.
#[derive(Default)]
pub struct KindTracker {
    /// Per stack: its phase, whether it is a module's call, and who made its tensors.
    by_stack: FastMap<u64, (Phase, bool, Maker)>,
    /// ZeRO-3's optimizer set-up: which of its lines made the gradients' buffer.
    setup: SetupOrder,
    current: Option<Phase>,
    pub(super) run: u64,
    /// Per thread: the tensor whose stack the thread's next `StackRef` names.
    awaiting: Vec<u64>,
    /// Live tensors, by address.
    born: FastMap<u64, Born>,
    /// Tensors the program let go of whose memory stays in use on other streams until their
    /// `TensorFree` (`TensorFreeRequested`): no longer PyTorch's allocated bytes, nor a kind.
    in_use_elsewhere: crate::fasthash::FastSet<u64>,
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
    /// A forward ran since the last backward or optimizer step: what the program's own lines
    /// make now is computed from a module's output (`h = gelu(lin(x))`), the forward's.
    forward_in_step: bool,
    /// A backward ran: the program trains, so its steps end with a backward or an optimizer
    /// step. A loop of forwards alone has no such end, and its next input comes after a
    /// forward too: there the program's own lines stay input.
    trains: bool,
    /// Before the first backward: the program's own tensors made after a forward (address and
    /// run), the forward's if a backward comes (at most [`TENTATIVE_MAX`]).
    tentative: Vec<(u64, u64)>,
    /// The tensors a ring's checkpoint restored whose lifetime decides their kind (when made,
    /// address, phase), until the records' first run begins: those its run may have made (see
    /// [`KindTracker::join_the_run_in_progress`]).
    restored_recent: Vec<(u64, u64, Phase)>,
    /// How many runs of the forward, the backward and the optimizer began in the records (a
    /// checkpoint's restored tensors begin none): how much of the run a ring's records hold.
    begun: StepsBegun,
    /// DDP's buckets: whether any was made, and whether a backward has shown the parameters'
    /// gradients apart from them (made by autograd and outliving the backward), which makes
    /// them DDP's own buffers ([`KindTracker::ddp_gradients_apart`]).
    ddp: (bool, bool),
}

/// The most tensors kept waiting for the first backward to say whether they were the forward's.
const TENTATIVE_MAX: usize = 1 << 16;

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
    /// Who made it: a data-parallel framework's own code makes its buffers, whatever their
    /// phase says.
    maker: Maker,
    thread: u16,
    stream: u16,
    size: u64,
    device: u8,
}

impl KindTracker {
    /// Takes in one record of the trace, in order. A definition (a caller among them) changes
    /// nothing, and a call of the program's own ends its thread's window for a stack: each
    /// record of a step asks, so those are answered here, without a call.
    #[inline]
    pub fn observe(&mut self, tables: &TraceTables, r: &Record) -> Option<(u64, Kind)> {
        match r.kind {
            k if k.is_definition() => None,
            RecordKind::Alloc | RecordKind::Free => {
                if let Some(p) = self.awaiting.get_mut(r.thread as usize) {
                    *p = 0;
                }
                None
            }
            // A tensor made, its stack, a tensor freed: each record of a real model's trace is
            // one of these, each on a road of its own ([`KindTracker::observe_any`] takes them the
            // same way).
            RecordKind::TensorAlloc if r.status == 0 && r.ptr != 0 && self.restoring.is_none() => {
                self.made(tables, r);
                None
            }
            RecordKind::StackRef => self.stack_of(tables, r),
            RecordKind::TensorFreeRequested | RecordKind::TensorFree if r.ptr != 0 => {
                self.let_go(r)
            }
            _ => self.observe_any(tables, r),
        }
    }

    /// [`KindTracker::observe`], any record.
    #[inline(never)]
    fn observe_any(&mut self, tables: &TraceTables, r: &Record) -> Option<(u64, Kind)> {
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
                self.restored(tables, r);
                None
            }
            RecordKind::TensorAlloc if r.status == 0 && r.ptr != 0 => {
                self.made(tables, r);
                None
            }
            RecordKind::StackRef => self.stack_of(tables, r),
            RecordKind::TensorFreeRequested | RecordKind::TensorFree if r.ptr != 0 => {
                self.let_go(r)
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

    /// A tensor made (not a checkpoint's): its thread's next stack is its, and it is live.
    #[inline(never)]
    fn made(&mut self, tables: &TraceTables, r: &Record) {
        let i = r.thread as usize;
        if self.awaiting.len() <= i {
            self.awaiting.resize(i + 1, 0);
        }
        self.awaiting[i] = r.ptr;
        if !self.in_use_elsewhere.is_empty() {
            self.in_use_elsewhere.remove(&r.ptr);
        }
        let workspace_size = self.workspace_size(tables, r.size);
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
                maker: Maker::Program,
                thread: r.thread,
                stream: r.stream,
                size: r.size,
                device,
            },
        );
    }

    /// A stack: the phase of the tensor its thread made just before, if any.
    #[inline(never)]
    fn stack_of(&mut self, tables: &TraceTables, r: &Record) -> Option<(u64, Kind)> {
        let ptr = self
            .awaiting
            .get_mut(r.thread as usize)
            .map(std::mem::take)
            .filter(|&p| p != 0)?;
        let (phase, module_call, mut maker) = *self
            .by_stack
            .entry(r.ptr)
            .or_insert_with(|| of_stack(tables, r.ptr));
        match maker {
            Maker::InOrder { line, earlier } => {
                let before;
                (maker, before) = self.setup.place(ptr, line, earlier);
                if let Some(b) = before.and_then(|p| self.born.get_mut(&p)) {
                    b.maker = Maker::Kept(earlier);
                }
            }
            Maker::DdpBucket if self.ddp.1 => maker = DDP_APART,
            Maker::DdpBucket => self.ddp.0 = true,
            _ => {}
        }
        let phase = self.in_step(phase);
        if phase != Phase::Unknown && self.current != Some(phase) {
            self.begin_run(phase, r.time_ns);
        }
        // Before the program has shown it trains: the forward's if a backward comes.
        if phase == Phase::Program
            && self.forward_in_step
            && !self.trains
            && self.tentative.len() < TENTATIVE_MAX
        {
            self.tentative.push((ptr, self.run));
        }
        if let Some(b) = self.born.get_mut(&ptr) {
            (b.phase, b.run, b.maker) = (phase, self.run, maker);
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

    /// A tensor let go of: its free asked for (its memory in use on other streams until its
    /// free) or done; its kind, decided at the first of the two.
    #[inline]
    fn let_go(&mut self, r: &Record) -> Option<(u64, Kind)> {
        let decided = self.freed(r.ptr);
        if r.kind == RecordKind::TensorFreeRequested {
            if decided.is_some() {
                self.in_use_elsewhere.insert(r.ptr);
            }
        } else if !self.in_use_elsewhere.is_empty() {
            self.in_use_elsewhere.remove(&r.ptr);
        }
        decided
    }

    /// Whether live tensor `ptr` was let go of by the program, its memory still in use on other
    /// streams (PyTorch no longer counts it allocated).
    pub fn in_use_elsewhere(&self, ptr: u64) -> bool {
        self.in_use_elsewhere.contains(&ptr)
    }

    /// A tensor freed (or its free asked for): its kind, once decided.
    #[inline(never)]
    fn freed(&mut self, ptr: u64) -> Option<(u64, Kind)> {
        let b = self.born.remove(&ptr)?;
        Some((ptr, own(b.maker, self.decide(b.phase, b.run, true))))
    }

    /// A tensor a ring's checkpoint restores: made before any run the records show, by the
    /// phase its line says.
    fn restored(&mut self, tables: &TraceTables, r: &Record) {
        let stack = self.restoring.unwrap_or(0);
        let (phase, module_call, maker) = *self
            .by_stack
            .entry(stack)
            .or_insert_with(|| of_stack(tables, stack));
        let workspace_size = self.workspace_size(tables, r.size);
        // Whether it was the first of its size there is lost with the older records.
        let candidate = workspace_size.is_some_and(|i| self.workspace_fits(phase, module_call, i));
        if phase.by_lifetime() && self.current.is_none() {
            self.restored_recent.push((r.time_ns, r.ptr, phase));
        }
        self.born.insert(
            r.ptr,
            Born {
                phase,
                run: RESTORED,
                candidate,
                workspace_size,
                maker,
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
    }

    /// The phase a tensor of `phase`'s frames is made in, where in its step it comes. Input is
    /// what the program makes before a step's forward; after it, in a program that trains, what
    /// its own lines make comes from the forward's output: an activation if it outlives its run
    /// (a metric kept with its graph), else a temporary.
    fn in_step(&mut self, phase: Phase) -> Phase {
        match phase {
            Phase::Forward => self.forward_in_step = true,
            Phase::Backward => {
                if !self.trains {
                    self.trains = true;
                    self.forward_before_the_first_backward();
                }
                self.forward_in_step = false;
            }
            Phase::Optimizer => self.forward_in_step = false,
            Phase::Program if self.forward_in_step && self.trains => return Phase::Forward,
            _ => {}
        }
        phase
    }

    /// The first backward came: the program's own tensors made after a forward before it, still
    /// live and as they were, are the forward's (the first step's metric, as every later one).
    fn forward_before_the_first_backward(&mut self) {
        for (ptr, run) in std::mem::take(&mut self.tentative) {
            if let Some(b) = self.born.get_mut(&ptr)
                && b.run == run
                && b.phase == Phase::Program
            {
                b.phase = Phase::Forward;
            }
        }
    }

    /// Which of the run's workspace sizes `size` is, if any.
    fn workspace_size(&mut self, tables: &TraceTables, size: u64) -> Option<u8> {
        self.workspaces
            .get_or_insert_with(|| workspace_sizes(&tables.info().env))
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
        if self.ddp == (true, false) && self.current == Some(Phase::Backward) {
            self.ddp_gradients_apart();
        }
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
                // A framework's buffers made in a forward (gathered parameters) are not the
                // forward's activations.
                if b.phase == Phase::Forward
                    && own(b.maker, Kind::Activation) == Kind::Activation
                    && !maybe_workspace(b.phase, b.candidate)
                {
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
        match phase {
            Phase::Forward => self.begun.forwards += 1,
            Phase::Backward => self.begun.backwards += 1,
            Phase::Optimizer => self.begun.optimizer_steps += 1,
            _ => {}
        }
        let first = self.current.is_none();
        self.previous = self.current;
        self.current = Some(phase);
        self.run += 1;
        if first {
            self.join_the_run_in_progress(phase);
        }
    }

    /// A backward run ends while DDP's buckets live: where autograd's own gradients outlive it
    /// (at least half the buckets' bytes, not counting cuBLAS's workspaces), the parameters'
    /// gradients are apart from the buckets (no `gradient_as_bucket_view`; with it autograd's
    /// gradient is copied into the bucket and freed within the backward), and every bucket,
    /// live or to come, is DDP's own buffer.
    fn ddp_gradients_apart(&mut self) {
        let (mut buckets, mut gradients) = (0u64, 0u64);
        for b in self.born.values() {
            if b.maker == Maker::DdpBucket {
                buckets = buckets.saturating_add(b.size);
            } else if b.maker == Maker::Program
                && b.phase == Phase::Backward
                && b.run == self.run
                && !maybe_workspace(b.phase, b.candidate)
            {
                gradients = gradients.saturating_add(b.size);
            }
        }
        if buckets == 0 || gradients < buckets / 2 {
            return;
        }
        self.ddp.1 = true;
        for b in self.born.values_mut() {
            if b.maker == Maker::DdpBucket {
                b.maker = DDP_APART;
            }
        }
    }

    /// The records' first run (of `phase`) has begun, after a ring's checkpoint restored the
    /// tensors live when the ring began: those of the same phase made since the newest restored
    /// tensor of any other phase were made by this same run, in progress when the checkpoint
    /// was taken (a checkpoint can fall inside an optimizer step, its temporaries part made).
    /// They join it, so that one freed before it ends is a temporary, as the whole trace says,
    /// where a tensor of a run long ended would take its line's lasting kind. A restored tensor
    /// freed before any run begins keeps the lasting kind: which run it was is not known
    /// there (a step's gradients freed by `zero_grad` come right after an optimizer step).
    fn join_the_run_in_progress(&mut self, phase: Phase) {
        let restored = std::mem::take(&mut self.restored_recent);
        let since = restored
            .iter()
            .filter(|&&(_, _, p)| p != phase)
            .map(|&(t, _, _)| t)
            .max();
        for (t, ptr, p) in restored {
            if p != phase || since.is_some_and(|s| t <= s) {
                continue;
            }
            if let Some(b) = self.born.get_mut(&ptr).filter(|b| b.run == RESTORED) {
                b.run = self.run;
            }
        }
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
            Some(own(b.maker, b.phase.lasting()))
        }
    }

    /// The kind of live tensor `ptr` if it is never freed (at the end of a trace), or of a
    /// tensor the records never showed being made (restored from a checkpoint: by its stack).
    pub fn lasting(&self, tables: &TraceTables, ptr: u64, stack: u64) -> Kind {
        match self.born.get(&ptr) {
            Some(b) if maybe_workspace(b.phase, b.candidate) => Kind::Workspace,
            Some(b) => own(b.maker, b.phase.lasting()),
            None if stack != 0 => {
                let (phase, _, maker) = of_stack(tables, stack);
                own(maker, phase.lasting())
            }
            None => Kind::Unknown,
        }
    }

    /// Whether `ptr` is a live tensor the records showed being made.
    pub(super) fn made_live(&self, ptr: u64) -> bool {
        self.born.contains_key(&ptr)
    }

    /// The phase run now going on (a new one begins as the phase changes).
    pub fn run(&self) -> u64 {
        self.run
    }

    /// How many forwards, backward passes and optimizer steps began in the records read so far.
    pub fn steps_begun(&self) -> StepsBegun {
        self.begun
    }
}
