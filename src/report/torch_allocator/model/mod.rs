//! PyTorch's caching allocator, modelled: its settings ([`conf`]) and one device of it over
//! memory ([`model`]). `gpushim simulate --torch` replays a trace's tensors through it to show
//! what another `PYTORCH_CUDA_ALLOC_CONF` would have reserved.

pub mod conf;
pub mod device;

pub use conf::TorchConf;
pub use device::{DeviceLimits, Hint, Model, Refused, SegmentEvent, Stats};

#[cfg(test)]
mod tests;
