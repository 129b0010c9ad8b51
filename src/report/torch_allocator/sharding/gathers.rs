//! FSDP2's all-gather outputs at more ranks, from a run at one. At a world of one FSDP2
//! all-gathers nothing: before a unit's forward or backward it makes the unit's parameters
//! whole straight from the shards (`wait_for_unshard`), with no all-gather output. At two
//! ranks or more each such gathering first makes an all-gather output of the unit's whole
//! bytes on a stream of its own, and lets it go as FSDP2's hooks do (read from traces of
//! FSDP2 on two H200s, `docs/fit.md`):
//!
//! - **In the forward** the output is made before the unit's parameters are gathered, and
//!   the unit before's output is let go after them (FSDP2 keeps its last all-gather's
//!   result); the forward's last is let go where the forward ends (before the first request
//!   of the backward, or of the optimizer).
//! - **In the backward** the output goes once the parameters are gathered, and the next unit's
//!   all-gather is issued at once (FSDP2's backward prefetch), its output held until that unit
//!   gathers; the first unit's is made where it gathers.
//!
//! Under mixed precision one rank casts each parameter's shard to 16 bits as it makes that
//! parameter whole (`FSDPParam.all_gather_inputs` under `wait_for_unshard`, on the default
//! stream), where more ranks cast all of a unit's shards before its all-gather, on the
//! all-gather's stream, and let the casts go once its output is made (`foreach_all_gather`).
//! The casts are moved there: made just before the output, a shard of the world asked each,
//! and let go after it.
//!
//! The what-if adds only these requests and moves only those casts: every other request of
//! the run keeps its place.

use super::{ALL_GATHER, Act, CAST, Edits};
use crate::report::torch_allocator::{Ev, Input};

/// What a request of the run is to the all-gathers: one of a unit's parameters gathered
/// (before its forward or its backward), a request of the backward or the optimizer (the
/// forward is over), or neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    GatheredForward,
    GatheredBackward,
    /// A shard cast to be gathered (under mixed precision), among its unit's gathered
    /// parameters: of the gathering, not of its output's bytes.
    GatherInput,
    AfterForward,
    Other,
}

/// A unit's parameters gathered at once: its first and last requests (events' indices), its
/// bytes, whether before its backward, and its shards' casts (events' indices: those just
/// before its first request and among its requests).
struct Unit {
    first: usize,
    last: usize,
    bytes: u64,
    backward: bool,
    casts: Vec<usize>,
}

impl Input {
    /// The all-gather outputs a run of FSDP2 at one rank did not make, as it makes them at
    /// `world` ranks (`role` says what each request's stack is), with the gatherings they are
    /// added to; `None` where the run gathered nothing.
    pub fn all_gather_outputs(
        &self,
        world: u64,
        role: &dyn Fn(u64) -> Role,
    ) -> Option<(u64, Edits)> {
        let (units, roles) = self.units_gathered(role);
        if units.is_empty() || world < 2 {
            return None;
        }
        let top = self.events.iter().map(|e| e.stream).max().unwrap_or(0);
        let stream = top.saturating_add(1);
        let mut edits = Edits::over(1);
        // The casts moved: their own requests and frees not made where the run made them.
        if units.iter().any(|u| !u.casts.is_empty()) {
            edits.act = vec![Act::Keep; self.events.len()];
            let frees = self.frees();
            for &c in units.iter().flat_map(|u| &u.casts) {
                edits.act[c] = Act::Skip;
                for &f in frees.get(&c).into_iter().flatten() {
                    edits.act[f] = Act::Skip;
                }
            }
        }
        let events = &self.events;
        let mut put = |(at, like): (usize, usize), free, ptr, size| {
            // Each request or free goes before event `at`, on the device (and with the stack)
            // of the unit's first gathered parameter, `like`.
            edits.put((at, like), free, ptr, size, stream);
        };
        // A unit's all-gather issued before event `at`: its casts (a shard of the world each),
        // its output, then the casts let go.
        let all_gather =
            |put: &mut dyn FnMut((usize, usize), bool, u64, u64), at: usize, u: &Unit, ptr: u64| {
                for &c in &u.casts {
                    put(
                        (at, c),
                        false,
                        CAST | (c as u64 & 0xff_ffff_ffff_ffff),
                        events[c].size.div_ceil(world),
                    );
                }
                put((at, u.first), false, ptr, u.bytes);
                for &c in &u.casts {
                    put((at, c), true, CAST | (c as u64 & 0xff_ffff_ffff_ffff), 0);
                }
            };
        let (mut held, mut prefetched): (Option<u64>, Option<u64>) = (None, None);
        for (k, u) in units.iter().enumerate() {
            let ptr = ALL_GATHER | (k as u64 + 1);
            let next = units.get(k + 1);
            if u.backward {
                let ptr = match prefetched.take() {
                    Some(p) => p,
                    None => {
                        if let Some(h) = held.take() {
                            put((u.first, u.first), true, h, 0);
                        }
                        all_gather(&mut put, u.first, u, ptr);
                        ptr
                    }
                };
                put((u.last + 1, u.first), true, ptr, 0);
                if let Some(n) = next.filter(|n| n.backward) {
                    let p = ALL_GATHER | (k as u64 + 2);
                    all_gather(&mut put, u.last + 1, n, p);
                    prefetched = Some(p);
                }
            } else {
                all_gather(&mut put, u.first, u, ptr);
                if let Some(h) = held.replace(ptr) {
                    put((u.last + 1, u.first), true, h, 0);
                }
                // The forward's end: the first request of the backward or the optimizer
                // before the next unit gathers (each event looked at once over the units).
                let until = next.map_or(self.events.len(), |n| n.first);
                if let Some(end) = (u.last + 1..until).find(|&i| roles[i] == Role::AfterForward)
                    && let Some(h) = held.take()
                {
                    put((end, u.first), true, h, 0);
                }
            }
        }
        edits.inserts.sort_by_key(|(i, _)| *i);
        Some((units.len() as u64, edits))
    }

    /// The units' gatherings of the run in order (a run of consecutive requests of gathered
    /// parameters, no other request between), and each event's role (a free's: `Other`).
    fn units_gathered(&self, role: &dyn Fn(u64) -> Role) -> (Vec<Unit>, Vec<Role>) {
        let mut roles = vec![Role::Other; self.events.len()];
        let mut by_stack: crate::fasthash::FastMap<u64, Role> = Default::default();
        let mut units: Vec<Unit> = Vec::new();
        let mut open = false;
        // Casts met before a unit's first request, for that unit.
        let mut pending: Vec<usize> = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            if e.ev != Ev::Alloc || e.private {
                continue;
            }
            let r = *by_stack.entry(e.stack).or_insert_with(|| role(e.stack));
            roles[i] = r;
            let backward = match r {
                Role::GatheredForward => false,
                Role::GatheredBackward => true,
                Role::GatherInput => {
                    match units.last_mut() {
                        Some(u) if open => u.casts.push(i),
                        _ => pending.push(i),
                    }
                    continue;
                }
                _ => {
                    open = false;
                    pending.clear();
                    continue;
                }
            };
            match units.last_mut() {
                Some(u) if open && u.backward == backward => {
                    u.last = i;
                    u.bytes = u.bytes.saturating_add(e.size);
                }
                _ => units.push(Unit {
                    first: i,
                    last: i,
                    bytes: e.size,
                    backward,
                    casts: std::mem::take(&mut pending),
                }),
            }
            open = true;
        }
        (units, roles)
    }
}
