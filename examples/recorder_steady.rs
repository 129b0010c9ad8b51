//! Steady-state cost of one record over a long run (the grower thread running), and the cost of
//! the clock read alone; with THREADS, also the aggregate rate of that many producer threads.
//! Usage: cargo run --release --example recorder_steady [RECORDS [THREADS]]
use gpushim::trace::format::{Api, Record, RecordKind};
use gpushim::trace::recorder::{OpenOptions, Recorder};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50_000_000);
    let path = std::env::temp_dir().join(format!("gpushim-steady-{}.trace", std::process::id()));
    let r = Box::new(Recorder::new());
    assert!(r.begin_open());
    r.open(&OpenOptions {
        path: path.to_str().unwrap().as_bytes(),
        pid: 1,
        rank: -1,
        host: b"h",
        program: b"steady",
        cmdline: b"steady\0",
        env: b"",
        trace_max: 16 << 30,
        ring: false,
    })
    .unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| r.run_grower(&stop));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let t = Instant::now();
        let mut sink = 0u64;
        for _ in 0..n {
            sink = sink.wrapping_add(r.now_ns());
        }
        let clock = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for i in 0..n {
            r.append(&Record {
                kind: RecordKind::Alloc,
                api: Api::CudaMalloc,
                device: 0,
                status: 0,
                thread: 0,
                time_ns: r.now_ns(),
                ptr: i,
                size: 1 << 20,
                stream: 0,
            });
        }
        let rec = t.elapsed().as_nanos() as f64 / n as f64;
        let threads: u64 = std::env::args()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        if let Some(per) = n.checked_div(threads) {
            let t = Instant::now();
            std::thread::scope(|s2| {
                for th in 0..threads {
                    let r = &r;
                    s2.spawn(move || {
                        for i in 0..per {
                            r.append(&Record {
                                kind: RecordKind::Alloc,
                                api: Api::CudaMalloc,
                                device: 0,
                                status: 0,
                                thread: th as u16,
                                time_ns: r.now_ns(),
                                ptr: i,
                                size: 1 << 20,
                                stream: 0,
                            });
                        }
                    });
                }
            });
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{threads} threads: {:.1} M records/s in aggregate",
                (per * threads) as f64 / secs / 1e6
            );
        }
        stop.store(true, Ordering::Relaxed);
        println!(
            "clock read: {clock:.1} ns; one record (clock included): {rec:.1} ns; lost {} (sink {})",
            r.lost(),
            sink % 2
        );
    });
    let _ = std::fs::remove_file(&path);
}
