//! The frees PyTorch's allocator was asked for and has not completed at once (a block other
//! streams still use), held per device until the device's next event says whether the
//! completion follows (one record for both) or waits (the request recorded on its own), and
//! recorded at exit where none came ([`super::torch`] calls these from its tracker).

use crate::trace;
use core::sync::atomic::{AtomicU64, Ordering};

/// A free requested on a device and not recorded yet (its address, 0 for none; size; stream).
/// PyTorch completes almost every free at once, within the same hold of the device's allocator
/// lock, and one `tensor_free` record then stands for both events; a block its streams still
/// use is completed later, and its request is recorded on its own as the device's next event
/// comes, on whichever thread (PyTorch's `memory_allocated()` drops at the request). Each
/// device's events come one at a time, under its lock, so a slot is never written by two
/// threads at once; its fields are atomics only to be shared.
struct Requested {
    addr: AtomicU64,
    size: AtomicU64,
    stream: AtomicU64,
}

/// The devices with a slot of their own; a free on a device past them is recorded at once, as
/// a request then a completion.
const DEVICE_SLOTS: usize = 64;
static REQUESTED: [Requested; DEVICE_SLOTS] = [const {
    Requested {
        addr: AtomicU64::new(0),
        size: AtomicU64::new(0),
        stream: AtomicU64::new(0),
    }
}; DEVICE_SLOTS];

/// The free requested on `device` not yet recorded, taken out (address 0: none).
pub fn take(device: u8) -> (u64, u64, u64) {
    let Some(slot) = REQUESTED.get(device as usize) else {
        return (0, 0, 0);
    };
    let addr = slot.addr.swap(0, Ordering::Acquire);
    if addr == 0 {
        return (0, 0, 0);
    }
    (
        addr,
        slot.size.load(Ordering::Relaxed),
        slot.stream.load(Ordering::Relaxed),
    )
}

/// Holds a free requested on `device` until its next event; false where it has no slot.
pub fn hold(device: u8, addr: u64, size: u64, stream: u64) -> bool {
    let Some(slot) = REQUESTED.get(device as usize) else {
        return false;
    };
    slot.size.store(size, Ordering::Relaxed);
    slot.stream.store(stream, Ordering::Relaxed);
    slot.addr.store(addr, Ordering::Release);
    true
}

/// At exit (called by the trace's own handler, before it marks the exit clean): each device's
/// free requested last and not yet recorded, recorded.
pub fn record_at_exit() {
    for device in 0..DEVICE_SLOTS as u8 {
        let (p, n, s) = take(device);
        if p != 0 {
            trace::record(trace::Event::tensor_free_requested(p, n, device).on(s));
        }
    }
}
