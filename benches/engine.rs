//! The pool's engine on a per-tensor training pattern (every tensor a `cudaMalloc` and a
//! `cudaFree`, fences passing as a GPU a little behind the host would pass them), timed per
//! allocation-and-free pair twice: with warm caches, and with 8 MiB of other memory touched
//! between requests, as the program's own work does between two allocations in a real process.
//! On the GPU, `GPUSHIM_COSTS=1` measured the engine at several µs per request inside GPT-2
//! where `gpushim simulate` replays the same trace at under 1 µs: the difference is
//! cache misses, and this benchmark shows it without a GPU. Prints one table; asserts nothing.
//! With `GPUSHIM_BENCH_TRACES=A.trace:B.trace` (traces recorded under the pool, on the GPU
//! machine), each trace's own requests are replayed too, against its recorded fence timeline
//! (as `gpushim simulate` does), under `GPUSHIM_BENCH_CONF` (default: `--per-tensor`'s pool),
//! instead of the pattern.
//! Run: cargo bench --bench engine

use gpushim::config::{self, Conf};
use gpushim::engine::front::Front;
use gpushim::engine::{FreeKind, MemoryBackend, Policy, SYNC_KEY};
use gpushim::report::pool_replay::PoolReplayer;
use gpushim::trace::format::Record;
use gpushim::trace::reader::TraceReader;
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

/// Touches every cache line of `thrash` (evicting the engine, as a program's own work does).
fn touch(thrash: &mut [u8]) {
    for i in (0..thrash.len()).step_by(64) {
        thrash[i] = thrash[i].wrapping_add(1);
    }
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

/// Replays `records` under `conf`, timing each request: mean ns per request, peak reserved.
fn replay(records: &[Record], conf: &Conf, thrash: &mut [u8]) -> (f64, u64, u64) {
    let mut r = PoolReplayer::new(Policy::from(conf));
    let (mut spent, mut requests) = (0u128, 0u64);
    for rec in records {
        if !PoolReplayer::is_request(rec) {
            r.apply(rec);
            continue;
        }
        touch(thrash);
        let t0 = Instant::now();
        r.apply(rec);
        spent += t0.elapsed().as_nanos();
        requests += 1;
    }
    let s = r.pool.engine.stats();
    (
        spent as f64 / requests.max(1) as f64,
        s.peak_reserved_bytes,
        requests,
    )
}

fn traces(cold: &mut [u8]) {
    let Ok(paths) = std::env::var("GPUSHIM_BENCH_TRACES") else {
        return;
    };
    let text = std::env::var("GPUSHIM_BENCH_CONF").unwrap_or(PER_TENSOR.into());
    let conf = config::parse_strict(&text).expect("GPUSHIM_BENCH_CONF: a valid policy");
    println!("\nrecorded traces replayed under {text}");
    println!(
        "{:40} {:>10} {:>16} {:>18}",
        "trace", "requests", "warm ns/request", "cold ns/request"
    );
    for path in paths.split(':').filter(|p| !p.is_empty()) {
        let records: Vec<Record> = match TraceReader::open(path) {
            Ok(r) => r.collect(),
            Err(e) => {
                println!("{path}: {e}");
                continue;
            }
        };
        let (warm, peak, requests) = replay(&records, &conf, &mut []);
        let (cold_ns, cold_peak, _) = replay(&records, &conf, cold);
        assert_eq!(peak, cold_peak);
        let name = std::path::Path::new(path)
            .file_name()
            .map_or(path.into(), |n| n.to_string_lossy().into_owned());
        println!(
            "{name:40} {requests:>10} {warm:>16.0} {cold_ns:>18.0}   (peak reserved {} MiB)",
            peak >> 20
        );
    }
}

const PER_TENSOR: &str = "pool:caching,medium:20MiB";

fn main() {
    // `cargo bench` passes `--bench`; any other argument is ignored too.
    let steps = 24;
    let mut cold = vec![0u8; 8 << 20];
    if std::env::var_os("GPUSHIM_BENCH_TRACES").is_some() {
        traces(&mut cold);
        return;
    }
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
