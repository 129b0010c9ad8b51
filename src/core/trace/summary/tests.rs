//! A checkpoint restores what the records before it made: replayed from a checkpoint and the
//! records after it, the state is the state of replaying every record.

use super::*;
use crate::trace::format::restore;
use crate::trace::live::Live;
use proptest::prelude::*;
use std::collections::HashMap;

/// One step of a random program: allocate (kind, device, size, stack, thread, in an NVTX
/// range or not), free the n-th live allocation, or fail a request.
#[derive(Clone, Debug)]
enum Op {
    Alloc {
        kind: u8,
        device: u8,
        size: u64,
        stack: u64,
        thread: u16,
        ranged: bool,
    },
    Free(usize),
    Fail {
        size: u64,
    },
    Nvml(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..3, 0u8..2, 1u64..1 << 24, 0u64..6, 0u16..3, any::<bool>()).prop_map(
            |(kind, device, size, stack, thread, ranged)| Op::Alloc {
                kind,
                device,
                size,
                stack,
                thread,
                ranged
            }
        ),
        4 => (0usize..64).prop_map(Op::Free),
        1 => (1u64..1 << 40).prop_map(|size| Op::Fail { size }),
        1 => (1u64..1 << 34).prop_map(Op::Nvml),
    ]
}

fn rec(kind: RecordKind, api: Api, thread: u16, t: u64, ptr: u64, size: u64) -> Record {
    Record {
        kind,
        api,
        device: 0,
        status: 0,
        thread,
        time_ns: t,
        ptr,
        size,
        stream: 0,
    }
}

/// The records of a program, times 1 ms apart (so time order is file order).
fn records(ops: &[Op]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut live: Vec<(u64, u8, u16)> = Vec::new();
    let mut next_ptr = 0x7f00_0000_0000u64;
    let mut t = 0u64;
    let mut tick = || {
        t += 1_000_000;
        t
    };
    out.push(Record {
        ptr: 1,
        size: 5,
        ..rec(RecordKind::String, Api::Shim, 0, 0, 1, 4)
    });
    for o in ops {
        match *o {
            Op::Alloc {
                kind,
                device,
                size,
                stack,
                thread,
                ranged,
            } => {
                let (k, api) = match kind {
                    0 => (RecordKind::Alloc, Api::CudaMalloc),
                    1 => (RecordKind::AllocAsync, Api::CudaMallocAsync),
                    _ => (RecordKind::TensorAlloc, Api::Torch),
                };
                if ranged {
                    out.push(rec(RecordKind::RangePush, Api::Nvtx, thread, tick(), 1, 1));
                }
                next_ptr += 1 << 24;
                out.push(Record {
                    device,
                    ..rec(k, api, thread, tick(), next_ptr, size)
                });
                out.push(rec(
                    RecordKind::Caller,
                    Api::Shim,
                    thread,
                    tick(),
                    0x4000 + stack,
                    0,
                ));
                if stack > 0 {
                    out.push(rec(
                        RecordKind::StackRef,
                        Api::Shim,
                        thread,
                        tick(),
                        stack,
                        0,
                    ));
                }
                if ranged {
                    out.push(rec(RecordKind::RangePop, Api::Nvtx, thread, tick(), 0, 1));
                }
                live.push((next_ptr, kind, thread));
            }
            Op::Free(n) if !live.is_empty() => {
                let (p, kind, thread) = live.remove(n % live.len());
                let (k, api) = match kind {
                    0 => (RecordKind::Free, Api::CudaFree),
                    1 => (RecordKind::FreeAsync, Api::CudaFreeAsync),
                    _ => (RecordKind::TensorFree, Api::Torch),
                };
                out.push(rec(k, api, thread, tick(), p, 0));
            }
            Op::Free(_) => {}
            Op::Fail { size } => out.push(Record {
                status: 2,
                ..rec(RecordKind::Alloc, Api::CudaMalloc, 0, tick(), 0, size)
            }),
            Op::Nvml(bytes) => out.push(rec(
                RecordKind::DeviceMemory,
                Api::Shim,
                0,
                tick(),
                bytes,
                80 << 30,
            )),
        }
    }
    out
}

fn body(r: &Record) -> [u8; RECORD_SIZE] {
    let mut b = [0u8; RECORD_SIZE];
    r.encode_body(&mut b);
    b
}

/// What a checkpoint written after every body fed restores: the replay of its records alone.
fn restored_after(bodies: impl IntoIterator<Item = [u8; RECORD_SIZE]>) -> Replay {
    let mut s = Summarizer::new();
    for b in bodies {
        s.feed(&b);
    }
    s.drain(true);
    let mut out = Vec::new();
    s.checkpoint(0, usize::MAX, &mut out);
    let mut restored = Replay::default();
    for b in &out {
        restored.apply(&Record::decode(b).expect("a checkpoint's records decode"));
    }
    restored
}

/// What the reports read of a replay, comparable.
#[derive(Debug, PartialEq)]
struct State {
    live: Vec<(u64, Live)>,
    peaks: Vec<(u8, u64, u64)>,
    tensors: Vec<(u8, (u64, u64))>,
    host_peak: u64,
}

fn state(rp: &Replay) -> State {
    let mut live: Vec<(u64, Live)> = rp.live.iter().map(|(&p, &l)| (p, l)).collect();
    live.sort_unstable_by_key(|e| e.0);
    State {
        live,
        peaks: rp.peaks().collect(),
        tensors: rp.tensors.by_device().collect(),
        host_peak: rp.pinned.peak,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_checkpoint_and_the_records_after_it_replay_to_the_same_state(
        ops in proptest::collection::vec(op(), 1..200),
        cut in 0.0f64..1.0,
    ) {
        let all = records(&ops);
        let k = ((all.len() as f64) * cut) as usize;
        let mut whole = Replay::default();
        for r in &all {
            whole.apply(r);
        }
        let mut s = Summarizer::new();
        for r in &all[..k] {
            s.feed(&body(r));
        }
        let mut bodies = Vec::new();
        s.checkpoint(k as u64, usize::MAX, &mut bodies);
        let mut restored = Replay::default();
        for b in &bodies {
            restored.apply(&Record::decode(b).expect("a checkpoint's records decode"));
        }
        prop_assert!(!restored.restored.active, "the checkpoint ends its restoring");
        for r in &all[k..] {
            restored.apply(r);
        }
        prop_assert_eq!(state(&restored), state(&whole));
        // Calls of each API: the checkpoint's count and the records after it.
        let calls = |rs: &[Record]| rs.iter().filter(|r| is_call(r)).count() as u64;
        let restored_calls: u64 = restored.restored.api_totals.values().map(|t| t.0).sum();
        let tail = bodies
            .iter()
            .filter_map(Record::decode)
            .skip_while(|r| !(r.kind == RecordKind::Restore && r.status == restore::END))
            .filter(is_call)
            .count() as u64;
        prop_assert_eq!(restored_calls + tail + calls(&all[k..]), calls(&all));
    }
}

#[test]
fn the_peak_snapshot_holds_what_was_live_at_the_peak() {
    let ops = [
        Op::Alloc {
            kind: 0,
            device: 0,
            size: 100,
            stack: 1,
            thread: 0,
            ranged: false,
        },
        Op::Alloc {
            kind: 0,
            device: 0,
            size: 1000,
            stack: 2,
            thread: 0,
            ranged: false,
        },
        Op::Free(1),
        Op::Alloc {
            kind: 0,
            device: 0,
            size: 50,
            stack: 3,
            thread: 0,
            ranged: false,
        },
    ];
    let rp = restored_after(records(&ops).iter().map(body));
    let peak = rp
        .restored
        .snapshots
        .iter()
        .find(|s| !s.failure)
        .expect("a peak snapshot");
    assert_eq!(peak.live, 1100);
    let mut h: Vec<(u64, u64)> = peak.holdings.iter().map(|h| (h.stack, h.bytes)).collect();
    h.sort_unstable();
    assert_eq!(h, vec![(1, 100), (2, 1000)], "stack 3 came after the peak");
}

#[test]
fn the_step_is_the_site_that_recurs_once_a_step_not_the_loop_inside_it() {
    // 48 allocations from one line and one from another, every step, for 200 steps; three
    // allocations at start from a third.
    let mut sites: HashMap<u64, Occurrences> = HashMap::new();
    let mut n = 0u64;
    let mut at = |site: u64, sites: &mut HashMap<u64, Occurrences>| {
        n += 1;
        sites.entry(site).or_default().add(n);
    };
    for _ in 0..3 {
        at(3, &mut sites);
    }
    for _ in 0..200 {
        for _ in 0..48 {
            at(1, &mut sites);
        }
        at(2, &mut sites);
    }
    assert_eq!(detect_period(&sites, n), Some(2));
    // A model: ten lines once a step and one line twice; the first of the step marks it.
    let mut sites: HashMap<u64, Occurrences> = HashMap::new();
    let mut n = 0u64;
    for _ in 0..50 {
        for line in 10..20 {
            n += 1;
            sites.entry(line).or_default().add(n);
            if line == 15 {
                n += 1;
                sites.entry(99).or_default().add(n);
                n += 1;
                sites.entry(99).or_default().add(n);
            }
        }
    }
    assert_eq!(detect_period(&sites, n), Some(10));
    // An optimizer's state made at its first step (161 allocations from one line, three
    // lines), then 60 steps of eight lines once a step whose count of other allocations varies
    // with the shape (20 to 60).
    let mut sites: HashMap<u64, Occurrences> = HashMap::new();
    let mut n = 0u64;
    for step in 0..60u64 {
        for line in 10..18 {
            n += 1 + (step * 7 + line) % 4;
            sites.entry(line).or_default().add(n);
        }
        n += 20 + (step * 13) % 41;
        if step == 0 {
            for _ in 0..161 {
                for line in 50..53 {
                    n += 1;
                    sites.entry(line).or_default().add(n);
                }
            }
        }
    }
    assert_eq!(detect_period(&sites, n), Some(10));
}

#[test]
fn the_step_chosen_does_not_move_with_where_the_trace_is_cut() {
    // Ten lines once a step, one line twice, 40 steps: cut after any allocation from the
    // fourth step on (a crash, an OOM, the first look at a sixteenth of a trace), the step's
    // first line marks it, as at the end. Cut mid-step, the lines after the cut have one
    // occurrence fewer than those before it.
    let mut order = Vec::new();
    for _ in 0..40 {
        for line in 10..20 {
            order.push(line);
            if line == 15 {
                order.extend([99, 99]);
            }
        }
    }
    let mut sites: HashMap<u64, Occurrences> = HashMap::new();
    for (n, &site) in (1u64..).zip(&order) {
        sites.entry(site).or_default().add(n);
        if n >= 36 {
            assert_eq!(detect_period(&sites, n), Some(10), "cut after {n}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// A site's score, found by two binary searches of the sorted counts, is the number of
    /// counts about its own (within a tenth, or 1), as counting them one by one finds.
    #[test]
    fn the_score_by_search_is_the_score_by_counting(
        mut counts in proptest::collection::vec(3u64..400, 0..60),
        count in 3u64..400,
    ) {
        counts.sort_unstable();
        let near = |a: u64, b: u64| a.abs_diff(b) <= (b / 10).max(1);
        let by_counting = counts.iter().filter(|&&n| near(n, count)).count();
        prop_assert_eq!(super::iterations::about_as_often(&counts, count), by_counting);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// The journal undone from the live set is the live set at the peak: the same holdings as
    /// replaying every record up to the one that reached the peak (and the stacks after it).
    #[test]
    fn the_journalled_peak_is_the_live_set_at_the_peak(
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let all = records(&ops);
        let restored = restored_after(all.iter().map(body));
        // Brute force: the first record that reached each device's peak.
        let mut rp = Replay::default();
        let mut best: BTreeMap<u8, (u64, usize)> = BTreeMap::new();
        for (i, r) in all.iter().enumerate() {
            if let Change::Alloc { device, .. } = rp.apply(r) {
                let e = best.entry(device).or_default();
                if rp.live_on(device) > e.0 {
                    *e = (rp.live_on(device), i);
                }
            }
        }
        for (&d, &(bytes, at)) in &best {
            let mut rp = Replay::default();
            for r in &all[..=at] {
                rp.apply(r);
            }
            // The stack of the peak's own allocation follows it.
            for r in all[at + 1..].iter().take(3) {
                if r.kind == RecordKind::StackRef || r.kind == RecordKind::Caller {
                    rp.apply(r);
                }
            }
            let mut want =
                Snapshot::of(rp.all_live().filter(|l| l.device == d), d, 0).holdings;
            want.sort_unstable();
            let snap = restored
                .restored.snapshots
                .iter()
                .find(|s| !s.failure && s.device == d)
                .expect("a snapshot of each device's peak");
            let mut got = snap.holdings.clone();
            got.sort_unstable();
            prop_assert_eq!(snap.live, bytes);
            prop_assert_eq!(got, want);
        }
    }
}

#[test]
fn thinned_keeps_at_most_max_spread_evenly_over_the_stream() {
    let mut t: Thinned<u64> = Thinned::new(8);
    for i in 1..=1000u64 {
        if t.wants() {
            t.push(i);
        }
    }
    let kept = t.items();
    assert!(kept.len() < 8 && kept.len() >= 4, "{kept:?}");
    assert_eq!(kept[0], 1, "the first stays");
    let gaps: Vec<u64> = kept.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|&g| g == gaps[0]),
        "evenly spaced: {kept:?}"
    );
    assert!(
        *kept.last().unwrap() + gaps[0] > 1000 - gaps[0],
        "up to the end: {kept:?}"
    );
}

/// PyTorch's recorded runs: the checkpoint's peak is the program's, not the rounding of a
/// segment whose `cudaMalloc` (or expandable page) passed it a few records before the segment's
/// record claimed it.
#[test]
fn a_checkpoints_peak_is_the_programs_whatever_segments_pytorch_took() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/torch");
    for name in [
        "resnet50",
        "resnet50-expandable",
        "gpt2",
        "gpt2-expandable",
        "transformer-expandable",
        "streams-expandable",
    ] {
        let bytes = std::fs::read(format!("{dir}/{name}.trace")).unwrap();
        let bodies: Vec<[u8; RECORD_SIZE]> = bytes[crate::trace::format::HEADER_SIZE..]
            .chunks_exact(RECORD_SIZE)
            .map(|slot| slot.try_into().unwrap())
            .filter(|b| Record::decode(b).is_some())
            .collect();
        let mut straight = Replay::default();
        for b in &bodies {
            straight.apply(&Record::decode(b).unwrap());
        }
        let restored = restored_after(bodies);
        let (_, want, _) = straight.peaks().next().unwrap();
        let snap = restored
            .restored
            .snapshots
            .iter()
            .find(|s| !s.failure)
            .unwrap();
        assert_eq!(snap.live, want, "{name}: the checkpoint's peak");
        let held: u64 = snap.holdings.iter().map(|h| h.bytes).sum();
        assert_eq!(held, want, "{name}: what held the peak");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    /// A checkpoint with too little room for its live set still fits, and still holds every
    /// byte by call site and device: the older allocations summed under their site.
    #[test]
    fn a_checkpoint_without_room_sums_the_older_allocations_by_site(
        ops in proptest::collection::vec(op(), 200..600),
        shrink in 0.0f64..1.0,
    ) {
        // Allocations and frees only, three in four kept live: a live set larger than the room.
        let ops: Vec<Op> = ops
            .into_iter()
            .filter(|o| matches!(o, Op::Alloc { .. } | Op::Free(_)))
            .enumerate()
            .filter(|(i, o)| !matches!(o, Op::Free(_)) || i % 4 == 0)
            .map(|(_, o)| match o {
                // One thread and one kind: sites that repeat, as a leaking loop's do.
                Op::Alloc { device, size, stack, ranged, .. } => Op::Alloc {
                    kind: 0,
                    device,
                    size,
                    stack,
                    thread: 0,
                    ranged,
                },
                o => o,
            })
            .collect();
        let all = records(&ops);
        let mut whole = Replay::default();
        for r in &all {
            whole.apply(r);
        }
        let mut s = Summarizer::new();
        for r in &all {
            s.feed(&body(r));
        }
        s.drain(true);
        let mut full = Vec::new();
        s.checkpoint(0, usize::MAX, &mut full);
        // Room for the checkpoint with up to all of its live allocations summed by site.
        let sites = {
            let mut k: Vec<_> = whole
                .live
                .values()
                .map(|l| (l.stack, l.range, l.caller, l.device, l.kind, l.api, l.thread, l.stream))
                .collect();
            k.sort_unstable();
            k.dedup();
            k.len()
        };
        let spare = whole.live.len().saturating_sub(3 * sites + 16);
        let room = full.len() - (spare as f64 * shrink) as usize;
        let mut bodies = Vec::new();
        s.checkpoint(0, room, &mut bodies);
        let by_site_device = |rp: &Replay| {
            let mut m: BTreeMap<(u64, u64, u8), u64> = BTreeMap::new();
            for l in rp.live.values() {
                *m.entry((l.stack, l.range, l.device)).or_default() += l.size;
            }
            m
        };
        let mut restored = Replay::default();
        for b in &bodies {
            restored.apply(&Record::decode(b).expect("a checkpoint's records decode"));
        }
        prop_assert_eq!(by_site_device(&restored), by_site_device(&whole));
        prop_assert_eq!(restored.total_live(), whole.total_live());
        if full.len() <= room {
            prop_assert_eq!(bodies.len(), full.len());
        } else {
            prop_assert!(bodies.len() <= room, "{} > {room}", bodies.len());
            let summed: u64 = bodies
                .iter()
                .filter_map(Record::decode)
                .filter(|r| r.kind == RecordKind::Restore && r.status == restore::SUMMED)
                .map(|r| r.ptr)
                .sum();
            prop_assert!(summed > 0);
        }
    }
}

/// The raw `cudaMalloc` of a segment PyTorch claims a moment later is no moment of the
/// series: its highest point is the device's peak, never the segment counted twice.
#[test]
fn the_series_never_counts_a_claimed_segment_twice() {
    const MIB: u64 = 1 << 20;
    let t = |kind, api, at: u64, ptr, size| body(&rec(kind, api, 0, at * 1_000_000, ptr, size));
    let mut s = Summarizer::new();
    for b in [
        t(
            RecordKind::SegmentReserve,
            Api::Torch,
            1,
            0x1000_0000,
            2 * MIB,
        ),
        t(RecordKind::TensorAlloc, Api::Torch, 2, 0x1000_0000, MIB),
        // PyTorch takes a second segment: CUDA's call first, then its own record claims it.
        t(RecordKind::Alloc, Api::CudaMalloc, 3, 0x2000_0000, 2 * MIB),
        t(
            RecordKind::SegmentReserve,
            Api::Torch,
            4,
            0x2000_0000,
            2 * MIB,
        ),
        t(RecordKind::TensorAlloc, Api::Torch, 5, 0x2000_0000, MIB),
    ] {
        s.feed(&b);
    }
    s.drain(true);
    let mut out = Vec::new();
    s.checkpoint(0, usize::MAX, &mut out);
    let records: Vec<Record> = out.iter().filter_map(Record::decode).collect();
    let of = |what| {
        records
            .iter()
            .filter(|r| r.kind == RecordKind::Restore && r.status == what)
            .map(|r| r.ptr)
            .max()
    };
    assert_eq!(of(restore::DEVICE_PEAK), Some(2 * MIB));
    assert_eq!(of(restore::SERIES), of(restore::DEVICE_PEAK));
}
