//! Every environment variable the shim reads, in two tables: its own ([`Switch`]) and those other
//! programs set that it reads ([`Foreign`]), each with its name and what it does. The shim's
//! own are read once, into `state::settings()` (the off switch apart, `state::enabled`); the
//! foreign ones where they are needed.
//! `GPUSHIM_CONF`'s keys are `gpushim_core::config::KEYS`. A test (`tests/docs.rs`) holds every
//! variable name the shim's code writes to these tables.

use core::ffi::CStr;

/// An environment switch of the shim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// `GPUSHIM_DISABLE=1`: every hook only forwards, nothing is written.
    Disable,
    /// `GPUSHIM_CONF`: the configuration (`pool:caching,limit:24GiB,...`).
    Conf,
    /// `GPUSHIM_TRACE`: the trace path pattern, or `off`.
    Trace,
    /// `GPUSHIM_RUN_REPORT=FOLDER`: set by `gpushim run` to a folder of the user's alone; each
    /// process that opens a trace leaves there a note of which file it wrote (its device,
    /// inode and path), so `run` reads only what its own processes wrote and names every trace
    /// itself at the end.
    RunReport,
    /// `GPUSHIM_COSTS=1`: measure the pool's own costs and print them at exit.
    Costs,
    /// `GPUSHIM_CTX_EVENTS=1`: checkpoints record one context-wide event (`cuCtxRecordEvent`).
    CtxEvents,
    /// `GPUSHIM_SEAL_SPACING=N`: the pool's checkpoint spacing, for measuring (1 to 1024).
    SealSpacing,
}

impl Switch {
    pub const fn name(self) -> &'static CStr {
        match self {
            Switch::Disable => c"GPUSHIM_DISABLE",
            Switch::Conf => c"GPUSHIM_CONF",
            Switch::Trace => c"GPUSHIM_TRACE",
            Switch::RunReport => c"GPUSHIM_RUN_REPORT",
            Switch::Costs => c"GPUSHIM_COSTS",
            Switch::CtxEvents => c"GPUSHIM_CTX_EVENTS",
            Switch::SealSpacing => c"GPUSHIM_SEAL_SPACING",
        }
    }

    /// Its value, if set (see [`crate::os::env`]: no allocation, unset in setuid programs).
    pub fn value(self) -> Option<&'static CStr> {
        crate::os::env(self.name())
    }

    /// Whether it is set to anything but empty or `0`.
    pub fn on(self) -> bool {
        crate::os::env_flag(self.name())
    }
}

/// A variable other programs set that the shim reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// `RANK` (torchrun, Slurm wrappers): the rank in the trace's name (`%r`) and header.
    Rank,
    /// `LOCAL_RANK`: the rank when `RANK` is not set.
    LocalRank,
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: PyTorch's cache is off, so it is no caching
    /// allocator above the pool (`trim:auto`).
    PytorchNoCaching,
    /// `XLA_PYTHON_CLIENT_ALLOCATOR=platform`: JAX's allocator does not cache (`trim:auto`).
    XlaAllocator,
    /// `PYTORCH_ALLOC_CONF` (PyTorch 2.8 on) and its older name `PYTORCH_CUDA_ALLOC_CONF`:
    /// PyTorch's allocator settings, kept in the trace's header for `simulate --torch`.
    PytorchAllocConf,
    PytorchCudaAllocConf,
    /// `CUBLAS_WORKSPACE_CONFIG` and `CUBLASLT_WORKSPACE_SIZE`: the sizes of the workspaces
    /// PyTorch allocates for cuBLAS through its own allocator, kept in the trace's header so
    /// the reports tell them from the tensors (`docs/kinds.md`).
    CublasWorkspaceConfig,
    CublasLtWorkspaceSize,
    /// `WORLD_SIZE` (torchrun): the job's ranks, kept in the trace's header for
    /// `fit --world-size`.
    WorldSize,
}

impl Foreign {
    pub const fn name(self) -> &'static CStr {
        match self {
            Foreign::Rank => c"RANK",
            Foreign::LocalRank => c"LOCAL_RANK",
            Foreign::PytorchNoCaching => c"PYTORCH_NO_CUDA_MEMORY_CACHING",
            Foreign::XlaAllocator => c"XLA_PYTHON_CLIENT_ALLOCATOR",
            Foreign::PytorchAllocConf => c"PYTORCH_ALLOC_CONF",
            Foreign::PytorchCudaAllocConf => c"PYTORCH_CUDA_ALLOC_CONF",
            Foreign::CublasWorkspaceConfig => c"CUBLAS_WORKSPACE_CONFIG",
            Foreign::CublasLtWorkspaceSize => c"CUBLASLT_WORKSPACE_SIZE",
            Foreign::WorldSize => c"WORLD_SIZE",
        }
    }

    /// Its value, if set (see [`crate::os::env`]).
    pub fn value(self) -> Option<&'static CStr> {
        crate::os::env(self.name())
    }
}
