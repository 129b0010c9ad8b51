//! A replay that does not replay what repeats. A training loop asks for the same tensors every
//! step, and once the allocator's cache has settled it hands out the same blocks: a ring of a
//! long run holds thousands of such steps, and `fit` replayed every one of them some twenty
//! times per setting (minutes on a 2 GiB trace). Where the models and everything else the
//! replay goes on from are at one boundary of a repeating stretch as they were some boundaries
//! before, and the events ahead are those events again, each later repeat goes the same way
//! (the replay is a function of its state and its events): the peaks stay those already
//! reached, the counts grow by what the repeat counted, and the replay goes on past them.
//!
//! Tensors are known by the request that made them, not by the run's addresses (see
//! [`Stretch`]), and those the stretch made that are live when repeats are passed over are
//! renamed as the ones of the step the replay lands in.
//!
//! A what-if (`--checkpoint`, `--autocast`) edits the events; its edits are made once, before
//! any resizing, and held for its replays ([`Edited`]), which pass over their repeats alike.
//!
//! Nothing here is taken on trust: the stretch found in the run's events ([`period_of`]) only
//! says where to look; a skip needs the state found equal ([`Replayer::goes_on_as`], every
//! field that decides what comes next) and the events ahead checked, as resized for this
//! replay, against those of the repeat just replayed ([`Replayer::repeats`]).

use super::edited::Stream;
use super::{Replayer, Resized};
use crate::report::torch_allocator::model::{Model, Stats};
use crate::report::torch_allocator::{Ev, Event, Input};
use std::collections::BTreeMap;

/// A stretch of the run's events where each is the same as the one `len` before it:
/// `events[i]` and `events[i - len]` for every `i` in `start + len..end` (see [`same_event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::report::torch_allocator) struct Period {
    pub(in crate::report::torch_allocator) start: usize,
    pub(in crate::report::torch_allocator) len: usize,
    pub(in crate::report::torch_allocator) end: usize,
}

/// The run's repeating stretch, and for each event that frees a tensor the events made, the
/// event that made it ([`NONE`] for every other event): a replay that passes over repeats
/// knows each tensor by the request that made it, not by its address in the run. A run's
/// allocator may hand a step's tensors other addresses than the step before's while asking
/// for the same (ResNet-50's: about 100 of a step's 836 tensors, all of them the same again
/// only every 28 steps), and none of that reaches the replay, which places each tensor
/// itself.
pub(in crate::report::torch_allocator) struct Stretch {
    pub(in crate::report::torch_allocator) period: Period,
    made: Vec<u32>,
}

/// Not a free of a tensor the events made.
const NONE: u32 = u32::MAX;

/// A tensor's name in a replay that passes over repeats: the event that made it, above any
/// address (a trace's addresses are below 2^57).
const MADE: u64 = 1 << 63;

/// Earlier events like the probe's tried as the start of its repeat, at most.
const CANDIDATES: usize = 256;
/// How far before the probe such events are looked for.
const LOOK_BACK: usize = 1 << 20;

/// For each event, the request a free (or a free asked for) frees, as the replay pairs them:
/// by device and the run's address, the latest request there; `None` past `u32`'s events.
fn made_of(events: &[Event]) -> Option<Vec<u32>> {
    if events.len() >= NONE as usize {
        return None;
    }
    let mut live: crate::fasthash::FastMap<(u8, u64), u32> = Default::default();
    let mut made = vec![NONE; events.len()];
    for (i, e) in events.iter().enumerate() {
        let key = (e.device, e.ptr);
        match e.ev {
            Ev::Alloc => {
                live.insert(key, i as u32);
            }
            Ev::FreeRequested => made[i] = live.get(&key).copied().unwrap_or(NONE),
            Ev::Free => made[i] = live.remove(&key).unwrap_or(NONE),
            _ => {}
        }
    }
    Some(made)
}

/// Whether events `i` and `j` are the same to a replay before resizing: the same call on the
/// same device and stream, of the same size and line; a free, of the request as many events
/// before it (or, of a tensor the events did not make, at the same address); a request, at
/// whatever address; anything else, at the same address.
fn same_event(events: &[Event], made: &[u32], i: usize, j: usize) -> bool {
    let (Some(a), Some(b)) = (events.get(i), events.get(j)) else {
        return false;
    };
    let alike = a.ev == b.ev
        && a.device == b.device
        && a.stream == b.stream
        && a.size == b.size
        && a.stack == b.stack
        && a.private == b.private;
    alike
        && match a.ev {
            Ev::Alloc => true,
            Ev::Free | Ev::FreeRequested => match (made.get(i), made.get(j)) {
                (Some(&NONE), Some(&NONE)) => a.ptr == b.ptr,
                (Some(&x), Some(&y)) if x != NONE && y != NONE => {
                    i.checked_sub(x as usize) == j.checked_sub(y as usize)
                }
                _ => false,
            },
            _ => a.ptr == b.ptr,
        }
}

/// The run's repeating stretch ([`period_of`]), begun late enough that no free after its
/// first repeat frees a tensor made before it: such a tensor keeps its name across a pass over
/// repeats, where the tensors the stretch makes are renamed as the repeats they stand for.
pub(in crate::report::torch_allocator) fn stretch_of(events: &[Event]) -> Option<Stretch> {
    let made = made_of(events)?;
    let p = period_of(events, &made)?;
    // The least request freed from each event of the stretch on.
    let mut least = vec![u32::MAX; p.end - p.start + 1];
    for f in (p.start..p.end).rev() {
        least[f - p.start] = least[f - p.start + 1].min(made[f]);
    }
    let start = (p.start..p.end.saturating_sub(4 * p.len)).find(|&s| {
        least
            .get(s + p.len - p.start)
            .is_none_or(|&m| m as usize >= s)
    })?;
    Some(Stretch {
        period: Period { start, ..p },
        made,
    })
}

/// Checked once for a size function, so that its replays need not check each repeat's
/// requests again: up to the event `end`, every request of the run's repeating stretch has
/// the class of the request one repeat before it (what a size function reads of a request
/// besides its recorded size and stack). See [`Input::repeating`].
#[derive(Clone, Copy, Debug)]
pub struct Repeating {
    end: usize,
}

impl Input {
    /// Where the classes `class` gives the run's requests (by their place among them) repeat
    /// with its events (see [`Repeating`]); `None` where the events do not repeat.
    pub fn repeating<K: PartialEq>(&self, class: impl Fn(usize) -> K) -> Option<Repeating> {
        let p = self.period()?;
        let alloc = |e: &&Event| e.ev == Ev::Alloc;
        let first = self.events.get(..p.start)?.iter().filter(alloc).count();
        let per = self
            .events
            .get(p.start..p.start + p.len)?
            .iter()
            .filter(alloc)
            .count();
        let mut n = first;
        for (i, e) in self.events.get(p.start..p.end)?.iter().enumerate() {
            if e.ev != Ev::Alloc {
                continue;
            }
            if n >= first + per && class(n) != class(n - per) {
                return Some(Repeating { end: p.start + i });
            }
            n += 1;
        }
        Some(Repeating { end: p.end })
    }
}

/// The longest stretch of `events` that repeats (at least four times), found from events at a
/// quarter, a half and three quarters of the run: each is matched with the earlier events the
/// same as it, nearest first, and the repeat that covers the most events is kept. The work is
/// the stretch's length plus, for each candidate that is not the repeat, how far it matched,
/// and never more than a few times the events (a trace made to match every candidate far
/// gets the best found within that).
fn period_of(events: &[Event], made: &[u32]) -> Option<Period> {
    let mut best: Option<Period> = None;
    let n = events.len();
    let mut budget = n.saturating_mul(4).saturating_add(1 << 16);
    for probe in [n / 2, n / 4, n / 4 * 3] {
        if probe >= n {
            continue;
        }
        let from = probe.saturating_sub(LOOK_BACK);
        let earlier = (from..probe)
            .rev()
            .filter(|&c| same_event(events, made, c, probe));
        for c in earlier.take(CANDIDATES) {
            let len = probe - c;
            if best.is_some_and(|b| b.start <= c && probe + len <= b.end && len % b.len == 0) {
                // Inside the best stretch, and a multiple of its repeat: nothing longer.
                continue;
            }
            let mut like = |i: usize| {
                budget = budget.saturating_sub(1);
                budget > 0 && same_event(events, made, i, i - len)
            };
            let mut end = probe;
            while end < n && like(end) {
                end += 1;
            }
            let mut first = probe;
            while first > len && like(first - 1) {
                first -= 1;
            }
            if budget == 0 {
                return best;
            }
            let p = Period {
                start: first - len,
                len,
                end,
            };
            let covers = p.end - p.start;
            if covers >= 4 * len && best.is_none_or(|b| covers > b.end - b.start) {
                best = Some(p);
            }
        }
    }
    best
}

/// `name` as `to` moves the event it counts from, where it names a tensor the stretch from
/// `start` made (see [`MADE`]); any other name stays. `None`: the event moved to is none.
fn renamed(name: u64, start: usize, to: impl Fn(usize) -> Option<usize>) -> Option<u64> {
    let Some(n) = name.checked_sub(MADE).and_then(|n| usize::try_from(n).ok()) else {
        return Some(name);
    };
    if n < start {
        return Some(name);
    }
    to(n).map(|n| MADE | n as u64)
}

/// What a replay held at a boundary, to be compared with what it holds at a later one, and
/// what it had counted then.
pub(super) struct Mark {
    /// The event and the request it was taken before.
    at: usize,
    request: usize,
    models: BTreeMap<u8, Model>,
    placed: crate::fasthash::FastMap<(u8, u64), u64>,
    private: BTreeMap<u8, u64>,
    serves_oom: Option<bool>,
    oom_in_private_pool: bool,
    private_at_oom: u64,
    failed: bool,
    /// Counted: the models' stats, the requests done without, tensors placed where the run's
    /// were.
    stats: BTreeMap<u8, Stats>,
    done_without: u64,
    same: BTreeMap<u8, (u64, u64)>,
}

impl Replayer<'_> {
    /// What comparing the replay's state costs: its tensors placed and its models' blocks.
    fn state_size(&self) -> usize {
        let blocks: usize = self.models.values().map(Model::blocks).sum();
        self.placed.len().saturating_add(blocks)
    }

    fn mark(&self, at: usize, request: usize) -> Mark {
        Mark {
            at,
            request,
            models: self.models.clone(),
            placed: self.placed.clone(),
            private: self.private.clone(),
            serves_oom: self.serves_oom,
            oom_in_private_pool: self.oom_in_private_pool,
            private_at_oom: self.private_at_oom,
            failed: self.first_failure.is_some(),
            stats: self.models.iter().map(|(&d, m)| (d, m.stats())).collect(),
            done_without: self.done_without,
            same: self.same.clone(),
        }
    }

    /// Whether the replay goes on from here as it did from `m`, `shift` events before, the
    /// stretch beginning at `start`: the models (see [`Model::goes_on_as`]), where each live
    /// tensor went (a tensor the stretch made standing for the one made `shift` events
    /// before it), the private pools, and what decides how the next failure or run's failure
    /// is taken.
    fn goes_on_as(&self, m: &Mark, start: usize, shift: usize) -> bool {
        self.serves_oom == m.serves_oom
            && self.oom_in_private_pool == m.oom_in_private_pool
            && self.private_at_oom == m.private_at_oom
            && self.first_failure.is_some() == m.failed
            && self.private == m.private
            && self.placed.len() == m.placed.len()
            && self.models.len() == m.models.len()
            && self
                .models
                .iter()
                .zip(&m.models)
                .all(|((d, a), (e, b))| d == e && a.goes_on_as(b))
            && self.placed.iter().all(|(&(d, name), at)| {
                let then = match renamed(name, start, |n| n.checked_sub(shift)) {
                    Some(n) => n,
                    None => return false,
                };
                m.placed.get(&(d, then)) == Some(at)
            })
    }

    /// The tensors the stretch made, renamed as those `by` events later (a pass over repeats).
    fn rename_made(&mut self, start: usize, by: usize) {
        let placed = std::mem::take(&mut self.placed);
        self.placed = placed
            .into_iter()
            .map(|((d, name), at)| {
                let now = renamed(name, start, |n| n.checked_add(by)).unwrap_or(name);
                ((d, now), at)
            })
            .collect();
    }

    /// How many times (up to `most`) the `len` events before `at` come again from `at` as this
    /// replay sizes them, `requests` of them requests: each event the same as the one `len`
    /// before it, each request sized the same as the one `requests` before it.
    fn repeats(
        &self,
        (rs, stream): (&Resized<'_>, Stream<'_>),
        made: &[u32],
        (at, request): (usize, usize),
        (len, requests): (usize, usize),
        most: usize,
    ) -> usize {
        if let Some(r) = rs.repeating.filter(|_| stream.sources.is_none()) {
            // The caller's size function reads nothing of a request but its class, its size
            // and its stack, and those repeat up to `r.end`.
            return most.min(r.end.saturating_sub(at) / len);
        }
        let events = stream.events;
        let mut n = request;
        for i in at..at.saturating_add(most.saturating_mul(len)) {
            let (Some(e), Some(before)) = (events.get(i), events.get(i.wrapping_sub(len))) else {
                return (i - at) / len;
            };
            if !same_event(events, made, i, i - len) {
                return (i - at) / len;
            }
            if e.ev == Ev::Alloc {
                let Some(m) = n.checked_sub(requests) else {
                    return (i - at) / len;
                };
                if stream.size(rs, i, n, e) != stream.size(rs, i - len, m, before) {
                    return (i - at) / len;
                }
                n += 1;
            }
        }
        most
    }

    /// The replay as it stands counted `times` more what it counted since `m`.
    fn counted_again(&mut self, m: &Mark, times: u64) {
        for (d, model) in self.models.iter_mut() {
            if let Some(before) = m.stats.get(d) {
                model.counted_since(before, times);
            }
        }
        let more = |now: u64, then: u64| now.saturating_sub(then).saturating_mul(times);
        self.done_without = self
            .done_without
            .saturating_add(more(self.done_without, m.done_without));
        for (d, s) in self.same.iter_mut() {
            let then = m.same.get(d).copied().unwrap_or_default();
            *s = (
                s.0.saturating_add(more(s.0, then.0)),
                s.1.saturating_add(more(s.1, then.1)),
            );
        }
    }

    /// Every event of `stream` as `rs` sizes it (the run's events, or a what-if's edits of
    /// them held for its replays; with `run_failures`, the
    /// run's failed requests too, asking whether the setting serves them) applied in order,
    /// but for the repeats of `p` that go as one just replayed went: at each of its boundaries
    /// the replay is compared with a mark taken at the first, second, fourth, eighth ...
    /// boundary, and where it is the same and the events ahead repeat, as many whole repeats
    /// as the stretch holds are counted and passed. Returns the events applied, and those
    /// passed so.
    pub(super) fn replay_repeating(
        &mut self,
        (rs, stream): (&Resized<'_>, Stream<'_>),
        st: &Stretch,
        run_failures: bool,
    ) -> (usize, usize) {
        let (events, p, made) = (stream.events, st.period, &st.made);
        let (mut i, mut request) = (0usize, 0usize);
        let (mut mark, mut next_mark, mut passed) = (None::<Mark>, 0usize, 0usize);
        // A comparison costs up to the state's size; the events replayed pay for them, so
        // that a state far larger than a repeat is not compared in full at every boundary.
        let mut budget = 0usize;
        while let Some(e) = events.get(i) {
            if i >= p.start && i < p.end && (i - p.start) % p.len == 0 {
                let boundary = (i - p.start) / p.len;
                budget = budget.saturating_add(p.len);
                let size = self.state_size();
                let compared = mark.as_ref().filter(|_| budget >= size).filter(|m| {
                    budget -= size;
                    self.goes_on_as(m, p.start, i - m.at)
                });
                if let Some(m) = compared {
                    let (len, requests) = (i - m.at, request - m.request);
                    let most = (p.end - i) / len;
                    let times =
                        self.repeats((rs, stream), made, (i, request), (len, requests), most);
                    if times > 0 {
                        self.counted_again(m, times as u64);
                        self.rename_made(p.start, times * len);
                        i += times * len;
                        request += times * requests;
                        passed += times * len;
                        // One pass per stretch: what follows is replayed event by event.
                        mark = None;
                        next_mark = usize::MAX;
                        continue;
                    }
                }
                if boundary >= next_mark {
                    mark = Some(self.mark(i, request));
                    next_mark = boundary.saturating_mul(2).max(1);
                }
            }
            // Each tensor by the request that made it (see `Stretch`).
            let mut named = *e;
            match made.get(i) {
                _ if e.ev == Ev::Alloc => named.ptr = MADE | i as u64,
                Some(&a) if a != NONE => named.ptr = MADE | u64::from(a),
                _ => {}
            }
            i += 1;
            let go_on = match e.ev {
                Ev::Oom if run_failures => self.apply(&named),
                Ev::Oom | Ev::Skip => true,
                Ev::Alloc => {
                    (named.size, named.optional) = stream.size(rs, i - 1, request, e);
                    request += 1;
                    self.apply(&named)
                }
                _ => self.apply(&named),
            };
            if !go_on {
                break;
            }
        }
        (i - passed, passed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ev: Ev, ptr: u64, size: u64) -> Event {
        Event {
            ev,
            device: 0,
            stream: 0,
            ptr,
            size,
            time_ns: 0,
            stack: 0,
            sequence: 0,
            private: false,
            optional: false,
            kind: crate::report::kinds::Kind::Unknown,
        }
    }

    /// A step: layers that repeat within it (the same two events three times), then what ends
    /// it, each at addresses of its own.
    fn step() -> Vec<Event> {
        let mut s = Vec::new();
        for _ in 0..3 {
            s.push(event(Ev::Alloc, 0x1000, 512));
            s.push(event(Ev::Free, 0x1000, 0));
        }
        s.push(event(Ev::Alloc, 0x2000, 4096));
        s.push(event(Ev::Free, 0x2000, 0));
        s
    }

    /// The repeat found is the step's, not a layer's within it, from the first event that
    /// repeats to the last; what comes before and after (setting up, shutting down) is outside.
    #[test]
    fn the_stretch_found_is_the_longest_that_repeats_and_its_repeat_the_step() {
        let mut events = vec![
            event(Ev::Alloc, 0x9000, 1 << 20),
            event(Ev::Alloc, 0x8000, 64),
        ];
        for _ in 0..40 {
            events.extend(step());
        }
        events.push(event(Ev::Free, 0x9000, 0));
        events.push(event(Ev::Free, 0x8000, 0));
        let st = stretch_of(&events).expect("the steps repeat");
        let p = st.period;
        assert_eq!(p.len, step().len());
        assert_eq!((p.start, p.end), (2, 2 + 40 * step().len()));
        // Each event of the stretch is the one a repeat before it.
        assert!((p.start + p.len..p.end).all(|i| same_event(&events, &st.made, i, i - p.len)));
    }

    /// Steps whose requests differ (a size that changes every step, as shapes do) repeat
    /// nowhere: nothing is passed over.
    #[test]
    fn steps_whose_shapes_change_do_not_repeat() {
        let mut events = Vec::new();
        for n in 0..40u64 {
            events.push(event(Ev::Alloc, 0x1000, 512 * (n + 1)));
            events.push(event(Ev::Free, 0x1000, 0));
            events.push(event(Ev::Alloc, 0x2000, 4096 + n));
            events.push(event(Ev::Free, 0x2000, 0));
        }
        assert!(stretch_of(&events).is_none());
    }

    /// A tensor kept from one step into the next (a batch made ahead, alternating between two
    /// addresses in the run, as double buffers do) is live at every boundary: a pass over
    /// repeats renames it as the tensor of the step it lands in, so that the free that comes
    /// after finds it. The replay so, and the replay of every event, end the same.
    #[test]
    fn a_tensor_kept_into_the_next_step_is_found_after_a_pass_over_repeats() {
        use crate::report::torch_allocator::Bounds;
        use crate::report::torch_allocator::model::TorchConf;
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
        let mut input = crate::report::analysis::read_requests(
            &path,
            &crate::trace::reader::ReadOptions::default(),
        )
        .unwrap();
        let device = *input.devices.keys().next().unwrap();
        let on = |mut e: Event| {
            e.device = device;
            e
        };
        let mut events = vec![on(event(Ev::Alloc, 0x7000_0000, 64 << 20))];
        let buffers = [0x7100_0000, 0x7200_0000];
        for k in 0..60usize {
            events.push(on(event(Ev::Alloc, buffers[k % 2], 4 << 20)));
            if k > 0 {
                events.push(on(event(Ev::Free, buffers[(k - 1) % 2], 0)));
            }
            events.push(on(event(Ev::Alloc, 0x7300_0000, 8 << 20)));
            events.push(on(event(Ev::Free, 0x7300_0000, 0)));
        }
        events.push(on(event(Ev::Free, buffers[59 % 2], 0)));
        input.events = events;
        input.period = std::sync::OnceLock::new();
        let (conf, bounds) = (TorchConf::default(), Bounds::default());
        let rs = input.resized(|_, size, _| size);
        let mut every = Replayer::new(&input, &conf, &bounds, false, rs.as_run);
        rs.each(&mut |e| every.apply(e));
        let st = input.stretch().expect("the steps repeat");
        // One step, though the run's addresses repeat only every second one.
        assert_eq!(st.period.len, 4);
        let mut passing = Replayer::new(&input, &conf, &bounds, false, rs.as_run);
        let (applied, passed) = passing.replay_repeating((&rs, input.stream()), st, false);
        assert!(passed > applied, "applied {applied}, passed over {passed}");
        let (a, b) = (every.outcome(&conf), passing.outcome(&conf));
        assert_eq!(format!("{:?}", a.devices), format!("{:?}", b.devices));
        // Every tensor was freed in the end, in both.
        let held = |r: &Replayer<'_>| r.models.values().map(|m| m.stats().allocated).sum::<u64>();
        assert_eq!((held(&every), held(&passing)), (64 << 20, 64 << 20));
    }
}
