//! The trace: its file format ([`format`]), the lock-free writer the shim records with
//! ([`recorder`]), native call stacks captured without allocating ([`unwind`]), and the reader
//! every report decodes with ([`reader`]), which keeps what a report's [`filter`] asks for.

pub mod backward;
pub mod by_device;
pub mod checkpoint;
pub mod facts;
pub mod filter;
pub mod format;
pub mod graph;
pub mod live;
pub mod ranges;
pub mod reader;
pub mod recorder;
pub mod summary;
pub mod tensors;
pub mod unwind;
