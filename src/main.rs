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

/// Options every report takes. The filters keep the allocations that match (all of the given
/// conditions) and the frees of those allocations; everything else is left out of the report.
#[derive(clap::Args)]
#[command(next_help_heading = "Reading traces (every report)")]
struct Reading {
    /// Only allocations on device N (repeat for several).
    #[arg(long = "device", value_name = "N")]
    devices: Vec<u8>,
    /// Only allocations by thread T, numbered as in `gpushim events` (repeat for several).
    #[arg(long = "thread", value_name = "T")]
    threads: Vec<u16>,
    /// Only allocations on stream S, numbered as in `gpushim events` (repeat for several).
    #[arg(long = "stream", value_name = "S")]
    streams: Vec<u16>,
    /// Only allocations made at or after TIME since the trace began: 1.5s, 200ms, 300us.
    #[arg(long, value_name = "TIME")]
    from: Option<String>,
    /// Only allocations made before TIME since the trace began.
    #[arg(long, value_name = "TIME")]
    to: Option<String>,
    /// Only allocations made inside NVTX ranges named NAME (at any depth, on their thread).
    #[arg(long, value_name = "NAME")]
    range: Option<String>,
    /// Name frames module+offset; do not read the binaries for function names and lines.
    #[arg(long)]
    no_symbols: bool,
    /// No progress bar on long reads.
    #[arg(long)]
    quiet: bool,
}

impl Reading {
    fn apply(&self) -> Result<(), String> {
        let time = |flag: &str, t: &Option<String>| {
            t.as_deref()
                .map(gpushim::filter::parse_time)
                .transpose()
                .map_err(|e| format!("--{flag}: {e}"))
        };
        let filter = gpushim::filter::Filter {
            devices: self.devices.clone(),
            threads: self.threads.clone(),
            streams: self.streams.clone(),
            from_ns: time("from", &self.from)?,
            to_ns: time("to", &self.to)?,
            range: self.range.clone(),
        };
        if let (Some(a), Some(b)) = (filter.from_ns, filter.to_ns)
            && a >= b
        {
            return Err(format!(
                "--from {} is not before --to {}: the window is empty",
                self.from.as_deref().unwrap_or(""),
                self.to.as_deref().unwrap_or("")
            ));
        }
        let any = !filter.devices.is_empty()
            || !filter.threads.is_empty()
            || !filter.streams.is_empty()
            || filter.from_ns.is_some()
            || filter.to_ns.is_some()
            || filter.range.is_some();
        FILTERING.store(any, std::sync::atomic::Ordering::Relaxed);
        gpushim::reader::set_filter(filter);
        gpushim::symbolize::set_enabled(!self.no_symbols);
        if !self.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            gpushim::reader::set_progress(show_progress);
        }
        Ok(())
    }
}

static PROGRESS_BAR: std::sync::OnceLock<indicatif::ProgressBar> = std::sync::OnceLock::new();

/// The reader's progress hook: a bar on stderr once a trace has millions of records.
fn show_progress(done: u64, total: u64) {
    let bar = PROGRESS_BAR.get_or_init(|| {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} reading {human_pos}/{human_len} records [{bar:30}] {percent}% ({eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    });
    bar.set_length(total);
    bar.set_position(done);
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
        /// One record per PyTorch tensor: PyTorch's cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1)
        /// and the shim's pool on (pool:caching unless --conf names a pool). PyTorch's own
        /// counters (memory_allocated, memory_reserved) then read 0; the trace has the figures.
        #[arg(long)]
        per_tensor: bool,
        /// The command and its arguments (after `--` when they start with a dash).
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        cmd: Vec<OsString>,
    },
    /// Calls, bytes and failures per API; peak and final live memory per device; trace health.
    Summary {
        /// Trace files (one per process or rank).
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// Print JSON instead of text.
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Replay a trace's allocations under other pooling policies: peak reserved, fragmentation
    /// and device allocation calls for each, beside what the run had.
    #[command(
        after_help = "Example:\n  gpushim simulate run.trace --conf pool:caching \\\n    --conf pool:caching,round:pow2_4 --conf pool:caching,max_split:64MiB\n\n\
        The replay assumes the GPU keeps up with the program, so it shows the memory a policy \
        needs, not the waits it would cost."
    )]
    Simulate {
        /// The trace to replay.
        trace: PathBuf,

        /// A policy in GPUSHIM_CONF syntax; repeat to compare several (default: the defaults).
        #[arg(long = "conf", value_name = "POLICY")]
        conf: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Every record of a trace, one per line: CSV (default) or JSON lines.
    #[command(
        after_help = "Columns: time_ns (since the trace started), thread (index in the trace), \
        kind, api, device (empty when unknown), status (CUDA result code; 255 = a code above 254), \
        ptr, size, stream (interned index; 0 = the null stream)."
    )]
    Events {
        /// The trace to print.
        trace: PathBuf,

        /// JSON lines instead of CSV.
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// What was live at exit, by call site; and the call sites whose memory grows every
    /// iteration (iterations from a repeating NVTX range or mark, else a detected period).
    #[command(
        after_help = "Example:\n  gpushim run --conf stacks:on -- python train.py\n  gpushim leaks gpushim-python.1234.trace\n\n\
        Call sites are the first frames of the allocating stack (record them with \
        GPUSHIM_CONF=stacks:on); torch.cuda.nvtx.range_push(\"step\") marks iterations with no \
        other change under `gpushim run`."
    )]
    Leaks {
        /// Trace files (one per process or rank).
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// The NVTX range or mark name that starts an iteration (default: the one that repeats most).
        #[arg(long, value_name = "NAME")]
        boundary: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// The moment of peak live memory on each device, and what was live then, by call site and
    /// by NVTX range.
    Peak {
        /// Trace files (one per process or rank).
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// Rows per table.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Each failed allocation: the request, live and cached memory then, the largest free block
    /// in the pool, and the call sites holding the most.
    Oom {
        /// Trace files.
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Live and reserved memory per device over time, as an SVG or PNG chart. Several traces
    /// (the ranks of a job) share one time axis, aligned by their wall-clock starts.
    Plot {
        /// Trace files (the ranks of a job share one time axis).
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// Output file: .svg, or .png for a picture.
        #[arg(short, long, default_value = "gpushim-timeline.svg")]
        output: PathBuf,
        #[command(flatten)]
        reading: Reading,
    },
    /// A flame graph of the memory live at the peak, by stack: SVG, or PNG when the output
    /// ends in .png.
    Flamegraph {
        /// The trace (record stacks with GPUSHIM_CONF=stacks:on).
        trace: PathBuf,
        /// Output file: .svg, or .png for a picture.
        #[arg(short, long, default_value = "gpushim-flamegraph.svg")]
        output: PathBuf,
        #[command(flatten)]
        reading: Reading,
    },
    /// Convert a trace for other viewers: Perfetto/Chrome JSON, PyTorch memory_viz pickle,
    /// RMM replay CSV.
    #[command(
        after_help = "Formats:\n  perfetto         Chrome trace JSON: open in https://ui.perfetto.dev (a counter track per device, NVTX ranges as slices;\n                   several traces become one timeline, a process per rank, aligned by wall clock)\n  memory-viz       PyTorch snapshot pickle: open in https://pytorch.org/memory_viz\n  memory-viz-html  that snapshot inside a page that opens PyTorch's viewer on it\n  rmm          RMM replay log: Thread,Time,Action,Pointer,Size,Stream\n\n\
        For every record as CSV or JSON lines, see `gpushim events`."
    )]
    Export {
        /// One trace; for perfetto, several (one per rank) make one timeline.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// perfetto: Chrome/Perfetto JSON (ui.perfetto.dev); memory-viz: PyTorch's snapshot
        /// pickle (pytorch.org/memory_viz); memory-viz-html: a page that opens that viewer on
        /// the snapshot (needs the network to load the viewer); rmm: RMM's replay CSV.
        #[arg(long, value_parser = ["perfetto", "memory-viz", "memory-viz-html", "rmm"])]
        format: String,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
        /// Pickle protocol for memory-viz (2, 3 or 4).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=4))]
        protocol: u8,
        /// The first view of memory-viz-html.
        #[arg(long, default_value = "Active Memory Timeline", value_parser = [
            "Active Memory Timeline", "Active Cached Segment Timeline", "Allocator State History"])]
        view: String,
        #[command(flatten)]
        reading: Reading,
    },
    /// Watch a running process through its trace: live and peak memory per device and the
    /// call sites holding the most, refreshed until the process exits.
    #[command(
        after_help = "Example:\n  gpushim run --trace job.trace -- python train.py &\n  gpushim top job.trace\n\n\
        Each refresh reads the trace again; the trace is written as the program runs."
    )]
    Top {
        /// The trace of the running process.
        trace: PathBuf,

        /// Time between refreshes: 2s, 500ms.
        #[arg(long, default_value = "2s")]
        interval: String,
        /// Stop after this many refreshes (default: when the process exits).
        #[arg(long)]
        count: Option<u64>,
        /// Call sites to show.
        #[arg(long, default_value_t = 8)]
        top: usize,
        #[command(flatten)]
        reading: Reading,
    },
    /// Two traces side by side: peak, live at exit, and live bytes per call site.
    Diff {
        /// The first trace (the baseline).
        a: PathBuf,
        /// The second trace.
        b: PathBuf,

        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Print the path of the shim library that `gpushim run` preloads (for LD_PRELOAD by hand,
    /// or PyTorch's pluggable allocator). An installed wheel writes its bundled copy out first.
    Lib {
        /// The shim library to check instead of the one found.
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
    },
    /// Print the effective configuration from GPUSHIM_CONF and what each key does.
    Config {
        /// Configuration to check instead of $GPUSHIM_CONF.
        conf: Option<String>,
    },
}

impl Cmd {
    /// The reading options of a report command.
    fn reading(&self) -> Option<&Reading> {
        match self {
            Cmd::Summary { reading, .. }
            | Cmd::Simulate { reading, .. }
            | Cmd::Events { reading, .. }
            | Cmd::Leaks { reading, .. }
            | Cmd::Peak { reading, .. }
            | Cmd::Oom { reading, .. }
            | Cmd::Plot { reading, .. }
            | Cmd::Flamegraph { reading, .. }
            | Cmd::Export { reading, .. }
            | Cmd::Top { reading, .. }
            | Cmd::Diff { reading, .. } => Some(reading),
            Cmd::Run { .. } | Cmd::Config { .. } | Cmd::Lib { .. } => None,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(r) = cli.command.reading()
        && let Err(e) = r.apply()
    {
        return fail(e);
    }
    let code = dispatch(cli.command);
    if let Some(bar) = PROGRESS_BAR.get() {
        bar.finish_and_clear();
    }
    code
}

fn dispatch(command: Cmd) -> ExitCode {
    match command {
        Cmd::Run {
            conf,
            trace,
            lib,
            per_tensor,
            cmd,
        } => cmd_run(conf, trace, lib, per_tensor, cmd),
        Cmd::Summary { traces, json, .. } => cmd_summary(&traces, json),
        Cmd::Events { trace, json, .. } => cmd_events(&trace, json),
        Cmd::Simulate {
            trace, conf, json, ..
        } => cmd_simulate(&trace, conf, json),
        Cmd::Config { conf } => cmd_config(conf),
        Cmd::Lib { lib } => match gpushim::run::find_shim(lib.as_deref()) {
            Ok(p) => {
                println!("{}", p.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Cmd::Leaks {
            traces,
            boundary,
            json,
            ..
        } => cmd_leaks(&traces, boundary.as_deref(), json),
        Cmd::Peak {
            traces, top, json, ..
        } => cmd_peak(&traces, top, json),
        Cmd::Oom { traces, json, .. } => cmd_oom(&traces, json),
        Cmd::Plot { traces, output, .. } => match picture_kind(&output) {
            Err(e) => fail(e),
            Ok(()) => match gpushim::export::plot_svg(&traces) {
                Ok(svg) => write_picture(&output, &svg),
                Err(e) => fail(e),
            },
        },
        Cmd::Flamegraph { trace, output, .. } => match picture_kind(&output) {
            Err(e) => fail(e),
            Ok(()) => match gpushim::analysis::peak(&trace) {
                Ok(peaks) => match peaks.first() {
                    Some(p) => write_picture(
                        &output,
                        &gpushim::export::flamegraph_svg(
                            p,
                            &format!(
                                "{}: live at the peak ({})",
                                trace.display(),
                                human_bytes(p.live_bytes)
                            ),
                        ),
                    ),
                    None => fail(
                        "the trace holds no allocation (or none that the filters keep): no \
                         flame graph to draw",
                    ),
                },
                Err(e) => fail(e),
            },
        },
        Cmd::Export {
            traces,
            format,
            output,
            protocol,
            view,
            ..
        } => cmd_export(&traces, &format, &output, protocol, &view),
        Cmd::Diff { a, b, json, .. } => cmd_diff(&a, &b, json),
        Cmd::Top {
            trace,
            interval,
            count,
            top,
            ..
        } => cmd_top(&trace, &interval, count, top),
    }
}

/// Pictures are written as SVG or PNG, chosen by the output's extension; anything else is
/// refused rather than written as SVG under a misleading name.
fn picture_kind(output: &std::path::Path) -> Result<(), String> {
    match output.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") || e.eq_ignore_ascii_case("png") => Ok(()),
        _ => Err(format!(
            "--output {}: pictures are written as .svg or .png; name the file so",
            output.display()
        )),
    }
}

/// Whether a report filter is in force (set from the reading options).
fn filtering() -> bool {
    FILTERING.load(std::sync::atomic::Ordering::Relaxed)
}

static FILTERING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("gpushim: {msg}");
    ExitCode::from(2)
}

fn cmd_run(
    conf: Option<String>,
    trace: Option<String>,
    lib: Option<PathBuf>,
    per_tensor: bool,
    cmd: Vec<OsString>,
) -> ExitCode {
    let conf = if per_tensor {
        let given = conf.or_else(|| std::env::var("GPUSHIM_CONF").ok());
        Some(gpushim::run::per_tensor_conf(given.as_deref()))
    } else {
        conf
    };
    // One rule for the configuration, wherever it comes from: an error anywhere in it means
    // none of it applies, so the program is not started (the shim itself, without
    // `gpushim run`, says so in one line and runs on the defaults).
    let (conf_text, source) = match &conf {
        Some(c) => (Some(c.clone()), "--conf"),
        None => (std::env::var("GPUSHIM_CONF").ok(), "GPUSHIM_CONF"),
    };
    if let Some(c) = &conf_text
        && let Err(e) = config::parse_strict(c)
    {
        return fail(format!("{source}: {e}; nothing was started"));
    }
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
    let out = match gpushim::run::run(&shim, conf.as_deref(), trace.as_deref(), per_tensor, &cmd) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    if out.traces.is_empty() && recording {
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
    if out.traces.len() > 1 {
        let all: Vec<String> = out.traces.iter().map(|t| t.display().to_string()).collect();
        eprintln!(
            "gpushim: {} traces (one per process); together: gpushim summary {}",
            all.len(),
            all.join(" ")
        );
    }
    ExitCode::from(out.exit_code.clamp(0, 255) as u8)
}

fn print_json<T: serde::Serialize>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("reports serialize")
    );
}

/// One line per holder of memory: bytes, allocations, call site or range.
fn print_holders(holders: &[gpushim::analysis::Holder], n: usize, indent: &str) {
    for h in holders.iter().take(n) {
        println!(
            "{indent}{:>12} in {:>6}  {}",
            human_bytes(h.bytes),
            h.allocations,
            h.label
        );
    }
}

/// One report per trace; with several (one per rank), JSON becomes
/// `{"traces": [{"trace": path, ...}], "combined": ...}`.
fn print_json_set<T: serde::Serialize, C: serde::Serialize>(all: &[(String, T)], combined: C) {
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

fn cmd_leaks(traces: &[PathBuf], boundary: Option<&str>, json: bool) -> ExitCode {
    let mut all = Vec::new();
    for t in traces {
        match gpushim::analysis::leaks(t, boundary) {
            Ok(l) => all.push((t.display().to_string(), l)),
            Err(e) => return fail(e),
        }
    }
    let combined = gpushim::analysis::combine_leaks(&all);
    if json {
        print_json_set(&all, &combined);
        return ExitCode::SUCCESS;
    }
    for (i, (t, l)) in all.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("{t}");
        println!(
            "live at exit: {}{}",
            human_bytes(l.live_at_exit_bytes),
            if l.clean_exit {
                ""
            } else {
                " (the process did not exit cleanly: this is what was live when the trace ends)"
            }
        );
        print_holders(&l.live_at_exit, 10, "  ");
        if let Some(seen) = &l.boundary_not_found {
            println!(
                "iterations: --boundary {} names no NVTX range or mark of this trace; it holds {}",
                boundary.unwrap_or(""),
                if seen.is_empty() {
                    "none".to_string()
                } else {
                    seen.join(", ")
                }
            );
            continue;
        }
        match &l.iterations {
            None => println!(
                "iterations: none found (no repeating NVTX range or mark, no regular allocation)"
            ),
            Some(it) => {
                println!("iterations: {} boundaries, by {}", it.count, it.boundary);
                if let (Some(a), Some(b)) =
                    (it.live_at_boundaries.first(), it.live_at_boundaries.last())
                {
                    println!(
                        "  live at the first boundary {}, at the last {}",
                        human_bytes(*a),
                        human_bytes(*b)
                    );
                }
                if it.growing.is_empty() {
                    println!("  no call site grows steadily from one iteration to the next");
                }
                for g in &it.growing {
                    println!(
                        "  grows {} per iteration ({} -> {})  {}",
                        human_bytes(g.bytes_per_iteration),
                        human_bytes(g.live_at_first_boundary),
                        human_bytes(g.live_at_last_boundary),
                        g.call_site
                    );
                }
            }
        }
    }
    if all.len() > 1 {
        let c = &combined;
        println!();
        println!("all {} traces together", c.traces);
        println!("live at exit: {}", human_bytes(c.live_at_exit_bytes));
        print_holders(&c.live_at_exit, 10, "  ");
        if !c.unclean.is_empty() {
            println!("did not exit cleanly: {}", c.unclean.join(", "));
        }
        if c.growing.is_empty() {
            println!("no call site grows steadily in any trace");
        }
        for g in &c.growing {
            println!(
                "  grows {} per iteration in {} of {} traces  {}",
                human_bytes(g.bytes_per_iteration),
                g.traces,
                c.traces,
                g.call_site
            );
        }
    }
    ExitCode::SUCCESS
}

fn cmd_peak(traces: &[PathBuf], top: usize, json: bool) -> ExitCode {
    let mut all = Vec::new();
    for t in traces {
        match gpushim::analysis::peak(t) {
            Ok(p) => all.push((t.display().to_string(), p)),
            Err(e) => return fail(e),
        }
    }
    let combined = gpushim::analysis::combine_peaks(&all);
    if json {
        print_json_set(&all, &combined);
        return ExitCode::SUCCESS;
    }
    for (i, (t, peaks)) in all.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("{t}");
        if peaks.is_empty() {
            println!(
                "no allocation{}: nothing was live on any device",
                if filtering() {
                    " that the filters keep"
                } else {
                    " in this trace"
                }
            );
        }
        for p in peaks {
            println!(
                "device {}: peak live {} at {} (reserved {})",
                p.device,
                human_bytes(p.live_bytes),
                summary::human_duration(p.time_ns),
                human_bytes(p.reserved_bytes)
            );
            println!("  by call site:");
            print_holders(&p.by_call_site, top, "    ");
            println!("  by NVTX range:");
            print_holders(&p.by_range, top, "    ");
        }
    }
    if all.len() > 1 {
        let c = &combined;
        println!();
        println!("all {} traces together", c.traces);
        println!(
            "sum of the peaks {}; the largest {} (device {} of {})",
            human_bytes(c.sum_of_peaks),
            human_bytes(c.largest_bytes),
            c.largest_device,
            c.largest_trace
        );
        println!("  live at the peaks, by call site:");
        print_holders(&c.by_call_site, top, "    ");
        println!("  by NVTX range:");
        print_holders(&c.by_range, top, "    ");
    }
    ExitCode::SUCCESS
}

/// Whether the process that writes `info`'s trace still runs (on this host), so `top` goes on.
fn still_running(info: &gpushim::reader::TraceInfo) -> bool {
    if info.clean_exit {
        return false;
    }
    let here = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    if here.trim() != info.host {
        return true; // Another host's process: only --count or Ctrl-C ends the watch.
    }
    // SAFETY: signal 0 checks that the process exists and sends nothing.
    unsafe { libc::kill(info.pid as libc::pid_t, 0) == 0 }
}

/// Whether `path` looks like a trace whose header is still being written: missing, shorter
/// than the magic, or with the magic still zero.
fn header_pending(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    match std::fs::File::open(path) {
        Err(_) => true,
        Ok(mut f) => f.read_exact(&mut magic).is_err() || magic == [0; 8],
    }
}

fn cmd_top(trace: &std::path::Path, interval: &str, count: Option<u64>, top: usize) -> ExitCode {
    let every = match gpushim::filter::parse_time(interval) {
        Ok(ns) if ns > 0 => std::time::Duration::from_nanos(ns),
        Ok(_) => return fail("--interval must be more than 0"),
        Err(e) => return fail(format!("--interval: {e}")),
    };
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut shown = 0u64;
    let started = std::time::Instant::now();
    loop {
        let s = match summary::summarize(trace) {
            Ok(s) => s,
            // A process that just started may not have written the header yet (the file is
            // created, then filled in).
            Err(_)
                if shown == 0
                    && started.elapsed() < std::time::Duration::from_secs(10)
                    && header_pending(trace) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            Err(e) => return fail(e),
        };
        let l = match gpushim::analysis::leaks(trace, None) {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
        let running = gpushim::reader::TraceReader::open(trace)
            .map(|r| still_running(r.info()))
            .unwrap_or(false);
        if tty {
            print!("\x1b[H\x1b[2J");
        } else if shown > 0 {
            println!();
        }
        println!(
            "{} (pid {}): {} after {}, {} events",
            s.program,
            s.pid,
            if running { "running" } else { "exited" },
            summary::human_duration(s.duration_ns),
            s.events
        );
        for d in &s.devices {
            println!(
                "  device {}: live {} in {} allocations, peak {} at {}",
                d.device.map_or("?".to_string(), |d| d.to_string()),
                human_bytes(d.live_bytes_at_end),
                d.live_allocations_at_end,
                human_bytes(d.peak_live_bytes),
                summary::human_duration(d.peak_time_ns)
            );
        }
        println!("  live now, by call site:");
        print_holders(&l.live_at_exit, top, "    ");
        shown += 1;
        if !running || count.is_some_and(|c| shown >= c) {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(every);
    }
}

fn cmd_oom(traces: &[PathBuf], json: bool) -> ExitCode {
    for t in traces {
        let ooms = match gpushim::analysis::oom(t) {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        if json {
            print_json(&ooms);
            continue;
        }
        println!("{}: {} failed allocation(s)", t.display(), ooms.len());
        for o in &ooms {
            println!(
                "at {}: {} of {} failed with {} on device {}{}",
                summary::human_duration(o.time_ns),
                o.api,
                human_bytes(o.requested_bytes),
                o.status,
                o.device,
                if o.limit_hit {
                    " (the pool's limit, not the device)"
                } else {
                    ""
                }
            );
            println!(
                "  live {}, reserved {}, cached (reserved, not live) {}, largest free block in the pool {}",
                human_bytes(o.live_bytes),
                human_bytes(o.reserved_bytes),
                human_bytes(o.cached_bytes),
                human_bytes(o.largest_free_block)
            );
            if let Some(f) = o.device_free_bytes {
                println!(
                    "  the device said {} free at the last cudaMemGetInfo before",
                    human_bytes(f)
                );
            }
            println!("  holding the most:");
            print_holders(&o.holders, 5, "    ");
        }
    }
    ExitCode::SUCCESS
}

/// Writes an SVG as it is, or rendered to PNG when the path ends in `.png`.
fn write_picture(path: &std::path::Path, svg: &str) -> ExitCode {
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        return write_file(path, svg);
    }
    match gpushim::export::svg_to_png(svg) {
        Ok(bytes) => match std::fs::write(path, bytes) {
            Ok(()) => {
                eprintln!("gpushim: wrote {}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("cannot write {}: {e}", path.display())),
        },
        Err(e) => fail(e),
    }
}

fn write_file(path: &std::path::Path, text: &str) -> ExitCode {
    match std::fs::write(path, text) {
        Ok(()) => {
            eprintln!("gpushim: wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("cannot write {}: {e}", path.display())),
    }
}

fn cmd_export(
    traces: &[PathBuf],
    format: &str,
    output: &std::path::Path,
    protocol: u8,
    view: &str,
) -> ExitCode {
    let trace = match (format, traces) {
        ("perfetto", _) | (_, [_]) => &traces[0],
        _ => {
            return fail(format!(
                "{format} takes one trace ({} given): export each rank on its own, or use \
                 --format perfetto for one timeline of them all",
                traces.len()
            ));
        }
    };
    let file = match std::fs::File::create(output) {
        Ok(f) => f,
        Err(e) => return fail(format!("cannot write {}: {e}", output.display())),
    };
    let mut w = std::io::BufWriter::new(file);
    let r = match format {
        "perfetto" => gpushim::export::perfetto(traces, &mut w).map_err(|e| e.to_string()),
        "rmm" => gpushim::export::rmm_csv(trace, &mut w).map_err(|e| e.to_string()),
        "memory-viz-html" => gpushim::export::memory_viz_html(trace, &mut w, view),
        _ => gpushim::export::memory_viz(trace, &mut w, protocol),
    };
    match r {
        Ok(n) => {
            use std::io::Write;
            if let Err(e) = w.flush() {
                return fail(format!("cannot write {}: {e}", output.display()));
            }
            eprintln!(
                "gpushim: wrote {} ({n} {})",
                output.display(),
                match format {
                    "perfetto" => "events",
                    "rmm" => "rows",
                    _ => "segments",
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn cmd_diff(a: &std::path::Path, b: &std::path::Path, json: bool) -> ExitCode {
    let (la, sa) = match gpushim::export::live_by_site(a) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let (lb, sb) = match gpushim::export::live_by_site(b) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let peak = |t: &std::path::Path| {
        gpushim::analysis::peak(t).map(|p| p.iter().map(|x| x.live_bytes).sum::<u64>())
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
            "a": a.display().to_string(), "b": b.display().to_string(),
            "peak_live_bytes": [pa, pb], "live_at_exit_bytes": [la, lb],
            "call_sites": sites.iter().map(|s| serde_json::json!({"call_site": s.0, "a": s.2, "b": s.3})).collect::<Vec<_>>(),
        }));
        return ExitCode::SUCCESS;
    }
    // Columns named by the files (their names alone; the full paths head the table).
    let name = |p: &std::path::Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string())
    };
    let (na, nb) = (name(a), name(b));
    let w = na.len().max(nb.len()).max(14);
    println!("A = {}\nB = {}", a.display(), b.display());
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

fn cmd_summary(traces: &[PathBuf], json: bool) -> ExitCode {
    let mut all = Vec::new();
    for t in traces {
        match summary::summarize(t) {
            Ok(s) => all.push(s),
            Err(e) => return fail(e),
        }
    }
    if json {
        if all.len() == 1 {
            print_json(&all[0]);
        } else {
            print_json(&serde_json::json!({"traces": all, "combined": summary::combine(&all)}));
        }
    } else {
        for (i, s) in all.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", s.render());
        }
        if all.len() > 1 {
            println!();
            print!("{}", summary::combine(&all).render());
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
                .map(|&ip| gpushim::symbolize::describe(&reader, ip))
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
    let source = if conf.is_some() {
        "the configuration given"
    } else {
        "GPUSHIM_CONF"
    };
    let text = conf
        .or_else(|| std::env::var("GPUSHIM_CONF").ok())
        .unwrap_or_default();
    let c = match config::parse_strict(&text) {
        Ok(c) => c,
        Err(e) => return fail(format!("{source}: {e}")),
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
