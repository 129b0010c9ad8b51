//! What the pool tells the program it asks: `cudaMemGetInfo` with cached memory counted free,
//! and PyTorch's statistics of the pool's blocks when the pool serves its allocator.

use super::*;

/// What `cudaMemGetInfo` shows the process: idle cached memory counts as free (the process can
/// allocate it), and with `limit` the total is capped and the free figure kept under it.
pub fn mem_info(real_free: u64, real_total: u64) -> (u64, u64) {
    let Some(slot) = current_slot() else {
        return (real_free, real_total);
    };
    let (reserved, idle, limit) = with(|p| {
        (
            p.engine.reserved(slot),
            p.idle(slot),
            p.engine.policy().limit,
        )
    });
    let mut total = real_total;
    let mut free = real_free.saturating_add(idle);
    if limit > 0 {
        total = total.min(limit);
        free = free.min(limit.saturating_sub(reserved - idle));
    }
    (free.min(total), total)
}

/// The pool's figures for CUDA device `device`, every context on it added up; `None` without a
/// pool (or for a device it never served, which reads as zeros: `Some` of the default).
pub fn device_stats(device: u8) -> Option<DeviceStats> {
    if !serves_calls() {
        return None;
    }
    Some(with(|p| {
        let mut sum = DeviceStats::default();
        for slot in slots_on(device) {
            sum.add(&p.engine.device_stats(slot));
        }
        sum
    }))
}

/// Resets the peaks (`peaks`) or the totals of device `device`'s figures; false without a pool.
pub fn reset_device_stats(device: u8, peaks: bool) -> bool {
    if !serves_calls() {
        return false;
    }
    with(|p| {
        for slot in slots_on(device) {
            let d = p.engine.device_stats_mut(slot);
            if peaks {
                d.reset_peaks();
            } else {
                d.reset_totals();
            }
        }
    });
    true
}

/// The slots of the contexts registered on `device`.
fn slots_on(device: u8) -> impl Iterator<Item = u8> {
    (0..MAX_CONTEXTS as u8).filter(move |&s| {
        CONTEXTS[s as usize].load(Ordering::Acquire) != 0 && device_of(s) == device
    })
}
