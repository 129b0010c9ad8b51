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
    let mut stacks = StackTexts::default();
    while let Some(r) = reader.next() {
        if r.kind.is_definition() {
            continue;
        }
        let graph: String;
        let text: &str = match r.kind {
            RecordKind::RangePush | RecordKind::Mark | RecordKind::RangeStart => {
                reader.string(r.ptr).unwrap_or("")
            }
            RecordKind::StackRef => stacks.text(&reader, r.ptr),
            RecordKind::GraphNode => reader.string(r.size).unwrap_or(""),
            RecordKind::GraphEdge | RecordKind::Graph => {
                graph = graph_text(&r);
                &graph
            }
            _ => "",
        };
        let known = r.device != gpushim::trace::format::DEVICE_UNKNOWN;
        // Written field by field, not through a value built for each line: the lines are
        // the file's records, tens of millions of them.
        let written = if json {
            let device: &dyn std::fmt::Display = if known { &r.device } else { &"null" };
            write!(
                out,
                "{{\"api\":\"{}\",\"device\":{device},\"kind\":\"{}\",\"ptr\":\"{:#x}\",\"size\":{},\
                 \"status\":{},\"stream\":{},\"text\":",
                r.api.name(),
                r.kind.name(),
                r.ptr,
                r.size,
                r.status,
                r.stream,
            )
            .and_then(|()| {
                serde_json::to_writer(&mut out, text).map_err(std::io::Error::other)
            })
            .and_then(|()| {
                writeln!(out, ",\"thread\":{},\"time_ns\":{}}}", r.thread, r.time_ns)
            })
        } else {
            let device: &dyn std::fmt::Display = if known { &r.device } else { &"" };
            write!(
                out,
                "{},{},{},{},{device},{},{:#x},{},{},",
                r.time_ns,
                r.thread,
                r.kind.name(),
                r.api.name(),
                r.status,
                r.ptr,
                r.size,
                r.stream,
            )
            .and_then(|()| write_csv_field(&mut out, text))
            .and_then(|()| out.write_all(b"\n"))
        };
        if written.is_err() {
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

/// Each stack's words, made once for the stack's id (a line of every allocation made them
/// anew, most of the command's time), checked against the stack's frames (a trace may define
/// an id twice), and let go past 64 MiB of them.
#[derive(Default)]
struct StackTexts {
    made: std::collections::HashMap<u64, (Vec<u64>, String)>,
    bytes: usize,
}

impl StackTexts {
    const MOST_BYTES: usize = 64 << 20;

    fn text(&mut self, reader: &gpushim::trace::reader::TraceReader, id: u64) -> &str {
        let frames = reader.stack(id).unwrap_or(&[]);
        let fresh = self
            .made
            .get(&id)
            .is_none_or(|(f, _)| f.as_slice() != frames);
        if fresh {
            let words = frames
                .iter()
                .map(|&ip| gpushim::report::symbolize::describe(reader, ip))
                .collect::<Vec<_>>()
                .join(" < ");
            if self.bytes > Self::MOST_BYTES {
                self.made.clear();
                self.bytes = 0;
            }
            self.bytes += words.len() + 8 * frames.len();
            self.made.insert(id, (frames.to_vec(), words));
        }
        self.made.get(&id).map_or("", |(_, w)| w.as_str())
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break; a text that a
/// spreadsheet would take for a formula (starting `=`, `+`, `-`, `@`) gets a leading `'`, so
/// an NVTX name from someone else's trace is shown, never run.
fn write_csv_field(out: &mut impl std::io::Write, s: &str) -> std::io::Result<()> {
    let formula = if s.starts_with(['=', '+', '-', '@']) {
        "'"
    } else {
        ""
    };
    if s.contains([',', '"', '\n', '\r']) {
        write!(out, "\"{formula}{}\"", s.replace('"', "\"\""))
    } else {
        write!(out, "{formula}{s}")
    }
}
