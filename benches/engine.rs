//! The pool's engine on a per-tensor training pattern (every tensor a `cudaMalloc` and a
//! `cudaFree`, fences passing as a GPU a little behind the host would pass them), timed per
//! allocation-and-free pair twice: with warm caches, and with 8 MiB of other memory touched
//! between requests, as the program's own work does between two allocations in a real process.
//! On the GPU, `GPUSHIM_COSTS=1` measured the engine at several µs per request inside GPT-2
//! (session 8) where `gpushim simulate` replays the same trace at under 1 µs: the difference is
//! cache misses, and this benchmark shows it without a GPU. Prints one table; asserts nothing.
//! Run: cargo bench --bench engine

use gpushim::config::{self, Conf};
use gpushim::engine::front::Front;
use gpushim::engine::{FreeKind, MemoryBackend, Policy, SYNC_KEY};
use std::time::Instant;

/// Sizes of one step's tensors at its first shape; other shapes scale them.
fn step_sizes(shape: u64, rng: &mut u64) -> Vec<u64> {
    let mut sizes = Vec::new();
    for layer in 0..12u64 {
        for t in 0..100u64 {
            *rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let base = match t % 5 {
                0 => 4 << 10,
                1 => 96 << 10,
                2 => 768 << 10,
                3 => 3 << 20,
                _ => 9 << 20,
            };
            // Shapes change every step: sequence lengths cycle through 6 values.
            let size = base * (64 + shape * 89 % 449) / 512 + (*rng >> 54) * 512 + layer;
            sizes.push(size.max(512));
        }
    }
    sizes
}

struct Outcome {
    ns_per_pair: f64,
    peak_reserved: u64,
    pairs: u64,
}

fn run(conf: &Conf, steps: u64, thrash: &mut [u8]) -> Outcome {
    let mut pool = Front::new(MemoryBackend::new(1 << 40), Policy::from(conf));
    let mut rng = 1u64;
    let mut spent = 0u128;
    let mut pairs = 0u64;
    let touch = |thrash: &mut [u8]| {
        for i in (0..thrash.len()).step_by(64) {
            thrash[i] = thrash[i].wrapping_add(1);
        }
    };
    for step in 0..steps {
        let sizes = step_sizes(step % 6, &mut rng);
        // Forward: activations live until backward; temporaries die at once.
        let mut saved = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            if !thrash.is_empty() {
                touch(thrash);
            }
            let t0 = Instant::now();
            let b = pool.alloc(0, size, SYNC_KEY).expect("room");
            spent += t0.elapsed().as_nanos();
            if i % 3 == 0 {
                saved.push(b.ptr);
            } else {
                let t0 = Instant::now();
                pool.free(b.ptr, FreeKind::Sync);
                spent += t0.elapsed().as_nanos();
                pairs += 1;
            }
            // The GPU passes fences a few requests behind the host.
            let b = pool.engine.backend_mut();
            let made = b.fences_made();
            b.pass_up_to(made.saturating_sub(8));
        }
        // Backward frees the activations, newest first.
        while let Some(p) = saved.pop() {
            if !thrash.is_empty() {
                touch(thrash);
            }
            let t0 = Instant::now();
            pool.free(p, FreeKind::Sync);
            spent += t0.elapsed().as_nanos();
            pairs += 1;
            let b = pool.engine.backend_mut();
            let made = b.fences_made();
            b.pass_up_to(made.saturating_sub(8));
        }
        // The step's own synchronization.
        pool.engine.backend_mut().complete_all();
    }
    Outcome {
        ns_per_pair: spent as f64 / pairs as f64,
        peak_reserved: pool.engine.stats().peak_reserved_bytes,
        pairs,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is ignored too.
    let steps = 24;
    let mut cold = vec![0u8; 8 << 20];
    println!("engine, per-tensor pattern: {steps} steps of 1,200 tensors, 6 shapes cycling");
    println!(
        "{:24} {:>10} {:>16} {:>18}",
        "policy", "pairs", "warm ns/pair", "cold ns/pair"
    );
    for text in [
        "pool:caching",
        "pool:expandable",
        "pool:caching,medium:20MiB",
    ] {
        let conf = config::parse_strict(text).expect("a valid policy");
        let warm = run(&conf, steps, &mut []);
        let cold_run = run(&conf, steps, &mut cold);
        assert_eq!(warm.peak_reserved, cold_run.peak_reserved);
        println!(
            "{:24} {:>10} {:>16.0} {:>18.0}   (peak reserved {} MiB)",
            text,
            warm.pairs,
            warm.ns_per_pair,
            cold_run.ns_per_pair,
            warm.peak_reserved >> 20
        );
    }
}
