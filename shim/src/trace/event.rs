//! What the shim records: one constructor per kind of record, saying what its numbers mean, and
//! what each kind brings with it (a stack, the library that asked, a fresh NVML sample) as
//! methods of the event, so the recorder holds no rule of its own about kinds.

use gpushim_core::trace::format::{Api, DEVICE_UNKNOWN, RecordKind};

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

    /// A note of the shim about its own doings (the pool's segments, splits, waits, IPC; what
    /// the record kind says `ptr` and `size` mean).
    pub const fn note(kind: RecordKind, ptr: u64, size: u64, device: u8) -> Event {
        Event::of(kind, Api::Shim, 0, ptr, size, device)
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
