//! `gpushim oom`: each failed allocation, with what the device held at that moment.

use super::output::{fail, print_json_set};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_oom(traces: &[PathBuf], json: bool, at: Option<u64>, opts: &ReadOptions) -> ExitCode {
    // The failures, and what grew every iteration until them: one analysis per trace.
    let wants = gpushim::report::analysis::Wants {
        oom: true,
        leaks: Some(None),
        leaks_only_with_failures: true,
        // A failure of PyTorch's: the replay's run from the same descriptor, rewound (the
        // advice is not part of --json); a job's traces' each read after, one at a time, so
        // that one trace's requests are held at a time.
        replay_if_torch_failed: !json && traces.len() == 1,
        ..Default::default()
    };
    let job = match gpushim::report::analysis::analyze_job(traces, opts, &wants) {
        Ok(j) => j,
        Err(e) => return fail(e),
    };
    // --json: one document, every trace's failures in it.
    let mut json_all = Vec::new();
    for (name, mut a) in job {
        let t = a.info.path.as_path();
        let (ooms, cut) = (a.ooms.unwrap_or_default(), a.cut);
        let cut = cut.map(|c| {
            format!(
                "the trace is incomplete: {c}; a failure among what is missing is not here, \
                 and this report covers what the trace holds"
            )
        });
        if json {
            if let Some(c) = &cut {
                eprintln!("gpushim: {name}: {c}");
            }
            json_all.push((name, ooms));
            continue;
        }
        print!(
            "{}",
            gpushim::report::render::oom::render_ooms(&name, &ooms)
        );
        if let Some(c) = &cut {
            println!("{c}");
        }
        if let Some(l) = a.leaks {
            print!("{}", growth_at_failure(l, &ooms));
        }
        // A tensor PyTorch's allocator could not serve: would another setting have served it?
        // (A replay of the run's requests: from its trace, not from a saved analysis.)
        let torch_failed = ooms.iter().any(|o| o.api == "torch_allocator");
        if torch_failed && gpushim::report::analysis::saved::is_saved(t) {
            println!(
                "no replay of PyTorch's allocator from a saved analysis: run oom on {name}'s trace"
            );
        } else if torch_failed {
            // The replay's requests and the headroom beside them, read once for the advice
            // and the batch that fits (by the analysis, where it could).
            let run = a
                .replay_run
                .take()
                .unwrap_or_else(|| gpushim::report::analysis::read_run(t, opts));
            // What PyTorch's allocator could hold at the failure (its tensors and cache, and
            // what CUDA then said was free): the room a batch had, as the advice replays it.
            let mut room = None;
            match &run {
                Ok(r) => match gpushim::report::torch_allocator::oom_advice_of(r.input()) {
                    Ok(Some(a)) => {
                        room = a.fraction_bytes.or(a.capacity_bytes);
                        print!(
                            "{}",
                            gpushim::report::render::torch_allocator::render_advice(&a)
                        )
                    }
                    // Failures of PyTorch's with no tensor of PyTorch's failed: its raw
                    // cudaMalloc attempts only, which the tensor's failure record follows.
                    Ok(None) => {}
                    Err(e) => no_replay(t, &e),
                },
                Err(gpushim::report::fit::FitError::Replay(e)) => no_replay(t, e),
                Err(e) => eprintln!(
                    "gpushim: {}: no replay of PyTorch's allocator: {e}",
                    gpushim::files::shown(t)
                ),
            }
            // The batch as given, else as the run's command line said it.
            let said = at.map(|n| (n, None)).or_else(|| {
                gpushim::report::fit::batch_from_cmdline(&a.info.cmdline)
                    .map(|(n, words)| (n, Some(words)))
            });
            if let Some((at, words)) = said {
                if let Some(words) = words {
                    println!(
                        "the run's batch, from its command line ({}): {at} (--at says another)",
                        gpushim::fixedfmt::Escaped(words.as_bytes())
                    );
                }
                print!("{}", batch_that_fits(&run, at, room, opts));
            }
        }
    }
    if json {
        let failed: usize = json_all.iter().map(|(_, o)| o.len()).sum();
        print_json_set(
            &json_all,
            serde_json::json!({ "failed_allocations": failed }),
        );
    }
    ExitCode::SUCCESS
}

/// Why there is no replay of PyTorch's allocator for the failure: on stdout where the trace
/// says why (no tensors, the failure summarized), else on stderr.
fn no_replay(t: &std::path::Path, e: &gpushim::report::torch_allocator::ReplayError) {
    use gpushim::report::torch_allocator::ReplayError as E;
    let summarized = e.failure_summarized();
    match summarized.as_ref().unwrap_or(e) {
        e @ (E::NoTensors { .. } | E::FailureSummarized { .. }) => {
            println!("no replay of PyTorch's allocator: {e}")
        }
        e => eprintln!(
            "gpushim: {}: no replay of PyTorch's allocator: {e}",
            gpushim::files::shown(t)
        ),
    }
}

/// The largest batch that would have fit the run's device, under its setting and the other:
/// in the room PyTorch's allocator had at the failure where the advice found it, else the
/// device less what the CUDA context and libraries took.
fn batch_that_fits(
    run: &Result<gpushim::report::fit::FitRun, gpushim::report::fit::FitError>,
    at: u64,
    room: Option<u64>,
    opts: &ReadOptions,
) -> String {
    let ask = gpushim::report::fit::Ask {
        limit: room,
        ..gpushim::report::fit::Ask::largest(at, at.saturating_mul(8).max(8))
    };
    match run
        .as_ref()
        .map_err(ToString::to_string)
        .and_then(|r| gpushim::report::fit::fit_run(r, &ask, opts).map_err(|e| e.to_string()))
    {
        Err(e) => format!("no batch that fits: {e}\n"),
        // A run that leaks ran out because it grew: the steady step's answer first.
        Ok(f) => match f
            .leaking
            .as_ref()
            .and_then(|l| Some((l, l.steady.as_ref()?)))
        {
            Some((l, steady)) => format!(
                "the run grew {} per iteration (gpushim leaks names the lines): at batch {at}, \
                 the largest batch that fits {} without the growth (a steady step), under the \
                 run's setting: {}{}; as the run was, grown by its last iteration: {} \
                 (gpushim fit says how: docs/fit.md)\n",
                gpushim::report::units::human_bytes(l.bytes_per_iteration),
                gpushim::report::units::human_bytes(f.limit_bytes),
                steady.largest_batch,
                if steady.largest_is_the_cap {
                    " or more"
                } else {
                    ""
                },
                f.largest_by_setting()
            ),
            None => format!(
                "at batch {at}, the largest batch that fits {}: {} (gpushim fit says how: \
                 docs/fit.md)\n",
                gpushim::report::units::human_bytes(f.limit_bytes),
                f.largest_by_setting()
            ),
        },
    }
}
/// When lines grow every iteration: what they held of what was live at each failure, with
/// their kinds (the leak that filled the device, named).
fn growth_at_failure(l: gpushim::report::Leaks, ooms: &[gpushim::report::Oom]) -> String {
    use gpushim::report::units::human_bytes;
    if ooms.is_empty() {
        return String::new();
    }
    let Some(it) = l.iterations.filter(|i| !i.growing.is_empty()) else {
        return String::new();
    };
    let mut o = String::new();
    for f in ooms {
        let held: Vec<(&gpushim::report::Growth, u64)> = it
            .growing
            .iter()
            .filter_map(|g| {
                f.holders
                    .iter()
                    .find(|h| h.label == g.call_site)
                    .map(|h| (g, h.bytes))
            })
            .collect();
        if held.is_empty() {
            continue;
        }
        let sum = held.iter().fold(0u64, |a, (_, b)| a.saturating_add(*b));
        o.push_str(&format!(
            "at {}: the lines growing every iteration held {} of the {} live:\n",
            gpushim::report::units::human_duration(f.time_ns),
            human_bytes(sum),
            human_bytes(f.live_bytes)
        ));
        for (g, b) in held {
            o.push_str(&format!(
                "  {}{} (grows {} per iteration)  {}\n",
                human_bytes(b),
                g.kind
                    .map(|k| format!(" of {}", k.name()))
                    .unwrap_or_default(),
                human_bytes(g.bytes_per_iteration),
                g.call_site
            ));
        }
    }
    o
}
