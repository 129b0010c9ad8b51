//! How a command reads traces: its options (the records kept, how frames are named, progress)
//! and its mode (mapped or not, decoding apart or not, the passes' work shared), one value
//! passed down to every report; nothing process-wide.

/// How a report reads traces: the command's reading options, passed as a value to every
/// report (nothing process-wide).
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// The records to keep (the command's `--device`, `--from`, ... options); an empty filter
    /// keeps every record.
    pub filter: crate::trace::filter::Filter,
    /// Whether frames are named from the binaries (`--no-symbols` turns it off: frames read
    /// `module+0xoffset`).
    pub symbols: bool,
    /// Called as `progress(records read, records in the file)` every million records.
    pub progress: Option<fn(u64, u64)>,
    /// Called with a line saying what long work follows the read (`fit`'s replays).
    pub working: Option<fn(&str)>,
    /// Whether stacks with Python frames show their native frames too (after the Python
    /// ones); without Python frames a stack always shows its native frames.
    pub native_frames: bool,
    /// Whether call sites show only the program's own Python frames (not those of installed
    /// packages and the standard library), when a stack has any.
    pub program_frames: bool,
    /// Of a ring's two checkpoints, the one with the most of the ring after it (the older,
    /// while the ring still holds every record since): for a replay that needs the records
    /// themselves, not their summary. Off (the reports): the newest (the one written at exit
    /// covers the whole run), but for a failure only it holds, which is read in detail from
    /// the older (see `checkpoint::read::read_checkpoint`).
    pub longest_ring: bool,
    /// How the file is read and the passes' work shared: each way gives the same records and
    /// the same answers (the tests compare them).
    pub mode: ReadMode,
}

/// How a command reads, a value passed down with its options (the command takes it from its
/// `GPUSHIM_READ_*` settings; nothing below reads the environment). Every combination reads
/// the same records into the same answers; the tests and benchmarks compare them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadMode {
    /// Windows of the file mapped, where it can be (else read into a buffer).
    pub map: bool,
    /// Decoding on a thread of its own where there is a second core (else in turn).
    pub decode_apart: bool,
    /// The moments, the leaks' samples and the picture's bands taken in the first pass where
    /// they can be (else in a second pass).
    pub early: bool,
    /// At most this many groups of trackers in the first pass, whatever the cores (0: one);
    /// `None`: as the cores allow.
    pub groups: Option<usize>,
    /// The trackers' short roads for the records of nearly every step (a call that succeeded,
    /// its caller, its stack): what they do with such a record without asking what they ask
    /// of the rest (else every record by the long road).
    pub short_roads: bool,
    /// Replays of PyTorch's allocator apply every event, none passed over as a repeat of the
    /// loop (else the repeats of a training loop that go as one just replayed went are passed
    /// over, the same answer sooner).
    pub replay_every_event: bool,
    /// The most memory the requests gathered for a replay may take, as the command was given
    /// it (`GPUSHIM_REPLAY_MEMORY`, a size; a text that is not one is said back); `None`: as
    /// much as the machine's memory allows.
    pub replay_memory: Option<String>,
    /// What reading has cost so far, shared by every reader and pass made with this mode (not
    /// a way of reading: any two compare equal).
    pub counts: super::Counts,
}

impl Default for ReadMode {
    /// Every way that saves time, taken.
    fn default() -> ReadMode {
        ReadMode {
            map: true,
            decode_apart: true,
            early: true,
            groups: None,
            short_roads: true,
            replay_every_event: false,
            replay_memory: None,
            counts: super::Counts::default(),
        }
    }
}

impl Default for ReadOptions {
    /// Every record, frames named, no progress shown.
    fn default() -> ReadOptions {
        ReadOptions {
            filter: crate::trace::filter::Filter::default(),
            symbols: true,
            progress: None,
            working: None,
            native_frames: false,
            program_frames: false,
            longest_ring: false,
            mode: ReadMode::default(),
        }
    }
}
