//! `gpushim simulate`: the trace replayed under other pool settings.

use super::output::fail;
use gpushim::report::summary::human_bytes;
use gpushim::trace::reader::ReadOptions;
use std::path::Path;
use std::process::ExitCode;

pub fn cmd_simulate(
    trace: &Path,
    mut conf: Vec<String>,
    json: bool,
    opts: &ReadOptions,
) -> ExitCode {
    if conf.is_empty() {
        conf.push(String::new());
    }
    let out = match gpushim::report::simulate::simulate(trace, &conf, opts) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("outcomes serialize")
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<40} {:>14} {:>14} {:>14} {:>12} {:>8}",
        "policy", "peak reserved", "peak live", "fragmentation", "device allocs", "failed"
    );
    for o in &out {
        println!(
            "{:<40} {:>14} {:>14} {:>13.1}% {:>12} {:>8}",
            o.policy,
            human_bytes(o.peak_reserved_bytes),
            human_bytes(o.peak_live_bytes),
            o.fragmentation_at_peak * 100.0,
            o.device_allocations,
            o.failed_allocations
        );
    }
    ExitCode::SUCCESS
}
