//! `oom`: each failed allocation, with what the device held at that moment.

use super::live::replay_each;
use super::sites::{Holder, holders, site_label};
use crate::trace::format::DEVICE_UNKNOWN;
use crate::trace::format::RecordKind;
use crate::trace::reader::{ReadError, ReadOptions};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

#[derive(Clone, Debug, Serialize)]
pub struct Oom {
    pub time_ns: u64,
    pub api: String,
    pub status: u8,
    pub device: u8,
    pub requested_bytes: u64,
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    /// Reserved by the pool and not live: cached.
    pub cached_bytes: u64,
    pub largest_free_block: u64,
    /// The pool refused because of `limit`, not the device.
    pub limit_hit: bool,
    /// The device's own free memory at the last `cudaMemGetInfo` before, if any.
    pub device_free_bytes: Option<u64>,
    pub holders: Vec<Holder>,
}

/// Every failed allocation, with what held memory at that moment.
pub fn oom(path: &Path, opts: &ReadOptions) -> Result<Vec<Oom>, ReadError> {
    let mut out = Vec::new();
    let mut limit_pending: HashMap<u16, bool> = HashMap::new();
    replay_each(path, opts, |reader, rp, r, _| match r.kind {
        RecordKind::LimitHit => {
            limit_pending.insert(r.thread, true);
        }
        RecordKind::Alloc | RecordKind::AllocAsync | RecordKind::ManagedAlloc
            if r.status != 0 && r.size > 0 =>
        {
            let device = if r.device == DEVICE_UNKNOWN {
                0
            } else {
                r.device
            };
            let live = rp.live_on(device);
            let reserved = rp.reserved_on(device);
            let mut h = holders(
                rp.all_live(),
                Some(device),
                |l| l.stack,
                |k| site_label(reader, k),
            );
            h.truncate(10);
            out.push(Oom {
                time_ns: r.time_ns,
                api: r.api.name().to_string(),
                status: r.status,
                device,
                requested_bytes: r.size,
                live_bytes: live,
                reserved_bytes: reserved,
                cached_bytes: reserved.saturating_sub(live),
                largest_free_block: rp.largest_free_block(device),
                limit_hit: limit_pending.remove(&r.thread).unwrap_or(false),
                device_free_bytes: rp.mem_info.get(&device).map(|m| m.0),
                holders: h,
            });
        }
        _ => {}
    })?;
    Ok(out)
}
