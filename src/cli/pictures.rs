//! `gpushim plot` and `gpushim flamegraph`: pictures, written beside the trace unless
//! `--output` says where (and beside it only when that folder is the user's alone, see
//! `gpushim::files::default_output`).

use super::output::{fail, picture_kind, write_picture};
use gpushim::report::units::human_bytes;
use gpushim::trace::reader::ReadOptions;
use std::process::ExitCode;

/// Where a picture goes when no `--output` is given: beside `trace`, its name ending `.KIND`
/// (`run.trace` -> `run.timeline.svg`), when the trace's folder is the user's alone; else in
/// the working folder when that is; else nowhere (the error asks for `--output`).
fn beside(trace: &std::path::Path, kind: &str) -> Result<std::path::PathBuf, String> {
    let name = trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".trace").unwrap_or(&name);
    gpushim::files::default_output(trace, &format!("{stem}.{kind}"))
}

/// `gpushim plot`: memory over the run, stacked by kind or line, or the totals over time.
pub fn cmd_plot(
    traces: &[std::path::PathBuf],
    output: Option<std::path::PathBuf>,
    by: super::args::PlotBy,
    opts: &ReadOptions,
) -> ExitCode {
    use super::args::PlotBy;
    use gpushim::export::StackBy;
    let output = match output.map_or_else(|| beside(&traces[0], "timeline.svg"), Ok) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let output = output.as_path();
    match picture_kind(output) {
        Err(e) => fail(e),
        Ok(()) => match match by {
            PlotBy::Total => gpushim::export::plot_svg(traces, opts),
            PlotBy::Kind => gpushim::export::stacked_svg(traces, StackBy::Kind, opts),
            PlotBy::Line => gpushim::export::stacked_svg(traces, StackBy::Line, opts),
        } {
            Ok(svg) => write_picture(output, &svg),
            Err(e) => fail(e),
        },
    }
}

/// `gpushim report`: the run in one HTML page.
pub fn cmd_report(
    traces: &[std::path::PathBuf],
    output: Option<std::path::PathBuf>,
    at: Option<u64>,
    opts: &ReadOptions,
) -> ExitCode {
    let output = match output.map_or_else(|| beside(&traces[0], "html"), Ok) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    match output.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm") => {}
        _ => {
            return fail(format!(
                "--output {}: the page is written as .html; name the file so",
                gpushim::files::shown(&output)
            ));
        }
    }
    let step = |what: &str| {
        if traces.len() > 1 || opts.progress.is_some() {
            eprintln!("gpushim: reading {what}");
        }
    };
    match gpushim::export::page_html(traces, at, opts, &step) {
        Ok(html) => super::output::write_file(&output, html.as_bytes()),
        Err(e) => fail(e),
    }
}

/// `gpushim analyze`: this host's traces analysed (one core each) and saved, for the job's
/// reports to join.
pub fn cmd_analyze(
    traces: &[std::path::PathBuf],
    output: &std::path::Path,
    opts: &ReadOptions,
) -> ExitCode {
    use gpushim::report::analysis::{Wants, analyze_job};
    if let Some(t) = traces
        .iter()
        .find(|t| gpushim::report::analysis::saved::is_saved(t))
    {
        return fail(format!(
            "{}: a saved analysis already; analyze reads traces",
            gpushim::files::shown(t)
        ));
    }
    let all = match analyze_job(traces, opts, &Wants::page()) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    match gpushim::report::analysis::saved::save(&all) {
        Ok(json) => super::output::write_file(output, json.as_bytes()),
        Err(e) => fail(e),
    }
}

/// `gpushim flamegraph`: the memory live at the peak, by stack.
pub fn cmd_flamegraph(
    trace: &std::path::Path,
    output: Option<std::path::PathBuf>,
    by_kind: bool,
    opts: &ReadOptions,
) -> ExitCode {
    let output = match output.map_or_else(|| beside(trace, "flamegraph.svg"), Ok) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let output = output.as_path();
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
                            gpushim::files::shown(trace),
                            human_bytes(p.live_bytes)
                        ),
                        by_kind,
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
