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

#[derive(Clone, Copy)]
struct Hot {
    /// The block as the engine knows it.
    info: BlockInfo,
    ptr: u64,
    requested: u64,
    size: u64,
    device: u8,
    /// The stream it was freed on (cached) or allocated for (live).
    key: u64,
    used: bool,
    /// Freed by the program and waiting here; otherwise handed out again.
    cached: bool,
    stamp: u64,
}

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
    hot_bytes: [u64; 256],
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
            hot: [Hot {
                info: BlockInfo {
                    ptr: 0,
                    size: 0,
                    requested: 0,
                    device: 0,
                    stream: 0,
                    segment: 0,
                    segment_size: 0,
                },
                ptr: 0,
                requested: 0,
                size: 0,
                device: 0,
                key: 0,
                used: false,
                cached: false,
                stamp: 0,
            }; HOT],
            hot_bytes: [0; 256],
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
        if let Some(i) = self.hot.iter().position(|h| {
            h.used && h.cached && h.device == device && h.key == key && h.requested == size
        }) {
            let h = &mut self.hot[i];
            h.cached = false;
            self.hot_bytes[device as usize] -= h.size;
            self.hot_requested -= h.requested;
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
        if let Some(i) = self.hot.iter().position(|h| h.used && h.ptr == ptr) {
            let h = self.hot[i];
            if h.cached {
                return Freed::Invalid;
            }
            if let FreeKind::OnStream(k) = kind {
                self.clock += 1;
                let e = &mut self.hot[i];
                e.cached = true;
                e.key = k;
                e.stamp = self.clock;
                self.hot_bytes[h.device as usize] += h.size;
                self.hot_requested += h.requested;
                return Freed::Done(h.device);
            }
            // A synchronous free needs the engine's fence.
            self.hot[i].used = false;
        }
        if kind == FreeKind::Sync {
            // Straight to the engine: one lookup there instead of two.
            return match self.engine.free_on(ptr, kind) {
                Ok((_, device)) => Freed::Done(device),
                Err(()) if self.engine.in_segment(ptr) => Freed::Invalid,
                Err(()) => Freed::NotOurs,
            };
        }
        let Some(b) = self.engine.lookup(ptr).filter(|b| b.ptr == ptr) else {
            return if self.engine.in_segment(ptr) {
                Freed::Invalid
            } else {
                Freed::NotOurs
            };
        };
        match kind {
            // A block of a sealed segment (exported through IPC) is never kept for reuse.
            FreeKind::OnStream(k) if b.size <= HOT_MAX_BLOCK && !self.engine.sealed(ptr) => {
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
        match self.hot.iter().find(|h| h.used && h.ptr == b.ptr) {
            Some(h) if h.cached => None,
            _ => Some(b),
        }
    }

    /// Keeps a block just freed on `key` (live in the engine) for reuse; when the list is
    /// full, the least recently used cached block goes back to the engine.
    fn keep(&mut self, b: &BlockInfo, key: u64) {
        self.clock += 1;
        let i = match self.hot.iter().position(|h| !h.used) {
            Some(i) => i,
            None => {
                let Some(i) = (0..HOT)
                    .filter(|&i| self.hot[i].cached)
                    .min_by_key(|&i| self.hot[i].stamp)
                else {
                    // Every entry is live: this block goes to the engine.
                    let _ = self.engine.free(b.ptr, FreeKind::OnStream(key));
                    return;
                };
                self.evict(i);
                i
            }
        };
        self.hot[i] = Hot {
            info: *b,
            ptr: b.ptr,
            requested: b.requested,
            size: b.size,
            device: b.device,
            key,
            used: true,
            cached: true,
            stamp: self.clock,
        };
        self.hot_bytes[b.device as usize] += b.size;
        self.hot_requested += b.requested;
    }

    /// Gives entry `i` up: a cached block goes to the engine, as the free on its stream it
    /// stands for.
    fn evict(&mut self, i: usize) {
        let h = self.hot[i];
        self.hot[i].used = false;
        if h.cached {
            self.hot_bytes[h.device as usize] -= h.size;
            self.hot_requested -= h.requested;
            let _ = self.engine.free(h.ptr, FreeKind::OnStream(h.key));
        }
    }

    /// Gives every cached block of `device` (of all devices with `None`) to the engine.
    pub fn flush(&mut self, device: Option<u8>) {
        for i in 0..HOT {
            let h = self.hot[i];
            if h.used && h.cached && device.is_none_or(|d| h.device == d) {
                self.evict(i);
            }
        }
    }

    /// Stream `stream` is gone: its cached blocks go to the engine, which retires the handle.
    pub fn retire_stream(&mut self, stream: u64) {
        for i in 0..HOT {
            if self.hot[i].used && self.hot[i].key == stream {
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
            if h.used && h.cached && h.device == device && h.stamp <= before {
                self.evict(i);
            }
        }
        self.engine.trim(device, age);
    }

    /// Seals the segment of live block `ptr` (see `Engine::seal_segment`); a block waiting in
    /// the list is not live.
    pub fn seal(&mut self, ptr: u64) -> bool {
        self.lookup(ptr).is_some() && self.engine.seal_segment(ptr)
    }

    /// Sets whether a synchronous free that empties a segment gives it back at once (decided by
    /// the shim at the first allocation, for `trim:auto`).
    pub fn set_release_on_free(&mut self, on: bool) {
        self.engine.set_release_on_free(on);
    }

    /// Releases every idle segment of `device`.
    pub fn empty_cache(&mut self, device: u8) {
        self.flush(Some(device));
        self.engine.empty_cache(device);
    }
}
