//! The run's requests resized as another run would make them, and the what-ifs that edit
//! them, handed to a replay as it goes.

use super::Repeating;
use crate::report::torch_allocator::{Ev, Event, Input};

/// The run's tensor requests as another run would make them: each request's size as `size`
/// gives it (from its place among the requests, its recorded size and its stack), the rest of
/// the run as it was but for its failures (another run need not fail there). The run's own
/// segments stay as hints: the model takes a recorded address only for a segment of the
/// recorded length, so at the run's own sizes the replay is the run's, to the byte.
///
/// Made as the replay reads it, never held whole: a replay of a ring's tens of millions of
/// events read a copy of them written first (twice the requests' memory, and a search that
/// stops at its first failure wrote them all).
pub struct Resized<'a> {
    pub(super) input: &'a Input,
    pub(super) what_if: WhatIf<'a>,
    pub(super) size: Box<dyn Fn(usize, u64, u64) -> (u64, bool) + 'a>,
    /// Every request at the run's own size, and no what-if: the run's own requests.
    pub(super) as_run: bool,
    /// Where `size` repeats with the run's events, as its caller checked (see
    /// [`Resized::knowing`]).
    pub(super) repeating: Option<Repeating>,
}

impl Resized<'_> {
    /// Its sizes said to be a function of each request's class as `repeating` was found with
    /// (see [`Input::repeating`]), its recorded size and its stack: a replay then passes over
    /// repeats without checking their requests' sizes one by one.
    pub fn knowing(self, repeating: Option<Repeating>) -> Self {
        Resized { repeating, ..self }
    }

    /// Each event in order to `sink`, until it says stop (false).
    pub(super) fn each(&self, sink: &mut dyn FnMut(&Event) -> bool) {
        let copy_size = |bytes: u64, like: Option<usize>| (self.what_if.copy_size)(bytes, like);
        edits(self.input, &self.what_if, &mut |e, source| {
            let mut e = *e;
            match source {
                Source::Request(n) => (e.size, e.optional) = (self.size)(n, e.size, e.stack),
                Source::Copy(like) => e.size = copy_size(e.size, like),
                Source::Other => {}
            }
            sink(&e)
        });
    }

    /// The size of request `e` of a what-if's edited events, made as `source` says (see
    /// `edited.rs`).
    pub(super) fn size_of(&self, e: &Event, source: Source) -> (u64, bool) {
        match source {
            Source::Request(n) => (self.size)(n, e.size, e.stack),
            Source::Copy(like) => ((self.what_if.copy_size)(e.size, like), false),
            Source::Other => (e.size, e.optional),
        }
    }
}

/// Where a request of the edited events takes its size from, at whatever batch a replay asks:
/// the run's request `n` (its own, or the original a checkpoint's recomputation makes again),
/// or an autocast copy of the bytes the event holds, scaling as request `like` does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::report::torch_allocator) enum Source {
    Request(usize),
    Copy(Option<usize>),
    Other,
}

/// The run's events as a what-if edits them (see [`Resized::each`]), before any resizing:
/// each event with where its size comes from, to `sink` until it says stop.
pub(super) fn edits(
    input: &Input,
    what_if: &WhatIf<'_>,
    sink: &mut dyn FnMut(&Event, Source) -> bool,
) {
    let events = &input.events;
    let (checkpointing, autocast) = (what_if.checkpointing, what_if.autocast);
    let edits = what_if.edits;
    // Each event's place among the requests, for a checkpoint's recomputed requests (sized
    // as their originals); without one the count as the events go is enough.
    let index: Vec<usize> = match checkpointing {
        Some(_) => events
            .iter()
            .scan(0usize, |n, e| {
                let at = *n;
                *n += usize::from(e.ev == Ev::Alloc);
                Some(at)
            })
            .collect(),
        None => Vec::new(),
    };
    // What goes before an event (a checkpoint's recomputation, autocast's copies), then the
    // event: a few at a time. An inserted request says where its size comes from: the
    // checkpoint's the original they make again (`original`), autocast's the request they
    // scale as (`copy`, which keeps the bytes as the event's size).
    let mut out: Vec<(Event, Source)> = Vec::new();
    let mut made: Vec<Event> = Vec::new();
    let mut n = 0usize;
    let mut flush = |out: &mut Vec<(Event, Source)>| out.drain(..).all(|(e, s)| sink(&e, s));
    // The originals of a checkpoint's recomputed requests and the requests autocast's copies
    // scale as, in the order their inserts ask for their sizes.
    let asked: std::cell::RefCell<Vec<Option<usize>>> = Default::default();
    let insert = |i: usize, at: u64, out: &mut Vec<(Event, Source)>, made: &mut Vec<Event>| {
        if let Some(c) = checkpointing {
            made.clear();
            asked.borrow_mut().clear();
            let original = |j: usize| -> Event {
                asked.borrow_mut().push(index.get(j).copied());
                events[j]
            };
            c.insert_before(events, i, at, original, made);
            let mut asked = asked.borrow_mut();
            let mut originals = asked.drain(..);
            out.extend(made.iter().map(|e| match e.ev {
                Ev::Alloc => (*e, Source::Request(originals.next().flatten().unwrap_or(0))),
                _ => (*e, Source::Other),
            }));
        }
        if let Some(a) = autocast {
            made.clear();
            asked.borrow_mut().clear();
            let copy = |bytes: u64, like: Option<usize>| -> u64 {
                asked.borrow_mut().push(like);
                bytes
            };
            a.insert_before(events, i, at, &copy, made);
            let mut asked = asked.borrow_mut();
            let mut likes = asked.drain(..);
            out.extend(made.iter().map(|e| match e.ev {
                Ev::Alloc => (*e, Source::Copy(likes.next().flatten())),
                _ => (*e, Source::Other),
            }));
        }
        if let Some(s) = edits {
            made.clear();
            s.insert_before(events, i, at, made);
            out.extend(made.iter().map(|e| (*e, Source::Other)));
        }
    };
    for (i, e) in events.iter().enumerate() {
        insert(i, e.time_ns, &mut out, &mut made);
        let skipped = autocast.is_some_and(|a| a.skips(i));
        let this = n;
        n += usize::from(e.ev == Ev::Alloc);
        // Sharded: the event cut to its shard, its free moved, or not made.
        let edited = match edits {
            Some(s) => s.edit(i, e),
            None => Some(*e),
        };
        if let (false, Some(e)) = (skipped, edited) {
            match e.ev {
                Ev::Oom | Ev::Skip => {}
                Ev::Alloc => out.push((e, Source::Request(this))),
                _ => {
                    let mut e = e;
                    if let Some(c) = checkpointing {
                        c.remap(i, &mut e);
                    }
                    if e.ev != Ev::Skip {
                        out.push((e, Source::Other));
                    }
                }
            }
        }
        if !flush(&mut out) {
            return;
        }
    }
    if let Some(last) = events.last() {
        insert(events.len(), last.time_ns, &mut out, &mut made);
        flush(&mut out);
    }
}

impl Input {
    /// The requests resized by `size(n, recorded size, stack)`, `n` counting the requests.
    pub fn resized<'a>(&'a self, size: impl Fn(usize, u64, u64) -> u64 + 'a) -> Resized<'a> {
        self.resized_optional(&WhatIf::default(), move |n, s, stack| {
            (size(n, s, stack), false)
        })
    }

    /// The requests resized as [`Input::resized`] does, each also said to be one the program
    /// can do without when memory is short (see `Event::optional`), under the what-ifs asked:
    /// the blocks `checkpointing` names checkpointed (a recomputed request sized as its
    /// original), the forward under `autocast` (its copies sized by `copy_size`).
    pub fn resized_optional<'a>(
        &'a self,
        what_if: &WhatIf<'a>,
        size: impl Fn(usize, u64, u64) -> (u64, bool) + 'a,
    ) -> Resized<'a> {
        let no_what_if = what_if.none();
        let as_run = no_what_if
            && self
                .events
                .iter()
                .filter(|e| e.ev == Ev::Alloc)
                .enumerate()
                .all(|(n, e)| size(n, e.size, e.stack).0 == e.size);
        Resized {
            input: self,
            what_if: *what_if,
            size: Box::new(size),
            as_run,
            repeating: None,
        }
    }
}

/// The what-ifs a replay is asked to make of the run (none by default).
#[derive(Clone, Copy)]
pub struct WhatIf<'a> {
    pub checkpointing: Option<&'a crate::report::torch_allocator::Checkpointing>,
    pub autocast: Option<&'a crate::report::torch_allocator::Autocast>,
    /// The run's events edited: the model sharded over the ranks as FSDP2 shards it, or what a
    /// run at one rank does not show of more.
    pub edits: Option<&'a crate::report::torch_allocator::Edits>,
    /// The bytes at the replay's batch of an autocast copy of `bytes` at the run's, which
    /// scales as the request it copies (`Some(n)`) or not at all.
    pub copy_size: &'a dyn Fn(u64, Option<usize>) -> u64,
}

impl WhatIf<'_> {
    /// No what-if asked: the run's own events.
    pub fn none(&self) -> bool {
        self.checkpointing.is_none() && self.autocast.is_none() && self.edits.is_none()
    }
}

impl Default for WhatIf<'_> {
    fn default() -> Self {
        WhatIf {
            checkpointing: None,
            autocast: None,
            edits: None,
            copy_size: &|bytes, _| bytes,
        }
    }
}
