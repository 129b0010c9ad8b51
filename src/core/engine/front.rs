//! The front of the pool: the engine plus a short list of small blocks freed stream-ordered,
//! kept out of the engine for the next request of the same size on the same stream (the common
//! case of a training loop, served without the engine's maps). The engine counts them as
//! allocated; the front counts them as idle. The shim runs this, and `gpushim simulate` replays
//! traces through it, so a replay predicts exactly what the shim's pool did.

use super::{AllocError, Backend, BlockInfo, Engine, FreeKind, Policy, SMALL_REQUEST};

/// Entries in the list.
pub const HOT: usize = 32;
/// Only blocks up to this size are kept, so memory held for a size that does not come back
/// stays small.
pub const HOT_MAX_BLOCK: u64 = SMALL_REQUEST;

/// One entry of the list, beyond what a search compares (see `Front::ptrs`, `Front::waiting`).
#[derive(Clone, Copy)]
struct Hot {
    /// The block as the engine knows it.
    info: BlockInfo,
    /// The stream it was freed on (cached) or allocated for (live).
    key: u64,
    stamp: u64,
}

const EMPTY: Hot = Hot {
    info: BlockInfo {
        ptr: 0,
        size: 0,
        requested: 0,
        device: 0,
        stream: 0,
        segment: 0,
        segment_size: 0,
    },
    key: 0,
    stamp: 0,
};

/// What a free did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freed {
    /// The block went back to the pool; its device.
    Done(u8),
    /// `ptr` lies in pooled memory but is not a live block (interior, or freed already).
    Invalid,
    /// Not pooled memory.
    NotOurs,
}

pub struct Front<B: Backend> {
    pub engine: Engine<B>,
    hot: [Hot; HOT],
    /// Per entry, the block's address while the entry is in use (0: unused). Searches compare
    /// these and `waiting` alone, four cache lines each: in a real process the program evicts
    /// the list between two requests.
    ptrs: [u64; HOT],
    /// Per entry, the size the program asked for while the block waits here (0 otherwise).
    waiting: [u64; HOT],
    hot_bytes: [u64; 256],
    /// Entries in use (cached or handed out again): with none, a free looks at no entry.
    in_use: usize,
    /// Bytes requested for the blocks waiting in the list (all devices).
    hot_requested: u64,
    clock: u64,
    /// `clock` at the previous `trim`.
    trimmed_at: u64,
}

impl<B: Backend> Front<B> {
    pub fn new(backend: B, policy: Policy) -> Front<B> {
        Front {
            engine: Engine::new(backend, policy),
            hot: [EMPTY; HOT],
            ptrs: [0; HOT],
            waiting: [0; HOT],
            hot_bytes: [0; 256],
            in_use: 0,
            hot_requested: 0,
            clock: 0,
            trimmed_at: 0,
        }
    }

    /// Bytes the program asked for and holds now (blocks waiting in the list are not held).
    pub fn requested_live(&self) -> u64 {
        self.engine.stats().requested_bytes - self.hot_requested
    }

    /// Idle bytes on `device`: the engine's cache and the list's.
    pub fn idle(&self, device: u8) -> u64 {
        self.engine.idle(device) + self.hot_bytes[device as usize]
    }

    /// Serves `size` bytes on `device` for stream `key`.
    pub fn alloc(&mut self, device: u8, size: u64, key: u64) -> Result<BlockInfo, AllocError> {
        // No entry is looked at while none waits on this device (every request of a program
        // that frees with `cudaFree` alone).
        if self.hot_bytes[device as usize] > 0
            && let Some(i) = (0..HOT).find(|&i| {
                self.waiting[i] == size
                    && self.hot[i].key == key
                    && self.hot[i].info.device == device
            })
        {
            self.waiting[i] = 0;
            let h = &self.hot[i];
            self.hot_bytes[device as usize] -= h.info.size;
            self.hot_requested -= h.info.requested;
            return Ok(h.info);
        }
        let r = self.engine.alloc(device, size, key);
        if r.is_err() && self.hot_bytes[device as usize] > 0 {
            // Blocks waiting in the list count too: give them to the engine and try again.
            self.flush(Some(device));
            return self.engine.alloc(device, size, key);
        }
        r
    }

    /// Returns a block.
    pub fn free(&mut self, ptr: u64, kind: FreeKind) -> Freed {
        // 0 marks an unused entry: never a block.
        if ptr != 0
            && self.in_use > 0
            && let Some(i) = self.ptrs.iter().position(|&p| p == ptr)
        {
            if self.waiting[i] != 0 {
                return Freed::Invalid;
            }
            let info = self.hot[i].info;
            if let FreeKind::OnStream(k) = kind {
                self.clock += 1;
                self.waiting[i] = info.requested;
                let e = &mut self.hot[i];
                e.key = k;
                e.stamp = self.clock;
                self.hot_bytes[info.device as usize] += info.size;
                self.hot_requested += info.requested;
                return Freed::Done(info.device);
            }
            // A synchronous free needs the engine's fence.
            self.ptrs[i] = 0;
            self.in_use -= 1;
        }
        if kind == FreeKind::Sync {
            // Straight to the engine: one lookup there instead of two.
            return match self.engine.free_on(ptr, kind) {
                Ok((_, device)) => Freed::Done(device),
                Err(()) if self.engine.in_segment(ptr) => Freed::Invalid,
                Err(()) => Freed::NotOurs,
            };
        }
        let Some(b) = self.engine.block_at(ptr) else {
            return if self.engine.in_segment(ptr) {
                Freed::Invalid
            } else {
                Freed::NotOurs
            };
        };
        match kind {
            // A block of a exported segment (exported through IPC) is never kept for reuse.
            // (`waiting` marks a waiting block by its requested size, never 0.)
            FreeKind::OnStream(k)
                if b.size <= HOT_MAX_BLOCK && b.requested > 0 && !self.engine.exported(ptr) =>
            {
                self.keep(&b, k)
            }
            _ => {
                let _ = self.engine.free(ptr, kind);
            }
        }
        Freed::Done(b.device)
    }

    /// The live block containing `ptr`, if any (blocks waiting in the list are not live).
    pub fn lookup(&self, ptr: u64) -> Option<BlockInfo> {
        let b = self.engine.lookup(ptr)?;
        if self.in_use == 0 {
            return Some(b);
        }
        match self.ptrs.iter().position(|&p| p == b.ptr) {
            Some(i) if self.waiting[i] != 0 => None,
            _ => Some(b),
        }
    }

    /// Keeps a block just freed on `key` (live in the engine) for reuse; when the list is
    /// full, the least recently used cached block goes back to the engine.
    fn keep(&mut self, b: &BlockInfo, key: u64) {
        self.clock += 1;
        let i = match self.ptrs.iter().position(|&p| p == 0) {
            Some(i) => {
                self.in_use += 1;
                i
            }
            None => {
                let Some(i) = (0..HOT)
                    .filter(|&i| self.waiting[i] != 0)
                    .min_by_key(|&i| self.hot[i].stamp)
                else {
                    // Every entry is live: this block goes to the engine.
                    let _ = self.engine.free(b.ptr, FreeKind::OnStream(key));
                    return;
                };
                self.evict(i);
                self.in_use += 1;
                i
            }
        };
        self.hot[i] = Hot {
            info: *b,
            key,
            stamp: self.clock,
        };
        self.ptrs[i] = b.ptr;
        self.waiting[i] = b.requested;
        self.hot_bytes[b.device as usize] += b.size;
        self.hot_requested += b.requested;
    }

    /// Gives entry `i` up: a cached block goes to the engine, as the free on its stream it
    /// stands for.
    fn evict(&mut self, i: usize) {
        let h = self.hot[i];
        let cached = self.waiting[i] != 0;
        self.ptrs[i] = 0;
        self.waiting[i] = 0;
        self.in_use -= 1;
        if cached {
            self.hot_bytes[h.info.device as usize] -= h.info.size;
            self.hot_requested -= h.info.requested;
            let _ = self.engine.free(h.info.ptr, FreeKind::OnStream(h.key));
        }
    }

    /// Gives every cached block of `device` (of all devices with `None`) to the engine.
    pub fn flush(&mut self, device: Option<u8>) {
        for i in 0..HOT {
            if self.waiting[i] != 0 && device.is_none_or(|d| self.hot[i].info.device == d) {
                self.evict(i);
            }
        }
    }

    /// Stream `stream` is gone: its cached blocks go to the engine, which retires the handle.
    pub fn retire_stream(&mut self, stream: u64) {
        for i in 0..HOT {
            if self.ptrs[i] != 0 && self.hot[i].key == stream {
                self.evict(i);
            }
        }
        self.engine.retire_stream(stream);
    }

    /// Gives back memory of `device` idle for at least `age` (see `Engine::trim`). Blocks that
    /// waited in the list since the previous call go to the engine first.
    pub fn trim(&mut self, device: u8, age: u64) {
        let before = self.trimmed_at;
        self.trimmed_at = self.clock;
        for i in 0..HOT {
            let h = self.hot[i];
            if self.waiting[i] != 0 && h.info.device == device && h.stamp <= before {
                self.evict(i);
            }
        }
        self.engine.trim(device, age);
    }

    /// Marks the segment of live block `ptr` (see `Engine::mark_exported`); a block waiting in
    /// the list is not live.
    pub fn mark_exported(&mut self, ptr: u64) -> bool {
        self.lookup(ptr).is_some() && self.engine.mark_exported(ptr)
    }

    /// Sets whether a synchronous free that empties a segment gives it back at once (decided by
    /// the shim at the first allocation, for `trim:auto`).
    pub fn set_release_on_free(&mut self, on: bool) {
        self.engine.set_release_on_free(on);
    }

    /// The device lost all its memory (see `Engine::forget_device`): the list's entries of
    /// `device` are dropped with it.
    pub fn forget_device(&mut self, device: u8) -> Vec<(u64, u64)> {
        for i in 0..HOT {
            let h = self.hot[i];
            if self.ptrs[i] == 0 || h.info.device != device {
                continue;
            }
            if self.waiting[i] != 0 {
                self.hot_bytes[device as usize] -= h.info.size;
                self.hot_requested -= h.info.requested;
            }
            self.ptrs[i] = 0;
            self.waiting[i] = 0;
            self.in_use -= 1;
        }
        self.engine.forget_device(device)
    }

    /// Releases every idle segment of `device`.
    pub fn empty_cache(&mut self, device: u8) {
        self.flush(Some(device));
        self.engine.empty_cache(device);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::MemoryBackend;

    fn front() -> Front<MemoryBackend> {
        Front::new(MemoryBackend::new(1 << 34), Policy::default())
    }

    #[test]
    fn a_small_block_freed_on_a_stream_serves_the_same_size_on_that_stream_from_the_list() {
        let mut f = front();
        let a = f.alloc(0, 4096, 7).unwrap();
        assert_eq!(f.free(a.ptr, FreeKind::OnStream(7)), Freed::Done(0));
        assert_eq!(f.idle(0) - f.engine.idle(0), a.size, "waiting in the list");
        assert_eq!(f.requested_live(), 0);
        // Waiting, it is not live: a second free and a pointer query both say so.
        assert_eq!(f.free(a.ptr, FreeKind::OnStream(7)), Freed::Invalid);
        assert!(f.lookup(a.ptr).is_none());
        // Another size, another stream, another device: not this block.
        assert_ne!(f.alloc(0, 8192, 7).unwrap().ptr, a.ptr);
        assert_ne!(f.alloc(0, 4096, 8).unwrap().ptr, a.ptr);
        assert_ne!(f.alloc(1, 4096, 7).unwrap().ptr, a.ptr);
        let hits = f.engine.stats().cache_hits;
        let b = f.alloc(0, 4096, 7).unwrap();
        assert_eq!(b.ptr, a.ptr);
        assert_eq!(
            f.engine.stats().cache_hits,
            hits,
            "served without the engine"
        );
        assert_eq!(f.lookup(b.ptr).map(|i| i.ptr), Some(a.ptr));
        assert_eq!(f.requested_live(), 4096 + 8192 + 4096 + 4096);
    }

    #[test]
    fn a_block_from_the_list_freed_with_cudafree_goes_to_the_engine_behind_a_fence() {
        let mut f = front();
        let a = f.alloc(0, 4096, 7).unwrap();
        f.free(a.ptr, FreeKind::OnStream(7));
        let b = f.alloc(0, 4096, 7).unwrap();
        assert_eq!(b.ptr, a.ptr);
        f.engine.backend_mut().instant = false;
        assert_eq!(f.free(b.ptr, FreeKind::Sync), Freed::Done(0));
        assert_eq!(f.idle(0), f.engine.idle(0), "not kept in the list");
        // Fenced for every stream, its own included, until the device passes it.
        assert_ne!(f.alloc(0, 4096, 7).unwrap().ptr, a.ptr);
        f.engine.backend_mut().complete_all();
        assert_eq!(f.alloc(0, 4096, 9).unwrap().ptr, a.ptr);
        assert_eq!(f.free(a.ptr, FreeKind::Sync), Freed::Done(0));
        assert_eq!(f.free(a.ptr, FreeKind::Sync), Freed::Invalid);
        assert_eq!(f.free(0x10, FreeKind::Sync), Freed::NotOurs);
        // A null pointer is never an entry of the list, used or not.
        let c = f.alloc(0, 4096, 7).unwrap();
        f.free(c.ptr, FreeKind::OnStream(7));
        assert_eq!(f.free(0, FreeKind::OnStream(7)), Freed::NotOurs);
        assert_eq!(f.alloc(0, 4096, 7).unwrap().ptr, c.ptr);
    }

    #[test]
    fn a_full_list_gives_its_oldest_block_to_the_engine_and_flushes_when_memory_runs_out() {
        let mut f = front();
        let blocks: Vec<BlockInfo> = (0..=HOT as u64)
            .map(|i| f.alloc(0, 512 * (i + 1), 3).unwrap())
            .collect();
        for b in &blocks {
            f.free(b.ptr, FreeKind::OnStream(3));
        }
        // HOT entries wait; the first freed went to the engine when the last came.
        let waiting: u64 = blocks[1..].iter().map(|b| b.size).sum();
        assert_eq!(f.idle(0) - f.engine.idle(0), waiting);
        assert!(f.lookup(blocks[0].ptr).is_none());
        assert!(
            f.engine.lookup(blocks[0].ptr).is_none(),
            "free in the engine"
        );
        assert!(
            f.engine.lookup(blocks[1].ptr).is_some(),
            "live in the engine"
        );
        f.flush(Some(0));
        assert_eq!(f.idle(0), f.engine.idle(0));
        assert_eq!(f.requested_live(), 0);
        // Retiring a stream gives its blocks back too.
        let c = f.alloc(0, 1024, 5).unwrap();
        f.free(c.ptr, FreeKind::OnStream(5));
        assert!(f.engine.lookup(c.ptr).is_some());
        f.retire_stream(5);
        assert!(f.engine.lookup(c.ptr).is_none());
        assert_eq!(f.idle(0), f.engine.idle(0));
    }

    #[test]
    fn blocks_in_the_list_serve_a_request_that_would_otherwise_run_out_of_memory() {
        let mut f = Front::new(MemoryBackend::new(4 << 20), Policy::default());
        let a = f.alloc(0, 1 << 20, 1).unwrap();
        let b = f.alloc(0, 1 << 20, 1).unwrap();
        f.free(a.ptr, FreeKind::OnStream(1));
        f.free(b.ptr, FreeKind::OnStream(1));
        // 2 MiB of the 4 are free only in the list; a 3 MiB request needs them back.
        let c = f.alloc(0, 3 << 20, 1);
        assert!(c.is_ok(), "{c:?}");
        assert_eq!(f.idle(0), f.engine.idle(0));
    }
}
