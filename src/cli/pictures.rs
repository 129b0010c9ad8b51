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

/// `gpushim plot`: live, reserved and NVML's memory over time.
pub fn cmd_plot(
    traces: &[std::path::PathBuf],
    output: Option<std::path::PathBuf>,
    opts: &ReadOptions,
) -> ExitCode {
    let output = match output.map_or_else(|| beside(&traces[0], "timeline.svg"), Ok) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let output = output.as_path();
    match picture_kind(output) {
        Err(e) => fail(e),
        Ok(()) => match gpushim::export::plot_svg(traces, opts) {
            Ok(svg) => write_picture(output, &svg),
            Err(e) => fail(e),
        },
    }
}

/// `gpushim flamegraph`: the memory live at the peak, by stack.
pub fn cmd_flamegraph(
    trace: &std::path::Path,
    output: Option<std::path::PathBuf>,
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
