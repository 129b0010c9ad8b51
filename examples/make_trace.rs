//! Writes a synthetic trace of N events for the decoding benchmark: allocations and frees of
//! a sliding window of 4096 live blocks on 8 streams (no NVTX ranges).
//! Usage: cargo run --release --example make_trace -- OUT.trace N
use gpushim::trace::format::{Api, Record, RecordKind};
use gpushim::trace::recorder::{OpenOptions, Recorder};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!("usage: make_trace OUT.trace N");
        std::process::exit(2);
    };
    let r = Box::new(Recorder::new());
    assert!(r.begin_open());
    r.open(&OpenOptions {
        path: path.as_bytes(),
        pid: 1,
        rank: -1,
        host: b"bench",
        program: b"make_trace",
        cmdline: b"make_trace\0",
        env: b"",
        trace_max: 64 << 30,
        ring: false,
    })
    .expect("open the trace");
    let rec = |kind, api, ptr, size, stream, t| {
        r.append(&Record {
            kind,
            api,
            device: 0,
            status: 0,
            thread: 0,
            time_ns: t,
            ptr,
            size,
            stream,
        })
    };
    const WINDOW: u64 = 4096;
    let mut i = 0u64;
    while i < n {
        let t = i * 100;
        let k = i / 2;
        if i % 2 == 0 {
            rec(
                RecordKind::AllocAsync,
                Api::CudaMallocAsync,
                0x7f00_0000_0000 + (k % (2 * WINDOW)) * 0x10_0000,
                4096 + (k % 97) * 512,
                (k % 8) as u16,
                t,
            );
        } else if k >= WINDOW {
            rec(
                RecordKind::FreeAsync,
                Api::CudaFreeAsync,
                0x7f00_0000_0000 + ((k - WINDOW) % (2 * WINDOW)) * 0x10_0000,
                0,
                (k % 8) as u16,
                t,
            );
        } else {
            rec(
                RecordKind::MemInfo,
                Api::CudaMemGetInfo,
                1 << 30,
                2 << 30,
                0,
                t,
            );
        }
        i += 1;
    }
    r.mark_clean_exit();
    println!("{n} records written to {path}");
}
