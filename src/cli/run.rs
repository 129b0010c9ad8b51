//! `gpushim run`: the program under the shim, then a word on each trace it wrote.

use super::output::fail;
use gpushim::config;
use gpushim::report::units::human_bytes;
use gpushim::run::TorchRoute;
use gpushim::trace::reader::ReadOptions;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// One rule for the configuration, wherever it comes from: an error anywhere in it means none
/// of it applies, so the program is not started (the shim itself, without `gpushim run`, says
/// so in one line and runs on the defaults).
fn check_conf(conf: Option<&str>, route: TorchRoute) -> Result<(), String> {
    let (conf_text, source) = match conf {
        Some(c) => (Some(c.to_string()), "--conf"),
        None => (std::env::var("GPUSHIM_CONF").ok(), "GPUSHIM_CONF"),
    };
    let Some(c) = &conf_text else {
        return Ok(());
    };
    match config::parse_strict(c) {
        Err(e) => Err(format!("{source}: {e}; nothing was started")),
        // The pluggable allocator's tensors come from the pool alone: without one, every
        // allocation would fail.
        Ok(parsed) if route == TorchRoute::Pluggable && parsed.pool == config::Pool::Off => {
            Err(format!(
                "--pluggable needs the shim's pool, and {source} says pool:off (every PyTorch \
                 allocation would fail); name pool:expandable or pool:caching, or leave \
                 --pluggable out; nothing was started"
            ))
        }
        Ok(_) => Ok(()),
    }
}

/// An option `run` does not know lands in the command (everything after the options is the
/// command): refused, with the nearest option, instead of "cannot run --config".
fn check_command(cmd: &[OsString]) -> Result<(), String> {
    let Some(first) = cmd
        .first()
        .and_then(|c| c.to_str())
        .filter(|c| c.starts_with('-'))
    else {
        return Ok(());
    };
    let word = first.split('=').next().unwrap_or(first);
    let nearest = [
        "--conf",
        "--trace",
        "--lib",
        "--per-tensor",
        "--pluggable",
        "--help",
    ]
    .into_iter()
    .min_by_key(|o| config::edit_distance(o, word).unwrap_or(usize::MAX))
    .unwrap_or("--help");
    Err(format!(
        "run: unknown option {word} (did you mean {nearest}?); the command to run goes after \
         the options, as in `gpushim run --conf pool:caching -- python train.py`"
    ))
}

/// What the run left in trace `t`, in three lines, and the report to read next.
fn say_trace(t: &std::path::Path) {
    match gpushim::report::summarize(t, &ReadOptions::default()) {
        Ok(s) => {
            let allocs: u64 = s.apis.iter().filter(|a| a.bytes > 0).map(|a| a.calls).sum();
            let failed: u64 = s.apis.iter().map(|a| a.failed).sum();
            let peak = s
                .devices
                .iter()
                .map(|d| d.peak_live_bytes)
                .max()
                .unwrap_or(0);
            eprintln!("gpushim: trace {}", gpushim::files::shown(t));
            eprintln!(
                "gpushim:   {} events, {allocs} allocating calls, {failed} failed; peak live {}{}",
                s.events,
                human_bytes(peak),
                if s.health.live_figures.is_some() {
                    " in the records the trace kept (it is missing some: see summary)"
                } else {
                    ""
                }
            );
            // Failures for another reason than memory (a missing driver, no device) are
            // named with their code: `oom` would only say nothing was held.
            let otherwise: u64 = s
                .apis
                .iter()
                .filter_map(|a| a.failed_otherwise.as_ref().map(|f| f.0))
                .sum();
            if let Some((n, name)) = s.apis.iter().find_map(|a| {
                a.failed_otherwise
                    .as_ref()
                    .map(|(n, name)| (n, format!("{} with {name}", a.api)))
            }) {
                eprintln!(
                    "gpushim:   {otherwise} failed for another reason than memory: {n} {}{}",
                    name,
                    if otherwise > *n { ", and others" } else { "" }
                );
            }
            // A run that failed for lack of memory is read from its failures first.
            let next = if failed > otherwise { "oom" } else { "summary" };
            eprintln!(
                "gpushim:   next: gpushim {next} {}",
                gpushim::files::shown(t)
            );
        }
        Err(e) => eprintln!("gpushim: {e}"),
    }
}

pub fn cmd_run(
    conf: Option<String>,
    trace: Option<String>,
    lib: Option<PathBuf>,
    route: TorchRoute,
    cmd: Vec<OsString>,
) -> ExitCode {
    let conf = match route {
        TorchRoute::Cache => conf,
        _ => route.conf(
            conf.or_else(|| std::env::var("GPUSHIM_CONF").ok())
                .as_deref(),
        ),
    };
    if let Err(why) = check_conf(conf.as_deref(), route) {
        return fail(why);
    }
    if let Err(why) = check_command(&cmd) {
        return fail(why);
    }
    // A folder given as the trace takes the traces inside it, named as by default.
    let trace = trace.map(|t| gpushim::run::in_folder(&t, cmd.first()));
    let pattern = trace
        .clone()
        .or_else(|| std::env::var("GPUSHIM_TRACE").ok());
    let recording = match gpushim::run::check_trace(pattern.as_deref()) {
        Ok(r) => r,
        Err(e) => return fail(format!("{e}; nothing was started")),
    };
    if !recording {
        eprintln!("gpushim: recording is off (GPUSHIM_TRACE=off): the command runs unrecorded");
    }
    let shim = match gpushim::run::find_shim(lib.as_deref()) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let out = match gpushim::run::run(&shim, conf.as_deref(), trace.as_deref(), route, &cmd) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    // As the shim reads it: set to anything but 0 or empty.
    let disabled = std::env::var_os("GPUSHIM_DISABLE").is_some_and(|v| !v.is_empty() && v != "0");
    if out.traces.is_empty() && recording {
        if disabled {
            eprintln!(
                "gpushim: GPUSHIM_DISABLE=1 turned the shim off, so nothing was recorded (unset \
                 it to record)"
            );
        } else {
            eprintln!("gpushim: the command made no CUDA memory call, so no trace was written");
        }
    }
    for t in &out.traces {
        say_trace(t);
    }
    if out.traces.len() > 1 {
        let all: Vec<String> = out
            .traces
            .iter()
            .map(|t| gpushim::files::shown(t).to_string())
            .collect();
        eprintln!(
            "gpushim: {} traces (one per process); together: gpushim summary {}",
            all.len(),
            all.join(" ")
        );
    }
    if let Some(sig) = out.signal {
        eprintln!("gpushim: {}", killed_by(sig, !out.traces.is_empty()));
    }
    ExitCode::from(out.exit_code.clamp(0, 255) as u8)
}

/// What a program ended by signal `sig` is told: which signal, what usually sends it, and that
/// its trace holds what happened up to then.
fn killed_by(sig: i32, traced: bool) -> String {
    let (name, usual) = match sig {
        9 => (
            "SIGKILL",
            ": kill -9, or the kernel's out-of-memory killer (see `dmesg`)",
        ),
        15 => ("SIGTERM", ": kill, or a scheduler ending the job"),
        6 => ("SIGABRT", ": the program aborted itself"),
        11 => ("SIGSEGV", ": an invalid memory access"),
        7 => ("SIGBUS", ": a bus error"),
        2 => ("SIGINT", ": Ctrl-C"),
        _ => ("a signal", ""),
    };
    format!(
        "the program was killed by {name} (signal {sig}{usual}); exit code {}{}",
        128 + sig,
        if traced {
            ". Its trace holds every record up to then"
        } else {
            ""
        }
    )
}
