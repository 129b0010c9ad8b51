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
            gpushim::report::oom::render_ooms(&gpushim::files::shown(t).to_string(), &ooms)
        );
        // A tensor PyTorch's allocator could not serve: would another setting have served it?
        if ooms.iter().any(|o| o.api == "torch_allocator") {
            match gpushim::report::torch_replay::oom_advice(t, opts) {
                Ok(Some(a)) => print!("{}", gpushim::report::torch_replay::render_advice(&a)),
                Ok(None) => {}
                Err(e) => eprintln!(
                    "gpushim: {}: no replay of PyTorch's allocator: {e}",
                    gpushim::files::shown(t)
                ),
            }
        }
    }
    ExitCode::SUCCESS
}
