//! The checkpoint of a ring trace, in one place: what the oldest records of a ring said, kept
//! so that a report reads a run of any length as it reads a short one.
//!
//! Its life, file by file:
//! - [`codes`]: the format. A checkpoint is a stream of ordinary records, opened and closed by
//!   `Restore` records, whose `status` byte says what part of the state each puts back.
//! - [`write`]: the summarizer (`trace::summary`) writes everything it holds as such a stream,
//!   with [`live_set`] the live allocations (listed, or summed by line to fit its slot) and
//!   [`definitions`] the strings, stacks and modules, each once.
//! - [`read`]: the reader finds the newest whole checkpoint in the file (two slots, each with a
//!   checksum: a process killed while writing one leaves the other).
//! - [`restore`]: the replay (`trace::live`) applies each `Restore` record before the ring's
//!   own records, so the reports never know whether a run was summarized.
//!
//! `write` and `restore` are methods of the state they write and fill (the summarizer's,
//! the replay's); they live here so that the format, its writing, its reading and what it
//! restores are read together.

pub mod codes;
pub(crate) mod definitions;
pub mod live_set;
pub(crate) mod read;
mod restore;
mod write;

pub use live_set::SUMMED_BASE;
pub use write::seal;
