//! The caching engine against a simple model, over random sequences of allocations and frees
//! on several streams and devices: no two live blocks overlap, every byte is accounted for,
//! reserved covers live, statistics match the model, and a freed block is never handed out
//! while its fence protects it (contract 3).

use crate::common::XorShift;
use gpushim::engine::{AllocError, Engine, FreeKind, MemoryBackend, Policy};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug)]
struct Live {
    size: u64,
    requested: u64,
    device: u8,
}

/// A freed range and what must hold before it is handed out again.
#[derive(Clone, Copy, Debug)]
struct Hazard {
    start: u64,
    end: u64,
    /// The fence number (MemoryBackend counts fences 1, 2, ...).
    fence: u64,
    /// Stream-ordered frees may be reused at once on their own stream.
    stream: Option<u64>,
}

fn random_size(rng: &mut XorShift) -> u64 {
    match rng.below(10) {
        0..=4 => 1 + rng.below(4096),
        5..=7 => 4096 + rng.below(1 << 20),
        8 => (1 << 20) + rng.below(32 << 20),
        _ => (32 << 20) + rng.below(200 << 20),
    }
}

fn run(seed: u64, steps: usize, policy: Policy, capacity: u64) {
    let mut rng = XorShift(seed);
    let mut e = Engine::new(MemoryBackend::new(capacity), policy);
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    let mut hazards: Vec<Hazard> = Vec::new();
    let streams = [0u64, 0x1000, 0x2000];
    let trace = std::env::var_os("ENGINE_TRACE").is_some();
    for step in 0..steps {
        match rng.below(20) {
            0..=9 => {
                let device = rng.below(2) as u8;
                let stream = streams[rng.below(3) as usize];
                let size = random_size(&mut rng);
                let r = e.alloc(device, size, stream);
                if trace {
                    eprintln!("{step}: alloc dev {device} size {size} stream {stream:#x} -> {r:?}");
                }
                match r {
                    Ok(b) => {
                        assert!(b.size >= size && b.ptr % 256 == 0, "step {step}: {b:?}");
                        assert_eq!(b.requested, size);
                        // No overlap with anything live.
                        if let Some((&p, l)) = live.range(..b.ptr + b.size).next_back() {
                            assert!(
                                p + l.size <= b.ptr,
                                "step {step}: {b:?} overlaps {p:#x}+{:#x}",
                                l.size
                            );
                        }
                        // Inside its segment.
                        assert!(b.segment <= b.ptr && b.ptr + b.size <= b.segment + b.segment_size);
                        // Not handed out while a fence protects it (except its own stream).
                        let passed = passed_fences(&e);
                        for h in &hazards {
                            let overlaps = h.start < b.ptr + b.size && b.ptr < h.end;
                            if overlaps && h.fence > passed {
                                assert_eq!(
                                    h.stream,
                                    Some(stream),
                                    "step {step}: {b:?} reused before fence {} passed ({passed})",
                                    h.fence
                                );
                            }
                        }
                        // A legal reuse supersedes the older hazards of the range: its own free
                        // will carry a new fence.
                        let (lo, hi) = (b.ptr, b.ptr + b.size);
                        hazards = hazards
                            .into_iter()
                            .flat_map(|h| {
                                if h.end <= lo || hi <= h.start {
                                    return vec![h];
                                }
                                let mut rest = Vec::new();
                                if h.start < lo {
                                    rest.push(Hazard { end: lo, ..h });
                                }
                                if hi < h.end {
                                    rest.push(Hazard { start: hi, ..h });
                                }
                                rest
                            })
                            .collect();
                        live.insert(
                            b.ptr,
                            Live {
                                size: b.size,
                                requested: size,
                                device,
                            },
                        );
                    }
                    Err(AllocError::OutOfMemory | AllocError::LimitReached) => {
                        // Only when, with the idle cache given back, the device cannot take
                        // one more segment for this request.
                        let cap = if policy.limit > 0 {
                            policy.limit.min(capacity)
                        } else {
                            capacity
                        };
                        let segment = if size <= 1 << 20 {
                            2 << 20
                        } else {
                            gpushim::engine::round_size(size, policy.round_divisions)
                                .unwrap()
                                .div_ceil(2 << 20)
                                * (2 << 20)
                        };
                        assert!(
                            e.reserved(device) + segment > cap,
                            "step {step}: spurious failure for {size}: {} reserved of {cap}",
                            e.reserved(device)
                        );
                    }
                }
            }
            10..=17 if !live.is_empty() => {
                let k = rng.below(live.len() as u64) as usize;
                let (&p, &l) = live.iter().nth(k).unwrap();
                let kind = if rng.below(2) == 0 {
                    FreeKind::Sync
                } else {
                    FreeKind::OnStream(streams[rng.below(3) as usize])
                };
                let freed = e.free(p, kind).expect("a live block frees");
                if trace {
                    eprintln!(
                        "{step}: free {p:#x} ({kind:?}) fence {}",
                        e.backend().fences_made()
                    );
                }
                assert_eq!(freed, l.size);
                live.remove(&p);
                let fence = made_fences(&e);
                hazards.push(Hazard {
                    start: p,
                    end: p + l.size,
                    fence,
                    stream: match kind {
                        FreeKind::Sync => None,
                        FreeKind::OnStream(s) => Some(s),
                    },
                });
                // Frees of what is not ours are refused, never guessed about.
                assert_eq!(e.free(p, FreeKind::Sync), Err(()));
                assert_eq!(e.free(p + 256, FreeKind::Sync), Err(()));
            }
            18 => {
                if trace {
                    eprintln!("{step}: complete_all");
                }
                e.backend_mut().complete_all()
            }
            _ => e.empty_cache(rng.below(2) as u8),
        }
        let passed = passed_fences(&e);
        hazards.retain(|h| h.fence > passed);
        if let Err(e) = e.check_links() {
            panic!("step {step}: {e}");
        }
        // Accounting against the model.
        let s = e.stats();
        assert_eq!(
            s.live_bytes,
            live.values().map(|l| l.size).sum::<u64>(),
            "step {step}"
        );
        assert_eq!(
            s.requested_bytes,
            live.values().map(|l| l.requested).sum::<u64>()
        );
        assert_eq!(s.live_blocks, live.len() as u64);
        assert_eq!(
            s.reserved_bytes,
            e.backend().reserved(0) + e.backend().reserved(1)
        );
        assert!(s.reserved_bytes >= s.live_bytes);
        for d in 0..2u8 {
            assert_eq!(e.reserved(d), e.backend().reserved(d));
            let live_d: u64 = live
                .values()
                .filter(|l| l.device == d)
                .map(|l| l.size)
                .sum();
            assert_eq!(
                e.reserved(d),
                live_d + e.idle(d),
                "device {d}: every reserved byte is live or cached"
            );
        }
        if !policy.expandable {
            // (Expandable segments grow and shrink by pages; their bytes are checked above.)
            assert_eq!(s.segment_reserves - s.segment_releases, count_segments(&e));
        }
    }
    // Everything freed and the cache emptied: nothing stays reserved.
    for (&p, _) in live.clone().iter() {
        e.free(p, FreeKind::Sync).unwrap();
    }
    e.empty_cache(0);
    e.empty_cache(1);
    assert_eq!(e.stats().reserved_bytes, 0);
    assert_eq!(e.stats().live_bytes, 0);
}

fn made_fences(e: &Engine<MemoryBackend>) -> u64 {
    e.backend().fences_made()
}

fn passed_fences(e: &Engine<MemoryBackend>) -> u64 {
    e.backend().fences_passed()
}

fn count_segments(e: &Engine<MemoryBackend>) -> u64 {
    let b = e.backend();
    b.reserve_calls - b.failed_reserves - b.release_calls
}

#[test]
fn random_sequences_keep_every_invariant_with_default_policy() {
    for seed in 1..=20 {
        run(seed * 0x9e37_79b9, 3000, Policy::default(), 64 << 30);
    }
}

#[test]
fn random_sequences_keep_every_invariant_under_memory_pressure() {
    for seed in 1..=20 {
        run(seed * 0x5851_f42d, 3000, Policy::default(), 1 << 30);
    }
}

#[test]
fn random_sequences_keep_every_invariant_with_every_knob_set() {
    let policy = Policy {
        round_divisions: 4,
        max_split: 64 << 20,
        medium_segment: 20 << 20,
        release: 256 << 20,
        limit: 768 << 20,
        expandable: false,
        release_on_free: false,
    };
    for seed in 1..=20 {
        run(seed * 0x2545_f491, 3000, policy, 64 << 30);
    }
}

#[test]
fn random_sequences_keep_every_invariant_with_expandable_segments() {
    let expandable = Policy {
        expandable: true,
        ..Policy::default()
    };
    for seed in 1..=20 {
        run(seed * 0x1656_67b1, 3000, expandable, 64 << 30);
        run(seed * 0x27d4_eb2f, 3000, expandable, 1 << 30);
        let knobs = Policy {
            release: 256 << 20,
            limit: 768 << 20,
            ..expandable
        };
        run(seed * 0x85eb_ca6b, 3000, knobs, 64 << 30);
    }
}
