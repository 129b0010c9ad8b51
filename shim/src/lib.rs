//! libgpushim.so: preloaded into a program, it intercepts every CUDA memory call by every route
//! (exported symbols, `dlsym`, `cuGetProcAddress`, `cudaGetDriverEntryPoint`) and records it.
//!
//! The only code of gpushim that calls CUDA. Built with `panic = "abort"`; nothing on the hook
//! paths can panic, and nothing reachable from `dlsym` or the constructor allocates or locks.
//!
//! The layers, lowest first; a module only uses the ones above it in this list (and its own
//! folder's parent), never one below:
//!
//! - [`cuda`]: what is known of CUDA (types, constants, every hooked symbol and its signature)
//!   and how the real functions are found.
//! - [`os`]: the few operating-system helpers every layer shares (environment, a spin lock, one
//!   stderr line).
//! - [`state`], [`guard`]: the off switch, the configuration, the re-entrancy guard.
//! - [`lifecycle`]: the constructor, and the one exit and fork handler that run what the layers
//!   below ask for.
//! - [`costs`]: where the shim's own time goes, measured when `GPUSHIM_COSTS=1`.
//! - [`trace`]: the recorder in the memory-mapped file, with native and Python stacks.
//! - [`pool`]: the caching allocator over real CUDA, its IPC tickets and capture rules.
//! - [`hooks`]: one body per hooked function: forward or serve from the pool, then record.
//! - [`route`]: how calls reach the hooks (the tables behind `dlsym` and the entry-point
//!   lookups).

mod costs;
mod cuda;
mod guard;
mod hooks;
mod lifecycle;
mod options;
mod os;
mod pool;
mod route;
mod state;
mod trace;
