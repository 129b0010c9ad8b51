//! The integration tests, one binary: each module a behaviour of the command, the shim or the
//! trace, over the CUDA simulator (`tests/sim`), the PyTorch stand-in (`tests/standin`) and
//! the programs in `tests/clients`; `common` builds them once per run. `docs/internals.md`
//! says what each proves.

mod common;

mod autograd_graph;
mod capture;
mod command;
mod crash_and_fork;
mod device_memory;
mod doc_files;
mod docs;
mod engine_model;
mod fit;
mod fit_answers;
mod fit_autocast;
mod fit_checkpoint;
mod fit_not_clean;
mod fit_reduce;
mod fit_shard;
mod fit_world;
mod hostile_folders;
mod hostile_traces;
mod hostile_writes;
mod interposition;
mod job_frames;
mod job_on_hosts;
mod kinds;
mod kinds_jobs;
mod kinds_zero;
mod layers;
mod long_runs;
mod newcomer;
mod nvtx;
mod page;
mod per_tensor;
mod pictures;
mod pool;
mod python_frames;
mod read_once;
mod real_runtime;
mod recorder;
mod reports;
mod simulator_fidelity;
mod stacks;
mod torch_allocator;
mod torch_frees;
mod torch_pluggable;
mod torch_tensors;
mod vmm_accounting;
mod what_if_replay;
