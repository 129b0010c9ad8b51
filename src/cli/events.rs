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
    // The lines are made in a buffer of their own and written a buffer at a time.
    let mut out = std::io::stdout().lock();
    let mut lines = Lines::default();
    if !json {
        lines.text("time_ns,thread,kind,api,device,status,ptr,size,stream,text\n");
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
            RecordKind::StackRef => stacks.text(&reader, r.ptr).unwrap_or(""),
            RecordKind::GraphNode => reader.string(r.size).unwrap_or(""),
            RecordKind::GraphEdge | RecordKind::Graph => {
                graph = graph_text(&r);
                &graph
            }
            _ => "",
        };
        // Each line made in a buffer of its own, integers without `core::fmt` (four in ten
        // of the command's time went there), then written whole: the lines are the file's
        // records, tens of millions of them.
        if json {
            lines.record_json(&r, text);
        } else {
            lines.record_csv(&r, text);
        }
        if let Err(e) = lines.write_full(&mut out) {
            return write_failed(&e);
        }
    }
    if let Err(e) = lines.write(&mut out).and_then(|()| out.flush()) {
        return write_failed(&e);
    }
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

/// Where the lines could not be written: a closed pipe (`| head`) is not an error; anything
/// else (a full disk) is said, and the command fails.
fn write_failed(e: &std::io::Error) -> ExitCode {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return ExitCode::SUCCESS;
    }
    eprintln!("gpushim: events: writing the records failed: {e}");
    ExitCode::from(1)
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

/// Each stack's words, written once: the first `stack_ref` of a stack id carries them, and a
/// later one only the id (in `ptr`), so the output grows with the trace's distinct stacks, not
/// with its allocations times their stacks' length (one long stack named by every allocation
/// made hundreds of times the trace's size). An id the trace defines anew, with other frames,
/// is written again; past 64 MiB of words kept, they are let go and written again when met.
#[derive(Default)]
struct StackTexts {
    made: std::collections::HashMap<u64, (Vec<u64>, String)>,
    bytes: usize,
}

impl StackTexts {
    const MOST_BYTES: usize = 64 << 20;

    /// The words of stack `id` where this is their first time out (or the first since its
    /// frames changed), `None` where they were written already.
    fn text(&mut self, reader: &gpushim::trace::reader::TraceReader, id: u64) -> Option<&str> {
        let frames = reader.stack(id).unwrap_or(&[]);
        let fresh = self
            .made
            .get(&id)
            .is_none_or(|(f, _)| f.as_slice() != frames);
        if !fresh {
            return None;
        }
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
        self.made.get(&id).map(|(_, w)| w.as_str())
    }
}

/// Records' lines as text, written out a buffer at a time.
#[derive(Default)]
struct Lines {
    bytes: Vec<u8>,
}

impl Lines {
    /// Bytes held before they are written.
    const FULL: usize = 64 << 10;

    /// What is held, written, once it fills the buffer.
    fn write_full(&mut self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        if self.bytes.len() < Self::FULL {
            return Ok(());
        }
        self.write(out)
    }

    /// What is held, written.
    fn write(&mut self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let written = out.write_all(&self.bytes);
        self.bytes.clear();
        written
    }

    fn byte(&mut self, b: u8) -> &mut Self {
        self.bytes.push(b);
        self
    }

    fn int(&mut self, v: impl itoa::Integer) -> &mut Self {
        self.bytes
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        self
    }

    /// `v` as `{:#x}` writes it: `0x`, then its hexadecimal digits in lower case, no leading
    /// zeros (`0x0` for zero).
    fn hex(&mut self, v: u64) -> &mut Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0u8; 16];
        let mut at = digits.len();
        let mut v = v;
        loop {
            at -= 1;
            digits[at] = DIGITS[(v & 0xf) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        self.text("0x");
        self.bytes.extend_from_slice(&digits[at..]);
        self
    }

    fn text(&mut self, s: &str) -> &mut Self {
        self.bytes.extend_from_slice(s.as_bytes());
        self
    }

    /// `time_ns,thread,kind,api,device,status,ptr,size,stream,text`.
    fn record_csv(&mut self, r: &gpushim::trace::format::Record, text: &str) {
        self.int(r.time_ns).byte(b',').int(r.thread).byte(b',');
        self.text(r.kind.name())
            .byte(b',')
            .text(r.api.name())
            .byte(b',');
        if r.device != gpushim::trace::format::DEVICE_UNKNOWN {
            self.int(r.device);
        }
        self.byte(b',')
            .int(r.status)
            .byte(b',')
            .hex(r.ptr)
            .byte(b',');
        self.int(r.size).byte(b',').int(r.stream).byte(b',');
        self.csv_field(text);
        self.byte(b'\n');
    }

    /// The record as a JSON object, its keys in order.
    fn record_json(&mut self, r: &gpushim::trace::format::Record, text: &str) {
        self.text("{\"api\":\"").text(r.api.name());
        self.text("\",\"device\":");
        if r.device != gpushim::trace::format::DEVICE_UNKNOWN {
            self.int(r.device);
        } else {
            self.text("null");
        }
        self.text(",\"kind\":\"").text(r.kind.name());
        self.text("\",\"ptr\":\"")
            .hex(r.ptr)
            .text("\",\"size\":")
            .int(r.size);
        self.text(",\"status\":").int(r.status);
        self.text(",\"stream\":").int(r.stream).text(",\"text\":");
        // A string of JSON as serde_json escapes it (writing into a vector cannot fail).
        let _ = serde_json::to_writer(&mut self.bytes, text);
        self.text(",\"thread\":").int(r.thread);
        self.text(",\"time_ns\":").int(r.time_ns).text("}\n");
    }

    /// A CSV field, quoted when it holds a comma, a quote or a line break; a text that a
    /// spreadsheet would take for a formula (starting `=`, `+`, `-`, `@`) gets a leading `'`,
    /// so an NVTX name from someone else's trace is shown, never run.
    fn csv_field(&mut self, s: &str) {
        let formula = if s.starts_with(['=', '+', '-', '@']) {
            "'"
        } else {
            ""
        };
        if s.contains([',', '"', '\n', '\r']) {
            self.text("\"").text(formula);
            for (i, part) in s.split('"').enumerate() {
                if i > 0 {
                    self.text("\"\"");
                }
                self.text(part);
            }
            self.text("\"");
        } else {
            self.text(formula).text(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushim::trace::format::{Api, Record};
    use proptest::prelude::*;

    fn record(ptr: u64, size: u64, time_ns: u64, device: u8) -> Record {
        Record {
            kind: RecordKind::Alloc,
            api: Api::CudaMalloc,
            device,
            status: 2,
            thread: 7,
            time_ns,
            ptr,
            size,
            stream: 3,
        }
    }

    proptest! {
        /// A line as the formatting machinery writes it, whatever the numbers and the text.
        #[test]
        fn a_line_is_what_format_writes(
            ptr in any::<u64>(),
            size in any::<u64>(),
            time_ns in any::<u64>(),
            device in any::<u8>(),
            text in "[a-z=+@,\"\\n -]{0,12}",
        ) {
            let r = record(ptr, size, time_ns, device);
            let mut lines = Lines::default();
            lines.record_csv(&r, &text);
            let device_text = if device == gpushim::trace::format::DEVICE_UNKNOWN {
                String::new()
            } else {
                device.to_string()
            };
            let formula = if text.starts_with(['=', '+', '-', '@']) { "'" } else { "" };
            let field = if text.contains([',', '"', '\n', '\r']) {
                format!("\"{formula}{}\"", text.replace('"', "\"\""))
            } else {
                format!("{formula}{text}")
            };
            let want = format!(
                "{time_ns},7,alloc,cudaMalloc,{device_text},2,{ptr:#x},{size},3,{field}\n"
            );
            prop_assert_eq!(String::from_utf8(lines.bytes.clone()).unwrap(), want);
            lines.bytes.clear();
            lines.record_json(&r, &text);
            let device_json = if device == gpushim::trace::format::DEVICE_UNKNOWN {
                "null".to_string()
            } else {
                device.to_string()
            };
            let want = format!(
                "{{\"api\":\"cudaMalloc\",\"device\":{device_json},\"kind\":\"alloc\",\"ptr\":\"{ptr:#x}\",\
                 \"size\":{size},\"status\":2,\"stream\":3,\"text\":{},\"thread\":7,\"time_ns\":{time_ns}}}\n",
                serde_json::to_string(&text).unwrap()
            );
            prop_assert_eq!(String::from_utf8(lines.bytes).unwrap(), want);
        }
    }
}
