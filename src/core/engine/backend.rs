//! What the engine needs from a device, and nothing more (the `prim` layer of mimalloc's
//! design): reserve and release device memory, and know when earlier GPU work is done.
//! The shim implements it over real CUDA; tests and `gpushim simulate` over memory.

/// The device said no.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory;

/// A point in the GPU's work queues: once it is done, nothing enqueued before it can still
/// touch memory. Fences are cheap to make and to query.
pub trait Backend {
    type Fence: Clone;

    /// Reserves `size` bytes of device memory (a segment), 256-byte aligned at least.
    fn reserve(&mut self, device: u8, size: u64) -> Result<u64, OutOfMemory>;
    /// Returns a segment obtained from `reserve`.
    fn release(&mut self, device: u8, ptr: u64, size: u64);
    /// A fence after all work enqueued so far on every stream of `device` (for `cudaFree`).
    fn fence_device(&mut self, device: u8) -> Self::Fence;
    /// A fence after all work enqueued so far on `stream` (for `cudaFreeAsync`).
    fn fence_stream(&mut self, device: u8, stream: u64) -> Self::Fence;
    /// Whether the fence has passed. Must not block.
    fn passed(&mut self, fence: &Self::Fence) -> bool;
    /// Waits until every fence made so far on `device` has passed.
    fn synchronize(&mut self, device: u8);
    /// A number that grows whenever fences pass (any measure will do); the engine merges
    /// blocks kept apart while fenced when it changed.
    fn progress(&mut self) -> u64 {
        0
    }
    /// Makes progress on fences without blocking (the CUDA backend records the events of
    /// pending fences and queries earlier ones). `wanted`: the engine takes fresh memory
    /// unless a fence passes now, which costs more than any checkpoint, so none is put off.
    /// Returns whether any fence may have passed.
    fn poll(&mut self, _device: u8, _wanted: bool) -> bool {
        false
    }
    /// Hears of a decision of the engine, for the trace.
    fn note(&mut self, _event: Event) {}
    /// Reserves `size` bytes of address space with nothing behind it, for an expandable segment
    /// (`cuMemAddressReserve`). A backend without it answers `Err` and the engine makes plain
    /// segments.
    fn reserve_address(&mut self, _device: u8, _size: u64) -> Result<u64, OutOfMemory> {
        Err(OutOfMemory)
    }
    /// Backs `[ptr, ptr + size)` of a reserved range with device memory (`cuMemCreate` +
    /// `cuMemMap` + `cuMemSetAccess`); both are multiples of the 2 MiB granularity.
    fn map(&mut self, _device: u8, _ptr: u64, _size: u64) -> Result<(), OutOfMemory> {
        Err(OutOfMemory)
    }
    /// Gives the memory behind `[ptr, ptr + size)` back (`cuMemUnmap` + `cuMemRelease`).
    fn unmap(&mut self, _device: u8, _ptr: u64, _size: u64) {}
    /// Whether the device must be left alone now: no fence polled or waited for, no memory
    /// given back (the shim: while a stream capture is under way anywhere in the process,
    /// where CUDA would refuse such calls or fold them into the graph). Reserving stays
    /// allowed.
    fn quiet(&mut self) -> bool {
        false
    }
    /// While quiet, whether a plain segment with nothing allocated may still be given back
    /// when the device is out of memory, whatever its fences (the shim: during a stream
    /// capture, where its frees run in relaxed capture mode, which CUDA allows during any
    /// capture, and a segment's free waits for the device as the program's own `cudaFree`
    /// would have; never during a device reset). Without it the pool would refuse an
    /// allocation that CUDA, which had the program's frees, would have served.
    fn release_while_quiet(&mut self) -> bool {
        false
    }
    /// A monotonic clock in nanoseconds, for the age of idle memory (`Engine::trim`).
    fn now(&mut self) -> u64 {
        0
    }
}

/// The engine's decisions that explain memory: written to the trace by the shim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A segment was obtained from the device, or an expandable segment grew by `size` at
    /// `ptr`.
    SegmentReserve { device: u8, ptr: u64, size: u64 },
    /// A segment went back to the device, or an expandable segment shrank by `size` at `ptr`.
    SegmentRelease { device: u8, ptr: u64, size: u64 },
    /// A cached block was split; the rest (`ptr`, `size`) stays cached.
    Split { device: u8, ptr: u64, size: u64 },
    /// The device had no room for a segment of `size`; the cache was released and the retry
    /// succeeded.
    OomRetry { device: u8, size: u64 },
    /// The device had no room for `size` even after the cache was released.
    OutOfMemory { device: u8, size: u64 },
    /// A segment of `size` would have taken the device past `limit`.
    LimitHit { device: u8, size: u64 },
    /// The engine waited for the device so that fenced blocks could be reused.
    Synchronize { device: u8 },
}

/// A backend over ordinary memory: addresses are handed out from a large virtual range and
/// never touched, and fences pass when the test says so (`complete_all`) or at `synchronize`.
/// Used by the property tests and by `gpushim simulate`.
#[derive(Debug)]
pub struct MemoryBackend {
    pub next_address: u64,
    /// Device memory per device; reservations past it fail.
    pub capacity: u64,
    reserved: [u64; 256],
    /// Fences made so far and the count that has passed.
    fences_made: u64,
    fences_passed: u64,
    /// Calls to `reserve` and `release`, like cudaMalloc and cudaFree calls.
    pub reserve_calls: u64,
    /// Calls to `reserve` that failed.
    pub failed_reserves: u64,
    pub release_calls: u64,
    pub synchronize_calls: u64,
    /// What `quiet` answers (a capture under way).
    pub quiet: bool,
    /// What `release_while_quiet` answers.
    pub release_while_quiet: bool,
    /// Every fence passes as it is made (a GPU that keeps up).
    pub instant: bool,
    /// What `now` answers.
    pub clock: u64,
}

impl MemoryBackend {
    pub fn new(capacity: u64) -> MemoryBackend {
        MemoryBackend {
            next_address: 0x7f00_0000_0000,
            capacity,
            reserved: [0; 256],
            fences_made: 0,
            fences_passed: 0,
            reserve_calls: 0,
            failed_reserves: 0,
            release_calls: 0,
            synchronize_calls: 0,
            quiet: false,
            release_while_quiet: false,
            instant: false,
            clock: 0,
        }
    }

    /// Lets every fence made so far pass, as if the GPU caught up.
    pub fn complete_all(&mut self) {
        self.fences_passed = self.fences_made;
    }

    pub fn reserved(&self, device: u8) -> u64 {
        self.reserved[device as usize]
    }

    /// Fences made so far; they are numbered from 1 in order.
    pub fn fences_made(&self) -> u64 {
        self.fences_made
    }

    /// Every fence up to this number has passed.
    pub fn fences_passed(&self) -> u64 {
        self.fences_passed
    }

    /// Lets every fence up to number `n` pass.
    pub fn pass_up_to(&mut self, n: u64) {
        self.fences_passed = self.fences_passed.max(n.min(self.fences_made));
    }
}

impl Backend for MemoryBackend {
    type Fence = u64;

    fn reserve(&mut self, device: u8, size: u64) -> Result<u64, OutOfMemory> {
        self.reserve_calls += 1;
        let d = &mut self.reserved[device as usize];
        if size > self.capacity || *d + size > self.capacity {
            self.failed_reserves += 1;
            return Err(OutOfMemory);
        }
        *d += size;
        let p = self.next_address;
        // Leave a gap so neighbouring segments are never contiguous by accident.
        self.next_address += size.div_ceil(1 << 21) * (1 << 21) + (1 << 21);
        Ok(p)
    }

    fn release(&mut self, device: u8, _ptr: u64, size: u64) {
        assert!(
            !self.quiet || self.release_while_quiet,
            "the engine freed device memory while it had to stay quiet"
        );
        self.release_calls += 1;
        self.reserved[device as usize] -= size;
    }

    fn fence_device(&mut self, _device: u8) -> u64 {
        self.fences_made += 1;
        if self.instant {
            self.fences_passed = self.fences_made;
        }
        self.fences_made
    }

    fn fence_stream(&mut self, device: u8, _stream: u64) -> u64 {
        self.fence_device(device)
    }

    fn passed(&mut self, fence: &u64) -> bool {
        *fence <= self.fences_passed
    }

    fn progress(&mut self) -> u64 {
        self.fences_passed
    }

    fn synchronize(&mut self, _device: u8) {
        assert!(
            !self.quiet,
            "the engine waited for the device while it had to stay quiet"
        );
        self.synchronize_calls += 1;
        self.fences_passed = self.fences_made;
    }

    fn reserve_address(&mut self, _device: u8, size: u64) -> Result<u64, OutOfMemory> {
        let p = self.next_address;
        self.next_address += size.div_ceil(1 << 21) * (1 << 21) + (1 << 21);
        Ok(p)
    }

    fn map(&mut self, device: u8, _ptr: u64, size: u64) -> Result<(), OutOfMemory> {
        self.reserve(device, size).map(|_| ())
    }

    fn unmap(&mut self, device: u8, ptr: u64, size: u64) {
        self.release(device, ptr, size);
    }

    fn quiet(&mut self) -> bool {
        self.quiet
    }

    fn release_while_quiet(&mut self) -> bool {
        self.release_while_quiet
    }

    fn now(&mut self) -> u64 {
        self.clock
    }
}
