//! Decoding a trace file, streaming: memory stays constant whatever the trace length.
//!
//! A trace from a process that crashed is normal input. The reader decodes every committed
//! record, counts torn records (claimed, never committed), and stops at the first record that is
//! neither, saying where. A file cut short (copied while written, a full disk) decodes up to its
//! end, and the records it is missing are counted.
//!
//! Here: the reader, its options, and records put back in time order; `head.rs` the header
//! read and checked, `decode.rs` bodies read and decoded (a ring's checkpoint, read first,
//! is read back in `trace::checkpoint::read`), `source.rs` the decoder on a thread of its own
//! (each batch shared with any second reader), `fork.rs` a batch at a time and second
//! readers, `stats.rs` what decoding counted, `counts.rs` what a command's reading cost.

mod counts;
mod decode;
mod follow;
mod fork;
pub(crate) mod head;
mod mapped;
mod opening;
mod options;
mod order;
mod source;
mod spares;
mod stats;

use crate::trace::checkpoint::read::{
    checkpoint_summarized, checkpoint_summed, read_checkpoint, restoring_prefix,
};
pub use counts::{Counts, ReadCounts, thread_cpu_ns};
pub use follow::{Look, SETTLED_AFTER};
pub use fork::Held;
pub use head::{DeviceMake, printable, visible};
pub use opening::{open_named, opened_by_name, pin, pin_opened_traces};
pub use options::{ReadMode, ReadOptions};
pub use stats::{Damage, DecodeStats};

use crate::trace::format::{self, HEADER_SIZE, RECORD_SIZE, Record, RecordKind, header};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// What the header says about the traced process.
#[derive(Clone, Debug)]
pub struct TraceInfo {
    pub path: PathBuf,
    pub version: u32,
    pub pid: u32,
    pub rank: i32,
    pub host: String,
    pub program: String,
    pub cmdline: Vec<String>,
    /// The libraries' settings the trace kept (see `format::header::ENV`), as `NAME=value`.
    pub env: Vec<String>,
    pub start_realtime_ns: u64,
    pub clean_exit: bool,
    /// Records claimed by writers (committed, torn, or beyond the file's end).
    pub claimed: u64,
    /// Records dropped because the trace reached its size cap or the disk filled up.
    pub lost: u64,
    pub capacity: u64,
    pub file_len: u64,
    /// The records form a ring (a trace of any length): the oldest are summarized in a
    /// checkpoint.
    pub ring: bool,
    /// Records the trace's checkpoint summarizes (0: it starts from no checkpoint).
    pub summarized: u64,
    /// Checkpoints that did not fit the file's checkpoint slots.
    pub checkpoints_failed: u64,
    /// The header's checkpoint layout is not a writer's (what is wrong, where): no checkpoint
    /// was read.
    pub checkpoint_refused: Option<String>,
    /// What each CUDA device was made of (see `format::header::DEVICES`), by ordinal: its
    /// streaming multiprocessors and the most threads one runs at once; `None` where the
    /// trace does not say.
    pub devices: Vec<Option<DeviceMake>>,
}

impl TraceInfo {
    /// Whether the process that writes this trace still runs (on this host: a trace from
    /// another host whose process did not exit cleanly counts as running).
    pub fn still_running(&self) -> bool {
        if self.clean_exit {
            return false;
        }
        let here = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        if here.trim() != self.host {
            return true;
        }
        // SAFETY: signal 0 checks that the process exists and sends nothing.
        unsafe { libc::kill(self.pid as libc::pid_t, 0) == 0 }
    }

    /// Whether the process that writes this trace is running on this host now, as far as can
    /// be seen: it did not exit cleanly, and a process of its pid runs the same program (a pid
    /// given to another program after a crash does not count). Reports then speak of what is
    /// live now, not at exit.
    pub fn running_here(&self) -> bool {
        if self.clean_exit {
            return false;
        }
        let here = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        if here.trim() != self.host {
            return false;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return false;
        };
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or(&[]);
        let name = argv0.rsplit(|&b| b == b'/').next().unwrap_or(&[]);
        !name.is_empty() && printable(name) == self.program
    }
}

/// Why a file could not be read at all.
#[derive(Debug)]
pub enum ReadError {
    Io(PathBuf, io::Error),
    TooShort {
        path: PathBuf,
        len: u64,
    },
    BadMagic {
        path: PathBuf,
    },
    Version {
        path: PathBuf,
        version: u32,
    },
    Layout {
        path: PathBuf,
        record: u32,
        header: u32,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(p, e) => write!(
                f,
                "{}: {e}",
                crate::fixedfmt::Escaped(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()))
            ),
            ReadError::TooShort { path, len } => write!(
                f,
                "{}: {len} bytes, shorter than the {HEADER_SIZE}-byte trace header (offset {len}); \
                 the file was cut short or is not a gpushim trace",
                crate::fixedfmt::Escaped(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
            ),
            ReadError::BadMagic { path } => write!(
                f,
                "{}: not a gpushim trace (offset 0: expected the magic bytes \"GPUSHIM\")",
                crate::fixedfmt::Escaped(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
            ),
            ReadError::Version { path, version } => write!(
                f,
                "{}: trace format version {version} at offset {}, this gpushim reads version {}; \
                 decode it with the gpushim that wrote it",
                crate::fixedfmt::Escaped(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())),
                header::VERSION,
                format::VERSION
            ),
            ReadError::Layout {
                path,
                record,
                header: h,
            } => write!(
                f,
                "{}: header at offset {} says {record}-byte records and a {h}-byte header, \
                 expected {RECORD_SIZE} and {HEADER_SIZE}: the header is damaged",
                crate::fixedfmt::Escaped(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())),
                header::RECORD_SIZE
            ),
        }
    }
}

impl std::error::Error for ReadError {}

pub struct TraceReader {
    /// What the header said and the records defined so far, and how frames are named: what a
    /// reader reads as ([`std::ops::Deref`]) and leaves behind ([`TraceReader::into_tables`]).
    tables: TraceTables,
    /// The records, in batches, from the decoder (on its own thread where there is a core).
    source: source::Source,
    /// The batch being returned, and what came with it.
    batch: std::collections::VecDeque<Record>,
    /// Where batches read go back to the decoder.
    spares: std::sync::Arc<decode::Spares>,
    restoring: bool,
    next: u64,
    end: u64,
    /// The report's filter, if it keeps less than everything.
    filtering: Option<crate::trace::filter::Filtering>,
    progress: Option<fn(u64, u64)>,
    /// Records returned since the progress hook was last called.
    since_progress: u32,
    filter: crate::trace::filter::Filter,
    /// What a second reader of the same file starts from ([`TraceReader::fork`]).
    template: fork::Template,
    /// What this pass decoded, as the process counts it.
    pass_count: Counted,
    /// Read while its program writes it ([`TraceReader::open_following`]).
    following: Option<follow::Following>,
    /// Whether this reader reads the records a replay of PyTorch's allocator reads (the same
    /// checkpoint of a ring as [`ReadOptions::longest_ring`] chooses, or no lapped ring).
    as_replay_reads: bool,
    /// Reads another reader's batches ([`TraceReader::pairs`]): nothing decoded of its own,
    /// nothing counted.
    second: bool,
}

/// A trace's tables: what its header said and its records defined (strings, stacks, loaded
/// modules), how the command names frames and reads. Plain data, no file behind it: the
/// analysis keeps it past the reader that read it, for the reports to name what they hold.
pub struct TraceTables {
    info: TraceInfo,
    /// What decoding counted so far (final once the reader returned its last record).
    stats: DecodeStats,
    /// What the records defined so far: strings, stacks, modules.
    defs: Definitions,
    /// How frames are named.
    naming: Naming,
    /// How the command reads (passed on to the passes' trackers and second readers).
    mode: ReadMode,
}

impl std::ops::Deref for TraceReader {
    type Target = TraceTables;

    fn deref(&self) -> &TraceTables {
        &self.tables
    }
}

/// What a reader's records defined so far, by id: strings, stacks, loaded modules.
#[derive(Clone, Default)]
struct Definitions {
    /// Strings defined so far (NVTX messages, module paths), by id.
    strings: HashMap<u64, String>,
    /// Call stacks defined so far, by id: return addresses, innermost first.
    stacks: crate::fasthash::FastMap<u64, Vec<u64>>,
    /// Loaded modules seen so far: the string id of the path by load base (ordered, so naming a
    /// frame is a logarithmic lookup however many modules a trace holds).
    modules: std::collections::BTreeMap<u64, u64>,
    /// The string id of each module's build-id (hex), by load base, when the shim found one.
    build_ids: HashMap<u64, u64>,
    /// Whether a stack with Python frames has been read.
    python_frames: bool,
}

/// How a reader names frames (the command's options).
struct Naming {
    /// Whether frames are named from the binaries.
    symbols: bool,
    native_frames: bool,
    program_frames: bool,
}

/// What a pass decoded, as the process counts it.
#[derive(Default)]
struct Counted {
    /// Records this pass decoded so far, and whether a whole pass was counted (a second
    /// reader's never is).
    pass_decoded: u64,
    whole_counted: bool,
    /// Of this pass's records, those counted as a whole pass's (a followed reader counts each
    /// look's as it ends).
    held: u64,
}

/// Records read from the file at a time (256 KiB: the chunk stays in the cache).
const CHUNK_RECORDS: usize = 1 << 13;

impl TraceReader {
    /// What this reader read, kept once it is done: the header, the records' definitions and
    /// how frames are named, without the file.
    pub fn into_tables(self) -> TraceTables {
        self.tables
    }

    /// Opens a trace to read every record, with frames named.
    pub fn open(path: impl AsRef<Path>) -> Result<TraceReader, ReadError> {
        TraceReader::open_with(path, &ReadOptions::default())
    }

    /// Opens a trace to read as `opts` says.
    pub fn open_with(path: impl AsRef<Path>, opts: &ReadOptions) -> Result<TraceReader, ReadError> {
        let headed = head::open_header(path.as_ref())?;
        Ok(TraceReader::of_header(headed, opts)?.counted())
    }

    /// A reader before its first record (`next`, `end`: the records it reads), nothing defined
    /// yet, reading as `opts` asks.
    fn at_start(
        info: TraceInfo,
        decoder: decode::Decoder,
        template: fork::Template,
        stats: DecodeStats,
        extent: (u64, u64),
        opts: &ReadOptions,
    ) -> TraceReader {
        let spares = decoder.spares.clone();
        let source = source::Source::Pending(Box::new(decoder));
        TraceReader::with_source(info, (source, spares), template, stats, extent, opts)
    }

    /// [`TraceReader::at_start`] with its batches from `source`.
    fn with_source(
        info: TraceInfo,
        (source, spares): (source::Source, std::sync::Arc<decode::Spares>),
        template: fork::Template,
        stats: DecodeStats,
        (next, end): (u64, u64),
        opts: &ReadOptions,
    ) -> TraceReader {
        TraceReader {
            tables: TraceTables {
                info,
                stats,
                defs: Definitions::default(),
                naming: Naming {
                    symbols: opts.symbols,
                    native_frames: opts.native_frames,
                    program_frames: opts.program_frames,
                },
                mode: opts.mode.clone(),
            },
            spares,
            source,
            batch: std::collections::VecDeque::new(),
            restoring: false,
            next,
            end,
            filtering: (!opts.filter.is_empty())
                .then(|| crate::trace::filter::Filtering::new(opts.filter.clone())),
            progress: opts.progress,
            since_progress: 0,
            filter: opts.filter.clone(),
            template,
            pass_count: Counted::default(),
            following: None,
            second: false,
            as_replay_reads: true,
        }
    }

    /// A pass begun (the file's opening is counted where it is opened by its name: see
    /// [`opening::open_named`]).
    fn counted(self) -> TraceReader {
        ReadCounts::add(&self.tables.mode.counts.passes, 1);
        self
    }

    /// Reads the trace again from its first record, through the descriptor it was opened with
    /// (the same file, whatever has been renamed or linked since) and over the extent its
    /// header gave then: a second pass sees the records the first saw, in the same order, at
    /// the same indices. What the first pass learnt is forgotten.
    pub fn rewind(&mut self) -> Result<(), ReadError> {
        let gone = || io::Error::other("the decoding thread ended early");
        let path = self.tables.info.path.clone();
        let mut d = self
            .source
            .stop()
            .ok_or_else(|| ReadError::Io(path.clone(), gone()))?;
        d.rewind().map_err(|e| ReadError::Io(path, e))?;
        self.next = d.start;
        self.tables.stats = d.first.stats.clone();
        self.source = source::Source::Pending(d);
        self.batch.clear();
        self.restoring = false;
        self.tables.defs = Definitions::default();
        self.filtering = (!self.filter.is_empty())
            .then(|| crate::trace::filter::Filtering::new(self.filter.clone()));
        self.since_progress = 0;
        self.pass_count.pass_decoded = 0;
        ReadCounts::add(&self.tables.mode.counts.passes, 1);
        Ok(())
    }

    /// Whether the filter kept an allocation that succeeded in the records read since the
    /// reader was opened or rewound; `None` without a filter.
    pub fn filter_kept_any(&self) -> Option<bool> {
        self.filtering.as_ref().map(|f| f.kept_any())
    }

    /// Whether the records returned so far came from a checkpoint (a ring trace's summary of
    /// its oldest records) and the next one may too.
    pub fn in_checkpoint(&self) -> bool {
        self.restoring
    }

    /// Records examined so far and in all, for progress display.
    pub fn progress(&self) -> (u64, u64) {
        (self.next, self.end)
    }

    /// The definitions of a batch, before its records.
    fn apply(&mut self, defs: Vec<decode::Def>) {
        for d in defs {
            match d {
                decode::Def::String(id, text) => {
                    self.tables.defs.strings.insert(id, text);
                }
                decode::Def::Stack(id, frames) => {
                    if frames
                        .first()
                        .is_some_and(|&f| format::as_py_frame(f).is_some())
                    {
                        self.tables.defs.python_frames = true;
                    }
                    self.tables.defs.stacks.insert(id, frames);
                }
                decode::Def::Module(base, path) => {
                    self.tables.defs.modules.insert(base, path);
                    self.tables.defs.build_ids.remove(&base);
                }
                decode::Def::BuildId(base, id) => {
                    self.tables.defs.build_ids.insert(base, id);
                }
                decode::Def::Join(id, backward, forward) => {
                    let frames = crate::trace::backward::joined_frames(
                        &self.tables.defs.stacks,
                        backward,
                        forward,
                    );
                    self.tables.defs.stacks.insert(id, frames);
                }
            }
        }
    }
}

/// Records wait this long (in trace time) in the reorder window before they are returned.
/// Writers keep a block of slots for at most `MAX_BLOCK_AGE_NS` (1 ms), so file order and time
/// order differ by little more; the rest is room for a writer preempted between its clock read
/// and its claim.
pub const REORDER_WINDOW_NS: u64 = 20_000_000;
/// The reorder window never holds more records than this, whatever their times.
pub const REORDER_MAX: usize = 1 << 20;

impl Iterator for TraceReader {
    type Item = Record;

    /// The next record in time order (ties in file order) that the filter keeps. Strings are
    /// resolved as they are read, before any record that refers to them is returned.
    fn next(&mut self) -> Option<Record> {
        loop {
            crate::prefetch::ahead(self.batch.as_slices().0, 0);
            let Some(r) = self.batch.pop_front() else {
                self.batch = self.take_batch()?.into();
                continue;
            };
            self.since_progress += 1;
            if self.since_progress == 1 << 20 {
                self.since_progress = 0;
                if let Some(hook) = self.progress {
                    hook(self.next, self.end);
                }
            }
            // A checkpoint's state is the whole run's before the ring: filters apply to the
            // records after it.
            let keep = match &mut self.filtering {
                None => true,
                Some(_) if self.restoring => true,
                Some(f) => f.keep(&r, &self.tables.defs.strings),
            };
            if keep {
                return Some(r);
            }
        }
    }
}

impl TraceTables {
    /// Counts so far; final once the iterator returned `None`.
    pub fn stats(&self) -> &DecodeStats {
        &self.stats
    }

    /// Whether frames are to be named from the binaries (see [`ReadOptions::symbols`]).
    pub fn symbols(&self) -> bool {
        self.naming.symbols
    }

    /// Whether stacks with Python frames show their native frames too (see
    /// [`ReadOptions::native_frames`]).
    pub fn native_frames(&self) -> bool {
        self.naming.native_frames
    }

    /// How the command reads ([`ReadOptions::mode`]).
    pub fn mode(&self) -> &ReadMode {
        &self.mode
    }

    pub fn info(&self) -> &TraceInfo {
        &self.info
    }

    /// The text of a string id from a `String` record seen so far (NVTX messages).
    pub fn string(&self, id: u64) -> Option<&str> {
        self.defs.strings.get(&id).map(String::as_str)
    }

    /// Every string the records defined so far (Python frames are `file\0function`).
    pub fn strings(&self) -> impl Iterator<Item = &str> + '_ {
        self.defs.strings.values().map(String::as_str)
    }

    /// The return addresses of a stack id from a `Stack` record seen so far, innermost first.
    pub fn stack(&self, id: u64) -> Option<&[u64]> {
        self.defs.stacks.get(&id).map(Vec::as_slice)
    }

    /// Whether the trace holds any call stack so far (stacks were recorded).
    pub fn has_stacks(&self) -> bool {
        !self.defs.stacks.is_empty()
    }

    /// Whether any stack read so far holds Python frames.
    pub fn has_python_frames(&self) -> bool {
        self.defs.python_frames
    }

    /// The module an address lies in (the one with the nearest load base below it): its load
    /// base and path.
    pub fn module_of(&self, ip: u64) -> Option<(u64, &str)> {
        let (base, name) = self.defs.modules.range(..=ip).next_back()?;
        Some((*base, self.defs.strings.get(name)?.as_str()))
    }

    /// The GNU build-id (lowercase hex) recorded for the module loaded at `base`; `None` when
    /// the trace holds none (a module without one, or a trace from before they were recorded)
    /// or what it holds is not hex.
    pub fn build_id_of(&self, base: u64) -> Option<&str> {
        let id = self.defs.strings.get(self.defs.build_ids.get(&base)?)?;
        (!id.is_empty()
            && id.len() <= 2 * format::BUILD_ID_MAX
            && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some(id.as_str())
    }

    /// An address as `module+0xoffset`, or the bare address when no module is known.
    pub fn describe_address(&self, ip: u64) -> String {
        match self.module_of(ip) {
            Some((base, path)) => {
                let file = path.rsplit('/').next().unwrap_or(path);
                format!("{file}+{:#x}", ip - base)
            }
            None => format!("{ip:#x}"),
        }
    }

    /// Whether call sites show only the program's own Python frames (see
    /// [`ReadOptions::program_frames`]).
    pub fn program_frames(&self) -> bool {
        self.naming.program_frames
    }
}
