//! `gpushim leaks`: what is still held, and what grows every iteration, by call site.

use super::output::{fail, print_json_set};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_leaks(
    traces: &[PathBuf],
    boundary: Option<&str>,
    top: usize,
    json: bool,
    opts: &ReadOptions,
) -> ExitCode {
    use gpushim::report::analysis::{Wants, analyze_job};
    let all: Vec<(String, gpushim::report::Leaks)> =
        match analyze_job(traces, opts, &Wants::leaks(boundary)) {
            Ok(j) => j
                .into_iter()
                .filter_map(|(name, a)| Some((name, a.leaks?)))
                .collect(),
            Err(e) => return fail(e),
        };
    let combined = gpushim::report::combine_leaks(&all);
    if json {
        print_json_set(&all, &combined);
        return ExitCode::SUCCESS;
    }
    print!(
        "{}",
        gpushim::report::render::leaks::render_leaks(&all, &combined, boundary, top)
    );
    ExitCode::SUCCESS
}
