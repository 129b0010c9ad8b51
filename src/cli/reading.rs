//! The options every report takes: how traces are read (frames, filters, progress).

use gpushim::trace::reader::{Counts, ReadCounts, ReadMode, ReadOptions};

/// Options every report takes. The filters keep the allocations that match (all of the given
/// conditions) and the frees of those allocations; everything else is left out of the report.
#[derive(clap::Args)]
#[command(next_help_heading = "Reading traces (every report)")]
pub struct Reading {
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
    /// Only allocations made inside NVTX ranges named NAME: a push/pop range of their thread (at
    /// any depth), or a start/end range open at the time, whichever thread started it.
    #[arg(long, value_name = "NAME")]
    range: Option<String>,
    /// Name frames module+offset; do not read the binaries for function names and lines.
    #[arg(long)]
    no_symbols: bool,
    /// No progress bar on long reads.
    #[arg(long)]
    quiet: bool,
    /// Show native frames after the Python frames of stacks that have both (stacks without
    /// Python frames always show their native frames).
    #[arg(long)]
    native_frames: bool,
    /// Show only the program's own Python frames in call sites (leave out those of installed
    /// packages such as torch and transformers, and of the standard library), when a stack has
    /// any.
    #[arg(long)]
    program_frames: bool,
}

impl Reading {
    /// The reading options as the reports take them.
    pub fn options(&self) -> Result<ReadOptions, String> {
        let time = |flag: &str, t: &Option<String>| {
            t.as_deref()
                .map(gpushim::trace::filter::parse_time)
                .transpose()
                .map_err(|e| format!("--{flag}: {e}"))
        };
        let filter = gpushim::trace::filter::Filter {
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
        let shown = !self.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let progress = shown.then_some(super::progress::show_progress as fn(u64, u64));
        Ok(ReadOptions {
            filter,
            symbols: !self.no_symbols,
            progress,
            working: shown.then_some(super::progress::show_working as fn(&str)),
            native_frames: self.native_frames,
            program_frames: self.program_frames,
            longest_ring: false,
            mode: ReadMode::default(),
        })
    }
}

/// How the command reads, from its `GPUSHIM_READ_*` settings: each a way that saves time,
/// taken unless turned off, so that the tests and benchmarks can compare the ways (every way
/// gives the same answers). Read here, once, and passed down with the options.
///
/// - `GPUSHIM_READ_MAP=0`: the file read into a buffer, no window of it mapped.
/// - `GPUSHIM_READ_INLINE=1`: decoding in turn, on no thread of its own.
/// - `GPUSHIM_READ_EARLY=0`: every moment, the leaks' samples and the picture's bands in a
///   second pass, none taken in the first.
/// - `GPUSHIM_READ_SPLIT=N`: the first pass's trackers in at most N groups (0: one).
/// - `GPUSHIM_READ_SHORT=0`: every record by the trackers' long road.
/// - `GPUSHIM_REPLAY_EVERY=1`: replays of PyTorch's allocator pass over no repeat of the loop.
/// - `GPUSHIM_REPLAY_MEMORY=SIZE`: the most the requests gathered for a replay may take (a
///   limit of the user's, not a way of reading; carried with the others).
pub fn mode_from_env(counts: Counts) -> ReadMode {
    let is = |name: &str, value: &str| std::env::var_os(name).is_some_and(|v| v == value);
    ReadMode {
        map: !is("GPUSHIM_READ_MAP", "0"),
        decode_apart: !is("GPUSHIM_READ_INLINE", "1"),
        early: !is("GPUSHIM_READ_EARLY", "0"),
        groups: std::env::var("GPUSHIM_READ_SPLIT")
            .ok()
            .and_then(|v| v.parse().ok()),
        short_roads: !is("GPUSHIM_READ_SHORT", "0"),
        replay_every_event: is("GPUSHIM_REPLAY_EVERY", "1"),
        replay_memory: std::env::var_os("GPUSHIM_REPLAY_MEMORY")
            .map(|v| v.to_string_lossy().into_owned()),
        counts,
    }
}

/// What the command's reading cost (`GPUSHIM_READS=1`), said on standard error: how many
/// times it opened a trace and read one through (the tests and the benchmark count them: a
/// report reads its trace in a known number of passes), when its moments were taken, its
/// replays, and where a first pass's time went.
pub fn say_reads(c: &ReadCounts) {
    let get = ReadCounts::get;
    let opened = gpushim::trace::reader::opened_by_name();
    let (held, decoded) = (get(&c.held), get(&c.decoded));
    // Against a whole pass's records, where a pass was read to its end.
    let times = match held {
        0 => String::new(),
        _ => format!(": {:.2} times their records", decoded as f64 / held as f64),
    };
    eprintln!(
        "gpushim: opened {opened} trace file(s), read {} pass(es){times}",
        get(&c.passes)
    );
    let (reading, at_end) = (get(&c.moments_reading), get(&c.moments_at_end));
    if reading + at_end > 0 {
        eprintln!("gpushim: {reading} moment(s) taken as the trace was read, {at_end} at its end");
    }
    let visited = get(&c.moments_visited);
    if visited > 0 {
        eprintln!("gpushim: the moments being taken looked at {visited} record(s)");
    }
    let (copies, copied) = (get(&c.replay_copies), get(&c.replay_copied));
    if copies > 0 {
        eprintln!("gpushim: the moments copied the replay {copies} time(s), {copied} entries");
    }
    let sampled = get(&c.leaks_sampled_reading);
    if sampled > 0 {
        eprintln!("gpushim: {sampled} time(s) the leaks were sampled as the trace was read");
    }
    let replays = get(&c.replays);
    if replays > 0 {
        eprintln!(
            "gpushim: {replays} replay(s) of PyTorch's allocator applied {} events, passed over \
             {} as repeats",
            get(&c.replay_events),
            get(&c.replay_passed)
        );
    }
    let paired = get(&c.paired);
    if paired > 0 {
        eprintln!(
            "gpushim: {paired} pass(es) read by {} threads at once",
            get(&c.readers)
        );
    }
    // Where a first pass's time went: a thread whose CPU time is near the pass's is what the
    // pass waited for. The decoding threads are every pass's (a second pass, a second reader
    // of the first part), the trackers' the first pass's.
    let s = |t: &std::sync::atomic::AtomicU64| get(t) as f64 / 1e9;
    let wall = s(&c.first_pass_ns);
    if wall > 0.0 {
        eprintln!(
            "gpushim: first pass {wall:.2} s; CPU: decoding {:.2} s (every pass), trackers \
             {:.2} s (the busiest thread {:.2} s)",
            s(&c.decoding_ns),
            s(&c.tracking_ns),
            s(&c.tracking_most_ns)
        );
    }
}
