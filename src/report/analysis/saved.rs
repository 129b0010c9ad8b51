//! Saved analyses: a job's ranks analysed where their traces lie, one step per host (`gpushim
//! analyze TRACE... -o HOST.analysis`, launched by `srun` or `torchrun`), and the command
//! joining the saved files into the job's summary, leaks, peak, failures and page.
//!
//! A saved analysis is one JSON object: the format's name and version, then each trace's
//! reports as the analysis made them (everything the page shows). It is read as a file
//! another user may have written: a regular file of at most [`MAX_BYTES`], opened without
//! blocking; every string in it is made printable before any report sees it, as a trace's
//! strings are; a file of another format or version is refused with what it is.

use super::Analysis;
use crate::report::leaks::Leaks;
use crate::report::oom::Oom;
use crate::report::peak::Peak;
use crate::report::summary::Summary;
use crate::report::timeline::Lane;
use crate::trace::reader::{ReadError, TraceInfo};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What the file says it is.
pub const FORMAT: &str = "gpushim-analysis";
pub const VERSION: u32 = 2;
/// The largest saved analysis read (one trace's takes well under a megabyte: its reports are
/// bounded by the lines and columns they keep, not by the trace's length).
pub const MAX_BYTES: u64 = 256 << 20;
/// The most values (counted by the commas that part them) a saved analysis may hold: the
/// file is read into a JSON tree of about 50 bytes a value before anything in it is checked,
/// so this bounds that tree near 200 MiB. One trace's analysis holds tens of thousands.
pub const MAX_VALUES: usize = 4 << 20;

#[derive(Serialize, Deserialize)]
struct SavedFile {
    format: String,
    version: u32,
    /// The host that made it.
    host: String,
    traces: Vec<SavedTrace>,
}

/// One trace's analysis, as saved.
#[derive(Serialize, Deserialize)]
struct SavedTrace {
    /// The trace as the saving host named it.
    name: String,
    host: String,
    program: String,
    pid: u32,
    rank: i32,
    cmdline: Vec<String>,
    clean_exit: bool,
    summary: Summary,
    leaks: Leaks,
    /// When each iteration boundary `leaks` kept came (the page marks them).
    boundary_times_ns: Vec<u64>,
    peaks: Vec<Peak>,
    ooms: Vec<Oom>,
    cut: Option<String>,
    lanes: Vec<Lane>,
}

/// The saved form of `traces` (each: its name, and an analysis of everything the page shows).
pub fn save(traces: &[(String, Analysis)]) -> Result<String, String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut out = Vec::new();
    for (name, a) in traces {
        let (Some(summary), Some(leaks), Some(peaks), Some(ooms)) =
            (&a.summary, &a.leaks, &a.peaks, &a.ooms)
        else {
            return Err(format!("{name}: the analysis is not whole"));
        };
        out.push(SavedTrace {
            name: name.clone(),
            host: a.info.host.clone(),
            program: a.info.program.clone(),
            pid: a.info.pid,
            rank: a.info.rank,
            cmdline: a.info.cmdline.clone(),
            clean_exit: a.info.clean_exit,
            summary: summary.clone(),
            leaks: leaks.clone(),
            boundary_times_ns: leaks
                .iterations
                .as_ref()
                .map(|i| i.boundary_times_ns.clone())
                .unwrap_or_default(),
            peaks: peaks.clone(),
            ooms: ooms.clone(),
            cut: a.cut.clone(),
            lanes: a.lanes.clone().unwrap_or_default(),
        });
    }
    let file = SavedFile {
        format: FORMAT.to_string(),
        version: VERSION,
        host: host.trim().to_string(),
        traces: out,
    };
    serde_json::to_string(&file).map_err(|e| e.to_string())
}

/// Whether the file at `path` is a saved analysis (by its first bytes), not a trace.
pub fn is_saved(path: &Path) -> bool {
    let mut head = [0u8; 64];
    let Ok((mut f, _)) = crate::trace::reader::open_named(path) else {
        return false;
    };
    let n = std::io::Read::read(&mut f, &mut head).unwrap_or(0);
    let text = String::from_utf8_lossy(&head[..n]);
    let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    text.starts_with(&format!("{{\"format\":\"{FORMAT}\""))
}

/// The analyses a saved file holds, each named `HOST:NAME` (the host that saved it).
pub fn load(path: &Path) -> Result<Vec<(String, Analysis)>, ReadError> {
    let err = |m: String| ReadError::Io(path.to_path_buf(), std::io::Error::other(m));
    let (f, meta) =
        crate::trace::reader::open_named(path).map_err(|e| ReadError::Io(path.to_path_buf(), e))?;
    if meta.len() > MAX_BYTES {
        return Err(err(format!(
            "a saved analysis of {} bytes: more than the {MAX_BYTES} one can be (it is not one, \
             or it was damaged)",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX_BYTES), &mut bytes)
        .map_err(|e| ReadError::Io(path.to_path_buf(), e))?;
    let values = bytes.iter().filter(|&&b| b == b',').count();
    if values > MAX_VALUES {
        return Err(err(format!(
            "a saved analysis of {values} values: more than the {MAX_VALUES} one can hold (it \
             is not one, or it was damaged)"
        )));
    }
    let mut v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| err(format!("not a saved analysis: {}", said(&e))))?;
    printable_strings(&mut v);
    let format = v["format"].as_str().unwrap_or("");
    let version = v["version"].as_u64().unwrap_or(0);
    if format != FORMAT || version != u64::from(VERSION) {
        return Err(err(format!(
            "a file of format '{format}' version {version}: this gpushim reads {FORMAT} version \
             {VERSION} (save it again with this gpushim's `analyze`)"
        )));
    }
    let file: SavedFile = serde_json::from_value(v).map_err(|e| {
        err(format!(
            "a saved analysis this gpushim cannot read: {}",
            said(&e)
        ))
    })?;
    Ok(file
        .traces
        .into_iter()
        .map(|t| (format!("{}:{}", t.host, t.name), analysis_of(t, path)))
        .collect())
}

/// The parser's words for what it refused, at most 200 characters: they quote the value, which
/// a forged file can make as long as the file.
fn said(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.char_indices().nth(200) {
        Some((at, _)) => format!(
            "{}... (at line {}, column {})",
            &text[..at],
            e.line(),
            e.column()
        ),
        None => text,
    }
}

fn analysis_of(t: SavedTrace, path: &Path) -> Analysis {
    let mut summary = t.summary;
    summary.run.path = format!("{}:{}", t.host, t.name);
    let mut leaks = t.leaks;
    if let Some(i) = leaks.iterations.as_mut() {
        i.boundary_times_ns = t.boundary_times_ns;
    }
    let mut lanes = t.lanes;
    lanes.iter_mut().for_each(Lane::made_whole);
    Analysis {
        info: TraceInfo {
            path: path.to_path_buf(),
            version: 0,
            pid: t.pid,
            rank: t.rank,
            host: t.host,
            program: t.program,
            cmdline: t.cmdline,
            env: Vec::new(),
            start_realtime_ns: 0,
            clean_exit: t.clean_exit,
            claimed: 0,
            lost: 0,
            capacity: 0,
            file_len: 0,
            ring: false,
            summarized: 0,
            checkpoints_failed: 0,
            checkpoint_refused: None,
            devices: Vec::new(),
        },
        summary: Some(summary),
        peaks: Some(t.peaks),
        ooms: Some(t.ooms),
        leaks: Some(leaks),
        lanes: Some(lanes),
        cut: t.cut,
        requests: None,
        live_at_end: None,
        replay_run: None,
        kept_nothing: false,
    }
}

/// Every string of `v`, keys included, with its control and hidden characters escaped, as a
/// trace's strings are when read (backslashes kept: the saving host escaped its own). The
/// parser nests at most 128 deep, so the recursion is bounded.
fn printable_strings(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::String(s) => *s = printable(s),
        Value::Array(a) => a.iter_mut().for_each(printable_strings),
        Value::Object(o) => {
            let old = std::mem::take(o);
            for (k, mut v) in old {
                printable_strings(&mut v);
                o.insert(printable(&k), v);
            }
        }
        _ => {}
    }
}

fn printable(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if needs_escape(c) {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn needs_escape(c: char) -> bool {
    c.is_control() || crate::fixedfmt::hidden(c)
}

#[cfg(test)]
mod tests {
    use super::printable_strings;

    #[test]
    fn control_and_hidden_characters_are_escaped_and_backslashes_kept() {
        let mut v =
            serde_json::json!({"a": ["x\u{1b}[31m", {"b": "\u{202e}cod\\x5c", "\u{7}k": 1}]});
        printable_strings(&mut v);
        assert_eq!(v["a"][0], "x\\u{1b}[31m");
        assert_eq!(v["a"][1]["b"], "\\u{202e}cod\\x5c");
        assert_eq!(v["a"][1]["\\u{7}k"], 1);
    }
}
