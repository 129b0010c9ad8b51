//! `gpushim peak`: the moment of most memory in use, and who held it.

use super::output::{fail, print_json_set};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_peak(traces: &[PathBuf], top: usize, json: bool, opts: &ReadOptions) -> ExitCode {
    let mut all = Vec::new();
    for t in traces {
        match gpushim::report::peak(t, opts) {
            Ok(p) => all.push((gpushim::files::shown(t).to_string(), p)),
            Err(e) => return fail(e),
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
        gpushim::report::peak::render_peaks(&all, &combined, top, filtered)
    );
    ExitCode::SUCCESS
}
