//! A what-if's edits of the run's events (a checkpoint's recomputation, autocast's copies),
//! made once and held for its replays, which pass over their repeats as the run's replays
//! pass over the run's (`repeat.rs`); and the events such a replay reads, the run's or these.

use super::resized::Source;
use super::{Resized, Stretch, WhatIf, stretch_of};
use crate::report::torch_allocator::{Event, Input};

/// The events a replay that passes over repeats reads: the run's (each request sized by its
/// place among the requests), or a what-if's edits of them held for its replays (each request
/// sized as its [`Source`] says: see [`Edited`]).
#[derive(Clone, Copy)]
pub(super) struct Stream<'a> {
    pub(super) events: &'a [Event],
    pub(super) sources: Option<&'a [Source]>,
}

impl Stream<'_> {
    /// Event `i`, request `request` of the stream, sized as `rs` sizes it.
    pub(super) fn size(
        &self,
        rs: &Resized<'_>,
        i: usize,
        request: usize,
        e: &Event,
    ) -> (u64, bool) {
        match self.sources {
            None => (rs.size)(request, e.size, e.stack),
            Some(s) => rs.size_of(e, s.get(i).copied().unwrap_or(Source::Other)),
        }
    }
}

/// The run's events as a what-if (a checkpoint's recomputation, autocast's copies) edits them,
/// before any resizing, and where they repeat: made once for all the what-if's replays, so that
/// each passes over repeats as the run's replays do. A checkpoint's copies are named by their
/// block, which differs from step to step; a replay that passes over repeats names each tensor
/// by the event that made it (see `repeat.rs`), so they repeat as their originals do.
pub(in crate::report::torch_allocator) struct Edited {
    events: Vec<Event>,
    sources: Vec<Source>,
    stretch: Stretch,
}

impl std::fmt::Debug for Edited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Edited({} events, {:?})",
            self.events.len(),
            self.stretch.period
        )
    }
}

/// Events a what-if's edits are held for at most (some 60 bytes each, beside the run's own):
/// past it the what-if's replays read every event, made as they go.
const EDITED_MOST: usize = 1 << 23;

impl Edited {
    /// The what-if's edits of `input`'s events, held where they repeat; `None` where they do
    /// not, or are too many to hold.
    pub(in crate::report::torch_allocator) fn of(
        input: &Input,
        what_if: &WhatIf<'_>,
    ) -> Option<Edited> {
        let (mut events, mut sources) = (Vec::new(), Vec::new());
        let mut whole = true;
        super::resized::edits(input, what_if, &mut |e, source| {
            whole = events.len() < EDITED_MOST;
            if whole {
                events.push(*e);
                sources.push(source);
            }
            whole
        });
        if !whole {
            return None;
        }
        let stretch = stretch_of(&events)?;
        Some(Edited {
            events,
            sources,
            stretch,
        })
    }

    pub(super) fn stream(&self) -> Stream<'_> {
        Stream {
            events: &self.events,
            sources: Some(&self.sources),
        }
    }

    pub(super) fn stretch(&self) -> &Stretch {
        &self.stretch
    }
}
