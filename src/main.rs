//! The `gpushim` command: runs programs under the shim and decodes their traces.

use clap::{Parser, Subcommand};
use gpushim::config;
use gpushim::format::RecordKind;
use gpushim::summary::{self, human_bytes};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "gpushim",
    version,
    about = "Trace every CUDA memory call of a program, then ask where the memory went.",
    long_about = "Trace every CUDA memory call of a program, then ask where the memory went.\n\n\
        Run a program under the shim:     gpushim run -- python train.py\n\
        Read what it recorded:            gpushim summary gpushim-python.12345.trace\n\n\
        Without this command:  LD_PRELOAD=/path/to/libgpushim.so python train.py\n\
        Settings (environment): GPUSHIM_CONF (see `gpushim config`), GPUSHIM_TRACE=PATTERN|off, \
        GPUSHIM_DISABLE=1."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command with the shim preloaded; print where its traces are and what they hold.
    #[command(
        after_help = "Example:\n  gpushim run --conf pool:off -- python train.py --epochs 1\n\n\
        Any LD_PRELOAD already set is kept, after the shim. The exit code is the command's."
    )]
    Run {
        /// GPUSHIM_CONF for the run, as in `pool:off,limit:24GiB` (see `gpushim config`).
        #[arg(long)]
        conf: Option<String>,
        /// Trace path pattern: %p pid, %h host, %r rank (RANK or LOCAL_RANK), %% a percent sign.
        /// Default: gpushim-PROGRAM.PID.trace in the working directory.
        #[arg(long, value_name = "PATTERN")]
        trace: Option<String>,
        /// The shim library; default: libgpushim.so next to this executable, or $GPUSHIM_LIB.
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Calls, bytes and failures per API; peak and final live memory per device; trace health.
    Summary {
        /// Trace files (one per process or rank).
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Replay a trace's allocations under other pooling policies: peak reserved, fragmentation
    /// and device allocation calls for each, beside what the run had.
    #[command(
        after_help = "Example:\n  gpushim simulate run.trace --conf pool:caching \\\n    --conf pool:caching,round:pow2_4 --conf pool:caching,max_split:64MiB\n\n\
        The replay assumes the GPU keeps up with the program, so it shows the memory a policy \
        needs, not the waits it would cost."
    )]
    Simulate {
        trace: PathBuf,
        /// A policy in GPUSHIM_CONF syntax; repeat to compare several (default: the defaults).
        #[arg(long = "conf", value_name = "POLICY")]
        conf: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Every record of a trace, one per line: CSV (default) or JSON lines.
    #[command(
        after_help = "Columns: time_ns (since the trace started), thread (index in the trace), \
        kind, api, device (empty when unknown), status (CUDA result code; 255 = a code above 254), \
        ptr, size, stream (interned index; 0 = the null stream)."
    )]
    Events {
        trace: PathBuf,
        /// JSON lines instead of CSV.
        #[arg(long)]
        json: bool,
    },
    /// Print the effective configuration from GPUSHIM_CONF and what each key does.
    Config {
        /// Configuration to check instead of $GPUSHIM_CONF.
        conf: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Run {
            conf,
            trace,
            lib,
            cmd,
        } => cmd_run(conf, trace, lib, cmd),
        Cmd::Summary { traces, json } => cmd_summary(&traces, json),
        Cmd::Events { trace, json } => cmd_events(&trace, json),
        Cmd::Simulate { trace, conf, json } => cmd_simulate(&trace, conf, json),
        Cmd::Config { conf } => cmd_config(conf),
    }
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("gpushim: {msg}");
    ExitCode::from(2)
}

fn cmd_run(
    conf: Option<String>,
    trace: Option<String>,
    lib: Option<PathBuf>,
    cmd: Vec<OsString>,
) -> ExitCode {
    if let Some(c) = &conf
        && let Err(e) = config::parse_strict(c)
    {
        return fail(format!("--conf: {e}"));
    }
    let shim = match gpushim::run::find_shim(lib.as_deref()) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let out = match gpushim::run::run(&shim, conf.as_deref(), trace.as_deref(), &cmd) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    if out.traces.is_empty() {
        eprintln!("gpushim: the command made no CUDA memory call, so no trace was written");
    }
    for t in &out.traces {
        match summary::summarize(t) {
            Ok(s) => {
                let allocs: u64 = s.apis.iter().filter(|a| a.bytes > 0).map(|a| a.calls).sum();
                let failed: u64 = s.apis.iter().map(|a| a.failed).sum();
                let peak = s
                    .devices
                    .iter()
                    .map(|d| d.peak_live_bytes)
                    .max()
                    .unwrap_or(0);
                eprintln!("gpushim: trace {}", t.display());
                eprintln!(
                    "gpushim:   {} events, {allocs} allocating calls, {failed} failed; peak live {}",
                    s.events,
                    human_bytes(peak)
                );
                eprintln!("gpushim:   next: gpushim summary {}", t.display());
            }
            Err(e) => eprintln!("gpushim: {e}"),
        }
    }
    ExitCode::from(out.exit_code.clamp(0, 255) as u8)
}

fn cmd_summary(traces: &[PathBuf], json: bool) -> ExitCode {
    let mut all = Vec::new();
    for t in traces {
        match summary::summarize(t) {
            Ok(s) => all.push(s),
            Err(e) => return fail(e),
        }
    }
    if json {
        let v = if all.len() == 1 {
            serde_json::to_string_pretty(&all[0])
        } else {
            serde_json::to_string_pretty(&all)
        };
        println!("{}", v.expect("summaries serialize"));
    } else {
        for (i, s) in all.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", s.render());
        }
    }
    ExitCode::SUCCESS
}

fn cmd_events(trace: &std::path::Path, json: bool) -> ExitCode {
    use std::io::Write;
    let mut reader = match gpushim::reader::TraceReader::open(trace) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if !json {
        let _ = writeln!(
            out,
            "time_ns,thread,kind,api,device,status,ptr,size,stream,text"
        );
    }
    while let Some(r) = reader.next() {
        if r.kind == gpushim::format::RecordKind::String {
            continue;
        }
        if matches!(r.kind, RecordKind::Stack | RecordKind::Module) {
            continue;
        }
        let text = match r.kind {
            RecordKind::RangePush | RecordKind::Mark | RecordKind::RangeStart => {
                reader.string(r.ptr).unwrap_or("").to_string()
            }
            RecordKind::StackRef => reader
                .stack(r.ptr)
                .unwrap_or(&[])
                .iter()
                .map(|&ip| reader.describe_address(ip))
                .collect::<Vec<_>>()
                .join(" < "),
            _ => String::new(),
        };
        let device = if r.device == gpushim::format::DEVICE_UNKNOWN {
            String::new()
        } else {
            r.device.to_string()
        };
        let line = if json {
            serde_json::json!({
                "time_ns": r.time_ns, "thread": r.thread, "kind": r.kind.name(),
                "api": r.api.name(), "device": (r.device != gpushim::format::DEVICE_UNKNOWN).then_some(r.device),
                "status": r.status, "ptr": format!("{:#x}", r.ptr), "size": r.size, "stream": r.stream,
                "text": text,
            })
            .to_string()
        } else {
            format!(
                "{},{},{},{},{device},{},{:#x},{},{},{}",
                r.time_ns,
                r.thread,
                r.kind.name(),
                r.api.name(),
                r.status,
                r.ptr,
                r.size,
                r.stream,
                csv_field(&text)
            )
        };
        if writeln!(out, "{line}").is_err() {
            return ExitCode::SUCCESS; // a closed pipe (| head) is not an error
        }
    }
    let _ = out.flush();
    if let Some(d) = &reader.stats().damage {
        eprintln!(
            "gpushim: {}: stopped at offset {} (record {}): {}; {} later records not decoded",
            trace.display(),
            d.offset,
            d.index,
            d.reason,
            d.skipped
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

fn cmd_simulate(trace: &std::path::Path, mut conf: Vec<String>, json: bool) -> ExitCode {
    if conf.is_empty() {
        conf.push(String::new());
    }
    let out = match gpushim::simulate::simulate(trace, &conf) {
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

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn cmd_config(conf: Option<String>) -> ExitCode {
    let text = conf
        .or_else(|| std::env::var("GPUSHIM_CONF").ok())
        .unwrap_or_default();
    let c = match config::parse_strict(&text) {
        Ok(c) => c,
        Err(e) => return fail(format!("GPUSHIM_CONF: {e}")),
    };
    let size = |n: u64, off: u64| {
        if n == off {
            "off".to_string()
        } else {
            human_bytes(n)
        }
    };
    println!("effective configuration (GPUSHIM_CONF=\"{text}\"):");
    println!("  pool       {}", c.pool.name());
    if c.pool == config::Pool::Off && c.limit > 0 {
        println!("             (limit needs a pool: with pool:off it is not enforced)");
    }
    println!(
        "  round      {}",
        match c.round_divisions {
            0 => "off".to_string(),
            1 => "pow2".to_string(),
            n => format!("pow2_{n}"),
        }
    );
    println!("  max_split  {}", size(c.max_split, u64::MAX));
    println!("  release    {}", size(c.release, u64::MAX));
    println!("  limit      {}", size(c.limit, 0));
    println!("  trace_max  {}", human_bytes(c.trace_max));
    println!();
    println!("keys (GPUSHIM_CONF=\"key:value,key:value\"):");
    for k in config::KEYS {
        println!("  {:<10} {} [default {}]", k.key, k.meaning, k.default);
        println!("  {:<10} accepts: {}", "", k.accepted);
    }
    println!();
    println!(
        "other variables: GPUSHIM_TRACE=PATTERN|off (%p pid, %h host, %r rank), GPUSHIM_DISABLE=1"
    );
    ExitCode::SUCCESS
}
