//! `gpushim diff`: two traces side by side, call site by call site.

use super::output::{fail, print_json};
use gpushim::report::units::human_bytes;
use gpushim::trace::reader::ReadOptions;
use std::path::Path;
use std::process::ExitCode;

pub fn cmd_diff(a: &Path, b: &Path, json: bool, opts: &ReadOptions) -> ExitCode {
    let (la, sa) = match gpushim::export::live_by_site(a, opts) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let (lb, sb) = match gpushim::export::live_by_site(b, opts) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let peak = |t: &std::path::Path| {
        gpushim::report::peak(t, opts).map(|p| p.iter().map(|x| x.live_bytes).sum::<u64>())
    };
    let (pa, pb) = match (peak(a), peak(b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
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
    let w = na.len().max(nb.len()).max(14);
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
