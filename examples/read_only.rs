//! The reader alone: one pass over a trace, every record decoded, put in time order and handed
//! on, and nothing else done with it. `scripts/bench.sh readonce` prints its time beside the
//! reports', as the floor any report stands on.
//! Usage: cargo run --release --example read_only -- TRACE
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: read_only TRACE");
        std::process::exit(2);
    };
    let start = std::time::Instant::now();
    let mut reader = match gpushim::trace::reader::TraceReader::open(&path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let mut batch = Vec::new();
    let (mut records, mut bytes) = (0u64, 0u64);
    while reader.next_batch(&mut batch) {
        records += batch.len() as u64;
        // Each record read, so that nothing is left undone.
        bytes = batch.iter().fold(bytes, |b, r| b.wrapping_add(r.size));
    }
    println!(
        "{records} records ({bytes} bytes named) in {:.3} s",
        start.elapsed().as_secs_f64()
    );
}
