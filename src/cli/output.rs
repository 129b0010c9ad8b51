//! How every command writes: one error line, JSON, holder rows, pictures and files.

use gpushim::files::shown;
use std::process::ExitCode;

pub fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("gpushim: {msg}");
    ExitCode::from(2)
}

pub fn print_json<T: serde::Serialize>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("reports serialize")
    );
}

/// One line per holder of memory: bytes, allocations, call site or range.
pub fn print_holders(holders: &[gpushim::report::Holder], n: usize, indent: &str) {
    print!(
        "{}",
        gpushim::report::render::holders::holders_text(holders, n, indent)
    );
}

/// One report per trace; with several (one per rank), JSON becomes
/// `{"traces": [{"trace": path, ...}], "combined": ...}`.
pub fn print_json_set<T: serde::Serialize, C: serde::Serialize>(all: &[(String, T)], combined: C) {
    if let [(_, one)] = all {
        print_json(one);
        return;
    }
    let traces: Vec<_> = all
        .iter()
        .map(|(t, r)| serde_json::json!({"trace": t, "report": r}))
        .collect();
    print_json(&serde_json::json!({"traces": traces, "combined": combined}));
}

/// Pictures are written as SVG or PNG, chosen by the output's extension; anything else is
/// refused rather than written as SVG under a misleading name.
pub fn picture_kind(output: &std::path::Path) -> Result<(), String> {
    match output.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") || e.eq_ignore_ascii_case("png") => Ok(()),
        _ => Err(format!(
            "--output {}: pictures are written as .svg or .png; name the file so",
            shown(output)
        )),
    }
}

/// Writes an SVG as it is, or rendered to PNG when the path ends in `.png`.
pub fn write_picture(path: &std::path::Path, svg: &str) -> ExitCode {
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        return write_file(path, svg.as_bytes());
    }
    match gpushim::export::svg_to_png(svg) {
        Ok(bytes) => write_file(path, &bytes),
        Err(e) => fail(e),
    }
}

/// Writes `bytes` whole and private (`gpushim::files::write_whole`) and says where.
pub fn write_file(path: &std::path::Path, bytes: &[u8]) -> ExitCode {
    match gpushim::files::write_whole(path, |w| w.write_all(bytes)) {
        Ok(()) => {
            eprintln!("gpushim: wrote {}", shown(path));
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
