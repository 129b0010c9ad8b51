//! `gpushim events`: every record, one per line (CSV) or as JSON.

use super::output::fail;
use gpushim::trace::format::RecordKind;
use gpushim::trace::reader::ReadOptions;
use std::path::Path;
use std::process::ExitCode;

pub fn cmd_events(trace: &Path, json: bool, opts: &ReadOptions) -> ExitCode {
    use std::io::Write;
    let mut reader = match gpushim::trace::reader::TraceReader::open_with(trace, opts) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if !json {
        let _ = writeln!(
            out,
            "time_ns,thread,kind,api,device,status,ptr,size,stream,text"
        );
    }
    while let Some(r) = reader.next() {
        if r.kind.is_definition() {
            continue;
        }
        let text = match r.kind {
            RecordKind::RangePush | RecordKind::Mark | RecordKind::RangeStart => {
                reader.string(r.ptr).unwrap_or("").to_string()
            }
            RecordKind::StackRef => reader
                .stack(r.ptr)
                .unwrap_or(&[])
                .iter()
                .map(|&ip| gpushim::report::symbolize::describe(&reader, ip))
                .collect::<Vec<_>>()
                .join(" < "),
            RecordKind::GraphNode => reader.string(r.size).unwrap_or("").to_string(),
            RecordKind::GraphEdge | RecordKind::Graph => graph_text(&r),
            _ => String::new(),
        };
        let device = if r.device == gpushim::trace::format::DEVICE_UNKNOWN {
            String::new()
        } else {
            r.device.to_string()
        };
        let line = if json {
            serde_json::json!({
                "time_ns": r.time_ns, "thread": r.thread, "kind": r.kind.name(),
                "api": r.api.name(), "device": (r.device != gpushim::trace::format::DEVICE_UNKNOWN).then_some(r.device),
                "status": r.status, "ptr": format!("{:#x}", r.ptr), "size": r.size, "stream": r.stream,
                "text": text,
            })
            .to_string()
        } else {
            format!(
                "{},{},{},{},{device},{},{:#x},{},{},{}",
                r.time_ns,
                r.thread,
                r.kind.name(),
                r.api.name(),
                r.status,
                r.ptr,
                r.size,
                r.stream,
                csv_field(&text)
            )
        };
        if writeln!(out, "{line}").is_err() {
            return ExitCode::SUCCESS; // a closed pipe (| head) is not an error
        }
    }
    let _ = out.flush();
    if let Some(d) = &reader.stats().damage {
        eprintln!(
            "gpushim: {}: stopped at offset {} (record {}): {}; {} later records not decoded",
            gpushim::files::shown(trace),
            d.offset,
            d.index,
            d.reason,
            d.skipped
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// What a record of the autograd graph says, in words: where an input came from, or how a
/// walk ended.
fn graph_text(r: &gpushim::trace::format::Record) -> String {
    use gpushim::trace::format::graph;
    if r.kind == RecordKind::Graph {
        return format!("walk {}", graph::outcome(r.status));
    }
    let (node, input) = graph::unpack(r.ptr);
    match r.status {
        graph::FROM_NODE => {
            let (from, output) = graph::unpack(r.size);
            format!("input {input} of node {node} from node {from} (its output {output})")
        }
        graph::FROM_LEAF => format!("input {input} of node {node} from a leaf at {:#x}", r.size),
        _ => format!("input {input} of node {node} takes no gradient"),
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break; a text that a
/// spreadsheet would take for a formula (starting `=`, `+`, `-`, `@`) gets a leading `'`, so
/// an NVTX name from someone else's trace is shown, never run.
fn csv_field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}
