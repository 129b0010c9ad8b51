//! The `gpushim` command, one module per command; [`args`] holds the command line, [`output`]
//! how results are written. The reading options travel to each report as a value.

mod args;
mod config;
mod diff;
mod events;
mod export;
mod fit;
mod help;
mod leaks;
mod oom;
mod output;
mod peak;
mod pictures;
mod progress;
mod reading;
mod run;
mod simulate;
mod summary;
mod top;
mod values;

use args::{Cli, Cmd};
use clap::Parser;
use gpushim::trace::reader::{Counts, ReadOptions};
use output::fail;
use std::process::ExitCode;

/// Parses the command line, reads the reading options once, and runs the command; with
/// `GPUSHIM_READS=1`, says what its reading cost.
pub fn main() -> ExitCode {
    let counts = Counts::default();
    let code = run(&counts);
    if std::env::var_os("GPUSHIM_READS").is_some_and(|v| v == "1") {
        reading::say_reads(&counts);
    }
    code
}

/// [`main`], its reading counted in `counts`.
fn run(counts: &Counts) -> ExitCode {
    // A closed pipe (`gpushim config | head -1`) ends the command quietly, as for any Unix
    // tool, instead of a panic on the next print.
    // SAFETY: setting a signal's disposition to the default has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    // Each trace named is the file it named when first opened, for every part of the command
    // that reads it.
    gpushim::trace::reader::pin_opened_traces();
    let opts = match cli.command.reading().map(|r| r.options()) {
        Some(Err(e)) => return fail(e),
        Some(Ok(o)) => o,
        None => ReadOptions::default(),
    };
    let opts = ReadOptions {
        mode: reading::mode_from_env(counts.clone()),
        ..opts
    };
    for t in cli.command.trace_paths() {
        if let Some(help) = missing_trace(&t) {
            return fail(help);
        }
    }
    if !opts.filter.is_empty() && !cli.command.checks_filter_as_it_reads() {
        // A filter that keeps nothing would read like "no leak": it is an error that says
        // what the trace holds instead (the analysis says so as it reads).
        for t in cli.command.trace_paths() {
            if gpushim::report::analysis::saved::is_saved(&t) {
                continue;
            }
            if let Err(e) = gpushim::report::filter_keeps_any(&t, &opts) {
                return fail(e);
            }
        }
    }
    let code = dispatch(cli.command, &opts);
    progress::finish();
    code
}

/// For a trace named that is not there: where `run` writes traces, the traces that are in that
/// folder, and the nearest of them. `None` when it exists (or cannot be looked at: the reader
/// says why).
fn missing_trace(t: &std::path::Path) -> Option<String> {
    use gpushim::files::shown;
    match std::fs::symlink_metadata(t) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        _ => return None,
    }
    let (folder, in_here) = match t.parent() {
        Some(p) if !p.as_os_str().is_empty() => (p, false),
        _ => (std::path::Path::new("."), true),
    };
    let mut here: Vec<String> = std::fs::read_dir(folder)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name())
                .filter(|n| n.to_string_lossy().ends_with(".trace"))
                .map(|n| shown(std::path::Path::new(&n)).to_string())
                .collect()
        })
        .unwrap_or_default();
    here.sort();
    let name = t
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut o = format!(
        "{}: no such trace. `gpushim run` writes a trace per process into the working folder, \
         named gpushim-PROGRAM.PID.trace (or where --trace or GPUSHIM_TRACE says), and names it \
         when the program ends",
        shown(t)
    );
    let near = here
        .iter()
        .filter_map(|h| Some((gpushim::config::edit_distance(h, &name)?, h)))
        .filter(|(d, h)| *d <= (h.len().max(name.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, h)| h.clone());
    let there = if in_here {
        "the working folder".to_string()
    } else {
        shown(folder).to_string()
    };
    if let Some(near) = near {
        let near = if in_here {
            near
        } else {
            shown(&folder.join(&near)).to_string()
        };
        o.push_str(&format!("; did you mean {near}?"));
    } else if !folder.is_dir() {
        o.push_str(&format!("; {there} does not exist"));
    } else if here.is_empty() {
        o.push_str(&format!("; {there} holds no trace"));
    } else {
        const SHOWN: usize = 8;
        o.push_str(&format!(
            "; the traces in {there}: {}{}",
            here.iter()
                .take(SHOWN)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if here.len() > SHOWN {
                format!(" and {} more", here.len() - SHOWN)
            } else {
                String::new()
            }
        ));
    }
    Some(o)
}

/// `opts` for a command that lists a trace's records rather than reporting on the run: of a
/// ring's two checkpoints, the one with the most records after it in detail (the older, up to
/// seven eighths of the ring back), where the reports read the newest (its summary covers the
/// whole run, and only a second or so of the records follow it).
fn in_full(opts: &ReadOptions) -> ReadOptions {
    ReadOptions {
        longest_ring: true,
        ..opts.clone()
    }
}

fn dispatch(command: Cmd, opts: &ReadOptions) -> ExitCode {
    match command {
        Cmd::Run {
            conf,
            trace,
            lib,
            per_tensor,
            pluggable,
            cmd,
        } => {
            let route = match (per_tensor, pluggable) {
                (true, _) => gpushim::run::TorchRoute::PerTensor,
                (false, true) => gpushim::run::TorchRoute::Pluggable,
                (false, false) => gpushim::run::TorchRoute::Cache,
            };
            run::cmd_run(conf, trace, lib, route, cmd)
        }
        Cmd::Summary {
            traces, json, at, ..
        } => summary::cmd_summary(&traces, json, at, opts),
        // The records themselves: from a ring's checkpoint with the most of the ring after it.
        Cmd::Events { trace, json, .. } => events::cmd_events(&trace, json, &in_full(opts)),
        Cmd::Simulate {
            traces,
            conf,
            torch,
            recommend,
            limit,
            fraction,
            json,
            ..
        } => {
            if torch.is_empty() && !recommend {
                simulate::cmd_simulate(&traces, conf, json, opts)
            } else {
                let bounds = gpushim::report::torch_allocator::Bounds {
                    limit,
                    fraction,
                    stop_at_oom: false,
                    // Peaks under each setting, from a ring as a run under it would stand.
                    afresh: true,
                    ..Default::default()
                };
                simulate::cmd_simulate_torch(&traces, &torch, recommend, &bounds, json, opts)
            }
        }
        c @ Cmd::Fit { .. } => fit::cmd_fit_of(c, opts),
        Cmd::Config { conf } => config::cmd_config(conf),
        Cmd::Lib { lib, sources } => config::cmd_lib(lib, sources),
        Cmd::Leaks {
            traces,
            boundary,
            top,
            json,
            ..
        } => leaks::cmd_leaks(&traces, boundary.as_deref(), top, json, opts),
        Cmd::Peak {
            traces, top, json, ..
        } => peak::cmd_peak(&traces, top, json, opts),
        Cmd::Oom {
            traces, json, at, ..
        } => oom::cmd_oom(&traces, json, at, opts),
        Cmd::Plot {
            traces, output, by, ..
        } => pictures::cmd_plot(&traces, output, by, opts),
        Cmd::Report {
            traces, output, at, ..
        } => pictures::cmd_report(&traces, output, at, opts),
        Cmd::Analyze { traces, output, .. } => pictures::cmd_analyze(&traces, &output, opts),
        Cmd::Flamegraph {
            trace,
            output,
            color,
            ..
        } => pictures::cmd_flamegraph(&trace, output, color == args::FlameColor::Kind, opts),
        Cmd::Export {
            traces,
            format,
            output,
            protocol,
            max_entries,
            ..
        } => export::cmd_export(
            &traces,
            &format,
            &output,
            (protocol, max_entries),
            &in_full(opts),
        ),
        Cmd::Diff { a, b, json, .. } => diff::cmd_diff(&a, &b, json, opts),
        Cmd::Top {
            trace,
            interval,
            count,
            top,
            ..
        } => top::cmd_top(&trace, &interval, count, top, opts),
    }
}
