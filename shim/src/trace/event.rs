//! What the shim records: one constructor per kind of record (per kind and source where two
//! sources write one kind: a segment of PyTorch's or of the pool's), saying what its numbers
//! mean; and what each kind brings with it (a
//! stack, the library that asked, a fresh NVML sample) as methods of the event, so the recorder
//! holds no rule of its own about kinds. No record is built past them ([`Event::record`]).

use gpushim_core::trace::format::{self, Api, DEVICE_UNKNOWN, Record, RecordKind};

/// One record about to be written, before the recorder adds when and which thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub(super) kind: RecordKind,
    pub(super) api: Api,
    pub(super) rc: i32,
    pub(super) ptr: u64,
    pub(super) size: u64,
    pub(super) device: u8,
    /// The stream handle (0: none); the recorder interns it.
    pub(super) stream: u64,
}

impl Event {
    const fn of(kind: RecordKind, api: Api, rc: i32, ptr: u64, size: u64, device: u8) -> Event {
        Event {
            kind,
            api,
            rc,
            ptr,
            size,
            device,
            stream: 0,
        }
    }

    /// Device memory allocated by a synchronous call (`cudaMalloc`, `cuMemAlloc`, the pitched
    /// and 3D forms), or the pool's answer to one: the call's result `rc`, the address (0 when
    /// it failed), the bytes, the device.
    pub const fn alloc(api: Api, rc: i32, ptr: u64, size: u64, device: u8) -> Event {
        Event::of(RecordKind::Alloc, api, rc, ptr, size, device)
    }

    /// Device memory allocated in stream order (`cudaMallocAsync`, from a CUDA pool, a graph's
    /// memory node), on `stream` (0: none or the legacy stream).
    pub const fn alloc_async(
        api: Api,
        rc: i32,
        ptr: u64,
        size: u64,
        device: u8,
        stream: u64,
    ) -> Event {
        Event::of(RecordKind::AllocAsync, api, rc, ptr, size, device).on(stream)
    }

    /// Managed memory (`cudaMallocManaged`): address, bytes, the device current then.
    pub const fn managed_alloc(api: Api, rc: i32, ptr: u64, size: u64, device: u8) -> Event {
        Event::of(RecordKind::ManagedAlloc, api, rc, ptr, size, device)
    }

    /// Device memory given back synchronously (`cudaFree`, `cuMemFree`) at `ptr`; the device
    /// where known (the pool knows its blocks'; CUDA's own call does not say).
    pub const fn free(api: Api, rc: i32, ptr: u64, device: u8) -> Event {
        Event::of(RecordKind::Free, api, rc, ptr, 0, device)
    }

    /// Device memory given back in stream order (`cudaFreeAsync`, a graph's free node) on
    /// `stream`.
    pub const fn free_async(api: Api, rc: i32, ptr: u64, device: u8, stream: u64) -> Event {
        Event::of(RecordKind::FreeAsync, api, rc, ptr, 0, device).on(stream)
    }

    /// Pinned host memory allocated (`cudaMallocHost`, `cudaHostAlloc`, `cuMemHostAlloc`):
    /// address and bytes.
    pub const fn host_alloc(api: Api, rc: i32, ptr: u64, size: u64) -> Event {
        Event::of(RecordKind::HostAlloc, api, rc, ptr, size, DEVICE_UNKNOWN)
    }

    /// Pinned host memory freed at `ptr`.
    pub const fn host_free(api: Api, rc: i32, ptr: u64) -> Event {
        Event::of(RecordKind::HostFree, api, rc, ptr, 0, DEVICE_UNKNOWN)
    }

    /// A VMM physical allocation made (`cuMemCreate`): its handle, bytes and device.
    pub const fn phys_create(api: Api, rc: i32, handle: u64, size: u64, device: u8) -> Event {
        Event::of(RecordKind::PhysCreate, api, rc, handle, size, device)
    }

    /// A VMM physical allocation released (`cuMemRelease`): its handle.
    pub const fn phys_release(api: Api, rc: i32, handle: u64) -> Event {
        Event::of(RecordKind::PhysRelease, api, rc, handle, 0, DEVICE_UNKNOWN)
    }

    /// A range of virtual addresses mapped to physical memory (`cuMemMap`): start and bytes.
    pub const fn map(api: Api, rc: i32, ptr: u64, size: u64) -> Event {
        Event::of(RecordKind::Map, api, rc, ptr, size, DEVICE_UNKNOWN)
    }

    /// A mapped range unmapped (`cuMemUnmap`): start and bytes.
    pub const fn unmap(api: Api, rc: i32, ptr: u64, size: u64) -> Event {
        Event::of(RecordKind::Unmap, api, rc, ptr, size, DEVICE_UNKNOWN)
    }

    /// Virtual addresses reserved (`cuMemAddressReserve`): start (0 when it failed) and bytes.
    pub const fn address_reserve(api: Api, rc: i32, ptr: u64, size: u64) -> Event {
        Event::of(
            RecordKind::AddressReserve,
            api,
            rc,
            ptr,
            size,
            DEVICE_UNKNOWN,
        )
    }

    /// Reserved virtual addresses given back (`cuMemAddressFree`): start and bytes.
    pub const fn address_free(api: Api, rc: i32, ptr: u64, size: u64) -> Event {
        Event::of(RecordKind::AddressFree, api, rc, ptr, size, DEVICE_UNKNOWN)
    }

    /// Access to a mapped range granted (`cuMemSetAccess`): start and bytes.
    pub const fn set_access(api: Api, rc: i32, ptr: u64, size: u64) -> Event {
        Event::of(RecordKind::SetAccess, api, rc, ptr, size, DEVICE_UNKNOWN)
    }

    /// The process used a stream other than the legacy one for the first time (`stream`, by
    /// the call `api`): the pool's blocks freed with `cudaFree` wait for the device from then.
    pub const fn pool_streams(api: Api, stream: u64) -> Event {
        Event::of(RecordKind::PoolStreams, api, 0, stream, 0, DEVICE_UNKNOWN)
    }

    /// What `cudaMemGetInfo` answered: free and total bytes.
    pub const fn mem_info(api: Api, rc: i32, free: u64, total: u64, device: u8) -> Event {
        Event::of(RecordKind::MemInfo, api, rc, free, total, device)
    }

    /// What the program was shown instead (after `limit` and the pool's idle cache).
    pub const fn mem_info_shown(api: Api, free: u64, total: u64, device: u8) -> Event {
        Event::of(RecordKind::MemInfoShown, api, 0, free, total, device)
    }

    /// A tensor PyTorch's allocator handed out: address, bytes (as asked), device.
    pub const fn tensor_alloc(ptr: u64, size: u64, device: u8) -> Event {
        Event::of(RecordKind::TensorAlloc, Api::Torch, 0, ptr, size, device)
    }

    /// A tensor PyTorch was asked to free (its block may wait for streams that used it).
    pub const fn tensor_free_requested(ptr: u64, size: u64, device: u8) -> Event {
        Event::of(
            RecordKind::TensorFreeRequested,
            Api::Torch,
            0,
            ptr,
            size,
            device,
        )
    }

    /// A tensor's block back in PyTorch's cache, reusable.
    pub const fn tensor_free(ptr: u64, size: u64, device: u8) -> Event {
        Event::of(RecordKind::TensorFree, Api::Torch, 0, ptr, size, device)
    }

    /// PyTorch could not make a tensor of `size` bytes: `free` is the free memory CUDA
    /// reported to it then.
    pub const fn tensor_oom(free: u64, size: u64, device: u8) -> Event {
        Event::of(RecordKind::TensorOom, Api::Torch, 0, free, size, device)
    }

    /// The thread's latest tensor or segment record of PyTorch's belongs to the private pool
    /// whose id (PyTorch's `MempoolId_t`) is `(first, second)`.
    pub const fn tensor_pool(first: u64, second: u64, device: u8) -> Event {
        Event::of(RecordKind::TensorPool, Api::Torch, 0, first, second, device)
    }

    /// A node of PyTorch's autograd graph: its sequence number, the string id of its class.
    pub const fn graph_node(sequence: u64, class: u64) -> Event {
        Event::of(
            RecordKind::GraphNode,
            Api::Torch,
            0,
            sequence,
            class,
            DEVICE_UNKNOWN,
        )
    }

    /// Input `index` of node `sequence` came from `from` (`format::graph` says how each
    /// `status` reads `size`).
    pub const fn graph_edge(sequence: u64, index: u64, status: u8, from: u64) -> Event {
        Event::of(
            RecordKind::GraphEdge,
            Api::Torch,
            status as i32,
            format::graph::pack(sequence, index),
            from,
            DEVICE_UNKNOWN,
        )
    }

    /// A walk of the graph ended (`outcome`, a `format::graph` code) after `nodes` nodes and
    /// `edges` edges.
    pub const fn graph_walked(nodes: u64, edges: u64, outcome: u8) -> Event {
        Event::of(
            RecordKind::Graph,
            Api::Torch,
            outcome as i32,
            nodes,
            edges,
            DEVICE_UNKNOWN,
        )
    }

    /// A segment PyTorch's allocator took (`pages`: pages of an expandable segment mapped).
    pub const fn framework_segment_reserve(ptr: u64, size: u64, device: u8, pages: bool) -> Event {
        Event::of(
            RecordKind::SegmentReserve,
            Api::Torch,
            pages as i32,
            ptr,
            size,
            device,
        )
    }

    /// A segment PyTorch's allocator gave back (`pages`: pages of an expandable segment
    /// unmapped).
    pub const fn framework_segment_release(ptr: u64, size: u64, device: u8, pages: bool) -> Event {
        Event::of(
            RecordKind::SegmentRelease,
            Api::Torch,
            pages as i32,
            ptr,
            size,
            device,
        )
    }

    /// Whether PyTorch's tensors are recorded from here on (`why`: a `tensors_off` code).
    pub const fn tensors(on: bool, why: u64) -> Event {
        Event::of(
            RecordKind::Tensors,
            Api::Torch,
            0,
            why,
            on as u64,
            DEVICE_UNKNOWN,
        )
    }

    /// The shim's pool took a segment of `size` bytes at `ptr` from CUDA on `device`.
    pub const fn pool_segment_reserve(ptr: u64, size: u64, device: u8) -> Event {
        Event::of(RecordKind::SegmentReserve, Api::Shim, 0, ptr, size, device)
    }

    /// The shim's pool gave a segment back to CUDA.
    pub const fn pool_segment_release(ptr: u64, size: u64, device: u8) -> Event {
        Event::of(RecordKind::SegmentRelease, Api::Shim, 0, ptr, size, device)
    }

    /// The device had no room for a segment of `size`; the pool released its idle cache and
    /// the retry succeeded.
    pub const fn oom_retry(size: u64, device: u8) -> Event {
        Event::of(RecordKind::OomRetry, Api::Shim, 0, 0, size, device)
    }

    /// The device had no room for a segment of `size`, even after the cache was released.
    pub const fn out_of_memory(size: u64, device: u8) -> Event {
        Event::of(RecordKind::OutOfMemory, Api::Shim, 0, 0, size, device)
    }

    /// A segment of `size` would have taken the process past `limit`.
    pub const fn limit_hit(size: u64, device: u8) -> Event {
        Event::of(RecordKind::LimitHit, Api::Shim, 0, 0, size, device)
    }

    /// The pool waited for `device` to finish its work (to reuse fenced blocks).
    pub const fn pool_sync(device: u8) -> Event {
        Event::of(RecordKind::PoolSync, Api::Shim, 0, 0, 0, device)
    }

    /// The pool split cached blocks `splits` times on `device` since its last such record.
    pub const fn splits(splits: u64, device: u8) -> Event {
        Event::of(RecordKind::Split, Api::Shim, 0, 0, splits, device)
    }

    /// The pool's checkpoint `id` on `device` made (`passed` false) or passed by the GPU.
    pub const fn pool_checkpoint(id: u64, passed: bool, device: u8) -> Event {
        Event::of(
            RecordKind::PoolCheckpoint,
            Api::Shim,
            0,
            id,
            passed as u64,
            device,
        )
    }

    /// A pooled block at `ptr` exported for another process (`bytes` the size it was asked
    /// for), a block another process exported opened at `ptr`, or one closed.
    pub const fn ipc_export(ptr: u64, bytes: u64, device: u8) -> Event {
        Event::of(RecordKind::IpcExport, Api::Shim, 0, ptr, bytes, device)
    }
    pub const fn ipc_open(ptr: u64, device: u8) -> Event {
        Event::of(RecordKind::IpcOpen, Api::Shim, 0, ptr, 0, device)
    }
    pub const fn ipc_close(ptr: u64, device: u8) -> Event {
        Event::of(RecordKind::IpcClose, Api::Shim, 0, ptr, 0, device)
    }

    /// A thread's first record in this trace: its kernel thread id and its index here.
    pub const fn thread_start(tid: u64, index: u16) -> Event {
        Event::of(
            RecordKind::ThreadStart,
            Api::Shim,
            0,
            tid,
            index as u64,
            DEVICE_UNKNOWN,
        )
    }

    /// A stream's first use in this trace: its handle and the index records name it by.
    pub const fn stream_name(handle: u64, index: u16) -> Event {
        Event::of(
            RecordKind::StreamName,
            Api::Shim,
            0,
            handle,
            index as u64,
            DEVICE_UNKNOWN,
        )
    }

    /// The stack of the thread's previous record: its id, and its depth with PyTorch's
    /// autograd sequence number above it (`format::RecordKind::StackRef`).
    pub const fn stack_ref(stack: u64, depth_and_sequence: u64) -> Event {
        Event::of(
            RecordKind::StackRef,
            Api::Shim,
            0,
            stack,
            depth_and_sequence,
            DEVICE_UNKNOWN,
        )
    }

    /// Who called CUDA for the thread's previous record: the first return address outside
    /// the shim and the next one (0: none).
    pub const fn caller(first: u64, second: u64) -> Event {
        Event::of(
            RecordKind::Caller,
            Api::Shim,
            0,
            first,
            second,
            DEVICE_UNKNOWN,
        )
    }

    /// A loaded module at `base`, its path's string id; and its build-id's string id.
    pub const fn module(base: u64, path: u64) -> Event {
        Event::of(RecordKind::Module, Api::Shim, 0, base, path, DEVICE_UNKNOWN)
    }
    pub const fn module_build_id(base: u64, id: u64) -> Event {
        Event::of(
            RecordKind::ModuleBuildId,
            Api::Shim,
            0,
            base,
            id,
            DEVICE_UNKNOWN,
        )
    }

    /// The record this event is, written at `time_ns` by `thread` (its stream by index).
    pub const fn record(self, time_ns: u64, thread: u16, stream: u16) -> Record {
        Record {
            kind: self.kind,
            api: self.api,
            device: self.device,
            status: format::status_byte(self.rc),
            thread,
            time_ns,
            ptr: self.ptr,
            size: self.size,
            stream,
        }
    }

    /// What NVML says this process uses on `device` (the device's whole use when
    /// `device_wide`), of `total`.
    pub const fn nvml(bytes: u64, total: u64, device: u8, device_wide: bool) -> Event {
        Event::of(
            RecordKind::DeviceMemory,
            Api::Shim,
            device_wide as i32,
            bytes,
            total,
            device,
        )
    }

    /// What one of CUDA's own pools on `device` reserves and uses (`which`: 0 the default
    /// pool, 1 graph memory, 2 the pools the program created, together).
    pub const fn cuda_pool(which: u8, reserved: u64, used: u64, device: u8) -> Event {
        Event::of(
            RecordKind::CudaPool,
            Api::Shim,
            which as i32,
            reserved,
            used,
            device,
        )
    }

    /// An NVTX range pushed on the calling thread: its message's string id, its zero-based
    /// level (0: the outermost, as `nvtxRangePushA` returns it).
    pub const fn range_push(message: u64, depth: u64) -> Event {
        Event::of(
            RecordKind::RangePush,
            Api::Nvtx,
            0,
            message,
            depth,
            DEVICE_UNKNOWN,
        )
    }

    /// The calling thread's innermost NVTX range popped: its zero-based level, the depth
    /// after.
    pub const fn range_pop(depth: u64) -> Event {
        Event::of(RecordKind::RangePop, Api::Nvtx, 0, 0, depth, DEVICE_UNKNOWN)
    }

    /// An NVTX mark: its message's string id.
    pub const fn mark(message: u64) -> Event {
        Event::of(RecordKind::Mark, Api::Nvtx, 0, message, 0, DEVICE_UNKNOWN)
    }

    /// An NVTX start/end range started: its message's string id and its range id.
    pub const fn range_start(message: u64, range: u64) -> Event {
        Event::of(
            RecordKind::RangeStart,
            Api::Nvtx,
            0,
            message,
            range,
            DEVICE_UNKNOWN,
        )
    }

    /// An NVTX start/end range ended: its range id.
    pub const fn range_end(range: u64) -> Event {
        Event::of(RecordKind::RangeEnd, Api::Nvtx, 0, 0, range, DEVICE_UNKNOWN)
    }

    /// The same event on stream `stream` (a handle; 0 for none).
    pub const fn on(self, stream: u64) -> Event {
        Event { stream, ..self }
    }

    /// Whether the allocating thread's stack follows it: every call of the program's and the
    /// framework's (the pool's own notes follow the call that caused them, which has it).
    pub fn takes_stack(&self) -> bool {
        self.api != Api::Shim
            && !matches!(
                self.kind,
                RecordKind::TensorPool
                    | RecordKind::GraphNode
                    | RecordKind::GraphEdge
                    | RecordKind::Graph
            )
    }

    /// Whether the library that asked for it is recorded after it (a `Caller` record): the
    /// program's own device allocations that succeeded, not the framework's tensors, whose
    /// owner is the framework.
    pub fn names_caller(&self) -> bool {
        self.rc == 0
            && matches!(
                self.kind,
                RecordKind::Alloc
                    | RecordKind::AllocAsync
                    | RecordKind::ManagedAlloc
                    | RecordKind::PhysCreate
            )
            && !matches!(self.api, Api::Torch | Api::Pluggable)
    }

    /// Whether the device's memory may have moved with it, so NVML is asked again soon
    /// (tensors come and go inside the framework's segments, which are recorded themselves).
    pub fn moves_device_memory(&self) -> bool {
        self.rc != 0
            || matches!(
                self.kind,
                RecordKind::Alloc
                    | RecordKind::AllocAsync
                    | RecordKind::ManagedAlloc
                    | RecordKind::Free
                    | RecordKind::FreeAsync
                    | RecordKind::PhysCreate
                    | RecordKind::PhysRelease
                    | RecordKind::SegmentReserve
                    | RecordKind::SegmentRelease
            ) && !matches!(self.api, Api::Torch | Api::Pluggable)
            || self.kind == RecordKind::TensorOom
    }
}
