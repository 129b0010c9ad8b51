//! `gpushim diff`: two traces side by side, call site by call site.

use super::output::{fail, print_json};
use gpushim::report::units::human_bytes;
use gpushim::trace::reader::ReadOptions;
use std::path::Path;
use std::process::ExitCode;

pub fn cmd_diff(a: &Path, b: &Path, json: bool, opts: &ReadOptions) -> ExitCode {
    if let Some(saved) = [a, b]
        .into_iter()
        .find(|p| gpushim::report::analysis::saved::is_saved(p))
    {
        return super::output::fail(format!(
            "{} is a saved analysis (gpushim analyze -o): diff compares two runs line by line \
             from their traces: give the traces",
            gpushim::files::shown(saved)
        ));
    }
    // Each trace read once: its peaks, and what was live at its end by call site.
    let wants = gpushim::report::analysis::Wants {
        live_at_end: true,
        ..gpushim::report::analysis::Wants::peak()
    };
    let read = |t: &Path| {
        let a = gpushim::report::analysis::analyze(t, opts, &wants)?;
        let (live, holders) = a.live_at_end.unwrap_or_default();
        let by = gpushim::report::sites::by_label(&holders);
        Ok::<_, gpushim::trace::reader::ReadError>((live, by, a.peaks.unwrap_or_default()))
    };
    let ((la, sa, peaks_a), (lb, sb, peaks_b)) = match (read(a), read(b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let total = |p: &[gpushim::report::Peak]| p.iter().map(|x| x.live_bytes).sum::<u64>();
    let (pa, pb) = (total(&peaks_a), total(&peaks_b));
    // PyTorch's tensors at each peak by kind (every device's added up).
    let by_kind = |p: &[gpushim::report::Peak]| {
        gpushim::report::kinds::ByKind::of(
            p.iter().flat_map(|x| &x.by_kind).map(|k| (k.kind, k.bytes)),
        )
    };
    let (ka, kb) = (by_kind(&peaks_a), by_kind(&peaks_b));
    let mut sites: Vec<(String, i128, u64, u64)> = sa
        .keys()
        .chain(sb.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|k| {
            let (x, y) = (
                sa.get(k).copied().unwrap_or(0),
                sb.get(k).copied().unwrap_or(0),
            );
            (k.clone(), y as i128 - x as i128, x, y)
        })
        .filter(|s| s.1 != 0)
        .collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.1.abs()));
    if json {
        print_json(&serde_json::json!({
            "a": gpushim::files::shown(a).to_string(), "b": gpushim::files::shown(b).to_string(),
            "peak_live_bytes": [pa, pb], "live_at_exit_bytes": [la, lb],
            "peak_by_kind": gpushim::report::kinds::Kind::ALL.iter()
                .filter(|&&k| ka.bytes(k) > 0 || kb.bytes(k) > 0)
                .map(|&k| serde_json::json!({"kind": k, "a": ka.bytes(k), "b": kb.bytes(k)}))
                .collect::<Vec<_>>(),
            "call_sites": sites.iter().map(|s| serde_json::json!({"call_site": s.0, "a": s.2, "b": s.3})).collect::<Vec<_>>(),
        }));
        return ExitCode::SUCCESS;
    }
    // Columns named by the files (their names alone; the full paths head the table).
    let name = |p: &std::path::Path| {
        p.file_name()
            .map(std::path::Path::new)
            .map_or_else(|| gpushim::files::shown(p), gpushim::files::shown)
            .to_string()
    };
    let (na, nb) = (name(a), name(b));
    let w = gpushim::report::units::column(na.len().max(nb.len()).max(14));
    println!(
        "A = {}\nB = {}",
        gpushim::files::shown(a),
        gpushim::files::shown(b)
    );
    println!("{:<24} {:>w$} {:>w$}", "", na, nb);
    println!(
        "{:<24} {:>w$} {:>w$}",
        "peak live",
        human_bytes(pa),
        human_bytes(pb)
    );
    for k in gpushim::report::kinds::Kind::ALL {
        let (x, y) = (ka.bytes(k), kb.bytes(k));
        if x > 0 || y > 0 {
            println!(
                "{:<24} {:>w$} {:>w$}",
                format!("  {}", k.name()),
                human_bytes(x),
                human_bytes(y)
            );
        }
    }
    println!(
        "{:<24} {:>w$} {:>w$}",
        "live at exit",
        human_bytes(la),
        human_bytes(lb)
    );
    println!("live at exit by call site, largest changes first ({nb} against {na}):");
    for s in sites.iter().take(20) {
        let sign = if s.1 > 0 { "+" } else { "-" };
        println!(
            "  {sign}{:>12}  {}",
            human_bytes(s.1.unsigned_abs() as u64),
            s.0
        );
    }
    ExitCode::SUCCESS
}
