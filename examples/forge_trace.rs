//! Writes the forged traces whose worst cases `scripts/bench.sh hostile` times: shapes an
//! adversary can give for work that once grew faster than the trace.
//!   expandable N   a kept 3 GiB tensor alternating with a freed 2^47-byte one, N times (the
//!                  expandable segments' model made a reservation per huge request and every
//!                  later huge request walked them all)
//! Usage: cargo run --release --example forge_trace -- SHAPE N OUT.trace
use gpushim::trace::format::{Api, Record, RecordKind};
use gpushim::trace::recorder::{OpenOptions, Recorder};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(shape), Some(n), Some(path)) = (
        args.first(),
        args.get(1).and_then(|n| n.parse::<u64>().ok()),
        args.get(2),
    ) else {
        eprintln!("usage: forge_trace expandable N OUT.trace");
        std::process::exit(2);
    };
    let r = Box::new(Recorder::new());
    assert!(r.begin_open());
    r.open(&OpenOptions {
        path: path.as_bytes(),
        pid: 1,
        rank: -1,
        host: b"bench",
        program: b"forge_trace",
        cmdline: b"forge_trace\0",
        env: b"",
        trace_max: 64 << 30,
        ring: false,
    })
    .expect("open the trace");
    let mut t = 0u64;
    let mut rec = |kind, ptr, size| {
        t += 1000;
        r.append(&Record {
            kind,
            api: Api::Torch,
            device: 0,
            status: 0,
            thread: 0,
            time_ns: t,
            ptr,
            size,
            stream: 0,
        })
    };
    match shape.as_str() {
        "expandable" => {
            let mut at = 0x7e00_0000_0000u64;
            for _ in 0..n {
                rec(RecordKind::SegmentReserve, at, 3 << 30);
                rec(RecordKind::TensorAlloc, at, 3 << 30);
                at += 4 << 30;
                rec(RecordKind::TensorAlloc, at, 1 << 47);
                rec(RecordKind::TensorFree, at, 1 << 47);
            }
        }
        other => {
            eprintln!("forge_trace: no shape '{other}' (expandable)");
            std::process::exit(2);
        }
    }
    r.mark_clean_exit();
}
