//! Where a sharding what-if's requests and frees go: each of FSDP2's hooks, in order, made into
//! the requests and frees FSDP2 makes there (see the module's comment).

use super::{ALL_GATHER, Act, Hook, PARAMETER, Params, SCATTER_INPUT, SHARD, Sharding, gathered};
use crate::fasthash::FastMap;
use crate::report::torch_allocator::{Event, Input};

/// The hooks' walk: what FSDP2 holds between them, and where the what-if's requests go.
struct Placing<'a> {
    events: &'a [Event],
    frees: &'a FastMap<usize, Vec<usize>>,
    params: &'a Params,
    out: &'a mut Sharding,
    /// The all-gather and reduce-scatter streams (numbers no request of the run has).
    streams: (u16, u16),
    /// The all-gather output and the reduce-scatter input FSDP2 holds (their addresses).
    all_gather: Option<u64>,
    scatter: Option<u64>,
    /// Numbers the buffers' addresses apart.
    serial: u64,
    /// The hook's event, the event whose device and stack its requests take, and its stream.
    at: (usize, usize, u16),
}

impl Placing<'_> {
    fn put(&mut self, free: bool, ptr: u64, size: u64, stream: u16) {
        let (i, like, _) = self.at;
        self.out.edits.put((i, like), free, ptr, size, stream);
    }

    /// A new buffer's address with `tag`.
    fn next(&mut self, tag: u64) -> u64 {
        self.serial += 1;
        tag | self.serial
    }

    /// Where fully_shard is applied: a unit at a time (each block's, then the root's), its
    /// shards made, then its whole parameters let go; the whole's own free lets go of its shard.
    fn cut(&mut self) {
        let (params, events) = (self.params, self.events);
        let blocks = params.cut.len() - params.root.len();
        let mut units: Vec<&[usize]> = Vec::new();
        let mut rest = &params.cut[..blocks];
        for b in &params.block {
            let (unit, after) = rest.split_at(b.len().min(rest.len()));
            units.push(unit);
            rest = after;
        }
        units.push(&params.cut[blocks..]);
        let world = self.out.said.world;
        for unit in units {
            for &a in unit {
                let e = &events[a];
                let ptr = PARAMETER | (a as u64 & 0xff_ffff_ffff_ffff);
                // A parameter kept whole on every rank (`broadcast.rs`): its shard its whole.
                let shard = match params.whole.contains(&a) {
                    true => e.size,
                    false => e.size.div_ceil(world),
                };
                self.put(false, ptr, shard, e.stream);
                for &f in self.frees.get(&a).into_iter().flatten() {
                    self.out.edits.frees_shard.insert(f, ptr);
                }
            }
            for &a in unit {
                self.put(true, events[a].ptr, 0, events[a].stream);
            }
        }
    }

    /// Unit `u`'s gathered parameters let go.
    fn reshard(&mut self, u: u64) {
        let stream = self.at.2;
        for p in 0..self.params.of(u).len() {
            self.put(true, gathered(u, p), 0, stream);
        }
    }

    /// Unit `u`'s parameters gathered in `pass`, `next` the next gather's (its unit and pass).
    /// In the forward its all-gather output is made now and held to the next gather (the unit
    /// before's let go then); in the backward it was issued before (or is now), goes once
    /// copied out, and the next unit's all-gather of the same backward is issued at once.
    fn gather(&mut self, u: u64, pass: usize, next: Option<(u64, usize)>) {
        let (gather_stream, stream) = (self.streams.0, self.at.2);
        let backward = pass % 2 == 1;
        let bytes = super::units::total(self.params.of(u));
        let output = match self.all_gather.take() {
            Some(ptr) if backward => ptr,
            held => {
                let ptr = self.next(ALL_GATHER);
                self.put(false, ptr, bytes, gather_stream);
                self.all_gather = held;
                ptr
            }
        };
        for (p, &size) in self.params.of(u).iter().enumerate() {
            self.put(false, gathered(u, p), size, stream);
        }
        if !backward {
            if let Some(ptr) = self.all_gather.replace(output) {
                self.put(true, ptr, 0, gather_stream);
            }
            return;
        }
        self.put(true, output, 0, gather_stream);
        if let Some((n, _)) = next.filter(|n| n.1 == pass) {
            let ptr = self.next(ALL_GATHER);
            let bytes = super::units::total(self.params.of(n));
            self.put(false, ptr, bytes, gather_stream);
            self.all_gather = Some(ptr);
        }
    }

    /// What FSDP2 holds let go: the all-gather output, and (`scatter`) the reduce-scatter
    /// input.
    fn let_go(&mut self, scatter: bool) {
        if let Some(ptr) = self.all_gather.take() {
            self.put(true, ptr, 0, self.streams.0);
        }
        if let Some(ptr) = self.scatter.take().filter(|_| scatter) {
            self.put(true, ptr, 0, self.at.2);
        }
    }

    /// Unit `u`'s backward over, `grads` its gradients: its gathered parameters go, the
    /// reduce-scatter input before goes and its own is made (the gradients' bytes), the
    /// gradients go (those the run let go later; their frees are moved here), and the rank's
    /// shard of them is made on the reduce-scatter stream, let go where the run let go of the
    /// first of them.
    fn post_backward(&mut self, u: u64, grads: &[usize]) {
        let (events, frees, i) = (self.events, self.frees, self.at.0);
        let stream = self.at.2;
        self.reshard(u);
        let first_free = |g: &usize| frees.get(g).and_then(|f| f.first()).copied();
        let moved: Vec<usize> = grads
            .iter()
            .copied()
            .filter(|g| first_free(g).is_none_or(|f| f >= i))
            .collect();
        // The gradient of a parameter kept whole is the world times it in the reduce-scatter.
        let world = self.out.said.world;
        let bytes = moved.iter().fold(0u64, |a, &g| {
            let n = if self.params.whole_grads.contains(&g) {
                world
            } else {
                1
            };
            a.saturating_add(events[g].size.saturating_mul(n))
        });
        if let Some(ptr) = self.scatter.take() {
            self.put(true, ptr, 0, stream);
        }
        let input = self.next(SCATTER_INPUT);
        let input_bytes = match moved.is_empty() {
            true => super::units::total(self.params.of(u)),
            false => bytes,
        };
        self.put(false, input, input_bytes, stream);
        self.scatter = Some(input);
        for &g in &moved {
            self.put(true, events[g].ptr, 0, events[g].stream);
        }
        if moved.is_empty() {
            return;
        }
        self.put(false, SHARD | u, bytes.div_ceil(world), self.streams.1);
        self.out.said.gradients += moved.len() as u64;
        let first = moved.iter().copied().min_by_key(first_free);
        for &g in &moved {
            for &f in frees.get(&g).into_iter().flatten() {
                if Some(g) == first {
                    self.out.edits.frees_shard.insert(f, SHARD | u);
                } else {
                    self.out.edits.act[f] = Act::Skip;
                }
            }
        }
    }
}

impl Sharding {
    /// The what-if's requests and frees for `hooks` (in order), each unit's gradients `grads`.
    pub(super) fn place(
        &mut self,
        input: &Input,
        hooks: &[(usize, Hook)],
        (grads, params): (&[Vec<usize>], &Params),
        frees: &FastMap<usize, Vec<usize>>,
    ) {
        let events = &input.events[..];
        let top = events.iter().map(|e| e.stream).max().unwrap_or(0);
        let mut p = Placing {
            events,
            frees,
            params,
            out: self,
            streams: (top.saturating_add(1), top.saturating_add(2)),
            all_gather: None,
            scatter: None,
            serial: 0,
            at: (0, 0, 0),
        };
        for (h, &(i, hook)) in hooks.iter().enumerate() {
            let like = i.min(events.len().saturating_sub(1));
            p.at = (i, like, events.get(like).map_or(0, |e| e.stream));
            match hook {
                Hook::Cut => p.cut(),
                Hook::Reshard(u) => p.reshard(u),
                Hook::Gather(u, pass) => {
                    let next = hooks[h + 1..].iter().find_map(|(_, h)| match h {
                        Hook::Gather(n, pass) => Some((*n, *pass)),
                        _ => None,
                    });
                    p.gather(u, pass, next);
                }
                Hook::ForwardEnd => p.let_go(false),
                Hook::StepEnd => p.let_go(true),
                Hook::PostBackward(u, w) => p.post_backward(u, &grads[w]),
            }
        }
    }
}
