//! `gpushim oom`: each failed allocation, with what the device held at that moment.

use super::output::{fail, print_json};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_oom(traces: &[PathBuf], json: bool, opts: &ReadOptions) -> ExitCode {
    for t in traces {
        let ooms = match gpushim::report::oom(t, opts) {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        if json {
            print_json(&ooms);
            continue;
        }
        print!(
            "{}",
            gpushim::report::oom::render_ooms(&t.display().to_string(), &ooms)
        );
    }
    ExitCode::SUCCESS
}
