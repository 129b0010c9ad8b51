//! `gpushim summary`: calls, bytes, peaks and failures per API and device.

use super::output::{fail, print_json};
use gpushim::report::{job, summary};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_summary(traces: &[PathBuf], json: bool, opts: &ReadOptions) -> ExitCode {
    let mut all = Vec::new();
    for t in traces {
        match summary::summarize(t, opts) {
            Ok(s) => all.push(s),
            Err(e) => return fail(e),
        }
    }
    if json {
        if all.len() == 1 {
            print_json(&all[0]);
        } else {
            print_json(&serde_json::json!({"traces": all, "combined": job::combine(&all)}));
        }
    } else {
        for (i, s) in all.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", s.render());
        }
        if all.len() > 1 {
            println!();
            print!("{}", job::combine(&all).render());
        }
    }
    ExitCode::SUCCESS
}
