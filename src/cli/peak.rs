//! `gpushim peak`: the moment of most memory in use, and who held it.

use super::output::{fail, print_holders, print_json_set};
use gpushim::report::summary::{self, human_bytes};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_peak(traces: &[PathBuf], top: usize, json: bool, opts: &ReadOptions) -> ExitCode {
    let mut all = Vec::new();
    for t in traces {
        match gpushim::report::peak(t, opts) {
            Ok(p) => all.push((t.display().to_string(), p)),
            Err(e) => return fail(e),
        }
    }
    let combined = gpushim::report::combine_peaks(&all);
    if json {
        print_json_set(&all, &combined);
        return ExitCode::SUCCESS;
    }
    for (i, (t, peaks)) in all.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("{t}");
        if peaks.is_empty() {
            println!(
                "no allocation{}: nothing was live on any device",
                if !opts.filter.is_empty() {
                    " that the filters keep"
                } else {
                    " in this trace"
                }
            );
        }
        for p in peaks {
            println!(
                "device {}: peak live {} at {} (reserved {})",
                p.device,
                human_bytes(p.live_bytes),
                summary::human_duration(p.time_ns),
                human_bytes(p.reserved_bytes)
            );
            println!("  by call site:");
            print_holders(&p.by_call_site, top, "    ");
            println!("  by NVTX range:");
            print_holders(&p.by_range, top, "    ");
        }
    }
    if all.len() > 1 {
        let c = &combined;
        println!();
        println!("all {} traces together", c.traces);
        println!(
            "sum of the peaks {}; the largest {} (device {} of {})",
            human_bytes(c.sum_of_peaks),
            human_bytes(c.largest_bytes),
            c.largest_device,
            c.largest_trace
        );
        println!("  live at the peaks, by call site:");
        print_holders(&c.by_call_site, top, "    ");
        println!("  by NVTX range:");
        print_holders(&c.by_range, top, "    ");
    }
    ExitCode::SUCCESS
}
