//! Where a reader's batches come from: its decoder called in turn, or the decoder on a thread
//! of its own a few batches ahead, handing each batch to the reader and to any other reader
//! of the same records on another thread: one batch shared by all, each copied (if at all) by
//! the reader that takes it, so the decoding thread's work does not grow with the readers.

use super::decode::{AHEAD, Batch, Decoder, Spares};
use std::sync::Arc;

/// A batch as the decoding thread hands it on: shared by every reader of the same records.
pub(super) type Shared = Arc<Batch>;

/// The batch itself: the last reader to take it has it whole, the others a copy of it (made
/// on their own thread, into a spare batch).
pub(super) fn own(b: Shared, spares: &Spares) -> Batch {
    Arc::try_unwrap(b).unwrap_or_else(|b| b.copy(spares))
}

/// Where a reader's batches come from: its decoder, called in turn, or the decoder's thread
/// before it (a bounded channel of a few batches between them). A reader dropped mid-way drops
/// the receiving end: the thread ends at its next send.
pub(super) enum Source {
    /// Not read yet: a reader opened for its header alone starts no thread.
    Pending(Box<Decoder>),
    Inline(Box<Decoder>),
    Threaded {
        /// In a mutex only so that a reader can be shared between threads (read-only: the
        /// what-if replays), as a receiver alone cannot be.
        batches: Option<std::sync::Mutex<std::sync::mpsc::Receiver<Shared>>>,
        thread: Option<std::thread::JoinHandle<Option<Box<Decoder>>>>,
    },
    /// Each batch another reader's decoding thread reads (see [`Source::start_shared`]).
    Second(std::sync::Mutex<std::sync::mpsc::Receiver<Shared>>),
    /// Between a stop and a start (never seen by a caller).
    Gone,
}

impl Source {
    /// The decoder, on a thread of its own when the machine has more than one core and a
    /// thread can be had, else called in turn.
    pub fn start(d: Box<Decoder>) -> Source {
        match Source::start_shared(d, 0) {
            Ok((source, _)) => source,
            Err(d) => Source::Inline(d),
        }
    }

    /// Sources of the same batches from one decoder on a thread of its own: the first (which
    /// gets the decoder back when stopped) and each of the `others` read every batch, shared
    /// (see [`own`]). `Err`: the decoder back, where a thread cannot be had or decoding is
    /// asked to stay in turn (one core, or `ReadMode::decode_apart` off).
    ///
    /// The thread waits for every reader (a few batches ahead of the slowest): each of the
    /// others is read to its end or dropped before the first is stopped, or the stop waits
    /// for it.
    pub fn start_shared(
        d: Box<Decoder>,
        others: usize,
    ) -> Result<(Source, Vec<Source>), Box<Decoder>> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Asked to decode in turn whatever the cores (the tests compare the two).
        if cores < 2 || !d.mode.decode_apart {
            return Err(d);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<Shared>(AHEAD);
        let (mut to_others, mut from_others) = (Vec::new(), Vec::new());
        for _ in 0..others {
            let (t, r) = std::sync::mpsc::sync_channel::<Shared>(AHEAD);
            to_others.push(Some(t));
            from_others.push(r);
        }
        // The decoder comes back through the join, for a second pass.
        let holder = std::sync::Arc::new(std::sync::Mutex::new(Some(d)));
        let theirs = holder.clone();
        let spawned = std::thread::Builder::new()
            .name("gpushim-decode".into())
            .spawn(move || {
                let mut d = theirs.lock().ok().and_then(|mut g| g.take())?;
                let mut first = Some(tx);
                loop {
                    let b = Arc::new(d.step());
                    let last = b.last;
                    // A reader gone (dropped) is sent no more.
                    for t in &mut to_others {
                        if let Some(tx) = t
                            && tx.send(b.clone()).is_err()
                        {
                            *t = None;
                        }
                    }
                    if let Some(t) = &first
                        && t.send(b).is_err()
                    {
                        first = None;
                    }
                    if last || (first.is_none() && to_others.iter().all(Option::is_none)) {
                        break;
                    }
                }
                let cpu = super::thread_cpu_ns();
                super::ReadCounts::add(&d.mode.counts.decoding_ns, cpu);
                Some(d)
            });
        match spawned {
            Ok(thread) => Ok((
                Source::Threaded {
                    batches: Some(std::sync::Mutex::new(rx)),
                    thread: Some(thread),
                },
                from_others
                    .into_iter()
                    .map(|r| Source::Second(std::sync::Mutex::new(r)))
                    .collect(),
            )),
            // No thread to be had: the decoder, unmoved (the closure never ran).
            Err(_) => match holder.lock().ok().and_then(|mut g| g.take()) {
                Some(d) => Err(d),
                None => Ok((Source::Gone, Vec::new())),
            },
        }
    }

    /// The next batch as it was handed on, shared with any other reader of it (not copied),
    /// `None` once the last was handed on.
    pub fn next_shared(&mut self) -> Option<Shared> {
        if let Source::Pending(_) = self
            && let Source::Pending(d) = std::mem::replace(self, Source::Gone)
        {
            *self = Source::start(d);
        }
        match self {
            Source::Inline(d) if !d.finished => Some(Arc::new(d.step())),
            Source::Threaded {
                batches: Some(rx), ..
            }
            | Source::Second(rx) => rx.get_mut().ok()?.recv().ok(),
            _ => None,
        }
    }

    /// The decoder back, its thread stopped.
    pub fn stop(&mut self) -> Option<Box<Decoder>> {
        match std::mem::replace(self, Source::Gone) {
            Source::Pending(d) | Source::Inline(d) => Some(d),
            Source::Threaded {
                mut batches,
                mut thread,
                ..
            } => {
                // Dropping the receiver ends the thread at its next send.
                batches.take();
                thread.take().and_then(|t| t.join().ok()).flatten()
            }
            Source::Second(_) | Source::Gone => None,
        }
    }
}
