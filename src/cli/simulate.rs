//! `gpushim simulate`: the trace replayed under other settings: PyTorch's allocator under
//! another `PYTORCH_CUDA_ALLOC_CONF` (`--torch`, `--recommend`), or the shim's pool under
//! other policies (`--conf`).

use super::output::{fail, print_json};
use gpushim::report::torch_replay::model::TorchConf;
use gpushim::report::torch_replay::{self, Bounds, Fidelity, Outcome, ReplayError};
use gpushim::report::units::{human_bytes, human_duration};
use gpushim::trace::reader::ReadOptions;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_simulate(
    traces: &[PathBuf],
    mut conf: Vec<String>,
    json: bool,
    opts: &ReadOptions,
) -> ExitCode {
    let [trace] = traces else {
        eprintln!(
            "gpushim: simulate --conf replays one trace at a time; give one (or use --torch, \
             which takes several)"
        );
        return ExitCode::from(2);
    };
    if conf.is_empty() {
        conf.push(String::new());
    }
    let out = match gpushim::report::simulate::simulate(trace, &conf, opts) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("outcomes serialize")
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<40} {:>14} {:>14} {:>14} {:>12} {:>8}",
        "policy", "peak reserved", "peak live", "fragmentation", "device allocs", "failed"
    );
    for o in &out {
        println!(
            "{:<40} {:>14} {:>14} {:>13.1}% {:>12} {:>8}",
            o.policy,
            human_bytes(o.peak_reserved_bytes),
            human_bytes(o.peak_live_bytes),
            o.fragmentation_at_peak * 100.0,
            o.device_allocations,
            o.failed_allocations
        );
    }
    ExitCode::SUCCESS
}

/// What `simulate --torch --json` prints for one trace.
#[derive(Serialize)]
struct TorchReport {
    trace: String,
    tensors: u64,
    recorded_setting: torch_replay::RecordedSetting,
    /// The recorded setting replayed first, then each `--torch` setting.
    outcomes: Vec<Outcome>,
    /// The recorded setting's replay against the run, per device.
    fidelity: Vec<Fidelity>,
    /// With `--recommend`: the best setting found, then the next four.
    recommended: Vec<Outcome>,
}

pub fn cmd_simulate_torch(
    traces: &[PathBuf],
    settings: &[String],
    recommend: bool,
    bounds: &Bounds,
    json: bool,
    opts: &ReadOptions,
) -> ExitCode {
    // Every setting is checked before any trace is read.
    let mut asked = Vec::new();
    for text in settings {
        match TorchConf::parse(text) {
            Ok(c) => asked.push(c),
            Err(e) => {
                return fail(ReplayError::Setting {
                    text: text.clone(),
                    reason: e.to_string(),
                });
            }
        }
    }
    let mut reports = Vec::new();
    for t in traces {
        match simulate_one(t, &asked, recommend, bounds, opts) {
            Ok(r) => {
                if !json {
                    print!("{}", render(&r, bounds));
                }
                reports.push(r);
            }
            Err(e) => return fail(e),
        }
    }
    if json {
        print_json(&reports);
    }
    ExitCode::SUCCESS
}

fn simulate_one(
    trace: &std::path::Path,
    asked: &[TorchConf],
    recommend: bool,
    bounds: &Bounds,
    opts: &ReadOptions,
) -> Result<TorchReport, ReplayError> {
    let input = torch_replay::read(trace, opts)?;
    let recorded = torch_replay::recorded_conf(&input)?;
    let (first, fidelity) = torch_replay::replay(&input, &recorded, bounds, true);
    let mut outcomes = vec![first];
    for c in asked {
        outcomes.push(torch_replay::replay(&input, c, bounds, false).0);
    }
    let mut recommended = Vec::new();
    if recommend {
        eprintln!(
            "gpushim: replaying {} settings of PyTorch's allocator over {} tensors...",
            torch_replay::candidates(&recorded, bounds.fraction.is_some()).len(),
            input.tensors
        );
        recommended = torch_replay::recommend(&input, &recorded, bounds);
        // Settings that come out the same are one row: the shortest text stands for them.
        let mut seen = std::collections::HashSet::new();
        recommended.retain(|o| {
            seen.insert((
                o.peak_reserved_bytes,
                o.peak_allocated_bytes,
                o.device_allocs,
                o.device_frees,
                o.failures,
            ))
        });
        recommended.truncate(5);
    }
    if input.from_checkpoint {
        eprintln!(
            "gpushim: {}: the trace's oldest records were folded into its checkpoint (it \
             reached trace_max): the replay starts where the ring does, with an empty cache, \
             so it is not the run's; record with a larger trace_max for an exact replay",
            gpushim::files::shown(trace)
        );
    }
    Ok(TorchReport {
        trace: gpushim::files::shown(trace).to_string(),
        tensors: input.tensors,
        recorded_setting: input.recorded.clone(),
        outcomes,
        fidelity,
        recommended,
    })
}

fn setting_name(text: &str) -> String {
    if text.is_empty() {
        "(defaults)".into()
    } else {
        text.into()
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

fn render(r: &TorchReport, bounds: &Bounds) -> String {
    let w = r
        .outcomes
        .iter()
        .chain(&r.recommended)
        .map(|o| setting_name(&o.setting).len() + 14)
        .max()
        .unwrap_or(0)
        .max(44);
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
