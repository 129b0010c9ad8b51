//! `gpushim oom`: each failed allocation, with what the device held at that moment.

use super::output::{fail, print_json};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_oom(traces: &[PathBuf], json: bool, at: Option<u64>, opts: &ReadOptions) -> ExitCode {
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
            if let Some(at) = at {
                print!("{}", batch_that_fits(t, at, opts));
            }
        }
    }
    ExitCode::SUCCESS
}

/// The largest batch that would have fit the run's device, under its setting and the other.
fn batch_that_fits(t: &std::path::Path, at: u64, opts: &ReadOptions) -> String {
    use gpushim::report::units::human_bytes;
    let ask = gpushim::report::fit::Ask {
        at,
        batches: Vec::new(),
        device_memory: None,
        limit: None,
        max_batch: at.saturating_mul(8).max(8),
    };
    match gpushim::report::fit::fit(t, &ask, opts) {
        Err(e) => format!("no batch that fits: {e}\n"),
        Ok(f) => {
            let name = |s: &str| {
                if s.is_empty() {
                    "the defaults".to_string()
                } else {
                    s.to_string()
                }
            };
            let mut o = format!(
                "at batch {at}, the largest batch that fits {}: ",
                human_bytes(f.limit_bytes)
            );
            let parts: Vec<String> = f
                .settings
                .iter()
                .map(|s| {
                    format!(
                        "{} under {}{}",
                        s.largest_batch,
                        name(&s.setting),
                        if s.recorded { " (the run's)" } else { "" }
                    )
                })
                .collect();
            o.push_str(&parts.join(", "));
            o.push_str(" (gpushim fit says how: docs/fit.md)\n");
            o
        }
    }
}
