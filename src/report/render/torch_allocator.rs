//! `simulate --torch`'s text: the run's replay against the run, a row per setting, the first
//! request that fails, the recommendation and the line to set.

use crate::report::torch_allocator::{Bounds, Fidelity, OomAdvice, Outcome, TorchReport};
use crate::report::units::{human_bytes, human_duration};

/// A setting's name in the table, escaped for a terminal (the run's is the trace's text).
fn setting_name(text: &str) -> String {
    if text.is_empty() {
        "(defaults)".into()
    } else {
        crate::fixedfmt::Escaped(text.as_bytes()).to_string()
    }
}

fn row(label: &str, w: usize, o: &Outcome) -> String {
    format!(
        "{:<w$} {:>14} {:>15} {:>16} {:>8} {:>8} {:>6}\n",
        label,
        human_bytes(o.peak_reserved_bytes),
        human_bytes(o.peak_allocated_bytes),
        human_bytes(o.unallocated_at_peak_bytes),
        o.device_allocs,
        o.device_frees,
        o.failures
    )
}

/// `simulate --torch`'s text for one trace.
pub fn render_report(r: &TorchReport, bounds: &Bounds) -> String {
    let w = r
        .outcomes
        .iter()
        .chain(&r.recommended)
        .map(|o| setting_name(&o.setting).len() + 14)
        .max()
        .unwrap_or(0)
        .clamp(44, crate::report::units::COLUMN_MAX);
    let mut s = header(r, bounds);
    s.push_str(&table_head("setting (PYTORCH_CUDA_ALLOC_CONF)", w));
    for (i, o) in r.outcomes.iter().enumerate() {
        let label = if i == 0 {
            format!("{} [the run's]", setting_name(&o.setting))
        } else {
            setting_name(&o.setting)
        };
        s.push_str(&row(&label, w, o));
    }
    s.push('\n');
    // The same tensors, yet "peak allocated" moves with the setting: it counts blocks as PyTorch
    // does (memory_allocated), each request rounded up to its block size, and the settings round
    // differently (roundup_power2_divisions, expandable segments' page-sized blocks).
    let allocated: std::collections::BTreeSet<u64> = r
        .outcomes
        .iter()
        .chain(&r.recommended)
        .map(|o| o.peak_allocated_bytes)
        .collect();
    if allocated.len() > 1 {
        s.push_str(
            "peak allocated counts blocks as PyTorch's memory_allocated() does: each request \
             rounded up to its block, which the settings round differently; the tensors are the \
             same in every row\n",
        );
    }
    for f in &r.fidelity {
        s.push_str(&fidelity_line(f));
    }
    for o in &r.outcomes {
        s.push_str(&failure_line(o));
    }
    s.push_str(&recommendation(r, w));
    s.push('\n');
    s
}

/// The trace, its tensors, the run's setting and each device's limit.
fn header(r: &TorchReport, bounds: &Bounds) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let source = match r.recorded_setting.source.as_str() {
        "unset" => "PYTORCH_CUDA_ALLOC_CONF unset".to_string(),
        "inferred" => "expandable segments, seen in its records".to_string(),
        name if r.recorded_setting.text.is_empty() => format!("{name} empty, the defaults"),
        name => format!("{name}={}", r.recorded_setting.text),
    };
    let _ = writeln!(
        s,
        "{}: PyTorch's caching allocator replayed over {} tensors (the run: {source})",
        r.trace, r.tensors
    );
    for d in r.outcomes.first().map_or(&[][..], |o| &o.devices[..]) {
        let _ = match bounds.limit {
            Some(l) => writeln!(
                s,
                "  device {}: limit {} (--limit)",
                d.device,
                human_bytes(l)
            ),
            None if d.limit_bytes == u64::MAX => writeln!(
                s,
                "  device {}: no limit (the trace never learned the device's memory; \
                 --limit sets one)",
                d.device
            ),
            None => writeln!(
                s,
                "  device {}: limit {} (the device's memory, or what PyTorch could have \
                 held when the run first failed a tensor; --limit sets another)",
                d.device,
                human_bytes(d.limit_bytes)
            ),
        };
    }
    s
}

fn table_head(first: &str, w: usize) -> String {
    format!(
        "\n{first:<w$} {:>14} {:>15} {:>16} {:>8} {:>8} {:>6}\n",
        "peak reserved", "peak allocated", "unallocated@peak", "mallocs", "frees", "fails"
    )
}

/// Whether the replay of the run's setting took the run's own segments.
fn fidelity_line(f: &Fidelity) -> String {
    let placed = if f.tensors > 0 {
        100.0 * f.tensors_at_recorded_address as f64 / f.tensors as f64
    } else {
        0.0
    };
    if f.exact() {
        return format!(
            "device {}: the replay of the run's setting matches the run: the same {} segment \
             events, peak reserved {} to the byte; {placed:.1}% of {} tensors at the run's own \
             address\n",
            f.device,
            f.recorded_segment_events,
            human_bytes(f.recorded_peak_reserved_bytes),
            f.tensors
        );
    }
    let at = f
        .first_difference
        .as_ref()
        .map(|(i, run, rep)| {
            format!(
                "; first difference at segment event {} of {} (run: {run}; replay: {rep})",
                i + 1,
                f.recorded_segment_events
            )
        })
        .unwrap_or_default();
    format!(
        "device {}: the replay of the run's setting differs from the run: peak reserved {} \
         replayed, {} in the run{at}; {placed:.1}% of tensors at the run's own address. Other \
         rows are estimates.\n",
        f.device,
        human_bytes(f.replayed_peak_reserved_bytes),
        human_bytes(f.recorded_peak_reserved_bytes),
    )
}

/// The first request a setting could not serve, if any.
fn failure_line(o: &Outcome) -> String {
    let Some(ff) = &o.first_failure else {
        return String::new();
    };
    format!(
        "{}: the first request that fails is {} on device {} at {}{}\n",
        setting_name(&o.setting),
        human_bytes(ff.requested_bytes),
        ff.device,
        human_duration(ff.time_ns),
        ff.site
            .as_ref()
            .map(|l| format!(", made at {l}"))
            .unwrap_or_default()
    )
}

/// `--recommend`'s table and its line to set.
fn recommendation(r: &TorchReport, w: usize) -> String {
    let (Some(best), Some(run)) = (r.recommended.first(), r.outcomes.first()) else {
        return String::new();
    };
    let mut s = table_head("best settings found (one row per outcome)", w);
    for o in &r.recommended {
        s.push_str(&row(&setting_name(&o.setting), w, o));
    }
    let saved = run.peak_reserved_bytes as i128 - best.peak_reserved_bytes as i128;
    if saved > 0 && best.failures == 0 {
        s.push_str(&format!(
            "\nRecommended: {} less peak reserved ({:.1}%) than the run's setting:\n  \
             export PYTORCH_CUDA_ALLOC_CONF={}\n",
            human_bytes(saved as u64),
            100.0 * saved as f64 / run.peak_reserved_bytes.max(1) as f64,
            shell_word(&best.setting)
        ));
    } else {
        s.push_str("\nNo setting tried reserves less at the peak than the run's own.\n");
    }
    s
}

/// `text` as one shell word (quoted when it holds brackets).
fn shell_word(text: &str) -> String {
    if text.is_empty() {
        "\"\"".into()
    } else if text.contains(['[', ']', '>']) {
        format!("'{text}'")
    } else {
        text.into()
    }
}

/// The advice in words, for `gpushim oom`.
pub fn render_advice(a: &OomAdvice) -> String {
    use std::fmt::Write as _;
    let name = |t: &str| {
        if t.is_empty() {
            "the defaults".to_string()
        } else {
            t.to_string()
        }
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "PyTorch's allocator replayed up to the failed request of {} under {} settings{}:",
        human_bytes(a.requested_bytes),
        a.tried,
        match (a.fraction_bytes, a.capacity_bytes) {
            (Some(f), _) => format!(
                ", PyTorch's allocator held to {} by its memory fraction \
                 (set_per_process_memory_fraction: it refused the request without asking CUDA, \
                 having reserved at most that much before)",
                human_bytes(f)
            ),
            (None, Some(c)) => format!(
                ", PyTorch's allocator held to {}: what it held at the failure (its tensors \
                 and cache) plus what CUDA then said was free; the rest of the device was not \
                 PyTorch's to take",
                human_bytes(c)
            ),
            (None, None) => String::new(),
        }
    );
    if let Some(r) = &a.ring_began_late {
        ring_began_late(&mut s, r);
    }
    if a.private_pool_bytes > 0 {
        let _ = writeln!(
            s,
            "  PyTorch's private pools (CUDA graphs' pools, torch.cuda.MemPool) held {} then, \
             which its default pools could not use: the replay keeps them as the run had them \
             and counts them against the limit",
            human_bytes(a.private_pool_bytes)
        );
    }
    if a.in_private_pool {
        let _ = writeln!(
            s,
            "  the failed request was in one of PyTorch's private pools (a CUDA graph's or a \
             torch.cuda.MemPool), which the replay keeps as the run had them rather than model: \
             no setting is judged on it"
        );
        return s;
    }
    if a.run_setting_fails_too {
        let _ = writeln!(
            s,
            "  the run's own setting ({}) fails there too, as in the run",
            name(&a.run_setting)
        );
    } else {
        let _ = writeln!(
            s,
            "  the replay of the run's own setting ({}) does not fail there: {}",
            name(&a.run_setting),
            a.run_setting_serves_it
                .as_deref()
                .unwrap_or("the replay did not reach the failure")
        );
        // A replay that serves what the run failed cannot say which setting avoids the
        // failure: at most which reserve less than the run's own there, and never the run's
        // own as the fix.
        let own = a.serving.iter().find(|o| o.setting == a.run_setting);
        let less = a.serving.iter().find(|o| {
            o.setting != a.run_setting
                && own.is_none_or(|own| o.peak_reserved_bytes < own.peak_reserved_bytes)
        });
        match (less, own) {
            (Some(best), Some(own)) => {
                let _ = writeln!(
                    s,
                    "  so no setting is shown to avoid it; as a rough guide, the one reserving \
                     least in the replay ({} at its peak, {} less than the run's own):\n  \
                     export PYTORCH_CUDA_ALLOC_CONF={}",
                    human_bytes(best.peak_reserved_bytes),
                    human_bytes(own.peak_reserved_bytes - best.peak_reserved_bytes),
                    quoted(&best.setting)
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "  so no setting is shown to avoid it, and none reserves less than the run's \
                     own in the replay: nothing to recommend"
                );
            }
        }
        return s;
    }
    match a.serving.first() {
        Some(best) => {
            let shown: Vec<String> = a.serving.iter().take(3).map(|o| name(&o.setting)).collect();
            let _ = writeln!(
                s,
                "  {} of them serve it, among them {}; the one reserving least ({} at its peak):\n  \
                 export PYTORCH_CUDA_ALLOC_CONF={}",
                a.serving.len(),
                shown.join("; "),
                human_bytes(best.peak_reserved_bytes),
                quoted(&best.setting)
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  none of them serves it: the program needs more memory there than the device \
                 had, whatever PyTorch's allocator does"
            );
        }
    }
    s
}

/// Where the replay starts when the trace's ring began after the run's first tensors.
fn ring_began_late(s: &mut String, r: &crate::report::torch_allocator::RingStart) {
    use std::fmt::Write as _;
    let cache = format!(
        "{} segments of {} with {} tensors live",
        r.segments,
        human_bytes(r.reserved_bytes),
        r.tensors
    );
    let _ = match &r.not_exact {
        None => writeln!(
            s,
            "  the trace's ring began after the run's first tensors ({} records made): the \
             replay starts from PyTorch's cache as the ring's checkpoint kept it ({cache}), \
             the run's own to the byte; other settings start from that cache too, so a \
             setting named below serves from it, and one that would have kept another cache \
             before the ring began (expandable segments) may serve unnamed",
            r.records
        ),
        Some(why) => writeln!(
            s,
            "  the trace's ring began after the run's first tensors ({} records made): the \
             replay starts from what the ring's checkpoint kept ({cache}), which is not \
             PyTorch's cache to the byte: {why}; to replay exactly, record with \
             GPUSHIM_CONF=trace_max:{}MiB or more",
            r.records,
            r.trace_max_needed.div_ceil(1 << 20)
        ),
    };
}

/// A setting as the value of an `export` line.
fn quoted(setting: &str) -> String {
    if setting.is_empty() {
        "\"\"".to_string()
    } else {
        setting.to_string()
    }
}
