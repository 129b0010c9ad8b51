//! Who holds memory: call sites and NVTX ranges named from the trace, and holders merged
//! across traces.

use super::live::Live;
use crate::trace::reader::TraceTables;
use serde::Serialize;
use std::collections::HashMap;

/// A call site as people read it: the first frames of its stack, innermost first.
pub fn site_label(tables: &TraceTables, stack: u64) -> String {
    if let Some((api, size)) = crate::trace::live::size_key_parts(stack) {
        let api = crate::trace::format::Api::from_u8(api).map_or("?", |a| a.name());
        let why = if tables.has_python_frames() {
            "no Python frames: made where they cannot be read (a thread not running Python, \
             interpreter start or exit)"
        } else if tables.has_stacks() {
            "no stack recorded for these allocations"
        } else {
            "no stack: record with GPUSHIM_CONF=stacks:on"
        };
        return format!("{api} of {size} B ({why})");
    }
    match tables.stack(stack) {
        Some(frames) if stack != 0 && !frames.is_empty() => {
            let shown = shown_frames(tables, frames);
            let mut parts: Vec<String> = shown
                .iter()
                .take(4)
                .map(|&ip| crate::report::symbolize::describe(tables, ip))
                .collect();
            // Allocations made inside libraries (torch.nn, transformers) name the program's own
            // line that led there, however deep.
            let python = |ip: &u64| crate::report::symbolize::frame(tables, *ip);
            if shown
                .iter()
                .take(4)
                .all(|ip| !is_program_frame(&python(ip)))
                && let Some(own) = shown.iter().skip(4).map(python).find(is_program_frame)
            {
                parts.push(format!("\u{2026} < {}", own.label()));
            }
            parts.join(" < ")
        }
        // A stack named but never defined: its definition went with records the trace could
        // not keep (a ring's records lost before they were summarized, a cut file), not for
        // want of recording stacks.
        None if stack != 0 => "(its stack was recorded, but its definition was lost with \
             records the trace could not keep)"
            .into(),
        _ if tables.has_python_frames() => "(no Python frames: made where they cannot be read: \
             a thread not running Python, interpreter start or exit)"
            .into(),
        // Stacks were on (sampled, or this one not written yet): nothing to suggest.
        _ if tables.has_stacks() => "(no stack recorded for these allocations)".into(),
        // A file cut short: the stack records may be in the part that is gone.
        _ if tables.stats().truncated > 0 => "(no stack in what the trace holds: the file was \
             cut short, and its stacks may have been in the part that is gone)"
            .into(),
        _ => "(no stack: record with GPUSHIM_CONF=stacks:on)".into(),
    }
}

pub fn range_label(tables: &TraceTables, range: u64) -> String {
    if range == 0 {
        "(no NVTX range)".into()
    } else {
        tables
            .string(range)
            .unwrap_or("(unnamed range)")
            .to_string()
    }
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Holder {
    pub label: String,
    pub bytes: u64,
    pub allocations: u64,
}

pub(super) fn holders<'a>(
    live: impl Iterator<Item = &'a Live>,
    device: Option<u8>,
    key: impl Fn(&Live) -> u64,
    label: impl Fn(u64) -> String,
) -> Vec<Holder> {
    let mut by: HashMap<u64, (u64, u64)> = HashMap::new();
    for l in live.filter(|l| device.is_none_or(|d| l.device == d)) {
        let e = by.entry(key(l)).or_default();
        e.0 = e.0.saturating_add(l.size);
        e.1 += 1;
    }
    holders_by_key(by, label)
}

/// Rows from what a checkpoint's snapshot held, by `key` (the stack id, or the range).
pub(super) fn snapshot_holders(
    holdings: &[crate::trace::live::Holding],
    key: impl Fn(&crate::trace::live::Holding) -> u64,
    label: impl Fn(u64) -> String,
) -> Vec<Holder> {
    let mut by: HashMap<u64, (u64, u64)> = HashMap::new();
    for h in holdings {
        let e = by.entry(key(h)).or_default();
        e.0 = e.0.saturating_add(h.bytes);
        e.1 = e.1.saturating_add(h.allocations);
    }
    holders_by_key(by, label)
}

/// Rows from bytes and allocations by key (a stack id, a range), labelled.
pub(super) fn holders_by_key(
    by: HashMap<u64, (u64, u64)>,
    label: impl Fn(u64) -> String,
) -> Vec<Holder> {
    // Two stacks that read the same (frames beyond the first four differ) are one row.
    let mut merged: HashMap<String, (u64, u64)> = HashMap::new();
    for (k, (bytes, allocations)) in by {
        let e = merged.entry(label(k)).or_default();
        e.0 = e.0.saturating_add(bytes);
        e.1 += allocations;
    }
    let mut v: Vec<Holder> = merged
        .into_iter()
        .map(|(label, (bytes, allocations))| Holder {
            label,
            bytes,
            allocations,
        })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
    v
}

/// Holders of several traces added up by label (a call site is labelled by module and offset,
/// so the same code in every rank has the same label).
pub fn merge_holders<'a>(holders: impl IntoIterator<Item = &'a Holder>) -> Vec<Holder> {
    let mut by: HashMap<&str, (u64, u64)> = HashMap::new();
    for h in holders {
        let e = by.entry(h.label.as_str()).or_default();
        e.0 = e.0.saturating_add(h.bytes);
        e.1 += h.allocations;
    }
    let mut out: Vec<Holder> = by
        .into_iter()
        .map(|(label, (bytes, allocations))| Holder {
            label: label.to_string(),
            bytes,
            allocations,
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
    out
}

/// The frames a report shows of a stack: its Python frames (innermost first) and, when the
/// reader asks for them or there are no Python frames, its native frames.
pub fn shown_frames(tables: &TraceTables, frames: &[u64]) -> Vec<u64> {
    let python = frames
        .iter()
        .take_while(|&&f| crate::trace::format::as_py_frame(f).is_some())
        .count();
    let mut shown = if python == 0 || tables.native_frames() {
        frames.to_vec()
    } else {
        frames[..python].to_vec()
    };
    if tables.program_frames() && python > 0 {
        let program = |ip: &u64| is_program_frame(&crate::report::symbolize::frame(tables, *ip));
        // The backward function that made a tensor stays: it tells the gradient from the
        // forward line's own activation.
        let own = |ip: &u64| {
            crate::trace::format::as_py_frame(*ip).is_none()
                || program(ip)
                || crate::report::symbolize::frame(tables, *ip).file.as_deref()
                    == Some(crate::report::symbolize::BACKWARD)
        };
        if frames[..python].iter().any(program) {
            shown.retain(own);
        }
    }
    shown
}

/// A Python frame in the program's own files (see [`crate::report::symbolize::is_program_file`]).
fn is_program_frame(f: &crate::report::symbolize::FrameInfo) -> bool {
    f.python
        && f.file
            .as_deref()
            .is_some_and(crate::report::symbolize::is_program_file)
}

/// Bytes by call site's label (sites whose labels are the same summed): what `diff` compares.
pub fn by_label(holders: &[Holder]) -> HashMap<String, u64> {
    let mut by: HashMap<String, u64> = HashMap::new();
    for h in holders {
        let b = by.entry(h.label.clone()).or_default();
        *b = b.saturating_add(h.bytes);
    }
    by
}

/// The bytes live at the end of a replay that read the whole trace, and who holds them by
/// call site, named from `reader` (`diff` compares them, `top` shows them).
pub fn live_holders(tables: &TraceTables, rp: &crate::report::Replay) -> (u64, Vec<Holder>) {
    let key = crate::report::site_key;
    (
        rp.total_live(),
        holders(rp.all_live(), None, key, |k| site_label(tables, k)),
    )
}
