//! The `gpushim` command's library. Nothing here calls CUDA; the shim (`shim/`) is the only
//! code that does.
//!
//! The layers, lowest first (a module uses only those above it):
//! - the core ([`gpushim_core`], `src/core/`, which the shim compiles too): [`fasthash`],
//!   [`fixedfmt`], [`config`], [`trace`] (the file format, the writer, the reader) and
//!   [`engine`] (the caching allocator), re-exported here under their own names;
//! - [`files`]: what the command writes and trusts in folders others may share; [`memory`]:
//!   the command's allocator, which says what it could not have rather than abort;
//! - [`report`]: summary, peak, leaks, OOM, what-if replays (the analysis on top, the only
//!   code that opens a trace; the reports below it);
//! - [`export`]: other viewers' formats and pictures;
//! - [`run`]: how `gpushim run` starts a program under the shim.

pub use gpushim_core::{config, fasthash, fixedfmt, prefetch, trace};

/// The core's caching allocator (PyTorch's, modelled, is in `report::torch_allocator::model`).
pub mod engine {
    pub use gpushim_core::engine::*;
}

pub mod export;
pub mod files;
pub mod memory;
pub mod report;
pub mod run;
