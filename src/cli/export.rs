//! `gpushim export`: the trace in the formats other viewers read.

use super::output::fail;
use gpushim::files::shown;
use gpushim::trace::reader::ReadOptions;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub fn cmd_export(
    traces: &[PathBuf],
    format: &str,
    output: &Path,
    (protocol, max_entries): (u8, usize),
    opts: &ReadOptions,
) -> ExitCode {
    if format == "memory-viz-html" {
        return fail(
            "memory-viz-html is no longer written: its page loaded PyTorch's viewer from the \
             network (an unpinned CDN address, so whoever controls it ran script in the page, \
             and offline it never opened). `gpushim report TRACE` writes one page of the run \
             that opens offline; `--format memory-viz` writes the snapshot for \
             https://pytorch.org/memory_viz",
        );
    }
    let trace = match (format, traces) {
        ("perfetto", _) | (_, [_]) => &traces[0],
        _ => {
            return fail(format!(
                "{format} takes one trace ({} given): export each rank on its own, or use \
                 --format perfetto for one timeline of them all",
                traces.len()
            ));
        }
    };
    // The export is written aside and renamed into place only when it is complete: a failed
    // read leaves no half file (and an earlier file of that name as it was).
    let mut failed = None;
    let r = gpushim::files::write_whole(output, |w| {
        let r = match format {
            "perfetto" => gpushim::export::perfetto(traces, w, opts).map_err(|e| e.to_string()),
            "rmm" => gpushim::export::rmm_csv(trace, w, opts).map_err(|e| e.to_string()),
            _ => gpushim::export::memory_viz(trace, w, (protocol, max_entries), opts)
                .map_err(|e| e.to_string()),
        };
        r.map_err(|e| {
            failed = Some(e);
            std::io::Error::other("the export failed")
        })
    });
    let r = match (r, failed) {
        (_, Some(why)) => Err(why),
        (r, None) => r.map_err(|e| e.to_string()),
    };
    match r {
        Ok(written) => {
            eprintln!(
                "gpushim: wrote {} ({} {})",
                shown(output),
                written.items,
                match format {
                    "perfetto" => "events",
                    "rmm" => "rows",
                    _ => "segments",
                }
            );
            if written.dropped > 0 {
                eprintln!(
                    "gpushim: the history holds the newest {max_entries} allocation events of \
                     each device; {} older ones are left out (--max-entries keeps more)",
                    written.dropped
                );
            }
            if written.dropped_for_bytes > 0 {
                eprintln!(
                    "gpushim: the history's newest events fill {} MiB with their stacks' frames \
                     already; {} older ones are left out (the pickle's size is bounded by it, \
                     not by the trace)",
                    gpushim::export::MOST_HISTORY_BYTES >> 20,
                    written.dropped_for_bytes
                );
            }
            for (t, summarized) in &written.summarized {
                if *summarized > 0 {
                    eprintln!(
                        "gpushim: {} is a trace of any length: its {summarized} oldest records are \
                         summarized in a checkpoint, so the export holds the allocations still \
                         live when the ring began (at their own times) and every record after \
                         in full; `gpushim summary`, `leaks`, `peak` and `oom` answer for the \
                         whole run",
                        shown(t)
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
