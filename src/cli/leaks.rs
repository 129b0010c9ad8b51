//! `gpushim leaks`: what is still held, and what grows every iteration, by call site.

use super::output::{fail, print_holders, print_json_set};
use gpushim::report::summary::human_bytes;
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_leaks(
    traces: &[PathBuf],
    boundary: Option<&str>,
    json: bool,
    opts: &ReadOptions,
) -> ExitCode {
    let mut all = Vec::new();
    for t in traces {
        match gpushim::report::leaks(t, boundary, opts) {
            Ok(l) => all.push((t.display().to_string(), l)),
            Err(e) => return fail(e),
        }
    }
    let combined = gpushim::report::combine_leaks(&all);
    if json {
        print_json_set(&all, &combined);
        return ExitCode::SUCCESS;
    }
    for (i, (t, l)) in all.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("{t}");
        println!(
            "live at exit: {}{}",
            human_bytes(l.live_at_exit_bytes),
            if l.clean_exit {
                ""
            } else {
                " (the process did not exit cleanly: this is what was live when the trace ends)"
            }
        );
        if let Some(cut) = &l.trace_cut {
            println!("the trace is incomplete: {cut}; this report covers what it holds");
        }
        print_holders(&l.live_at_exit, 10, "  ");
        if let Some(seen) = &l.boundary_not_found {
            println!(
                "iterations: --boundary {} names no NVTX range or mark of this trace; it holds {}",
                boundary.unwrap_or(""),
                if seen.is_empty() {
                    "none".to_string()
                } else {
                    seen.join(", ")
                }
            );
            continue;
        }
        match &l.iterations {
            None => println!(
                "iterations: none found (no repeating NVTX range or mark, no regular allocation)"
            ),
            Some(it) => {
                println!("iterations: {} boundaries, by {}", it.count, it.boundary);
                if let (Some(a), Some(b)) =
                    (it.live_at_boundaries.first(), it.live_at_boundaries.last())
                {
                    println!(
                        "  live at the first boundary {}, at the last {}",
                        human_bytes(*a),
                        human_bytes(*b)
                    );
                }
                if it.growing.is_empty() {
                    println!("  no call site grows steadily from one iteration to the next");
                }
                for g in &it.growing {
                    println!(
                        "  grows {} per iteration ({} -> {})  {}",
                        human_bytes(g.bytes_per_iteration),
                        human_bytes(g.live_at_first_boundary),
                        human_bytes(g.live_at_last_boundary),
                        g.call_site
                    );
                }
            }
        }
    }
    if all.len() > 1 {
        let c = &combined;
        println!();
        println!("all {} traces together", c.traces);
        println!("live at exit: {}", human_bytes(c.live_at_exit_bytes));
        print_holders(&c.live_at_exit, 10, "  ");
        if !c.unclean.is_empty() {
            println!("did not exit cleanly: {}", c.unclean.join(", "));
        }
        if c.growing.is_empty() {
            println!("no call site grows steadily in any trace");
        }
        for g in &c.growing {
            println!(
                "  grows {} per iteration in {} of {} traces  {}",
                human_bytes(g.bytes_per_iteration),
                g.traces,
                c.traces,
                g.call_site
            );
        }
    }
    ExitCode::SUCCESS
}
