//! The `gpushim` command, one module per command; [`args`] holds the command line, [`output`]
//! how results are written. The reading options travel to each report as a value.

mod args;
mod config;
mod diff;
mod events;
mod export;
mod leaks;
mod oom;
mod output;
mod peak;
mod progress;
mod run;
mod simulate;
mod summary;
mod top;

use args::{Cli, Cmd};
use clap::Parser;
use gpushim::report::units::human_bytes;
use gpushim::trace::reader::ReadOptions;
use output::{fail, picture_kind, write_picture};
use std::process::ExitCode;

/// Parses the command line, reads the reading options once, and runs the command.
pub fn main() -> ExitCode {
    // A closed pipe (`gpushim config | head -1`) ends the command quietly, as for any Unix
    // tool, instead of a panic on the next print.
    // SAFETY: setting a signal's disposition to the default has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let opts = match cli.command.reading().map(|r| r.options()) {
        Some(Err(e)) => return fail(e),
        Some(Ok(o)) => o,
        None => ReadOptions::default(),
    };
    if !opts.filter.is_empty() {
        // A filter that keeps nothing would read like "no leak": it is an error that says
        // what the trace holds instead.
        for t in cli.command.trace_paths() {
            if let Err(e) = gpushim::report::filter_keeps_any(&t, &opts) {
                return fail(e);
            }
        }
    }
    let code = dispatch(cli.command, &opts);
    progress::finish();
    code
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
        Cmd::Summary { traces, json, .. } => summary::cmd_summary(&traces, json, opts),
        Cmd::Events { trace, json, .. } => events::cmd_events(&trace, json, opts),
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
                let bounds = gpushim::report::torch_replay::Bounds {
                    limit,
                    fraction,
                    stop_at_oom: false,
                };
                simulate::cmd_simulate_torch(&traces, &torch, recommend, &bounds, json, opts)
            }
        }
        Cmd::Config { conf } => config::cmd_config(conf),
        Cmd::Lib { lib } => match gpushim::run::find_shim(lib.as_deref()) {
            Ok(p) => {
                println!("{}", p.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
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
        Cmd::Oom { traces, json, .. } => oom::cmd_oom(&traces, json, opts),
        Cmd::Plot { traces, output, .. } => {
            let output = output.unwrap_or_else(|| beside(&traces[0], "timeline.svg"));
            plot(&traces, &output, opts)
        }
        Cmd::Flamegraph { trace, output, .. } => {
            let output = output.unwrap_or_else(|| beside(&trace, "flamegraph.svg"));
            flamegraph(&trace, &output, opts)
        }
        Cmd::Export {
            traces,
            format,
            output,
            protocol,
            view,
            ..
        } => export::cmd_export(&traces, &format, &output, protocol, &view, opts),
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

/// Where a picture goes when no `--output` is given: beside `trace`, its name ending `.KIND`
/// (`run.trace` -> `run.timeline.svg`), never into the working folder.
fn beside(trace: &std::path::Path, kind: &str) -> std::path::PathBuf {
    let name = trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".trace").unwrap_or(&name);
    trace.with_file_name(format!("{stem}.{kind}"))
}

/// `gpushim plot`: live, reserved and NVML's memory over time.
fn plot(traces: &[std::path::PathBuf], output: &std::path::Path, opts: &ReadOptions) -> ExitCode {
    match picture_kind(output) {
        Err(e) => fail(e),
        Ok(()) => match gpushim::export::plot_svg(traces, opts) {
            Ok(svg) => write_picture(output, &svg),
            Err(e) => fail(e),
        },
    }
}

/// `gpushim flamegraph`: the memory live at the peak, by stack.
fn flamegraph(trace: &std::path::Path, output: &std::path::Path, opts: &ReadOptions) -> ExitCode {
    match picture_kind(output) {
        Err(e) => fail(e),
        Ok(()) => match gpushim::report::peak(trace, opts) {
            Ok(peaks) => match peaks.first() {
                Some(p) => write_picture(
                    output,
                    &gpushim::export::flamegraph_svg(
                        p,
                        &format!(
                            "{}: live at the peak ({})",
                            trace.display(),
                            human_bytes(p.live_bytes)
                        ),
                    ),
                ),
                None => fail(
                    "the trace holds no allocation (or none that the filters keep): no \
                     flame graph to draw",
                ),
            },
            Err(e) => fail(e),
        },
    }
}
