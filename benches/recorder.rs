//! The recorder's cost: one record from one thread, and records per second from 16 threads.
//! Each sample writes a fresh trace file and deletes it, so disk use stays bounded.
//! Run: cargo bench --bench recorder

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpushim::trace::format::{Api, Record, RecordKind};
use gpushim::trace::recorder::{OpenOptions, Recorder};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn trace_path(tag: &str) -> PathBuf {
    let dir = std::env::var_os("GPUSHIM_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("gpushim-bench-{tag}-{}.trace", std::process::id()))
}

fn open(path: &PathBuf) -> Box<Recorder> {
    let _ = std::fs::remove_file(path);
    let r = Box::new(Recorder::new());
    assert!(r.begin_open());
    r.open(&OpenOptions {
        path: path.to_str().unwrap().as_bytes(),
        pid: std::process::id(),
        rank: -1,
        host: b"bench",
        program: b"bench",
        cmdline: b"bench\0",
        env: b"",
        trace_max: 16 << 30,
        ring: false,
    })
    .expect("open the bench trace");
    r
}

fn record(i: u64, thread: u16) -> Record {
    Record {
        kind: RecordKind::Alloc,
        api: Api::CudaMalloc,
        device: 0,
        status: 0,
        thread,
        time_ns: i,
        ptr: 0x7f00_0000_0000 + i * 256,
        size: 1 << 20,
        stream: 0,
    }
}

fn one_record(c: &mut Criterion) {
    let path = trace_path("one");
    c.bench_function("record, one thread, no stack (timestamp included)", |b| {
        b.iter_custom(|iters| {
            let r = open(&path);
            r.grow_ahead(); // as in a process that has been recording for a while
            let stop = AtomicBool::new(false);
            let t = std::thread::scope(|s| {
                s.spawn(|| r.run_grower(&stop));
                let start = Instant::now();
                for i in 0..iters {
                    let mut rec = record(i, 0);
                    rec.time_ns = r.now_ns();
                    r.append(&rec);
                }
                let t = start.elapsed();
                stop.store(true, Ordering::Relaxed);
                t
            });
            assert_eq!(r.lost(), 0);
            drop(r);
            let _ = std::fs::remove_file(&path);
            t
        })
    });
}

/// Records an event and its stack from `depth` frames further down.
#[inline(never)]
fn at_depth(depth: u32, r: &Recorder, i: u64) -> u64 {
    if depth > 0 {
        return std::hint::black_box(at_depth(depth - 1, r, i)) + 1;
    }
    let mut rec = record(i, 0);
    rec.time_ns = r.now_ns();
    r.append(&rec);
    let mut frames = [0u64; gpushim::trace::unwind::MAX_FRAMES];
    let n = gpushim::trace::unwind::capture(0, &mut frames);
    let (id, _) = r.intern_stack(&frames[..n]);
    r.append(&Record {
        kind: RecordKind::StackRef,
        ptr: id,
        size: n as u64,
        ..rec
    });
    id
}

fn with_stack(c: &mut Criterion) {
    let path = trace_path("stack");
    c.bench_function(
        "record with a stack seen before (24 frames deep, 32 kept)",
        |b| {
            b.iter_custom(|iters| {
                let r = open(&path);
                r.grow_ahead();
                at_depth(24, &r, 0); // the stack is written once, before timing
                let stop = AtomicBool::new(false);
                let t = std::thread::scope(|s| {
                    s.spawn(|| r.run_grower(&stop));
                    let start = Instant::now();
                    for i in 0..iters {
                        at_depth(24, &r, i);
                    }
                    let t = start.elapsed();
                    stop.store(true, Ordering::Relaxed);
                    t
                });
                drop(r);
                let _ = std::fs::remove_file(&path);
                t
            })
        },
    );
}

fn many_threads(c: &mut Criterion) {
    let threads: u16 = std::env::var("GPUSHIM_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let per_thread = 200_000u64;
    let path = trace_path("many");
    let mut g = c.benchmark_group("records from many threads");
    g.throughput(Throughput::Elements(u64::from(threads) * per_thread));
    g.sample_size(10);
    g.bench_function(format!("{threads} producer threads"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let r = open(&path);
                r.grow_ahead();
                let stop = AtomicBool::new(false);
                std::thread::scope(|s| {
                    s.spawn(|| r.run_grower(&stop));
                    let start = Instant::now();
                    let producers: Vec<_> = (0..threads)
                        .map(|t| {
                            let r = &r;
                            s.spawn(move || {
                                for i in 0..per_thread {
                                    let mut rec = record(i, t);
                                    rec.time_ns = r.now_ns();
                                    r.append(&rec);
                                }
                            })
                        })
                        .collect();
                    for p in producers {
                        p.join().unwrap();
                    }
                    total += start.elapsed();
                    stop.store(true, Ordering::Relaxed);
                });
                assert_eq!(r.lost(), 0, "the default trace size loses nothing");
                drop(r);
                let _ = std::fs::remove_file(&path);
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, one_record, with_stack, many_threads);
criterion_main!(benches);
