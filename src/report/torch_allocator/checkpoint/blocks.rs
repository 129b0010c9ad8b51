//! The blocks a checkpoint what-if checkpoints, found from the frames: each block's requests in
//! the forward, where it ends, and its ops' autograd sequence numbers.

use super::{Checkpointed, Checkpointing};
use crate::fasthash::{FastMap, FastSet};
use crate::report::kinds::{Phase, phase_of_stack};
use crate::report::torch_allocator::{Ev, Input};
use crate::trace::format;
use crate::trace::reader::TraceTables;

/// Container classes, whose `forward` only calls others: not a block.
const CONTAINERS: [&str; 4] = ["Sequential", "ModuleList", "ModuleDict", "Module"];

/// The classes whose `forward` frames a stack holds, outermost last: (class, its line).
fn forward_frames(tables: &TraceTables, stack: u64) -> Vec<(String, u32)> {
    let Some(frames) = tables.stack(stack) else {
        return Vec::new();
    };
    frames
        .iter()
        .filter_map(|&f| format::as_py_frame(f))
        .filter_map(|(id, line)| {
            let text = tables.string(id)?;
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
    /// The most module frames seen inside the class's own: 1 where it calls only modules
    /// that call none (a layer of linear maps), 2 or more where it holds such a layer.
    below: usize,
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
            below: 0,
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
pub(in crate::report::torch_allocator) struct Stacks<'a> {
    tables: &'a TraceTables,
    seen: FastMap<u64, (Phase, Vec<(String, u32)>)>,
}

impl<'a> Stacks<'a> {
    pub(in crate::report::torch_allocator) fn new(tables: &'a TraceTables) -> Stacks<'a> {
        Stacks {
            tables,
            seen: FastMap::default(),
        }
    }

    pub(in crate::report::torch_allocator) fn of(
        &mut self,
        stack: u64,
    ) -> &(Phase, Vec<(String, u32)>) {
        let tables = self.tables;
        self.seen.entry(stack).or_insert_with(|| {
            let phase = phase_of_stack(tables, stack);
            let frames = if phase == Phase::Forward {
                forward_frames(tables, stack)
            } else {
                Vec::new()
            };
            (phase, frames)
        })
    }
}

impl Input {
    /// The run's blocks of `class` (found from the frames when `None`) and what checkpointing
    /// them changes, reentrant or not as `reentrant` asks (else as the frames suggest); `Err`
    /// says why no block can be found.
    pub fn checkpointing(
        &self,
        class: Option<&str>,
        reentrant: Option<bool>,
    ) -> Result<Checkpointing, String> {
        let mut stacks = Stacks::new(&self.tables);
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
        Ok(self.plan((class, found), blocks, per_step, reentrant, &mut stacks))
    }

    /// The outermost module class whose `forward` runs more than once in a step.
    pub(in crate::report::torch_allocator) fn repeated_class(
        &self,
        stacks: &mut Stacks<'_>,
    ) -> Result<String, String> {
        // Each class's outermost place in the stacks (counted from the root), its blocks'
        // bytes and the most blocks in a step: every class at once, in one walk of the events
        // (a walk per class was the classes times the events: minutes on a forged trace of
        // thousands of classes).
        let mut classes: FastMap<String, ClassBlocks> = FastMap::default();
        let (mut k, mut last_backward) = (0u64, 0u64);
        let mut present: Vec<(usize, u32)> = Vec::new();
        // Which class's forward was seen inside which (outer, inner), each stack once.
        let mut nested: FastSet<(String, String)> = FastSet::default();
        let mut stacks_seen: FastSet<u64> = FastSet::default();
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
            if stacks_seen.insert(e.stack) {
                for (x, &(outer, _)) in present.iter().enumerate() {
                    for &(inner, _) in &present[..x] {
                        nested.insert((frames[outer].0.clone(), frames[inner].0.clone()));
                    }
                }
            }
            for &(i, line) in &present {
                let class = &frames[i].0;
                let c = match classes.get_mut(class) {
                    Some(c) => c,
                    None => classes.entry(class.clone()).or_default(),
                };
                c.depth = c
                    .depth
                    .min(n - 1 - frames.iter().rposition(|f| f.0 == *class).unwrap_or(i));
                c.below = c.below.max(i);
                c.see(k, last_backward, e.stack, line, e.size);
            }
        }
        // A stack of blocks is not a block: a class each of whose calls runs two or more
        // blocks of another class inside it (T5's encoder and decoder, `T5Stack`, each of six
        // `T5Block`s), a block being a class that holds a layer of its own (not a layer of
        // linear maps, as a mixture of experts calls several of inside each of its blocks).
        let stacks_of_blocks: FastSet<&str> = nested
            .iter()
            .filter(|(outer, inner)| {
                let (Some(a), Some(b)) = (classes.get(outer), classes.get(inner)) else {
                    return false;
                };
                b.below >= 2 && b.per_step >= a.per_step.saturating_mul(2)
            })
            .map(|(outer, _)| outer.as_str())
            .collect();
        // The class whose blocks hold the most of the forward's requests: an outer block
        // holds its inner modules' requests, so this is the outermost that repeats; ties go
        // to the inner (a model whose forward is its blocks' loop and nothing else splits into
        // as many blocks as they, with their bytes).
        let mut best: Option<(u64, usize, String)> = None;
        for (class, c) in &classes {
            if CONTAINERS.contains(&class.as_str())
                || c.per_step < 2
                || stacks_of_blocks.contains(class.as_str())
            {
                continue;
            }
            let key = (c.bytes, c.depth, class.clone());
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
    pub(in crate::report::torch_allocator) fn blocks_of(
        &self,
        class: &str,
        stacks: &mut Stacks<'_>,
    ) -> (Vec<Checkpointed>, usize) {
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
