//! What a record is: its kind (`RecordKind`) and the API that made it (`Api`), each a byte.

macro_rules! byte_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $var:ident = $val:literal => $text:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum $name { $($(#[$vm])* $var = $val,)* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$var,)*];

            pub const fn from_u8(v: u8) -> Option<$name> {
                match v { $($val => Some($name::$var),)* _ => None }
            }

            pub const fn name(self) -> &'static str {
                match self { $($name::$var => $text,)* }
            }
        }
    };
}

byte_enum! {
    /// What happened. The meaning of `ptr` and `size` depends on the kind.
    pub enum RecordKind {
        /// Device memory obtained synchronously: `ptr`, `size`.
        Alloc = 1 => "alloc",
        /// Device memory released synchronously: `ptr`.
        Free = 2 => "free",
        /// Stream-ordered allocation: `ptr`, `size`, stream.
        AllocAsync = 3 => "alloc_async",
        /// Stream-ordered free: `ptr`, stream.
        FreeAsync = 4 => "free_async",
        /// Pinned host memory: `ptr`, `size`.
        HostAlloc = 5 => "host_alloc",
        HostFree = 6 => "host_free",
        /// Managed (unified) memory: `ptr`, `size`.
        ManagedAlloc = 7 => "managed_alloc",
        /// VMM physical allocation: `ptr` is the handle, `size`.
        PhysCreate = 8 => "phys_create",
        /// VMM physical release: `ptr` is the handle.
        PhysRelease = 9 => "phys_release",
        /// VMM map of physical memory at `ptr`, `size` bytes.
        Map = 10 => "map",
        Unmap = 11 => "unmap",
        /// VMM virtual address range reserved at `ptr`, `size` bytes.
        AddressReserve = 12 => "address_reserve",
        AddressFree = 13 => "address_free",
        SetAccess = 14 => "set_access",
        /// `cudaMemGetInfo`/`cuMemGetInfo`: `ptr` holds the free bytes, `size` the total.
        MemInfo = 15 => "mem_info",
        /// A thread's first record: `ptr` is its kernel thread id, `size` its index.
        ThreadStart = 16 => "thread_start",
        /// A stream's first use: `ptr` is the stream handle, `size` its interned index.
        StreamName = 17 => "stream_name",
        /// NVTX `nvtxRangePush*`: `ptr` is the message's string id, `size` its zero-based
        /// level on its thread (0: the outermost).
        RangePush = 18 => "range_push",
        /// NVTX `nvtxRangePop`: `size` is the zero-based level of the range that ended.
        RangePop = 19 => "range_pop",
        /// NVTX `nvtxMark*`: `ptr` is the message's string id.
        Mark = 20 => "mark",
        /// NVTX `nvtxRangeStart*`: `ptr` is the message's string id, `size` the range id.
        RangeStart = 21 => "range_start",
        /// NVTX `nvtxRangeEnd`: `size` is the range id.
        RangeEnd = 22 => "range_end",
        /// A string's definition: `ptr` is its id, `size` its length in bytes. The text follows
        /// in the next `ceil(size / 16)` records, claimed together with this one.
        String = 23 => "string",
        /// 16 bytes of a string's text, in `time_ns` and `ptr` (little-endian).
        StringData = 24 => "string_data",
        /// A call stack's definition: `ptr` is its id, `size` its number of frames. The return
        /// addresses follow, two per `StackData` record, claimed together with this one.
        Stack = 25 => "stack",
        /// Two return addresses of a stack, in `time_ns` and `ptr`.
        StackData = 26 => "stack_data",
        /// The call stack of the thread's previous record: `ptr` is the stack id; `size` the
        /// stack's frame count in its low 8 bits and, above them, PyTorch's autograd sequence
        /// number (0: none): for a tensor of a thread running Python, the number its thread's
        /// next autograd node takes; on the autograd thread, the running node's + 1. Equal
        /// numbers join a backward tensor to its forward op's line (`trace::backward`).
        StackRef = 27 => "stack_ref",
        /// A loaded module, for offline symbolization: `ptr` is its load base, `size` the string
        /// id of its path.
        Module = 28 => "module",
        /// The pool obtained a segment from the device: `ptr`, `size`. For PyTorch's
        /// allocator (`api` `torch_allocator`), `status` 1 says pages mapped into an expandable
        /// segment rather than a segment of its own.
        SegmentReserve = 29 => "segment_reserve",
        /// The pool gave a segment back to the device.
        SegmentRelease = 30 => "segment_release",
        /// The pool split cached blocks: `size` splits since the device's last such record
        /// (`ptr` 0; written every 64 splits and at exit). Older traces have one
        /// per split, with the rest that stayed cached (`ptr`, `size`).
        Split = 31 => "split",
        /// The device was out of memory for a segment of `size`; the pool released its idle
        /// cache and the retry succeeded.
        OomRetry = 32 => "oom_retry",
        /// The device had no room for a segment of `size`, even after releasing the cache.
        OutOfMemory = 33 => "oom",
        /// A segment of `size` would have taken the process past `limit`.
        LimitHit = 34 => "limit_hit",
        /// The pool waited for the device so that freed blocks could be reused.
        PoolSync = 35 => "pool_sync",
        /// Free and total device memory as the process saw them (`cudaMemGetInfo` after
        /// `limit` and idle cache): `ptr` free, `size` total. Follows the real `MemInfo`.
        MemInfoShown = 36 => "mem_info_shown",
        /// A pooled block was exported through legacy IPC: `ptr`, its `size`.
        IpcExport = 37 => "ipc_export",
        /// Another process's memory was mapped here through legacy IPC at `ptr`.
        IpcOpen = 38 => "ipc_open",
        /// A pointer from an IPC open was closed.
        IpcClose = 39 => "ipc_close",
        /// The pool's single-stream rule ended: the process created or used a stream other
        /// than the legacy one (`ptr`, its handle), so a block freed with `cudaFree` waits
        /// for the device to catch up before reuse. `api` is the call that did it; its stack
        /// follows.
        PoolStreams = 40 => "pool_streams",
        /// A checkpoint of the pool's fences (events after every block freed before it): `ptr`
        /// is its number in its context, `size` 0 when made and 1 when it passed (its events
        /// completed, or the program synchronized the device). The time between the two is how
        /// far the GPU ran behind the host.
        PoolCheckpoint = 41 => "pool_checkpoint",
        /// The GNU build-id of the module whose `Module` record came just before at the same
        /// base: `ptr` is its load base, `size` the string id of the id in lowercase hex. The
        /// command names a module's frames only from a file with this id.
        ModuleBuildId = 42 => "module_build_id",
        /// A tensor that the framework's caching allocator handed out (PyTorch's allocator
        /// trace): `ptr`, `size`, stream. Its stack follows. The framework's segments are
        /// `SegmentReserve`/`SegmentRelease` records with `api` `torch_allocator`.
        TensorAlloc = 43 => "tensor_alloc",
        /// The program let go of a tensor (`ptr`, `size`) whose memory stays in use on other
        /// streams until its `TensorFree`. A free completed at once has no such record: its
        /// `TensorFree` stands for both.
        TensorFreeRequested = 44 => "tensor_free_requested",
        /// A tensor's memory went back to the framework's cache: `ptr`, `size` (requested then
        /// too, unless a `TensorFreeRequested` came first).
        TensorFree = 45 => "tensor_free",
        /// The framework's allocator ran out of memory for a tensor of `size` bytes; `ptr` is
        /// the free device memory CUDA reported. The stack of the request follows.
        TensorOom = 46 => "tensor_oom",
        /// Whether tensors are recorded: `size` 1 from here on, 0 not (then `ptr` says why:
        /// see `TensorsOff`).
        Tensors = 47 => "tensors",
        /// Who called the shim for the thread's latest device allocation: `ptr` is the first
        /// return address outside the shim, `size` the next one (which names the caller of the
        /// CUDA runtime when `ptr` lies in it). Reports name the library it lies in: the
        /// allocation's owner.
        Caller = 48 => "caller",
        /// What NVML says this process uses on device `device` (NVML's index): `ptr` bytes,
        /// `size` the device's total; `status` 1 when NVML did not list this process and the
        /// figure is the whole device's.
        DeviceMemory = 49 => "device_memory",
        /// State a checkpoint restores (see [`restore`]; the `status` byte says which).
        Restore = 50 => "restore",
        /// What one call site held at a snapshot or boundary: `device`, `ptr` its stack id (or
        /// call-site key), `size` its NVTX range's string id, `time_ns` bytes, the count of
        /// allocations in `thread` and `stream` ([`restore::count_of`]).
        Holding = 51 => "holding",
        /// What one of CUDA's own pools on device `device` holds: `ptr` the bytes it reserves,
        /// `size` the bytes its allocations use; `status` 0 for the device's default pool
        /// (`cudaMallocAsync`), 1 for graph memory, 2 for the pools the program created
        /// (`cudaMemPoolCreate`), together. Written by the shim's sampler once the
        /// program made a stream-ordered allocation, when a figure moved by a MiB or more.
        CudaPool = 52 => "cuda_pool",
        /// The thread's latest tensor or segment record of PyTorch's allocator (an alloc, a
        /// segment taken or given back, an out-of-memory) belongs to one of its private pools (a
        /// CUDA graph's, or a `torch.cuda.MemPool`), not to its default pools: `ptr` and `size`
        /// are the pool's id (PyTorch's `MempoolId_t`, a pair: the first set for a graph's own
        /// pool, the second for a pool made by `graph_pool_handle` or `MemPool`). Written after
        /// that record and its stack; records of the default pools have none.
        TensorPool = 53 => "tensor_pool",
        /// A node of PyTorch's autograd graph, read when a backward pass began (see
        /// `GraphEdge` and `Graph`): `ptr` its sequence number (what its forward op's tensors
        /// record, less one), `size` the string id of its class name (`MmBackward0`).
        GraphNode = 54 => "graph_node",
        /// Where one input of a graph node came from: `ptr` the node's sequence number, with
        /// the input's index above bit 40 ([`graph`] says how to read both words); `size`, by
        /// `status`: 0, the node that made it (its sequence number, and above bit 40 which of
        /// that node's outputs); 1, a node without a sequence number (a parameter's
        /// `AccumulateGrad`), named by its address; 2, none (an input that takes no gradient).
        GraphEdge = 55 => "graph_edge",
        /// The end of one walk of the graph, from the first node of a backward pass that
        /// allocated: `ptr` the nodes and `size` the edges written before it by this thread
        /// since its previous walk; `status` how the walk ended (see [`graph`]).
        Graph = 56 => "graph",
    }
}

/// How to read the autograd graph's records (`GraphNode`, `GraphEdge`, `Graph`).
pub mod graph {
    /// Sequence numbers lie below this bit; what a word holds above it is an index.
    pub const SHIFT: u32 = 40;
    /// `GraphEdge`'s `status`: the input came from the node numbered in `size`.
    pub const FROM_NODE: u8 = 0;
    /// The input came from a node without a sequence number (`AccumulateGrad`: a leaf the
    /// program made, a parameter), `size` its address.
    pub const FROM_LEAF: u8 = 1;
    /// The input takes no gradient.
    pub const FROM_NONE: u8 = 2;
    /// `Graph`'s `status`: the walk reached every node below the first.
    pub const WHOLE: u8 = 0;
    /// The walk stopped at the most nodes one walk records ([`NODES_MAX`]).
    pub const CUT: u8 = 1;
    /// A node did not read as PyTorch's `Node` does: the walk stopped, and no other follows.
    pub const LAYOUT: u8 = 2;
    /// The process may not read its own memory through `process_vm_readv` (a seccomp
    /// profile): no walk is made.
    pub const UNREADABLE: u8 = 3;
    /// The most nodes one walk records.
    pub const NODES_MAX: u64 = 1 << 15;

    /// A number and the index above it, as one word.
    pub const fn pack(number: u64, index: u64) -> u64 {
        (number & ((1 << SHIFT) - 1)) | (index << SHIFT)
    }

    /// The number and the index of a word made by [`pack`].
    pub const fn unpack(word: u64) -> (u64, u64) {
        (word & ((1 << SHIFT) - 1), word >> SHIFT)
    }

    /// Why a walk ended, in words.
    pub fn outcome(code: u8) -> &'static str {
        match code {
            WHOLE => "whole",
            CUT => "cut at its most nodes",
            LAYOUT => "a node did not read as PyTorch's Node",
            UNREADABLE => {
                "the process may not read its own memory (no pipe could be made, or reads were refused)"
            }
            _ => "unknown",
        }
    }
}

/// Why a trace holds no tensors of the framework's allocator (`Tensors` records, `ptr`).
pub mod tensors_off {
    /// Turned off in the configuration (`tensors:off`).
    pub const CONFIGURED: u64 = 1;
    /// The framework runs another allocator backend (PyTorch's `cudaMallocAsync` backend, a
    /// pluggable allocator): its tensors are the allocation calls themselves.
    pub const OTHER_BACKEND: u64 = 2;
    /// This version's library does not offer the trace in a form the shim knows.
    pub const UNKNOWN_VERSION: u64 = 3;
    /// The trace's first segment did not match the allocation the shim saw: its layout is not
    /// the one the shim reads.
    pub const MISMATCH: u64 = 4;
    /// The trace named an event the shim does not know.
    pub const UNKNOWN_EVENT: u64 = 5;

    /// Why, in words, for reports.
    pub fn reason(code: u64) -> &'static str {
        match code {
            CONFIGURED => "turned off (tensors:off)",
            OTHER_BACKEND => {
                "PyTorch runs another allocator backend (cudaMallocAsync, or a pluggable allocator), whose tensors are the allocation calls themselves"
            }
            UNKNOWN_VERSION => {
                "this PyTorch's libc10_cuda.so does not offer its allocator trace in a form gpushim knows (torch 2.4 to 2.11 do)"
            }
            MISMATCH => {
                "PyTorch's allocator trace did not match the segment gpushim saw, so its layout is not the one gpushim reads"
            }
            UNKNOWN_EVENT => "PyTorch's allocator trace named an event gpushim does not know",
            _ => "unknown reason",
        }
    }
}

impl RecordKind {
    /// Whether the record only defines what later records refer to (a string, a stack, a
    /// module and its build-id), rather than telling of something the program did: such
    /// records may come between a call's record and its `StackRef`.
    pub const fn is_definition(self) -> bool {
        use RecordKind::*;
        matches!(
            self,
            String | StringData | Stack | StackData | Module | ModuleBuildId | Caller
        )
    }
}

byte_enum! {
    /// Which entry point produced the record.
    pub enum Api {
        CudaMalloc = 1 => "cudaMalloc",
        CudaFree = 2 => "cudaFree",
        CudaMallocAsync = 3 => "cudaMallocAsync",
        CudaMallocAsyncPtsz = 4 => "cudaMallocAsync_ptsz",
        CudaFreeAsync = 5 => "cudaFreeAsync",
        CudaFreeAsyncPtsz = 6 => "cudaFreeAsync_ptsz",
        CudaMallocFromPoolAsync = 7 => "cudaMallocFromPoolAsync",
        CudaMallocFromPoolAsyncPtsz = 8 => "cudaMallocFromPoolAsync_ptsz",
        CudaMallocManaged = 9 => "cudaMallocManaged",
        CudaMallocHost = 10 => "cudaMallocHost",
        CudaHostAlloc = 11 => "cudaHostAlloc",
        CudaFreeHost = 12 => "cudaFreeHost",
        CudaMallocPitch = 13 => "cudaMallocPitch",
        CudaMalloc3D = 14 => "cudaMalloc3D",
        CudaMemGetInfo = 15 => "cudaMemGetInfo",
        CuMemAlloc = 32 => "cuMemAlloc_v2",
        CuMemFree = 33 => "cuMemFree_v2",
        CuMemAllocAsync = 34 => "cuMemAllocAsync",
        CuMemAllocAsyncPtsz = 35 => "cuMemAllocAsync_ptsz",
        CuMemFreeAsync = 36 => "cuMemFreeAsync",
        CuMemFreeAsyncPtsz = 37 => "cuMemFreeAsync_ptsz",
        CuMemAllocFromPoolAsync = 38 => "cuMemAllocFromPoolAsync",
        CuMemAllocFromPoolAsyncPtsz = 39 => "cuMemAllocFromPoolAsync_ptsz",
        CuMemAllocPitch = 40 => "cuMemAllocPitch_v2",
        CuMemAllocManaged = 41 => "cuMemAllocManaged",
        CuMemHostAlloc = 42 => "cuMemHostAlloc",
        CuMemFreeHost = 43 => "cuMemFreeHost",
        CuMemCreate = 44 => "cuMemCreate",
        CuMemRelease = 45 => "cuMemRelease",
        CuMemMap = 46 => "cuMemMap",
        CuMemUnmap = 47 => "cuMemUnmap",
        CuMemAddressReserve = 48 => "cuMemAddressReserve",
        CuMemAddressFree = 49 => "cuMemAddressFree",
        CuMemSetAccess = 50 => "cuMemSetAccess",
        CuMemGetInfo = 51 => "cuMemGetInfo_v2",
        /// Stream creation: named in the trace only by the pool's `pool_streams` note.
        CuStreamCreate = 52 => "cuStreamCreate",
        CuStreamCreateWithPriority = 53 => "cuStreamCreateWithPriority",
        /// A graph's memory node added directly (not captured): recorded as a stream-ordered
        /// allocation or free, as a captured `cudaMallocAsync` is.
        CudaGraphAddMemAllocNode = 54 => "cudaGraphAddMemAllocNode",
        CudaGraphAddMemFreeNode = 55 => "cudaGraphAddMemFreeNode",
        CuGraphAddMemAllocNode = 56 => "cuGraphAddMemAllocNode",
        CuGraphAddMemFreeNode = 57 => "cuGraphAddMemFreeNode",
        /// Records the shim writes about itself (threads, streams, strings).
        Shim = 100 => "gpushim",
        /// NVTX ranges and marks, through NVTX injection.
        Nvtx = 101 => "nvtx",
        /// PyTorch's pluggable-allocator entry points (`gpushim_alloc`, `gpushim_free`).
        Pluggable = 102 => "torch_pluggable",
        /// PyTorch's own caching allocator, seen through its allocator trace.
        Torch = 103 => "torch_allocator",
    }
}
