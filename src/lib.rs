//! gpushim's core. Nothing here calls CUDA; the shim (`shim/`) is the only code that does.
//!
//! The layers, lowest first (a module uses only those above it):
//! - [`fasthash`], [`fixedfmt`]: a hash for addresses, formatting without allocating.
//! - [`config`]: `GPUSHIM_CONF`, parsed.
//! - [`trace`]: the file format, the writer the shim records with, the reader.
//! - [`engine`]: the caching allocator, over any backend (real CUDA in the shim, memory in the
//!   tests and in `simulate`).
//! - [`report`]: summary, peak, leaks, OOM, what-if replays (with the `cli` feature).
//! - [`export`]: other viewers' formats and pictures (with the `cli` feature).
//! - [`run`]: how `gpushim run` starts a program under the shim (with the `cli` feature).

pub mod config;
pub mod engine;
pub mod fasthash;
pub mod fixedfmt;
pub mod trace;

#[cfg(feature = "cli")]
pub mod export;
#[cfg(feature = "cli")]
pub mod report;
#[cfg(feature = "cli")]
pub mod run;
