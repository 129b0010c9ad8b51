//! gpushim's core: the trace format, the trace writer and reader, the configuration, and the
//! reports. Nothing here calls CUDA; the shim (`shim/`) is the only code that does.

pub mod config;
pub mod engine;
pub mod fasthash;
pub mod filter;
pub mod format;
pub mod reader;
pub mod recorder;
pub mod stack;
pub mod stackfmt;

#[cfg(feature = "cli")]
pub mod analysis;
#[cfg(feature = "cli")]
pub mod export;
#[cfg(feature = "cli")]
pub mod run;
#[cfg(feature = "cli")]
pub mod simulate;
#[cfg(feature = "cli")]
pub mod summary;
#[cfg(feature = "cli")]
pub mod symbolize;
