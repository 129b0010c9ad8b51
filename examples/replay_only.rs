fn main() {
    let path = std::env::args().nth(1).unwrap();
    let mode = std::env::args().nth(2).unwrap_or_default();
    let start = std::time::Instant::now();
    let mut reader = gpushim::trace::reader::TraceReader::open(&path).unwrap();
    let mut held = gpushim::trace::reader::Held::default();
    let mut rp = gpushim::report::live::Replay::default();
    let mut kinds = gpushim::report::kinds::Kinds::default();
    let mut n = 0u64;
    let cpu = gpushim::trace::reader::thread_cpu_ns();
    while reader.next_held(&mut held) {
        for r in held.records() {
            if mode != "none" {
                let c = rp.apply(r);
                if matches!(c, gpushim::trace::live::Change::Alloc { .. }) {
                    n += 1;
                }
            }
            if mode == "kinds" {
                kinds.observe(&reader, r);
            }
        }
    }
    let cpu = gpushim::trace::reader::thread_cpu_ns() - cpu;
    println!(
        "{n} allocs, {:.3} s, cpu {:.3}",
        start.elapsed().as_secs_f64(),
        cpu as f64 / 1e9
    );
}
