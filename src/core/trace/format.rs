//! The trace file format, shared by the writer (the shim) and the reader (the command).
//!
//! A trace is one file: a 4 KiB header followed by fixed-size 32-byte records, all little-endian.
//! Record `i` lives at `HEADER_SIZE + i * RECORD_SIZE`. Writers claim an index with one atomic
//! add on the header's `claimed` counter, fill the record, and store the commit word last with
//! release ordering. A record whose commit word does not match its index was claimed but never
//! finished (the process died in between): the reader counts it as torn and decodes nothing from
//! it.

/// First eight bytes of every trace.
pub const MAGIC: [u8; 8] = *b"GPUSHIM\0";
/// Bumped whenever the layout of the header or of a record changes.
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 4096;
pub const RECORD_SIZE: usize = 32;

/// Byte offsets of the header fields.
pub mod header {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const RECORD_SIZE: usize = 12;
    pub const HEADER_SIZE: usize = 16;
    pub const PID: usize = 20;
    pub const RANK: usize = 24;
    pub const FLAGS: usize = 28;
    /// `CLOCK_REALTIME` at the moment the clock origin was taken, in ns since the Unix epoch.
    pub const START_REALTIME_NS: usize = 32;
    /// `CLOCK_MONOTONIC` origin: record timestamps are ns since this instant.
    pub const START_MONOTONIC_NS: usize = 40;
    /// Atomic: records claimed so far (the next free index).
    pub const CLAIMED: usize = 64;
    /// Atomic: records lost because the trace reached its size cap.
    pub const LOST: usize = 72;
    /// Atomic: the largest number of records the file may hold (in a ring: the ring's slots).
    pub const CAPACITY: usize = 80;
    /// Non-zero when the records form a ring (see [`super::ring`]): record `i` lives in slot
    /// `i % CAPACITY`, and what the oldest said is kept in the newest checkpoint.
    pub const RING: usize = 88;
    /// Atomic: records that left the ring before the summarizer read them (it fell behind).
    pub const SUMMARY_LOST: usize = 96;
    /// File offset of the checkpoint area (two slots, one after the other).
    pub const CHECKPOINT_AREA: usize = 104;
    /// Bytes of one checkpoint slot.
    pub const CHECKPOINT_SLOT_BYTES: usize = 112;
    /// Atomic: checkpoints that did not fit their slot (or could not be written).
    pub const CHECKPOINTS_FAILED: usize = 120;
    /// Atomic: definitions (strings, stacks, modules) the shim could not keep apart from the
    /// ring (its log of them was full): one the ring overwrote before it was summarized is
    /// lost, and the reports say so where they would name it.
    pub const DEFINITIONS_DROPPED: usize = 3456;
    /// Two checkpoint descriptors of [`super::ring::DESCRIPTOR_BYTES`] each (see
    /// [`super::ring::Descriptor`]).
    pub const CHECKPOINTS: usize = 2304;
    /// NUL-separated `NAME=value` settings of the program's libraries at the start (PyTorch's
    /// `PYTORCH_ALLOC_CONF`, `PYTORCH_CUDA_ALLOC_CONF`): `simulate --torch` replays them.
    /// Empty in traces from before it was kept.
    pub const ENV: usize = 2432;
    pub const ENV_LEN: usize = 1024;
    pub const HOST: usize = 128;
    pub const HOST_LEN: usize = 64;
    pub const PROGRAM: usize = 192;
    pub const PROGRAM_LEN: usize = 64;
    /// NUL-separated command line, truncated to fit.
    pub const CMDLINE: usize = 256;
    pub const CMDLINE_LEN: usize = 2048;
}

/// Header flag: the process reached `exit` and closed the trace cleanly.
pub const FLAG_CLEAN_EXIT: u32 = 1;

/// A trace of any length: the records form a ring, and a helper thread of the traced process
/// keeps what the oldest records said in a checkpoint.
///
/// The ring holds `CAPACITY` slots; record `i` (the `i`-th claimed) lives in slot
/// `i % CAPACITY` and carries the commit word of `i`, so a slot left over from an earlier lap is
/// told from a record of this one. The checkpoint area after the ring holds two slots, written
/// in turn; a descriptor in the header says which records a checkpoint covers. A checkpoint is
/// itself a stream of records (definitions verbatim, then `Restore` and `Holding` records and
/// the live allocations), so the reader decodes it as it decodes the ring: the newest
/// checkpoint first, then every ring record from the index it covers on.
pub mod ring {
    /// Bytes of one checkpoint descriptor in the header.
    pub const DESCRIPTOR_BYTES: usize = 32;

    /// A checkpoint descriptor: `seq` is written last (0: empty), so a reader that finds the
    /// same non-zero `seq` before and after reading the slot read a whole checkpoint.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Descriptor {
        /// Which checkpoint this is (1, 2, ...); the larger of the two is the newest.
        pub seq: u64,
        /// Records in the slot.
        pub records: u64,
        /// Every ring record with a smaller index is in the checkpoint.
        pub covered: u64,
        /// A checksum of the slot's records (FNV-1a of their bytes, see [`checksum`]).
        pub checksum: u64,
    }

    impl Descriptor {
        pub fn decode(b: &[u8]) -> Descriptor {
            let at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
            Descriptor {
                seq: at(0),
                records: at(8),
                covered: at(16),
                checksum: at(24),
            }
        }
    }

    /// The checksum of a checkpoint's bytes.
    pub fn checksum(bytes: &[u8]) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}

/// What a `Restore` record restores (its `status` byte). A checkpoint opens with `BEGIN` and
/// closes with `END`; between them the records stand for state, not for calls the program made.
pub mod restore {
    /// `ptr`: the ring index the checkpoint covers up to; `size`: records summarized;
    /// `time_ns`: the time of the latest of them.
    pub const BEGIN: u8 = 0;
    pub const END: u8 = 1;
    /// The live allocations that follow (until the next `SITE`) share this call site: `ptr`
    /// the stack id, `size` the NVTX range's string id, `time_ns` the forward stack a backward
    /// tensor's autograd sequence number joined it to (0: none; `trace::backward`); a `Caller`
    /// record follows with who called CUDA for them.
    pub const SITE: u8 = 2;
    /// A VMM physical allocation backing a framework's segment: `ptr` handle, `size`, device.
    pub const FRAMEWORK_PHYSICAL: u8 = 3;
    /// A segment of the framework (`api` torch) or the pool: `ptr` base, `size`, device.
    pub const SEGMENT: u8 = 4;
    /// The framework's tensors on `device`: `ptr` bytes live, `size` their peak.
    pub const TENSOR_BYTES: u8 = 5;
    /// The most live on `device` at once: `ptr` bytes, `time_ns` when first reached.
    pub const DEVICE_PEAK: u8 = 6;
    /// Pinned host memory: `ptr` its peak.
    pub const HOST_PEAK: u8 = 7;
    /// NVML's figure for `device`: `ptr` latest, `time_ns` highest, `size` total, `thread` 1
    /// when it was the whole device's.
    pub const NVML: u8 = 8;
    /// `ptr`: frees of memory the trace never saw allocated.
    pub const UNMATCHED: u8 = 9;
    /// The latest `cudaMemGetInfo` of `device`: `ptr` free, `size` total.
    pub const MEM_INFO: u8 = 10;
    /// An open start/end NVTX range: `ptr` its string id, `size` its range id.
    pub const STARTED: u8 = 11;
    /// An open push/pop NVTX range of `thread`, outermost first: `ptr` its string id.
    pub const RANGE_OPEN: u8 = 12;
    /// Calls of `api` summarized: `ptr` calls, `time_ns` bytes allocated, `size` failures.
    pub const API: u8 = 13;
    /// What was live at one moment, by call site (the `Holding` records that follow): `device`,
    /// `ptr` live bytes, `size` reserved bytes, `time_ns` when; `thread` 0 for the device's
    /// peak, 1 for a failed allocation (whose records follow the holdings).
    pub const SNAPSHOT: u8 = 14;
    /// More of the snapshot before: `ptr` the largest free block, `size` the device's free
    /// memory as CUDA last said plus one (0: never asked).
    pub const SNAPSHOT_MORE: u8 = 15;
    /// An iteration boundary: `ptr` its number in the run, `time_ns` when, `size` live bytes
    /// on every device then; the
    /// `Holding` records that follow give live bytes by call site (only those that changed
    /// since the boundary before, `device` 0xff).
    pub const BOUNDARY: u8 = 16;
    /// What marks the iterations of the boundaries: `ptr` an NVTX string id (`thread` 0) or a
    /// call-site key (`thread` 1); `size` boundaries seen in all.
    pub const BOUNDARY_MARK: u8 = 17;
    // 18: not used.
    /// `thread`'s latest allocation, which a `StackRef` to come names: `ptr`.
    pub const LAST_ALLOC: u8 = 19;
    /// `thread`'s latest allocation, which a `Caller` to come names: `ptr`, `size` 1 for a
    /// VMM handle.
    pub const AWAITING_CALLER: u8 = 20;
    /// A VMM handle `thread` made that a framework segment to come may claim: `ptr`.
    pub const PENDING_PHYSICAL: u8 = 21;
    /// One point of the coarse series of memory over time: `device`, `ptr` live bytes, `size`
    /// reserved bytes, `time_ns` when (the highest live of its stretch of time).
    pub const SERIES: u8 = 22;
    /// Live allocations the checkpoint had no room to list one by one, summed by call site
    /// into stand-ins (addresses from `SUMMED_BASE`): `device`, `ptr` allocations, `size`
    /// bytes. A later free of one of them is not matched.
    pub const SUMMED: u8 = 23;

    /// The holding's count of allocations, kept in `thread` (low) and `stream` (high).
    pub fn count_of(r: &super::Record) -> u64 {
        u64::from(r.thread) | (u64::from(r.stream) << 16)
    }

    /// `count` split into `thread` (low) and `stream` (high), saturating at 2^32 - 1.
    pub fn split_count(count: u64) -> (u16, u16) {
        let c = count.min(u64::from(u32::MAX));
        (c as u16, (c >> 16) as u16)
    }
}

/// Byte offsets inside a record.
pub mod record {
    /// u16 commit word, written last. Equals [`super::commit_tag`] of the record's index.
    pub const COMMIT: usize = 0;
    pub const KIND: usize = 2;
    pub const API: usize = 3;
    pub const DEVICE: usize = 4;
    pub const STATUS: usize = 5;
    pub const THREAD: usize = 6;
    pub const TIME_NS: usize = 8;
    pub const PTR: usize = 16;
    /// Low 48 bits: size in bytes. High 16 bits: interned stream index (0 when no stream).
    pub const SIZE_STREAM: usize = 24;
}

/// The largest size a record holds exactly (256 TiB); larger sizes are clamped to it.
pub const SIZE_MAX: u64 = (1 << 48) - 1;

/// The commit word for record `index`: never zero, and different for neighbouring records, so a
/// record copied to the wrong place or left over from garbage is caught.
pub const fn commit_tag(index: u64) -> u16 {
    (index as u16 & 0x7fff) | 0x8000
}

/// Bytes of string text one `StringData` record carries.
pub const STRING_BYTES_PER_RECORD: usize = 16;
/// Longest string stored; longer ones are cut.
pub const STRING_MAX: usize = 256;

/// Bytes of a build-id the shim records (GNU ld writes 20, a SHA-1; `--build-id=0x...` any
/// number): its hex text fits in a string.
pub const BUILD_ID_MAX: usize = 64;

/// Device number used when the device is not known.
pub const DEVICE_UNKNOWN: u8 = 0xff;

/// Status stored for a result code that does not fit in a byte.
pub const STATUS_OTHER: u8 = 0xff;

pub const fn status_byte(code: i32) -> u8 {
    if code >= 0 && code < STATUS_OTHER as i32 {
        code as u8
    } else {
        STATUS_OTHER
    }
}

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
        /// NVTX `nvtxRangePush*`: `ptr` is the message's string id, `size` the new depth.
        RangePush = 18 => "range_push",
        /// NVTX `nvtxRangePop`: `size` is the depth of the range that ended.
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

/// One decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: RecordKind,
    pub api: Api,
    pub device: u8,
    /// The CUDA result code, as [`status_byte`] stored it.
    pub status: u8,
    pub thread: u16,
    pub time_ns: u64,
    pub ptr: u64,
    pub size: u64,
    pub stream: u16,
}

impl Record {
    /// Encodes everything but the commit word, which the writer stores last.
    /// Whether the call failed: a CUDA result code other than success. PyTorch's segment
    /// records use the byte to say "pages mapped" instead (see `SegmentReserve`).
    pub fn failed(&self) -> bool {
        self.status != 0
            && !(self.api == Api::Torch
                && matches!(
                    self.kind,
                    RecordKind::SegmentReserve | RecordKind::SegmentRelease
                ))
    }

    /// A PyTorch segment record of pages mapped or unmapped in an expandable segment.
    pub fn mapped_pages(&self) -> bool {
        self.api == Api::Torch
            && self.status == 1
            && matches!(
                self.kind,
                RecordKind::SegmentReserve | RecordKind::SegmentRelease
            )
    }

    pub fn encode_body(&self, out: &mut [u8; RECORD_SIZE]) {
        out[record::KIND] = self.kind as u8;
        out[record::API] = self.api as u8;
        out[record::DEVICE] = self.device;
        out[record::STATUS] = self.status;
        out[record::THREAD..record::THREAD + 2].copy_from_slice(&self.thread.to_le_bytes());
        out[record::TIME_NS..record::TIME_NS + 8].copy_from_slice(&self.time_ns.to_le_bytes());
        out[record::PTR..record::PTR + 8].copy_from_slice(&self.ptr.to_le_bytes());
        let size_stream = self.size.min(SIZE_MAX) | (u64::from(self.stream) << 48);
        out[record::SIZE_STREAM..record::SIZE_STREAM + 8]
            .copy_from_slice(&size_stream.to_le_bytes());
    }

    /// Decodes a committed record body; `None` when the kind or API byte is not one we know.
    pub fn decode(bytes: &[u8; RECORD_SIZE]) -> Option<Record> {
        let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let size_stream = u64_at(record::SIZE_STREAM);
        Some(Record {
            kind: RecordKind::from_u8(bytes[record::KIND])?,
            api: Api::from_u8(bytes[record::API])?,
            device: bytes[record::DEVICE],
            status: bytes[record::STATUS],
            thread: u16_at(record::THREAD),
            time_ns: u64_at(record::TIME_NS),
            ptr: u64_at(record::PTR),
            size: size_stream & SIZE_MAX,
            stream: (size_stream >> 48) as u16,
        })
    }

    pub fn commit_of(bytes: &[u8; RECORD_SIZE]) -> u16 {
        u16::from_le_bytes([bytes[record::COMMIT], bytes[record::COMMIT + 1]])
    }
}

/// A stack frame that is a Python frame rather than a return address: the top byte is this
/// tag (no user-space address has it), bits 24..56 hold the id of the interned string
/// `file\0function`, bits 0..24 the line. Stacks list Python frames first, innermost first,
/// then any native frames.
pub const PY_FRAME_TAG: u64 = 0xfe << 56;

/// The stack frame of a Python frame (see [`PY_FRAME_TAG`]); a line past 2^24 - 1 saturates.
pub fn py_frame(string_id: u64, line: u32) -> u64 {
    PY_FRAME_TAG | ((string_id & 0xffff_ffff) << 24) | u64::from(line.min(0xff_ffff))
}

/// The string id and line of a Python frame; `None` for a native frame.
pub fn as_py_frame(frame: u64) -> Option<(u64, u32)> {
    (frame >> 56 == PY_FRAME_TAG >> 56)
        .then_some(((frame >> 24) & 0xffff_ffff, frame as u32 & 0xff_ffff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_through_its_bytes() {
        let r = Record {
            kind: RecordKind::AllocAsync,
            api: Api::CudaMallocAsyncPtsz,
            device: 3,
            status: 2,
            thread: 513,
            time_ns: 0x0102_0304_0506_0708,
            ptr: 0x7f00_dead_beef_0000,
            size: (1 << 40) + 17,
            stream: 4242,
        };
        let mut b = [0u8; RECORD_SIZE];
        r.encode_body(&mut b);
        assert_eq!(Record::decode(&b), Some(r));
        assert_eq!(
            Record::commit_of(&b),
            0,
            "the body encoder must leave the commit word alone"
        );
    }

    #[test]
    fn sizes_beyond_48_bits_are_clamped_not_mixed_into_the_stream() {
        let r = Record {
            kind: RecordKind::AddressReserve,
            api: Api::CuMemAddressReserve,
            device: 0,
            status: 0,
            thread: 0,
            time_ns: 0,
            ptr: 0,
            size: u64::MAX,
            stream: 7,
        };
        let mut b = [0u8; RECORD_SIZE];
        r.encode_body(&mut b);
        let d = Record::decode(&b).unwrap();
        assert_eq!(d.size, SIZE_MAX);
        assert_eq!(d.stream, 7);
    }

    #[test]
    fn commit_tags_are_never_zero_and_differ_between_neighbours() {
        for i in 0..100_000u64 {
            assert_ne!(commit_tag(i), 0);
            assert_ne!(commit_tag(i), commit_tag(i + 1));
        }
    }

    #[test]
    fn status_byte_keeps_small_codes_and_folds_large_ones() {
        assert_eq!(status_byte(0), 0);
        assert_eq!(status_byte(35), 35);
        assert_eq!(status_byte(500), STATUS_OTHER);
        assert_eq!(status_byte(-1), STATUS_OTHER);
    }

    #[test]
    fn every_enum_value_decodes_to_itself() {
        for k in RecordKind::ALL {
            assert_eq!(RecordKind::from_u8(*k as u8), Some(*k));
        }
        for a in Api::ALL {
            assert_eq!(Api::from_u8(*a as u8), Some(*a));
        }
        assert_eq!(RecordKind::from_u8(0), None);
        assert_eq!(Api::from_u8(0), None);
    }

    #[test]
    fn python_frames_round_trip_and_never_read_as_native_addresses() {
        let f = py_frame(12345, 678);
        assert_eq!(as_py_frame(f), Some((12345, 678)));
        assert_eq!(as_py_frame(py_frame(1, u32::MAX)), Some((1, 0xff_ffff)));
        // User-space addresses (below 2^56) are never Python frames.
        assert_eq!(as_py_frame(0x7fff_ffff_f000), None);
        assert_eq!(as_py_frame((1 << 56) - 1), None);
    }
}
