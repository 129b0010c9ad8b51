//! libgpushim.so: preloaded into a program, it intercepts every CUDA memory call by every route
//! (exported symbols, `dlsym`, `cuGetProcAddress`, `cudaGetDriverEntryPoint`) and records it.
//!
//! The only code of gpushim that calls CUDA. Built with `panic = "abort"`; nothing on the hook
//! paths can panic, and nothing reachable from `dlsym` or the constructor allocates or locks.

mod driver;
mod entry;
mod ffi;
mod frameworks;
mod guard;
mod hook;
mod ipc;
mod nvtx;
mod pool;
mod pool_hooks;
mod real;
mod runtime;
mod stacks;
mod state;
mod symbols;
mod trace;
mod wrappers;

mod dlsym;
