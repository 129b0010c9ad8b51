//! The engine's rules, each shown on the in-memory backend.

use super::*;

fn engine(capacity: u64) -> Engine<MemoryBackend> {
    Engine::new(MemoryBackend::new(capacity), Policy::default())
}

#[test]
fn sizes_round_to_granules_and_to_power_of_two_divisions() {
    assert_eq!(round_size(1, 0), Some(512));
    assert_eq!(round_size(1000, 0), Some(1024));
    assert_eq!(round_size(1 << 20, 0), Some(1 << 20));
    // 4 divisions of [1 GiB, 2 GiB): steps of 256 MiB.
    assert_eq!(round_size((1 << 30) + 1, 4), Some((1 << 30) + (256 << 20)));
    assert_eq!(round_size(1200 << 20, 4), Some(1280 << 20));
    assert_eq!(round_size(1200 << 20, 1), Some(2048 << 20));
    // Near 2^64 nothing wraps.
    assert_eq!(round_size(u64::MAX - 100, 0), None);
    assert_eq!(round_size((1 << 63) + 1, 1), None);
    assert_eq!(round_size(u64::MAX - (1 << 59), 4), None);
}

#[test]
fn sizes_near_two_to_the_64_are_out_of_memory_and_never_a_cached_block() {
    for round in [0, 1, 4] {
        let mut e = Engine::new(
            MemoryBackend::new(1 << 40),
            Policy {
                round_divisions: round,
                ..Policy::default()
            },
        );
        // An 8 MiB block in the cache, which a wrapped size would fit.
        let a = e.alloc(0, 8 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
        for size in [u64::MAX, u64::MAX - 511, (1 << 63) + 1, MAX_REQUEST + 1] {
            assert_eq!(
                e.alloc(0, size, 0),
                Err(AllocError::OutOfMemory),
                "size {size:#x}, round {round}"
            );
        }
        assert_eq!(e.stats().live_blocks, 0);
        assert_eq!(e.idle(0), 8 << 20, "the cached block is still there");
    }
}

#[test]
fn out_of_memory_while_quiet_gives_empty_segments_back_where_the_backend_may() {
    // A capture under way on one thread while another allocates and frees with cudaFree
    // until the device is full: CUDA, which had those frees, serves; so must the pool,
    // giving its empty fenced segments back (their free waits for the device), never one
    // that holds a block.
    for may in [false, true] {
        let mut e = engine(32 << 20);
        let kept = e.alloc(0, 8 << 20, 0).unwrap();
        e.backend_mut().quiet = true;
        e.backend_mut().release_while_quiet = may;
        let mut served = 0;
        for _ in 0..16 {
            let Ok(a) = e.alloc(0, 8 << 20, 0) else {
                break;
            };
            e.free(a.ptr, FreeKind::Sync).unwrap();
            served += 1;
        }
        if may {
            assert_eq!(
                served, 16,
                "every request served by giving empty segments back"
            );
            assert!(e.backend().release_calls > 0);
        } else {
            assert_eq!(served, 3, "a backend that may not release runs out");
            assert_eq!(e.backend().release_calls, 0);
        }
        assert_eq!(
            e.backend().synchronize_calls,
            0,
            "never waited for while quiet"
        );
        assert!(
            e.free(kept.ptr, FreeKind::Sync).is_ok(),
            "the held block stayed"
        );
    }
}

#[test]
fn a_quiet_backend_is_neither_waited_for_nor_given_memory_back() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 8 << 20, 0).unwrap();
    e.free(a.ptr, FreeKind::Sync).unwrap();
    e.backend_mut().quiet = true;
    // The only cached block is fenced: a fresh segment instead of a wait (the backend
    // panics on synchronize or release while quiet).
    let b = e.alloc(0, 8 << 20, 0).unwrap();
    assert_ne!(b.ptr, a.ptr);
    assert_eq!(e.stats().segment_reserves, 2);
    e.empty_cache(0);
    e.trim(0, 0);
    assert_eq!(e.backend().release_calls, 0);
    // Past the capture, the idle segment goes back.
    e.backend_mut().quiet = false;
    e.empty_cache(0);
    assert_eq!(e.backend().release_calls, 1);
    assert_eq!(e.reserved(0), 8 << 20);
}

#[test]
fn trim_gives_back_segments_idle_for_the_age_asked_and_keeps_younger_ones() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 8 << 20, 0).unwrap();
    let b = e.alloc(0, 16 << 20, 0).unwrap();
    e.backend_mut().clock = 1_000;
    e.free(a.ptr, FreeKind::Sync).unwrap();
    e.backend_mut().clock = 5_000;
    e.free(b.ptr, FreeKind::Sync).unwrap();
    e.backend_mut().complete_all();
    e.backend_mut().clock = 6_000;
    e.trim(0, 3_000);
    assert_eq!(
        e.reserved(0),
        16 << 20,
        "only the segment idle since 1000 went back"
    );
    e.backend_mut().clock = 9_000;
    e.trim(0, 3_000);
    assert_eq!(e.reserved(0), 0);
    assert_eq!(e.backend().synchronize_calls, 0, "trimming never waits");
}

#[test]
fn trim_keeps_idle_segments_while_the_device_still_needs_fresh_memory() {
    // A training loop whose shapes change: one segment idle, others reserved all the time.
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 8 << 20, 0).unwrap();
    e.backend_mut().clock = 1_000;
    e.free(a.ptr, FreeKind::Sync).unwrap();
    e.backend_mut().complete_all();
    let mut live = Vec::new();
    for t in [2_000u64, 4_000, 6_000] {
        e.backend_mut().clock = t;
        // Bigger than anything cached: a fresh segment.
        live.push(e.alloc(0, (16 + t / 1_000) << 20, 0).unwrap());
        e.trim(0, 3_000);
        assert_eq!(
            e.backend().release_calls,
            0,
            "at {t}: the 8 MiB segment idle since 1000 is kept while memory is still reserved"
        );
    }
    // No fresh memory needed for the trim age: the idle segment goes back.
    e.backend_mut().clock = 9_000;
    e.trim(0, 3_000);
    assert_eq!(e.backend().release_calls, 1);
    assert_eq!(e.reserved(0), (18 + 20 + 22) << 20);
}

#[test]
fn trim_leaves_segments_whose_fences_have_not_passed() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 8 << 20, 0).unwrap();
    e.free(a.ptr, FreeKind::Sync).unwrap();
    e.backend_mut().clock = 10_000;
    e.trim(0, 0);
    assert_eq!(e.reserved(0), 8 << 20, "GPU work may still use it");
    e.backend_mut().complete_all();
    e.trim(0, 0);
    assert_eq!(e.reserved(0), 0);
}

#[test]
fn with_release_on_free_a_cuda_free_that_empties_a_segment_gives_it_back_at_once() {
    let mut e = Engine::new(
        MemoryBackend::new(1 << 30),
        Policy {
            release_on_free: true,
            ..Policy::default()
        },
    );
    let a = e.alloc(0, 512 << 20, 0).unwrap();
    let b = e.alloc(0, 1000, 0).unwrap();
    let c = e.alloc(0, 1000, 0).unwrap();
    e.free(a.ptr, FreeKind::Sync).unwrap();
    assert_eq!(e.reserved(0), 2 << 20, "the 512 MiB segment went back");
    e.free(b.ptr, FreeKind::Sync).unwrap();
    assert_eq!(e.reserved(0), 2 << 20, "c still lives in the small segment");
    e.free(c.ptr, FreeKind::OnStream(0)).unwrap();
    assert_eq!(
        e.reserved(0),
        2 << 20,
        "a stream-ordered free keeps it cached"
    );
    assert_eq!(e.backend().synchronize_calls, 0);
}

#[test]
fn an_exported_segment_hands_out_nothing_and_goes_back_once_empty() {
    let mut e = engine(1 << 30);
    // 32 MiB segment, then two 4 MiB blocks cut from it: the second is exported.
    let big = e.alloc(0, 32 << 20, 0).unwrap();
    e.free(big.ptr, FreeKind::OnStream(0)).unwrap();
    let x = e.alloc(0, 4 << 20, 0).unwrap();
    let y = e.alloc(0, 4 << 20, 0).unwrap();
    assert_eq!(y.segment, x.segment);
    assert!(e.mark_exported(y.ptr));
    e.free(y.ptr, FreeKind::OnStream(0)).unwrap();
    let z = e.alloc(0, 4 << 20, 0).unwrap();
    assert_ne!(
        z.segment, y.segment,
        "nothing more from the exported segment"
    );
    let releases = e.backend().release_calls;
    e.free(x.ptr, FreeKind::OnStream(0)).unwrap();
    assert_eq!(e.backend().release_calls, releases + 1, "empty: given back");
    assert!(e.lookup(y.ptr).is_none() && !e.in_segment(y.ptr));
}

#[test]
fn a_block_freed_on_a_stream_is_reused_at_once_on_that_stream() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 4096, 7).unwrap();
    e.free(a.ptr, FreeKind::OnStream(7)).unwrap();
    let b = e.alloc(0, 4096, 7).unwrap();
    assert_eq!(b.ptr, a.ptr);
    assert_eq!(e.stats().segment_reserves, 1);
    assert_eq!(e.backend().synchronize_calls, 0);
}

#[test]
fn a_block_freed_on_a_stream_is_not_given_to_another_stream_before_its_fence_passed() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 4096, 7).unwrap();
    // Keep the segment busy so the only free memory is a's block plus the rest.
    let _keep = e.alloc(0, SMALL_SEGMENT - 4096, 7).unwrap();
    e.free(a.ptr, FreeKind::OnStream(7)).unwrap();
    // Stream 8 may not take it before stream 7 caught up; the device has room, so it gets
    // fresh memory and nobody waits.
    let b = e.alloc(0, 4096, 8).unwrap();
    assert_ne!(b.ptr, a.ptr);
    assert_eq!(
        e.backend().synchronize_calls,
        0,
        "no wait while there is room"
    );
}

#[test]
fn a_synchronously_freed_block_is_not_reused_before_the_device_caught_up() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 8 << 20, 0).unwrap();
    e.free(a.ptr, FreeKind::Sync).unwrap();
    // Same stream, same size: not before the fence passed. With room: fresh memory.
    let b = e.alloc(0, 8 << 20, 0).unwrap();
    assert_ne!(b.ptr, a.ptr);
    assert_eq!(e.backend().synchronize_calls, 0);
    // Once the GPU caught up, the cached block serves, still without a wait.
    e.backend_mut().complete_all();
    let c = e.alloc(0, 8 << 20, 0).unwrap();
    assert_eq!(c.ptr, a.ptr);
    assert_eq!(e.backend().synchronize_calls, 0);
}

#[test]
fn under_memory_pressure_the_engine_waits_once_and_reuses_the_fenced_block() {
    // Room for one 32 MiB segment, cut in two 16 MiB blocks; one is freed and its fence
    // has not passed; another 16 MiB must come from it.
    let mut e = engine(32 << 20);
    let big = e.alloc(0, 32 << 20, 0).unwrap();
    e.free(big.ptr, FreeKind::OnStream(0)).unwrap();
    let x = e.alloc(0, 16 << 20, 0).unwrap();
    let _y = e.alloc(0, 16 << 20, 0).unwrap();
    e.free(x.ptr, FreeKind::Sync).unwrap();
    let c = e.alloc(0, 16 << 20, 0).unwrap();
    assert_eq!(c.ptr, x.ptr, "the fenced block, once the device caught up");
    assert_eq!(
        e.backend().synchronize_calls,
        1,
        "one wait, under pressure only"
    );
    assert_eq!(e.reserved(0), 32 << 20);
    // An idle segment under pressure goes back and its memory comes again.
    let mut e = engine(16 << 20);
    let a = e.alloc(0, 8 << 20, 0).unwrap();
    let _b = e.alloc(0, 8 << 20, 0).unwrap();
    e.free(a.ptr, FreeKind::Sync).unwrap();
    e.alloc(0, 8 << 20, 0).unwrap();
    assert_eq!(e.reserved(0), 16 << 20);
    assert_eq!(e.backend().synchronize_calls, 1);
}

#[test]
fn large_blocks_split_and_coalesce_back_into_one() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 64 << 20, 0).unwrap();
    e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
    let b = e.alloc(0, 16 << 20, 0).unwrap();
    let c = e.alloc(0, 16 << 20, 0).unwrap();
    assert_eq!(
        (b.ptr, c.ptr),
        (a.ptr, a.ptr + (16 << 20)),
        "split from the same segment"
    );
    assert_eq!(e.stats().segment_reserves, 1);
    e.free(b.ptr, FreeKind::OnStream(0)).unwrap();
    e.free(c.ptr, FreeKind::OnStream(0)).unwrap();
    e.backend_mut().complete_all();
    let d = e.alloc(0, 64 << 20, 0).unwrap();
    assert_eq!(d.ptr, a.ptr, "coalesced back into the whole segment");
    assert_eq!(e.stats().segment_reserves, 1);
}

#[test]
fn blocks_above_max_split_are_handed_out_whole() {
    let mut e = Engine::new(
        MemoryBackend::new(1 << 30),
        Policy {
            max_split: 32 << 20,
            ..Policy::default()
        },
    );
    let a = e.alloc(0, 64 << 20, 0).unwrap();
    e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
    let b = e.alloc(0, 16 << 20, 0).unwrap();
    assert_eq!((b.ptr, b.size), (a.ptr, 64 << 20));
}

#[test]
fn out_of_memory_releases_the_cache_and_retries_once() {
    let mut e = engine(100 << 20);
    let a = e.alloc(0, 60 << 20, 0).unwrap();
    e.free(a.ptr, FreeKind::Sync).unwrap();
    // 60 MiB cached and idle; 80 MiB more does not fit beside it.
    let b = e.alloc(0, 80 << 20, 0).unwrap();
    assert_eq!(e.stats().oom_retries, 1);
    assert_eq!(e.stats().reserved_bytes, 80 << 20);
    assert!(e.alloc(0, 80 << 20, 0).is_err());
    assert_eq!(e.stats().ooms, 1);
    e.free(b.ptr, FreeKind::Sync).unwrap();
}

#[test]
fn the_limit_caps_reserved_memory_per_device() {
    let mut e = Engine::new(
        MemoryBackend::new(1 << 40),
        Policy {
            limit: 100 << 20,
            ..Policy::default()
        },
    );
    let a = e.alloc(0, 60 << 20, 0).unwrap();
    assert_eq!(e.alloc(0, 60 << 20, 0), Err(AllocError::LimitReached));
    assert_eq!(e.stats().limit_hits, 1);
    // The other device has its own limit.
    e.alloc(1, 60 << 20, 0).unwrap();
    e.free(a.ptr, FreeKind::Sync).unwrap();
    e.alloc(0, 90 << 20, 0).unwrap();
}

#[test]
fn idle_memory_above_the_release_threshold_goes_back_to_the_device() {
    let mut e = Engine::new(
        MemoryBackend::new(1 << 40),
        Policy {
            release: 32 << 20,
            ..Policy::default()
        },
    );
    let a = e.alloc(0, 64 << 20, 0).unwrap();
    let b = e.alloc(0, 16 << 20, 0).unwrap();
    e.backend_mut().complete_all();
    e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
    e.backend_mut().complete_all();
    e.free(b.ptr, FreeKind::OnStream(0)).unwrap();
    assert!(e.idle(0) <= 32 << 20, "idle {} MiB", e.idle(0) >> 20);
    assert_eq!(e.stats().segment_releases, 1);
}

#[test]
fn pointer_lookups_find_the_block_containing_an_address() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 1000, 3).unwrap();
    let info = e.lookup(a.ptr + 999).unwrap();
    assert_eq!((info.ptr, info.requested, info.stream), (a.ptr, 1000, 3));
    assert_eq!(e.lookup(a.ptr + info.size), None);
    assert_eq!(
        e.free(a.ptr + 16, FreeKind::Sync),
        Err(()),
        "interior pointers are not ours"
    );
    e.free(a.ptr, FreeKind::Sync).unwrap();
    assert_eq!(
        e.free(a.ptr, FreeKind::Sync),
        Err(()),
        "double free is not ours either"
    );
}

#[test]
fn medium_requests_share_segments_and_fall_back_to_their_own_near_the_limit() {
    let three_of_3mib = |policy: Policy| {
        let mut e = Engine::new(MemoryBackend::new(1 << 40), policy);
        for _ in 0..3 {
            e.alloc(0, 3 << 20, 0).unwrap();
        }
        (e.stats().segment_reserves, e.reserved(0))
    };
    // Without `medium`: a 4 MiB segment each.
    assert_eq!(three_of_3mib(Policy::default()), (3, 12 << 20));
    // With it: one 20 MiB segment, split three times.
    let medium = Policy {
        medium_segment: 20 << 20,
        ..Policy::default()
    };
    assert_eq!(three_of_3mib(medium), (1, 20 << 20));
    // Larger than 10 MiB: a segment of its own, as before.
    let mut e = Engine::new(MemoryBackend::new(1 << 40), medium);
    e.alloc(0, 12 << 20, 0).unwrap();
    assert_eq!(e.reserved(0), 12 << 20);
    // 8 MiB under a 16 MiB limit: a 20 MiB segment would not fit, the request's own does,
    // and nothing waited for the device.
    let mut e = Engine::new(
        MemoryBackend::new(1 << 40),
        Policy {
            limit: 16 << 20,
            ..medium
        },
    );
    e.alloc(0, 8 << 20, 0).unwrap();
    assert_eq!((e.reserved(0), e.stats().synchronizations), (8 << 20, 0));
    // The device itself too small for the shared segment: the request's own size is tried.
    let mut e = Engine::new(MemoryBackend::new(10 << 20), medium);
    assert!(e.alloc(0, 6 << 20, 0).is_ok());
    assert_eq!(e.reserved(0), 6 << 20);
}

#[test]
fn blocks_kept_apart_while_fenced_are_remembered_in_bounded_memory() {
    // An expandable segment whose fences never pass: one stream reuses its own block at once
    // (stream order), so each free is a fenced block kept apart; the list of them stays bounded.
    let mut e = Engine::new(
        MemoryBackend::new(1 << 40),
        Policy {
            expandable: true,
            ..Policy::default()
        },
    );
    for _ in 0..100_000 {
        let b = e.alloc(0, 4 << 20, 1).unwrap();
        e.free(b.ptr, FreeKind::OnStream(1)).unwrap();
    }
    assert!(
        e.kept_apart.len() <= 2 * free_lists::KEPT_APART_MIN,
        "{}",
        e.kept_apart.len()
    );
    assert_eq!(
        e.stats().segment_reserves,
        1,
        "the block was reused on its stream"
    );
    // A larger request on that stream grows the segment by what its free end lacks: the kept
    // block is that free end once its fence passed.
    e.backend_mut().complete_all();
    e.alloc(0, 8 << 20, 1).unwrap();
    assert_eq!(e.stats().segment_reserves, 2);
    assert_eq!(
        e.reserved(0),
        8 << 20,
        "grown by the 4 MiB missing, not by 8 MiB"
    );
}

#[test]
fn a_block_freed_behind_a_fence_waits_apart_and_never_fences_free_space_beside_it() {
    for policy in [
        Policy::default(),
        Policy {
            expandable: true,
            ..Policy::default()
        },
    ] {
        let mut e = Engine::new(MemoryBackend::new(1 << 40), policy);
        // One 16 MiB segment: a 6 MiB block and 10 MiB free beside it, unfenced.
        let whole = e.alloc(0, 16 << 20, SYNC_KEY).unwrap();
        e.free(whole.ptr, FreeKind::Sync).unwrap();
        e.backend_mut().complete_all();
        let a = e.alloc(0, 6 << 20, SYNC_KEY).unwrap();
        assert_eq!(a.ptr, whole.ptr);
        // Freed while the GPU may still use it: it waits apart, counted as idle.
        e.free(a.ptr, FreeKind::Sync).unwrap();
        assert_eq!(e.idle(0), 16 << 20, "{policy:?}");
        // The free space beside it serves at once with no new memory (merged with the fenced
        // block, as before, it was fenced too and a segment was reserved).
        let reserves = e.stats().segment_reserves;
        let b = e.alloc(0, 8 << 20, SYNC_KEY).unwrap();
        assert_eq!(b.ptr, whole.ptr + (6 << 20), "{policy:?}");
        let c = e.alloc(0, 2 << 20, SYNC_KEY).unwrap();
        assert_eq!(e.stats().segment_reserves, reserves, "{policy:?}");
        assert!(c.ptr >= whole.ptr + (14 << 20) && c.ptr < whole.ptr + (16 << 20));
        // The fenced block is not handed out before its fence passes...
        let d = e.alloc(0, 6 << 20, SYNC_KEY).unwrap();
        assert!(
            d.ptr < whole.ptr || d.ptr >= whole.ptr + (16 << 20),
            "{policy:?}"
        );
        e.free(d.ptr, FreeKind::Sync).unwrap();
        // ...and once it passed, it joins its free neighbours and serves.
        e.free(b.ptr, FreeKind::Sync).unwrap();
        e.free(c.ptr, FreeKind::Sync).unwrap();
        e.backend_mut().complete_all();
        let reserves = e.stats().segment_reserves;
        let f = e.alloc(0, 16 << 20, SYNC_KEY).unwrap();
        assert_eq!(f.ptr, whole.ptr, "{policy:?}");
        assert_eq!(e.stats().segment_reserves, reserves, "{policy:?}");
    }
}

/// Interior lookups walk up from a hint per 2 MiB; a hint left pointing at a block that was
/// merged away, or at one above the pointer asked, must not misdirect them.
#[test]
fn interior_lookups_stay_right_as_blocks_split_and_merge_under_their_hints() {
    let mut e = engine(1 << 30);
    // 200 blocks of 8 KiB side by side in small segments; every other one freed later.
    let blocks: Vec<BlockInfo> = (0..200).map(|_| e.alloc(0, 8 << 10, 0).unwrap()).collect();
    let check = |e: &Engine<MemoryBackend>, live: &[&BlockInfo]| {
        for b in live {
            for off in [1, b.size / 2, b.size - 1] {
                let got = e.lookup(b.ptr + off).map(|i| i.ptr);
                assert_eq!(got, Some(b.ptr), "{:#x} + {off}", b.ptr);
            }
        }
    };
    // Highest first, so each 2 MiB's hint is left high, then asked about lower pointers.
    let all: Vec<&BlockInfo> = blocks.iter().rev().collect();
    check(&e, &all);
    for b in blocks.iter().step_by(2) {
        e.free(b.ptr, FreeKind::OnStream(0)).unwrap();
    }
    let kept: Vec<&BlockInfo> = blocks.iter().skip(1).step_by(2).collect();
    check(&e, &kept);
    for b in blocks.iter().step_by(2) {
        // Freed memory belongs to no live block.
        assert_eq!(e.lookup(b.ptr + 1), None);
    }
    // Merge everything back; the hints now name blocks that are gone.
    for b in &kept {
        e.free(b.ptr, FreeKind::OnStream(0)).unwrap();
    }
    let again: Vec<BlockInfo> = (0..50).map(|_| e.alloc(0, 24 << 10, 0).unwrap()).collect();
    check(&e, &again.iter().collect::<Vec<_>>());
    assert!(e.check_links().is_ok());
}

#[test]
fn each_device_keeps_its_own_figures_with_peaks_and_totals_that_reset() {
    let mut e = engine(1 << 30);
    let a = e.alloc(0, 3 << 20, 0).unwrap();
    let b = e.alloc(0, 1000, 0).unwrap();
    let c = e.alloc(1, 5 << 20, 0).unwrap();
    let d0 = e.device_stats(0);
    assert_eq!(d0.allocated_bytes.current, a.size + b.size);
    assert_eq!(d0.requested_bytes.current, (3 << 20) + 1000);
    assert_eq!(d0.allocations.current, 2);
    assert_eq!(d0.segments.current, 2, "a large and a small segment");
    assert_eq!(d0.reserved_bytes.current, e.reserved(0));
    assert_eq!(e.device_stats(1).allocated_bytes.current, c.size);
    assert_eq!(e.device_stats(1).allocations.current, 1);

    e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
    let d0 = e.device_stats(0);
    assert_eq!(d0.allocated_bytes.current, b.size);
    assert_eq!(d0.allocated_bytes.peak, a.size + b.size);
    assert_eq!(d0.allocated_bytes.allocated, a.size + b.size);
    assert_eq!(d0.allocated_bytes.freed, a.size);
    assert_eq!(d0.allocations.freed, 1);
    // Cached, not given back: still reserved.
    assert_eq!(d0.reserved_bytes.current, d0.reserved_bytes.peak);

    e.device_stats_mut(0).reset_peaks();
    let d0 = e.device_stats(0);
    assert_eq!(d0.allocated_bytes.peak, b.size);
    assert_eq!(d0.allocated_bytes.allocated, a.size + b.size, "totals kept");
    e.device_stats_mut(0).reset_totals();
    let d0 = e.device_stats(0);
    assert_eq!(
        (d0.allocated_bytes.allocated, d0.allocated_bytes.freed),
        (0, 0)
    );
    assert_eq!(d0.allocated_bytes.current, b.size, "current kept");
    assert_eq!(
        e.device_stats(1).allocated_bytes.peak,
        c.size,
        "device 1 untouched"
    );

    // Giving the idle cache back lowers reserved memory and the segment count.
    e.empty_cache(0);
    let d0 = e.device_stats(0);
    assert_eq!(d0.segments.current, 1);
    assert_eq!(d0.segments.freed, 1);
    assert_eq!(d0.reserved_bytes.current, e.reserved(0));
    assert!(d0.reserved_bytes.current < d0.reserved_bytes.peak);

    // Refusals count on their device.
    assert!(e.alloc(1, 2 << 30, 0).is_err());
    assert_eq!(e.device_stats(1).ooms, 1);
    assert_eq!(e.device_stats(0).ooms, 0);
}

#[test]
fn an_expandable_segment_counts_once_while_its_pages_count_as_reserved() {
    let mut e = Engine::new(
        MemoryBackend::new(1 << 30),
        Policy {
            expandable: true,
            ..Policy::default()
        },
    );
    let a = e.alloc(0, 8 << 20, 0).unwrap();
    let b = e.alloc(0, 8 << 20, 0).unwrap();
    let d = e.device_stats(0);
    assert_eq!(d.segments.current, 1);
    assert_eq!(d.reserved_bytes.current, 16 << 20);
    assert_eq!(d.reserved_bytes.allocated, 16 << 20);
    e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
    e.free(b.ptr, FreeKind::OnStream(0)).unwrap();
    e.empty_cache(0);
    let d = e.device_stats(0);
    assert_eq!(d.reserved_bytes.current, 0);
    assert_eq!(d.reserved_bytes.freed, 16 << 20);
    assert_eq!(d.allocated_bytes.current, 0);
}

#[test]
fn a_device_that_lost_its_memory_is_forgotten_and_its_addresses_can_come_back() {
    let mut e = engine(1 << 30);
    let live = e.alloc(0, 8 << 20, 0).unwrap();
    let cached = e.alloc(0, 1 << 20, 7).unwrap();
    e.free(cached.ptr, FreeKind::OnStream(7)).unwrap();
    let other = e.alloc(1, 4 << 20, 0).unwrap();
    let before_other = e.device_stats(1);
    let gone = e.forget_device(0);
    assert_eq!(gone.len(), 2, "both segments of device 0");
    assert!(gone.iter().any(|&(b, _)| b == live.segment));
    // Nothing of device 0 is known any more: its pointers are not the pool's, nothing of it
    // is cached, and its figures start again; device 1 is untouched.
    assert_eq!(e.lookup(live.ptr), None);
    assert!(!e.in_segment(live.ptr));
    assert_eq!(e.free(live.ptr, FreeKind::Sync), Err(()));
    assert_eq!(e.idle(0), 0);
    assert_eq!(e.device_stats(0), DeviceStats::default());
    assert_eq!(e.device_stats(1), before_other);
    assert_eq!(e.stats().reserved_bytes, other.segment_size);
    assert_eq!(e.stats().live_blocks, 1);
    assert_eq!(e.lookup(other.ptr).map(|b| b.ptr), Some(other.ptr));
    e.check_links().unwrap();
    // The device hands out the same addresses again after a reset: a segment at the base of
    // a forgotten one is a new segment, not the old one.
    e.backend_mut().next_address = live.segment;
    let again = e.alloc(0, 8 << 20, 0).unwrap();
    assert_eq!(again.segment, live.segment);
    assert_eq!(e.stats().segment_reserves, 3 + 1);
    e.free(again.ptr, FreeKind::Sync).unwrap();
    e.check_links().unwrap();
}
