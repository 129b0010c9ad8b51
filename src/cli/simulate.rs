//! `gpushim simulate`: the trace replayed under other settings: PyTorch's allocator under
//! another `PYTORCH_CUDA_ALLOC_CONF` (`--torch`, `--recommend`), or the shim's pool under
//! other policies (`--conf`).

use super::output::{fail, print_json};
use gpushim::report::torch_allocator::model::TorchConf;
use gpushim::report::torch_allocator::{self, Bounds, ReplayError};
use gpushim::report::units::human_bytes;
use gpushim::trace::reader::ReadOptions;
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
    let out = match gpushim::report::analysis::simulate_pool(trace, &conf, opts) {
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
    if let Some(first) = out.first()
        && let Some(reserved) = first.framework_reserved_peak_bytes
    {
        let t = gpushim::files::shown(trace);
        println!(
            "PyTorch's allocator made this run's device allocations (its cache reserved {} at \
             its peak): these rows replay its segments with the libraries' own allocations \
             ({} at their peak, the \"peak live\" here, where `summary` counts tensors) \
             through the shim's pool. PyTorch's own allocator under other settings: gpushim \
             simulate --recommend {t}",
            human_bytes(reserved),
            human_bytes(first.peak_live_bytes)
        );
    }
    ExitCode::SUCCESS
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
        let input = gpushim::report::analysis::read_requests(t, opts);
        let say = |line| eprintln!("{line}");
        match input.and_then(|i| torch_allocator::simulate(&i, &asked, recommend, bounds, &say)) {
            Ok(r) => {
                if !json {
                    print!(
                        "{}",
                        gpushim::report::render::torch_allocator::render_report(&r, bounds)
                    );
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
