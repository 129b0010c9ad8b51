//! `gpushim peak`: the moment of most memory in use, and who held it.

use super::output::{fail, print_json_set};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_peak(traces: &[PathBuf], top: usize, json: bool, opts: &ReadOptions) -> ExitCode {
    let mut all = Vec::new();
    let mut cuts = Vec::new();
    let wants = gpushim::report::analysis::Wants::peak();
    let job = match gpushim::report::analysis::analyze_job(traces, opts, &wants) {
        Ok(j) => j,
        Err(e) => return fail(e),
    };
    for (name, a) in job {
        if let Some(c) = a.cut {
            cuts.push(format!(
                "{name}: the trace is incomplete: {c}; the peak may have been in what is \
                 missing, and this report covers what the trace holds"
            ));
        }
        all.push((name, a.peaks.unwrap_or_default()));
    }
    for c in &cuts {
        if json {
            eprintln!("gpushim: {c}");
        } else {
            println!("{c}");
        }
    }
    let combined = gpushim::report::combine_peaks(&all);
    if json {
        print_json_set(&all, &combined);
        return ExitCode::SUCCESS;
    }
    let filtered = !opts.filter.is_empty();
    print!(
        "{}",
        gpushim::report::render::peak::render_peaks(&all, &combined, top, filtered)
    );
    ExitCode::SUCCESS
}
