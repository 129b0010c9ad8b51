//! The NVTX ranges open as a trace's records go, a tracker of the replay ([`super::live`]): per
//! thread, the push/pop ranges, innermost last; and the start/end ranges, which belong to no
//! thread. An allocation is named by its thread's innermost range, else by the latest start/end
//! range open.

use crate::fasthash::FastMap;
use crate::trace::format::{Record, RecordKind};
use std::collections::BTreeMap;

/// The open ranges: per thread, outermost first; and the start/end ranges as (string id, range
/// id), oldest first.
pub type OpenRanges = (Vec<(u16, Vec<u64>)>, Vec<(u64, u64)>);

#[derive(Clone, Default)]
pub struct Ranges {
    /// Per thread: its open push/pop ranges' string ids, innermost last.
    per_thread: Vec<Vec<u64>>,
    /// The start/end ranges open: string id by the index of the record that started it (so
    /// the last is the latest), and that index by range id.
    started: BTreeMap<u64, u64>,
    started_at: FastMap<u64, u64>,
}

impl Ranges {
    /// The threads it has a place for.
    pub fn threads(&self) -> usize {
        self.per_thread.len()
    }

    /// Applies an NVTX record (`index`: its place among the records); `false` for any other.
    pub fn apply(&mut self, r: &Record, index: u64) -> bool {
        match r.kind {
            RecordKind::RangePush => self.push(r.thread, r.ptr),
            RecordKind::RangePop => {
                if let Some(s) = self.per_thread.get_mut(r.thread as usize) {
                    s.pop();
                }
            }
            RecordKind::RangeStart => self.start(r.size, r.ptr, index),
            RecordKind::RangeEnd => {
                if let Some(at) = self.started_at.remove(&r.size) {
                    self.started.remove(&at);
                }
            }
            _ => return false,
        }
        true
    }

    /// A push/pop range `name` opened on `thread` (or restored open).
    pub fn push(&mut self, thread: u16, name: u64) {
        let i = thread as usize;
        if self.per_thread.len() <= i {
            self.per_thread.resize_with(i + 1, Vec::new);
        }
        self.per_thread[i].push(name);
    }

    /// Start/end range `id` named `name` started by record `index` (or restored open).
    pub fn start(&mut self, id: u64, name: u64, index: u64) {
        if let Some(old) = self.started_at.insert(id, index) {
            self.started.remove(&old);
        }
        self.started.insert(index, name);
    }

    /// The range an allocation on `thread` is made in: its innermost push/pop range, else the
    /// latest start/end range open.
    pub fn naming(&self, thread: u16) -> Option<u64> {
        self.per_thread
            .get(thread as usize)
            .and_then(|s| s.last().copied())
            .or_else(|| self.started.last_key_value().map(|(_, &name)| name))
    }

    /// The open ranges (see [`OpenRanges`]).
    pub fn open(&self) -> OpenRanges {
        let threads = self
            .per_thread
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
            .map(|(t, v)| (t as u16, v.clone()))
            .collect();
        let mut started: Vec<(u64, u64, u64)> = self
            .started_at
            .iter()
            .filter_map(|(&id, &at)| self.started.get(&at).map(|&name| (at, name, id)))
            .collect();
        started.sort_unstable();
        (
            threads,
            started.into_iter().map(|(_, n, id)| (n, id)).collect(),
        )
    }
}
