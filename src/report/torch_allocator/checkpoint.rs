//! A run without activation checkpointing replayed as if its repeated blocks were checkpointed
//! (`gpushim fit --checkpoint`): what `torch.utils.checkpoint` (and transformers'
//! `gradient_checkpointing_enable()`, which calls it per block) changes in the requests.
//!
//! - **Forward.** A checkpointed block runs without keeping what its backward needs: each
//!   tensor the block made that outlived the block's forward (saved for the backward) lives as
//!   long as the block's own temporaries did (their mean lifetime, in the block's requests made
//!   meanwhile: the run says how soon this block's ops let go of what they used), and at the
//!   latest to the block's end; but the block's output (the last such tensor it made: the next
//!   block's input, which the next checkpoint keeps).
//! - **Backward.** Before the block's backward begins, its forward runs again: the block's
//!   requests, in their order, with their frees inside the block, are made once more; what
//!   outlived the block is then freed where the run freed it in that backward, the output's
//!   copy once made (the gradients flow through it at once).
//!
//! Blocks are found from the frames: a request of the forward made under `CLASS.forward` belongs
//! to a block, and a new block begins where the line in `CLASS.forward` goes back up, or where
//! the block's first line comes again after another, or after a request made outside it. A
//! block's backward begins at the first backward request whose autograd sequence number is one
//! of the block's forward ops' (the shim records both). Without `CLASS`, the repeated blocks are
//! the outermost module class whose `forward` runs more than once in one step (containers
//! aside).

use super::{Ev, Event, Input};
use crate::fasthash::FastMap;
use crate::report::kinds::{Phase, phase_of_stack};
use crate::trace::format;
use crate::trace::reader::TraceReader;

/// The blocks a `--checkpoint` what-if checkpointed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Blocks {
    /// The module class whose blocks are checkpointed, and whether it was found from the
    /// frames (not named).
    pub class: String,
    pub found: bool,
    /// Blocks in the run, the most in one step, and those whose backward was found (the
    /// others run as they did).
    pub blocks: usize,
    pub per_step: usize,
    pub checkpointed: usize,
    /// What the checkpointed blocks kept for their backward in the run, at its batch: gone
    /// once used in the forward, made again one block at a time in the backward.
    pub saved_bytes: u64,
}

/// What checkpointing the blocks of a class changes in a run's events.
#[derive(Clone, Debug)]
pub struct Checkpointing {
    pub blocks: Blocks,
    /// Before each event (and at the end): what to insert.
    inserts: Vec<Vec<Insert>>,
    /// Each block's forward as made again: its requests and their frees inside it (event
    /// indices, in order).
    recompute: Vec<Vec<usize>>,
    /// Each event: the block whose recomputed copy it frees instead (a saved tensor's free).
    remap: Vec<Option<u32>>,
    /// The run's events so edited, made at the first replay and held for the rest.
    pub(super) edited: std::sync::OnceLock<Option<std::sync::Arc<super::replayer::Edited>>>,
}

#[derive(Clone, Copy, Debug)]
enum Insert {
    /// Free the tensor of this request (an event index): a saved tensor at its block's end.
    Free(usize),
    /// Checkpointed `k`'s forward once more: its requests and their frees inside the block.
    Recompute(u32),
    /// Free block `k`'s copy of this request.
    FreeCopy(usize, u32),
}

/// One block's run of the forward.
#[derive(Clone, Debug, Default)]
struct Checkpointed {
    /// Its requests (event indices), in order.
    allocs: Vec<usize>,
    /// Where its forward ends: the next request's event index.
    end: usize,
    /// Its ops' autograd sequence numbers, lowest and highest (0, 0: none).
    seq: (u64, u64),
}

/// Container classes, whose `forward` only calls others: not a block.
const CONTAINERS: [&str; 4] = ["Sequential", "ModuleList", "ModuleDict", "Module"];

/// The classes whose `forward` frames a stack holds, outermost last: (class, its line).
fn forward_frames(reader: &TraceReader, stack: u64) -> Vec<(String, u32)> {
    let Some(frames) = reader.stack(stack) else {
        return Vec::new();
    };
    frames
        .iter()
        .filter_map(|&f| format::as_py_frame(f))
        .filter_map(|(id, line)| {
            let text = reader.string(id)?;
            let function = text.split_once('\0').map_or(text, |(_, f)| f);
            // The class's own name, the last part of its qualified name: a class defined
            // inside a function (`build.<locals>.Checkpointed`) is `Checkpointed`, as its program names it.
            let qualified = function.strip_suffix(".forward")?;
            let class = qualified.rsplit('.').next().unwrap_or(qualified);
            let identifier =
                !class.is_empty() && class.chars().all(|c| c.is_alphanumeric() || c == '_');
            identifier.then(|| (class.to_string(), line))
        })
        .collect()
}

/// One class's blocks as [`Input::blocks_of`] finds them, kept for every class in one walk:
/// what ranks the classes (the blocks' bytes, the most blocks in a step, the depth).
struct ClassBlocks {
    /// The outermost place of the class in the stacks, counted from the root.
    depth: usize,
    /// The request (numbered among the forward's and backward's) that was the class's last,
    /// and the one that began its last block (0: none yet).
    last: u64,
    block_start: u64,
    first: Option<u64>,
    prev: (u64, u32),
    in_step: usize,
    per_step: usize,
    bytes: u64,
}

impl Default for ClassBlocks {
    fn default() -> ClassBlocks {
        ClassBlocks {
            depth: usize::MAX,
            last: 0,
            block_start: 0,
            first: None,
            prev: (0, 0),
            in_step: 0,
            per_step: 0,
            bytes: 0,
        }
    }
}

impl ClassBlocks {
    /// Request `k` of the forward, made under the class's `forward` at `line`, by `stack`:
    /// a block goes on while the class's requests follow one another without one of another
    /// place between, its line does not go back and its first stack does not come again;
    /// the step's count starts again after a backward (request `last_backward`).
    fn see(&mut self, k: u64, last_backward: u64, stack: u64, line: u32, size: u64) {
        let open = self.last != 0 && self.last + 1 == k;
        let again = self.first == Some(stack) && self.prev.0 != stack;
        if !open || line < self.prev.1 || again {
            if self.block_start == 0 || last_backward > self.block_start {
                self.in_step = 0;
            }
            self.in_step += 1;
            self.per_step = self.per_step.max(self.in_step);
            self.first.get_or_insert(stack);
            self.block_start = k;
        }
        self.bytes = self.bytes.saturating_add(size);
        self.prev = (stack, line);
        self.last = k;
    }
}

/// What the requests say of their stacks, asked once per stack.
struct Stacks<'a> {
    reader: &'a TraceReader,
    seen: FastMap<u64, (Phase, Vec<(String, u32)>)>,
}

impl Stacks<'_> {
    fn of(&mut self, stack: u64) -> &(Phase, Vec<(String, u32)>) {
        let reader = self.reader;
        self.seen.entry(stack).or_insert_with(|| {
            let phase = phase_of_stack(reader, stack);
            let frames = if phase == Phase::Forward {
                forward_frames(reader, stack)
            } else {
                Vec::new()
            };
            (phase, frames)
        })
    }
}

impl Input {
    /// The run's blocks of `class` (found from the frames when `None`) and what checkpointing
    /// them changes; `Err` says why no block can be found.
    pub fn checkpointing(&self, class: Option<&str>) -> Result<Checkpointing, String> {
        let mut stacks = Stacks {
            reader: &self.reader,
            seen: FastMap::default(),
        };
        let (class, found) = match class {
            Some(c) => (c.to_string(), false),
            None => (self.repeated_class(&mut stacks)?, true),
        };
        let (blocks, per_step) = self.blocks_of(&class, &mut stacks);
        if blocks.is_empty() {
            return Err(format!(
                "no request of the run's forward was made under {}.forward (the class of a \
                 module whose forward the frames show, as `gpushim leaks` names them)",
                crate::fixedfmt::Escaped(class.as_bytes())
            ));
        }
        Ok(self.plan(class, found, blocks, per_step, &mut stacks))
    }

    /// The outermost module class whose `forward` runs more than once in a step.
    fn repeated_class(&self, stacks: &mut Stacks<'_>) -> Result<String, String> {
        // Each class's outermost place in the stacks (counted from the root), its blocks'
        // bytes and the most blocks in a step: every class at once, in one walk of the events
        // (a walk per class was the classes times the events: minutes on a forged trace of
        // thousands of classes).
        let mut classes: FastMap<String, ClassBlocks> = FastMap::default();
        let (mut k, mut last_backward) = (0u64, 0u64);
        let mut present: Vec<(usize, u32)> = Vec::new();
        for e in self
            .events
            .iter()
            .filter(|e| e.ev == Ev::Alloc && !e.private)
        {
            k += 1;
            let (phase, frames) = stacks.of(e.stack);
            if *phase != Phase::Forward {
                if *phase == Phase::Backward || *phase == Phase::Optimizer {
                    last_backward = k;
                }
                continue;
            }
            // Each class once, at its innermost frame (as `blocks_of` finds it).
            present.clear();
            for (i, (class, line)) in frames.iter().enumerate() {
                if !frames[..i].iter().any(|(c, _)| c == class) {
                    present.push((i, *line));
                }
            }
            let n = frames.len();
            for &(i, line) in &present {
                let class = &frames[i].0;
                let c = match classes.get_mut(class) {
                    Some(c) => c,
                    None => classes.entry(class.clone()).or_default(),
                };
                c.depth = c
                    .depth
                    .min(n - 1 - frames.iter().rposition(|f| f.0 == *class).unwrap_or(i));
                c.see(k, last_backward, e.stack, line, e.size);
            }
        }
        // The class whose blocks hold the most of the forward's requests: an outer block
        // holds its inner modules' requests, so this is the outermost that repeats; ties go
        // to the outer.
        let mut best: Option<(u64, usize, String)> = None;
        for (class, c) in classes {
            if CONTAINERS.contains(&class.as_str()) || c.per_step < 2 {
                continue;
            }
            let key = (c.bytes, c.depth, class);
            if best.as_ref().is_none_or(|b| key > *b) {
                best = Some(key);
            }
        }
        best.map(|b| b.2).ok_or_else(|| {
            "no module's forward runs more than once in a step among the run's frames: name \
             the block's class (--checkpoint CLASS)"
                .to_string()
        })
    }

    /// The blocks of `class` in the forward, in order, and the most in one step.
    fn blocks_of(&self, class: &str, stacks: &mut Stacks<'_>) -> (Vec<Checkpointed>, usize) {
        let mut blocks: Vec<Checkpointed> = Vec::new();
        let (mut open, mut first, mut prev) = (false, None::<u64>, (0u64, 0u32));
        let (mut in_step, mut per_step, mut backward_since) = (0usize, 0usize, true);
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            let (phase, frames) = stacks.of(e.stack);
            let line = frames.iter().find(|(c, _)| c == class).map(|(_, l)| *l);
            if let Some(b) = blocks.last_mut().filter(|_| open) {
                b.end = i;
            }
            let Some(line) = line.filter(|_| *phase == Phase::Forward) else {
                open = false;
                if *phase == Phase::Backward || *phase == Phase::Optimizer {
                    backward_since = true;
                }
                continue;
            };
            let again = first == Some(e.stack) && prev.0 != e.stack;
            if !open || line < prev.1 || again {
                if backward_since {
                    (in_step, backward_since) = (0, false);
                }
                in_step += 1;
                per_step = per_step.max(in_step);
                blocks.push(Checkpointed::default());
                first.get_or_insert(e.stack);
                open = true;
            }
            let Some(b) = blocks.last_mut() else {
                continue;
            };
            b.allocs.push(i);
            b.end = i + 1;
            if e.sequence != 0 {
                b.seq = if b.seq.0 == 0 {
                    (e.sequence, e.sequence)
                } else {
                    (b.seq.0.min(e.sequence), b.seq.1.max(e.sequence))
                };
            }
            prev = (e.stack, line);
        }
        (blocks, per_step)
    }
}

/// The address of block `k`'s recomputed copy of a tensor at `ptr`: no address CUDA gives.
fn copy_ptr(ptr: u64, k: u32) -> u64 {
    ptr | 1 << 63 | ((u64::from(k) & 0x7fff) << 48)
}

impl Input {
    /// Each request's frees (a free asked, then done), by event index.
    pub(super) fn frees(&self) -> FastMap<usize, Vec<usize>> {
        let mut frees: FastMap<usize, Vec<usize>> = FastMap::default();
        let mut live: FastMap<(u8, u64), usize> = FastMap::default();
        for (i, e) in self.events.iter().enumerate() {
            match e.ev {
                Ev::Alloc => {
                    live.insert((e.device, e.ptr), i);
                }
                Ev::FreeRequested => {
                    if let Some(&a) = live.get(&(e.device, e.ptr)) {
                        frees.entry(a).or_default().push(i);
                    }
                }
                Ev::Free => {
                    if let Some(a) = live.remove(&(e.device, e.ptr)) {
                        frees.entry(a).or_default().push(i);
                    }
                }
                _ => {}
            }
        }
        frees
    }

    /// Where each block's backward begins: the first backward request (an event index) of one
    /// of its ops, by autograd sequence number; `None` where none is found.
    fn backward_begins(
        &self,
        blocks: &[Checkpointed],
        stacks: &mut Stacks<'_>,
    ) -> Vec<Option<usize>> {
        let mut begins: Vec<Option<usize>> = vec![None; blocks.len()];
        // The blocks' ranges of numbers, in order (numbers grow through a forward).
        let ranged: Vec<(u64, u64, usize)> = blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.seq.0 != 0)
            .map(|(k, b)| (b.seq.0, b.seq.1, k))
            .collect();
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private || e.sequence == 0 {
                continue;
            }
            if stacks.of(e.stack).0 != Phase::Backward {
                continue;
            }
            let at = ranged.partition_point(|r| r.0 <= e.sequence);
            if let Some(&(_, hi, k)) = at.checked_sub(1).and_then(|j| ranged.get(j))
                && e.sequence <= hi
                && i >= blocks[k].end
                && begins[k].is_none()
            {
                begins[k] = Some(i);
            }
        }
        begins
    }

    /// What checkpointing `blocks` changes: where each saved tensor is freed, where each
    /// block's forward is made again.
    fn plan(
        &self,
        class: String,
        found: bool,
        blocks: Vec<Checkpointed>,
        per_step: usize,
        stacks: &mut Stacks<'_>,
    ) -> Checkpointing {
        let n = self.events.len();
        let frees = self.frees();
        let begins = self.backward_begins(&blocks, stacks);
        let mut ck = Checkpointing {
            blocks: Blocks {
                class,
                found,
                blocks: blocks.len(),
                per_step,
                checkpointed: 0,
                saved_bytes: 0,
            },
            inserts: vec![Vec::new(); n + 1],
            recompute: vec![Vec::new(); blocks.len()],
            remap: vec![None; n],
            edited: Default::default(),
        };
        for (k, (b, begin)) in blocks.iter().zip(begins).enumerate() {
            let Some(begin) = begin else {
                continue;
            };
            let k32 = k as u32;
            let first_free = |a: usize| frees.get(&a).and_then(|f| f.first().copied());
            let survivors: Vec<usize> = b
                .allocs
                .iter()
                .copied()
                .filter(|&a| first_free(a).is_none_or(|f| f >= b.end))
                .collect();
            let output = survivors.last().copied();
            // How long the block's own temporaries lived, in the block's requests made
            // meanwhile (their mean, rounded): a tensor no longer kept for the backward lives
            // as long.
            let lags: Vec<usize> = b
                .allocs
                .iter()
                .enumerate()
                .filter_map(|(p, &a)| {
                    let f = first_free(a).filter(|&f| f < b.end)?;
                    // The block's requests are in the order made: a search, not a walk (a
                    // block of many requests made this quadratic).
                    Some(b.allocs[p + 1..].partition_point(|&x| x < f))
                })
                .collect();
            let lag = match lags.len() {
                0 => usize::MAX,
                n => (lags.iter().sum::<usize>() + n / 2) / n,
            }
            .max(1);
            let mut span = Vec::new();
            for &a in &b.allocs {
                span.push(a);
                span.extend(frees.get(&a).into_iter().flatten().filter(|&&f| f < b.end));
            }
            span.sort_unstable();
            ck.recompute[k] = span;
            ck.inserts[begin].push(Insert::Recompute(k32));
            for &a in &survivors {
                let saved = Some(a) != output && first_free(a).is_some_and(|f| f > begin);
                if saved {
                    let pos = b.allocs.binary_search(&a).unwrap_or(0);
                    let at = (b.allocs.get(pos.saturating_add(lag)))
                        .map_or(b.end, |&x| x + 1)
                        .min(b.end);
                    ck.inserts[at].push(Insert::Free(a));
                    for &f in frees.get(&a).into_iter().flatten() {
                        ck.remap[f] = Some(k32);
                    }
                    ck.blocks.saved_bytes =
                        ck.blocks.saved_bytes.saturating_add(self.events[a].size);
                } else {
                    ck.inserts[begin].push(Insert::FreeCopy(a, k32));
                }
            }
            ck.blocks.checkpointed += 1;
        }
        ck
    }
}

impl Checkpointing {
    /// What goes before event `i` of `events` (at `at`, or at the end for `events.len()`):
    /// saved tensors freed, a block's forward made again (its requests sized by `sized`, as
    /// their originals), copies freed; appended to `out`.
    pub(super) fn insert_before(
        &self,
        events: &[Event],
        i: usize,
        at: u64,
        sized: impl Fn(usize) -> Event,
        out: &mut Vec<Event>,
    ) {
        let freed = |a: usize, ptr: u64| -> Event {
            let mut e = events[a];
            (e.ev, e.ptr, e.size, e.time_ns) = (Ev::Free, ptr, 0, at);
            e
        };
        for x in self.inserts.get(i).into_iter().flatten() {
            match *x {
                Insert::Free(a) => out.push(freed(a, events[a].ptr)),
                Insert::FreeCopy(a, k) => out.push(freed(a, copy_ptr(events[a].ptr, k))),
                Insert::Recompute(k) => {
                    for &j in self.recompute.get(k as usize).into_iter().flatten() {
                        let mut e = if events[j].ev == Ev::Alloc {
                            sized(j)
                        } else {
                            events[j]
                        };
                        (e.ptr, e.time_ns) = (copy_ptr(e.ptr, k), at);
                        out.push(e);
                    }
                }
            }
        }
    }

    /// Event `i`, a saved tensor's free, frees its block's recomputed copy instead.
    pub(super) fn remap(&self, i: usize, e: &mut Event) {
        if let Some(&Some(k)) = self.remap.get(i) {
            e.ptr = copy_ptr(e.ptr, k);
        }
    }
}
