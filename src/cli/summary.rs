//! `gpushim summary`: calls, bytes, peaks and failures per API and device.

use super::output::{fail, print_json};
use gpushim::report::{job, summary};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_summary(
    traces: &[PathBuf],
    json: bool,
    at: Option<u64>,
    opts: &ReadOptions,
) -> ExitCode {
    use gpushim::report::analysis::{Wants, analyze_job};
    // With the run's batch: how many batches of headroom, as `fit` finds it (from a trace,
    // not a saved analysis), its requests from the summary's read; a job's traces' each read
    // after, one at a time, so that one trace's requests are held at a time.
    let wants = Wants {
        requests: at.is_some() && traces.len() == 1,
        ..Wants::summary()
    };
    let mut job = match analyze_job(traces, opts, &wants) {
        Ok(j) => j,
        Err(e) => return fail(e),
    };
    let fits: Vec<Option<gpushim::report::fit::Fit>> = job
        .iter_mut()
        .map(|(_, a)| {
            let at = at?;
            if gpushim::report::analysis::saved::is_saved(&a.info.path) {
                return None;
            }
            let run = gpushim::report::analysis::run_of(a, opts).ok()?;
            let ask = gpushim::report::fit::Ask::largest(at, 4096);
            gpushim::report::fit::fit_run(&run, &ask, opts).ok()
        })
        .collect();
    let all: Vec<summary::Summary> = job.into_iter().filter_map(|(_, a)| a.summary).collect();
    if json {
        let with = |s: &summary::Summary, f: &Option<gpushim::report::fit::Fit>| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            if let Some(f) = f {
                v["fit"] = serde_json::to_value(f).unwrap_or_default();
            }
            v
        };
        if all.len() == 1 {
            print_json(&with(&all[0], &fits[0]));
        } else {
            let each: Vec<_> = all.iter().zip(&fits).map(|(s, f)| with(s, f)).collect();
            print_json(&serde_json::json!({"traces": each, "combined": job::combine(&all)}));
        }
    } else {
        for (i, s) in all.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", s.render());
            if let Some(f) = &fits[i] {
                print!("{}", headroom(f));
            }
        }
        if all.len() > 1 {
            println!();
            print!("{}", job::combine(&all).render());
        }
    }
    ExitCode::SUCCESS
}

/// The headroom in batches, one line.
fn headroom(f: &gpushim::report::fit::Fit) -> String {
    let own = f
        .settings
        .iter()
        .find(|s| s.recorded)
        .map_or(0, |s| s.largest_batch);
    format!(
        "headroom in batches: the run used {}, the largest that fits {} is {} ({} more; \
         gpushim fit says how)\n",
        f.at,
        gpushim::report::units::human_bytes(f.limit_bytes),
        f.largest_by_setting(),
        own.saturating_sub(f.at)
    )
}
