//! The reports as text for the terminal: each takes a report's data and writes it, nothing
//! else (no trace read, no report computed). The reports' JSON is their own serialized data;
//! pictures and the page are `export`'s. Nothing in the reports uses this layer.

pub mod device_memory;
pub mod fit;
mod fit_jobs;
pub mod holders;
pub mod job;
pub mod leaks;
pub mod oom;
pub mod peak;
pub mod summary;
pub mod torch_allocator;
