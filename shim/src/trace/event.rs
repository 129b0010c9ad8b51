//! What the shim records: one constructor per kind of record, or per family of kinds whose
//! numbers mean the same (a CUDA call's outcome, a tensor event of PyTorch's, an NVTX event, a
//! decision of the pool), saying what its numbers mean; and what each kind brings with it (a
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

    /// A CUDA call of the program's that made or released memory (or asked about it), as its
    /// row in the table of CUDA functions says, or the pool's answer to one (a block it served,
    /// an IPC export): its result `rc`, the address and size it is about (0 where none), and
    /// the device.
    pub const fn call(
        kind: RecordKind,
        api: Api,
        rc: i32,
        ptr: u64,
        size: u64,
        device: u8,
    ) -> Event {
        Event::of(kind, api, rc, ptr, size, device)
    }

    /// Device memory given back (`Free`, `FreeAsync`) at `ptr`.
    pub const fn release(kind: RecordKind, api: Api, rc: i32, ptr: u64) -> Event {
        Event::of(kind, api, rc, ptr, 0, DEVICE_UNKNOWN)
    }

    /// What `cudaMemGetInfo` answered: free and total bytes.
    pub const fn mem_info(api: Api, rc: i32, free: u64, total: u64, device: u8) -> Event {
        Event::of(RecordKind::MemInfo, api, rc, free, total, device)
    }

    /// What the program was shown instead (after `limit` and the pool's idle cache).
    pub const fn mem_info_shown(api: Api, free: u64, total: u64, device: u8) -> Event {
        Event::of(RecordKind::MemInfoShown, api, 0, free, total, device)
    }

    /// A tensor event of PyTorch's allocator (`TensorAlloc`, `TensorFreeRequested`,
    /// `TensorFree`; `TensorOom` with the free memory CUDA reported as `ptr`).
    pub const fn tensor(kind: RecordKind, ptr: u64, size: u64, device: u8) -> Event {
        Event::of(kind, Api::Torch, 0, ptr, size, device)
    }

    /// A segment PyTorch's allocator took or gave back (`SegmentReserve`, `SegmentRelease`);
    /// `pages`: pages of an expandable segment mapped or unmapped.
    pub const fn framework_segment(
        kind: RecordKind,
        ptr: u64,
        size: u64,
        device: u8,
        pages: bool,
    ) -> Event {
        Event::of(kind, Api::Torch, pages as i32, ptr, size, device)
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

    /// A decision of the shim's pool, as the engine's own typed event says it (its segments,
    /// waits, out-of-memory retries; `pool::backend` maps each to its kind, whose doc in
    /// `format::RecordKind` says what `ptr` and `size` mean).
    pub const fn pool_decision(kind: RecordKind, ptr: u64, size: u64, device: u8) -> Event {
        Event::of(kind, Api::Shim, 0, ptr, size, device)
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

    /// An NVTX range or mark (`RangePush`, `RangePop`, `Mark`, `RangeStart`, `RangeEnd`): `id`
    /// the string id of its message, `size` the depth or range id.
    pub const fn nvtx(kind: RecordKind, id: u64, size: u64) -> Event {
        Event::of(kind, Api::Nvtx, 0, id, size, DEVICE_UNKNOWN)
    }

    /// The same event on stream `stream` (a handle; 0 for none).
    pub const fn on(self, stream: u64) -> Event {
        Event { stream, ..self }
    }

    /// Whether the allocating thread's stack follows it: every call of the program's and the
    /// framework's (the pool's own notes follow the call that caused them, which has it).
    pub fn takes_stack(&self) -> bool {
        self.api != Api::Shim
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
