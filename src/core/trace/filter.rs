//! Narrowing every report to part of a trace: by device, thread, stream, time window and NVTX
//! range.
//!
//! A filter keeps the *allocations* that match, and the frees of those allocations, so every
//! report stays consistent: what a kept allocation's free was is never lost, and an allocation
//! that was left out never shows as leaked because its free was kept. Everything else (NVTX,
//! strings, stacks, modules) is kept; the pool's segment records and memory figures are kept
//! for the devices kept, at any time, since they are state the window starts with.

use crate::fasthash::FastMap;
use crate::trace::format::{Record, RecordKind};
use std::collections::HashMap;
use std::fmt;

/// What to keep. Empty lists keep everything of that kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub devices: Vec<u8>,
    /// Thread indexes as the trace numbers them (the `thread` column of `gpushim events`).
    pub threads: Vec<u16>,
    /// Stream indexes as the trace numbers them (the `stream` column of `gpushim events`).
    pub streams: Vec<u16>,
    /// Allocations made at or after this time since the trace began.
    pub from_ns: Option<u64>,
    /// Allocations made before this time since the trace began.
    pub to_ns: Option<u64>,
    /// Allocations made inside an NVTX range of this name: a push/pop range (at any depth) of
    /// the allocating thread, or a start/end range (`nvtxRangeStart`/`nvtxRangeEnd`, which
    /// belong to no thread) open at the time.
    pub range: Option<String>,
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    fn allocation_matches(&self, r: &Record, in_range: bool) -> bool {
        (self.devices.is_empty() || self.devices.contains(&r.device))
            && (self.threads.is_empty() || self.threads.contains(&r.thread))
            && (self.streams.is_empty() || self.streams.contains(&r.stream))
            && self.from_ns.is_none_or(|t| r.time_ns >= t)
            && self.to_ns.is_none_or(|t| r.time_ns < t)
            && (self.range.is_none() || in_range)
    }
}

/// What a kept allocation is: the three kinds share addresses (a framework's first tensor lies
/// at its segment's address) and are freed by their own records.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Held {
    /// Memory from an allocating call, freed by its free call.
    Call,
    /// A VMM handle (`cuMemCreate`), released by `cuMemRelease`.
    Handle,
    /// A tensor of a framework's own allocator, freed by its free event.
    Tensor,
}

/// A filter applied to one pass over a trace.
pub struct Filtering {
    filter: Filter,
    /// Kept allocations by (what they are, address or handle).
    kept: FastMap<(Held, u64), ()>,
    /// Per thread: the NVTX ranges open (string ids), and whether the thread's last allocation
    /// was left out (so is the stack that follows it).
    ranges: HashMap<u16, Vec<u64>>,
    /// The start/end ranges open, by range id: whether each is named as the filter asks; and
    /// how many of those are.
    started: HashMap<u64, bool>,
    started_named: u64,
    dropped_last: HashMap<u16, bool>,
    /// Whether an allocation that succeeded was kept (device memory, a VMM handle or a
    /// tensor; pinned host memory not): a filter that keeps none is refused, with what the
    /// trace holds, rather than read as a run that allocated nothing.
    kept_any: bool,
}

impl Filtering {
    pub fn new(filter: Filter) -> Filtering {
        Filtering {
            filter,
            kept: FastMap::default(),
            ranges: HashMap::new(),
            started: HashMap::new(),
            started_named: 0,
            dropped_last: HashMap::new(),
            kept_any: false,
        }
    }

    /// Whether an allocation that succeeded was kept so far (see [`Filtering::keep`]).
    pub fn kept_any(&self) -> bool {
        self.kept_any
    }

    fn in_range(&self, thread: u16, strings: &HashMap<u64, String>) -> bool {
        let Some(name) = &self.filter.range else {
            return true;
        };
        let named = |id: &u64| strings.get(id).is_some_and(|s| s == name);
        self.ranges
            .get(&thread)
            .is_some_and(|open| open.iter().any(named))
            || self.started_named > 0
    }

    /// Whether `r` stays; `strings` resolves NVTX messages.
    pub fn keep(&mut self, r: &Record, strings: &HashMap<u64, String>) -> bool {
        use RecordKind::*;
        let device_kept = self.filter.devices.is_empty() || self.filter.devices.contains(&r.device);
        match r.kind {
            Alloc | AllocAsync | ManagedAlloc | HostAlloc | PhysCreate | TensorAlloc
            | TensorOom => {
                let keep = self
                    .filter
                    .allocation_matches(r, self.in_range(r.thread, strings));
                if keep && r.status == 0 && r.kind != TensorOom {
                    self.kept.insert((held(r.kind), r.ptr), ());
                    self.kept_any |= r.kind != HostAlloc;
                }
                self.dropped_last.insert(r.thread, !keep);
                keep
            }
            Free | FreeAsync | HostFree | PhysRelease | TensorFree => {
                self.dropped_last.insert(r.thread, false);
                self.kept.remove(&(held(r.kind), r.ptr)).is_some()
            }
            // The free of a tensor that the GPU may still use (its stream's work pending): the
            // tensor is freed by the `TensorFree` that follows.
            TensorFreeRequested => {
                self.dropped_last.insert(r.thread, false);
                self.kept.contains_key(&(Held::Tensor, r.ptr))
            }
            StackRef => !self.dropped_last.remove(&r.thread).unwrap_or(false),
            RangePush => {
                self.ranges.entry(r.thread).or_default().push(r.ptr);
                true
            }
            RangePop => {
                if let Some(open) = self.ranges.get_mut(&r.thread) {
                    open.pop();
                }
                true
            }
            RangeStart => {
                let named = self
                    .filter
                    .range
                    .as_ref()
                    .is_some_and(|name| strings.get(&r.ptr) == Some(name));
                if self.started.insert(r.size, named) == Some(true) {
                    self.started_named -= 1;
                }
                self.started_named += u64::from(named);
                true
            }
            RangeEnd => {
                if self.started.remove(&r.size) == Some(true) {
                    self.started_named -= 1;
                }
                true
            }
            SegmentReserve | SegmentRelease | Split | OomRetry | OutOfMemory | LimitHit
            | PoolSync | MemInfo | MemInfoShown | Map | Unmap | AddressReserve | AddressFree
            | SetAccess | IpcExport | IpcOpen | IpcClose | PoolCheckpoint => device_kept,
            _ => true,
        }
    }
}

fn held(kind: RecordKind) -> Held {
    match kind {
        RecordKind::PhysCreate | RecordKind::PhysRelease => Held::Handle,
        RecordKind::TensorAlloc | RecordKind::TensorFree => Held::Tensor,
        _ => Held::Call,
    }
}

/// A time the command line gave that is not one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TimeError {
    /// No unit after the number (the text as given).
    NoUnit(String),
    /// The text does not start with a number.
    NotANumber(String),
    /// A unit other than s, ms, us, µs or ns.
    UnknownUnit { unit: String, text: String },
}

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeError::NoUnit(t) => {
                write!(
                    f,
                    "'{t}' has no unit: write it as 1.5s, 200ms, 300us or 5000ns"
                )
            }
            TimeError::NotANumber(t) => {
                write!(
                    f,
                    "'{t}' does not start with a number (as in 1.5s or 200ms)"
                )
            }
            TimeError::UnknownUnit { unit, text } => {
                write!(f, "'{unit}' in '{text}' is not a unit: use s, ms, us or ns")
            }
        }
    }
}

impl std::error::Error for TimeError {}

/// Parses a time since the trace began: a number with a unit, `s`, `ms`, `us` (or `µs`) or
/// `ns`, as in `1.5s` or `200ms`. Times past `u64::MAX` ns read as `u64::MAX`.
pub fn parse_time(text: &str) -> Result<u64, TimeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| TimeError::NoUnit(text.to_string()))?;
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| TimeError::NotANumber(text.to_string()))?;
    let scale = match unit.trim() {
        "s" => 1e9,
        "ms" => 1e6,
        "us" | "µs" => 1e3,
        "ns" => 1.0,
        u => {
            return Err(TimeError::UnknownUnit {
                unit: u.to_string(),
                text: text.to_string(),
            });
        }
    };
    Ok((n * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: RecordKind, thread: u16, time_ns: u64, ptr: u64) -> Record {
        Record {
            kind,
            api: crate::trace::format::Api::CudaMalloc,
            device: 0,
            status: 0,
            thread,
            time_ns,
            ptr,
            size: 16,
            stream: 0,
        }
    }

    #[test]
    fn times_take_units_and_refuse_bare_numbers() {
        assert_eq!(parse_time("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_time("200ms"), Ok(200_000_000));
        assert_eq!(parse_time("3us"), Ok(3_000));
        assert_eq!(parse_time("7ns"), Ok(7));
        assert_eq!(parse_time("12"), Err(TimeError::NoUnit("12".into())));
        assert!(
            parse_time("12")
                .unwrap_err()
                .to_string()
                .contains("no unit")
        );
        assert!(
            matches!(parse_time("2h"), Err(TimeError::UnknownUnit { unit, .. }) if unit == "h")
        );
        assert!(
            parse_time("2h")
                .unwrap_err()
                .to_string()
                .contains("not a unit")
        );
        assert_eq!(
            parse_time("..5s"),
            Err(TimeError::NotANumber("..5s".into()))
        );
        assert_eq!(parse_time("99999999999999999999s"), Ok(u64::MAX));
    }

    #[test]
    fn a_device_keeps_a_frameworks_tensors_of_that_device_and_their_frees_only() {
        let mut f = Filtering::new(Filter {
            devices: vec![1],
            ..Filter::default()
        });
        let s = HashMap::new();
        use RecordKind::*;
        let on = |kind, device, ptr| Record {
            device,
            api: crate::trace::format::Api::Torch,
            ..rec(kind, 1, 10, ptr)
        };
        // The segment and its first tensor share an address; each is freed by its own record.
        assert!(f.keep(&on(SegmentReserve, 1, 0xa0), &s));
        assert!(f.keep(&on(TensorAlloc, 1, 0xa0), &s));
        assert!(f.keep(&rec(StackRef, 1, 10, 3), &s));
        assert!(!f.keep(&on(TensorAlloc, 0, 0xb0), &s)); // another device
        assert!(!f.keep(&rec(StackRef, 1, 10, 4), &s)); // and its stack
        assert!(!f.keep(&on(TensorOom, 0, 0), &s));
        assert!(f.keep(&on(TensorOom, 1, 0), &s));
        assert!(!f.keep(&on(TensorFree, 0, 0xb0), &s));
        assert!(f.keep(&on(TensorFreeRequested, 1, 0xa0), &s));
        assert!(f.keep(&on(TensorFree, 1, 0xa0), &s));
        assert!(!f.keep(&on(TensorFree, 1, 0xa0), &s)); // freed once
        // A call's allocation at a tensor's address is not the tensor.
        assert!(!f.keep(&on(Free, 1, 0xa0), &s));
    }

    #[test]
    fn a_window_keeps_its_allocations_their_frees_and_their_stacks_only() {
        let mut f = Filtering::new(Filter {
            from_ns: Some(100),
            to_ns: Some(200),
            ..Filter::default()
        });
        let s = HashMap::new();
        use RecordKind::*;
        assert!(!f.keep(&rec(Alloc, 1, 50, 0xa), &s)); // before the window
        assert!(!f.keep(&rec(StackRef, 1, 50, 7), &s)); // its stack goes with it
        assert!(f.keep(&rec(Alloc, 1, 150, 0xb), &s));
        assert!(f.keep(&rec(StackRef, 1, 150, 8), &s));
        assert!(!f.keep(&rec(Free, 2, 160, 0xa), &s)); // free of a dropped allocation
        assert!(f.keep(&rec(Free, 2, 300, 0xb), &s)); // a kept one's free, even after
        assert!(!f.keep(&rec(Free, 2, 310, 0xb), &s)); // already freed
    }

    #[test]
    fn a_range_keeps_allocations_made_inside_it_at_any_depth() {
        let mut f = Filtering::new(Filter {
            range: Some("step".into()),
            ..Filter::default()
        });
        let s: HashMap<u64, std::string::String> =
            [(1, "step".to_string()), (2, "fwd".to_string())].into();
        use RecordKind::*;
        assert!(!f.keep(&rec(Alloc, 1, 1, 0xa), &s));
        assert!(f.keep(&rec(RangePush, 1, 2, 1), &s));
        assert!(f.keep(&rec(RangePush, 1, 3, 2), &s));
        assert!(f.keep(&rec(Alloc, 1, 4, 0xb), &s)); // inside fwd inside step
        assert!(!f.keep(&rec(Alloc, 2, 4, 0xc), &s)); // another thread is not in it
        assert!(f.keep(&rec(RangePop, 1, 5, 0), &s));
        assert!(f.keep(&rec(RangePop, 1, 6, 0), &s));
        assert!(!f.keep(&rec(Alloc, 1, 7, 0xd), &s));
    }

    #[test]
    fn a_start_end_range_keeps_allocations_of_every_thread_while_it_is_open() {
        let mut f = Filtering::new(Filter {
            range: Some("step".into()),
            ..Filter::default()
        });
        let s: HashMap<u64, std::string::String> =
            [(1, "step".to_string()), (2, "fwd".to_string())].into();
        use RecordKind::*;
        let range = |kind, thread, message, id| Record {
            size: id,
            ..rec(kind, thread, 0, message)
        };
        assert!(!f.keep(&rec(Alloc, 2, 1, 0xa), &s));
        assert!(f.keep(&range(RangeStart, 1, 1, 7), &s)); // "step", range id 7, thread 1
        assert!(f.keep(&range(RangeStart, 1, 2, 8), &s)); // "fwd", range id 8
        assert!(f.keep(&rec(Alloc, 2, 3, 0xb), &s)); // another thread, inside "step"
        assert!(f.keep(&range(RangeEnd, 3, 0, 7), &s)); // ended by a third thread
        assert!(!f.keep(&rec(Alloc, 2, 4, 0xc), &s)); // "fwd" is still open, "step" is not
        assert!(f.keep(&range(RangeEnd, 1, 0, 8), &s));
        assert!(f.keep(&range(RangeEnd, 1, 0, 99), &s)); // an end of nothing open
        assert!(!f.keep(&rec(Alloc, 1, 5, 0xd), &s));
        // A range id started again under another name is that range now.
        assert!(f.keep(&range(RangeStart, 1, 1, 9), &s));
        assert!(f.keep(&range(RangeStart, 1, 2, 9), &s));
        assert!(!f.keep(&rec(Alloc, 1, 6, 0xe), &s));
        assert!(f.keep(&range(RangeStart, 1, 1, 9), &s));
        assert!(f.keep(&rec(Alloc, 1, 7, 0xf), &s));
        assert!(f.keep(&range(RangeEnd, 1, 0, 9), &s));
        assert!(!f.keep(&rec(Alloc, 1, 8, 0x10), &s));
    }
}
