//! gpushim's core, the part the shim (`shim/`) and the `gpushim` command (the crate around this
//! one) both compile. Nothing here calls CUDA; the shim is the only code that does.
//!
//! The layers, lowest first (a module uses only those above it):
//! - [`fasthash`], [`fixedfmt`], [`prefetch`]: a hash for addresses, formatting without
//!   allocating, memory asked for ahead of the hot loops.
//! - [`config`]: `GPUSHIM_CONF`, parsed.
//! - [`trace`]: the file format, the writer the shim records with, the reader.
//! - [`engine`]: the caching allocator, over any backend (real CUDA in the shim, memory in the
//!   tests and in `simulate`).

pub mod config;
pub mod engine;
pub mod fasthash;
pub mod fixedfmt;
pub mod prefetch;
pub mod trace;
