//! `GPUSHIM_CONF`: the pooling policy and the trace settings, in the syntax of
//! `PYTORCH_CUDA_ALLOC_CONF` (`key:value,key:value`).
//!
//! Parsing allocates nothing: the shim runs it inside the first intercepted CUDA call. An error
//! borrows the offending text from the input and carries static text naming what is accepted.

use core::fmt;

/// How device allocations are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// Every call goes to CUDA unchanged; the shim only records.
    Off,
    /// The caching allocator (best fit, splitting, per-stream pools).
    Caching,
    /// Segments that grow in place through the VMM functions.
    Expandable,
}

impl Pool {
    pub const fn name(self) -> &'static str {
        match self {
            Pool::Off => "off",
            Pool::Caching => "caching",
            Pool::Expandable => "expandable",
        }
    }
}

/// When cached memory with nothing allocated in it goes back to the device (`trim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trim {
    /// At the synchronous free that empties a segment when the process has a caching allocator
    /// of its own (the shim decides at the first pooled allocation), else after
    /// [`Trim::AUTO_AGE_NS`].
    Auto,
    /// After this long idle (ns); 0: at the synchronous free that empties it.
    After(u64),
    /// Kept until `empty_cache` or out-of-memory.
    Off,
}

impl Trim {
    /// The idle age `auto` takes where the process has no caching allocator of its own.
    pub const AUTO_AGE_NS: u64 = 1_000_000_000;

    /// The idle age after which the trimmer gives memory back (`u64::MAX`: never); `auto`'s
    /// age where the process has no caching allocator of its own.
    pub const fn age_ns(self) -> u64 {
        match self {
            Trim::Auto => Trim::AUTO_AGE_NS,
            Trim::After(ns) => ns,
            Trim::Off => u64::MAX,
        }
    }
}

/// What call stacks are recorded (`stacks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stacks {
    Off,
    /// Python frames, and in a process that runs no CPython the native stack of each
    /// allocating call (a C or C++ program gets its lines with nothing set).
    Auto,
    /// The Python frames (file, line, function) of each allocation by a thread running Python.
    Python,
    /// The native stack of every memory call.
    Native,
    /// Both.
    On,
    /// Python frames, and the native stack of one memory call in this many (per thread).
    Every(u32),
}

impl Stacks {
    /// One memory call in how many (per thread) records its native stack; 0 for none.
    pub const fn native_every(self) -> u32 {
        match self {
            Stacks::Native | Stacks::On => 1,
            Stacks::Every(n) => n,
            Stacks::Off | Stacks::Auto | Stacks::Python => 0,
        }
    }

    /// Whether each allocation records its Python frames.
    pub const fn python(self) -> bool {
        !matches!(self, Stacks::Off | Stacks::Native)
    }

    /// Whether a process that runs no CPython records native stacks of allocating calls instead.
    pub const fn native_without_python(self) -> bool {
        matches!(self, Stacks::Auto)
    }
}

/// `GPUSHIM_CONF`, resolved: one field per key of [`KEYS`], named as the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conf {
    pub pool: Pool,
    /// Round requests up within each power-of-two interval split into this many steps (0: 512 B).
    pub round: u32,
    /// Blocks larger than this are never split.
    pub max_split: u64,
    /// Requests above 1 MiB and up to 10 MiB share segments of this size (0: each gets a
    /// segment of its own, rounded up to 2 MiB).
    pub medium: u64,
    /// Idle cached memory above this goes back to the device.
    pub release: u64,
    /// Cap on the device memory of this process, 0 for none.
    pub limit: u64,
    pub trim: Trim,
    pub stacks: Stacks,
    /// Record every tensor of PyTorch's caching allocator through its allocator trace.
    pub tensors: bool,
    /// Record PyTorch's autograd graph when a backward pass begins (`fit --autocast`).
    pub graph: bool,
    /// Largest trace file, in bytes (a ring past it; below a ring's smallest size, records past
    /// it are dropped and counted as lost).
    pub trace_max: u64,
}

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

impl Conf {
    /// The defaults, usable in a `static` (the shim's).
    pub const DEFAULT: Conf = Conf {
        pool: Pool::Off,
        round: 0,
        max_split: u64::MAX,
        medium: 0,
        release: u64::MAX,
        limit: 0,
        trim: Trim::Auto,
        stacks: Stacks::Auto,
        tensors: true,
        graph: true,
        trace_max: 2 * GIB,
    };
}

impl Default for Conf {
    fn default() -> Self {
        Conf::DEFAULT
    }
}

/// One key of `GPUSHIM_CONF`: its name (the [`Conf`] field's), what it accepts, its default
/// (a value it accepts, giving [`Conf::DEFAULT`]'s field; a test holds them equal), what it
/// means (as `gpushim config` shows it), and how a value applies (`None`: not one it accepts).
pub struct KeyDoc {
    pub key: &'static str,
    pub accepted: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
    pub apply: fn(&mut Conf, &str) -> Option<()>,
}

fn pool(c: &mut Conf, v: &str) -> Option<()> {
    c.pool = match v {
        "off" => Pool::Off,
        "caching" => Pool::Caching,
        "expandable" => Pool::Expandable,
        _ => return None,
    };
    Some(())
}

fn round(c: &mut Conf, v: &str) -> Option<()> {
    c.round = parse_round(v)?;
    Some(())
}

fn max_split(c: &mut Conf, v: &str) -> Option<()> {
    c.max_split = parse_size_or_off(v, u64::MAX)?;
    Some(())
}

fn medium(c: &mut Conf, v: &str) -> Option<()> {
    let off = v == "off" || v == "none";
    c.medium = parse_size_or_off(v, 0).filter(|&n| if off { n == 0 } else { n >= 2 * MIB })?;
    Some(())
}

fn release(c: &mut Conf, v: &str) -> Option<()> {
    c.release = parse_size_or_off(v, u64::MAX)?;
    Some(())
}

/// `limit:0` would read as "no memory" but has always meant "no limit": refused, so neither
/// reading is silently taken.
fn limit(c: &mut Conf, v: &str) -> Option<()> {
    let off = v == "off" || v == "none";
    if unit_forgotten(v) {
        return None;
    }
    c.limit = parse_size_or_off(v, 0).filter(|&n| n > 0 || off)?;
    Some(())
}

fn trim(c: &mut Conf, v: &str) -> Option<()> {
    c.trim = match v {
        "auto" => Trim::Auto,
        "off" => Trim::Off,
        _ => Trim::After(parse_duration_ns(v)?),
    };
    Some(())
}

fn stacks(c: &mut Conf, v: &str) -> Option<()> {
    c.stacks = match v {
        "off" => Stacks::Off,
        "auto" => Stacks::Auto,
        "python" => Stacks::Python,
        "native" => Stacks::Native,
        "on" => Stacks::On,
        n => Stacks::Every(n.parse::<u32>().ok().filter(|&n| n > 0)?),
    };
    Some(())
}

fn tensors(c: &mut Conf, v: &str) -> Option<()> {
    c.tensors = match v {
        "on" => true,
        "off" => false,
        _ => return None,
    };
    Some(())
}

fn graph(c: &mut Conf, v: &str) -> Option<()> {
    c.graph = match v {
        "on" => true,
        "off" => false,
        _ => return None,
    };
    Some(())
}

/// The smallest `trace_max` taken: a trace's file grows in pieces of this size, so a smaller
/// bound would not be the file's size.
pub const MIN_TRACE_MAX: u64 = crate::trace::recorder::CHUNK_BYTES;

fn trace_max(c: &mut Conf, v: &str) -> Option<()> {
    c.trace_max = parse_size(v).filter(|&n| n >= MIN_TRACE_MAX)?;
    Some(())
}

pub const KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "pool",
        apply: pool,
        accepted: "off, caching, expandable",
        default: "off",
        meaning: "caching serves cudaMalloc/cuMemAlloc and the stream-ordered calls from a pool (best fit, split, coalesce, safe reuse); expandable is caching with one segment per device and stream that grows in place through the VMM functions (cuMemCreate/cuMemMap, 2 MiB pages), which fragments less; off passes every call to CUDA and records it",
    },
    KeyDoc {
        key: "round",
        apply: round,
        accepted: "off, pow2, pow2_N (N = 1..64, a power of two)",
        default: "off",
        meaning: "round requests up within each power-of-two interval split into N steps",
    },
    KeyDoc {
        key: "max_split",
        apply: max_split,
        accepted: "a size (512MiB) or off",
        default: "off",
        meaning: "cached blocks larger than this are never split",
    },
    KeyDoc {
        key: "medium",
        apply: medium,
        accepted: "off, or a size of at least 2MiB (20MiB)",
        default: "off",
        meaning: "requests above 1 MiB and up to 10 MiB are cut from shared segments of this size (PyTorch's allocator uses 20 MiB) instead of each getting a segment of its own rounded up to 2 MiB: fewer cudaMalloc calls when sizes change every step",
    },
    KeyDoc {
        key: "release",
        apply: release,
        accepted: "a size (2GiB) or off",
        default: "off",
        meaning: "idle cached memory above this goes back to the device",
    },
    KeyDoc {
        key: "limit",
        apply: limit,
        accepted: "a size with its unit (24GiB; a bare number of a MiB or more is bytes) or off",
        default: "off",
        meaning: "cap this process's device memory; allocations past it fail with out-of-memory",
    },
    KeyDoc {
        key: "trim",
        apply: trim,
        accepted: "auto, a duration (500ms, 2s), 0, or off",
        default: "auto",
        meaning: "cached segments with nothing allocated in them for this long go back to the device once the device has also gone this long without needing fresh memory (a background thread checks every 100 ms; while the program still reserves, what went back would be reserved again and each release waits for the whole device), so memory a program freed becomes usable by other processes; 0 gives a segment back at the cudaFree that empties it, as CUDA does; auto is 0 when the process has a caching allocator of its own (PyTorch's with caching on, RMM, CuPy, JAX's BFC: its cudaFree means give it back) and 1s otherwise; off keeps memory until empty_cache or out-of-memory",
    },
    KeyDoc {
        key: "stacks",
        apply: stacks,
        accepted: "auto, python, native, on (both), N (Python frames, and native stacks of one call in N per thread), or off",
        default: "auto",
        meaning: "what call stacks to record: python, the Python frames (file, line, function) of each allocation by a thread running CPython 3.9-3.13 (no Python frames where they cannot be read safely); native, the return addresses of each memory call (symbolized offline); auto, python, and in a process that runs no CPython (a C or C++ program) the native stack of each allocating call",
    },
    KeyDoc {
        key: "tensors",
        apply: tensors,
        accepted: "on, off",
        default: "on",
        meaning: "record every tensor that PyTorch's own caching allocator hands out and frees (its allocator trace, checked against the segments the shim sees; torch 2.4 to 2.11), with the Python line that made it, beside the segments it takes from CUDA; off records segments only",
    },
    KeyDoc {
        key: "graph",
        apply: graph,
        accepted: "on, off",
        default: "on",
        meaning: "record PyTorch's autograd graph (each node's class and where its inputs came from) when a backward pass begins: the first three of a trace, and in a ring again each time half of it was written; a walk costs about 2 ms for a model of 600 nodes; `fit --autocast` needs it; off records none",
    },
    KeyDoc {
        key: "trace_max",
        apply: trace_max,
        accepted: "a size, 4MiB at least (the file grows in 4 MiB pieces)",
        default: "2GiB",
        meaning: "largest trace file; the run is never cut off at it: the records form a ring, and what the oldest said (the live allocations and their lines, each device's peak and what held it, every failure, calls per API, growth per iteration, NVML's samples thinned) stays in a checkpoint the reports start from",
    },
];

/// Why `GPUSHIM_CONF` was rejected. Borrowed from the input, so building it allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfError<'a> {
    UnknownKey(&'a str),
    MissingValue(&'a str),
    BadValue {
        key: &'static str,
        value: &'a str,
        accepted: &'static str,
    },
}

impl fmt::Display for ConfError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfError::UnknownKey(k) => {
                // `pool=caching`: the separator of PYTORCH_CUDA_ALLOC_CONF is ':'.
                if let Some((name, value)) = k.split_once('=')
                    && KEYS.iter().any(|d| d.key == name.trim())
                {
                    return write!(
                        f,
                        "'{k}': a key and its value are joined by ':', as in '{}:{}'",
                        name.trim(),
                        value.trim()
                    );
                }
                write!(f, "unknown key '{k}'")?;
                if let Some(near) = nearest_key(k) {
                    write!(f, " (did you mean '{near}'?)")?;
                }
                write!(f, "; the keys: ")?;
                for (i, d) in KEYS.iter().enumerate() {
                    write!(f, "{}{}", if i > 0 { ", " } else { "" }, d.key)?;
                }
                Ok(())
            }
            ConfError::MissingValue(k) => write!(f, "'{k}' needs a value, written '{k}:VALUE'"),
            ConfError::BadValue {
                key,
                value,
                accepted,
            } => write!(f, "'{key}:{value}' is not valid ({key} takes {accepted})"),
        }
    }
}

/// The key `word` is most likely a misspelling of: at most two one-character edits away (one
/// for keys of four letters or fewer). Allocates nothing (the shim words its errors in place).
fn nearest_key(word: &str) -> Option<&'static str> {
    KEYS.iter()
        .filter_map(|d| Some((edit_distance(word.trim(), d.key)?, d.key)))
        .filter(|&(n, k)| n <= if k.len() <= 4 { 1 } else { 2 })
        .min_by_key(|&(n, _)| n)
        .map(|(_, k)| k)
}

/// The longest words [`edit_distance`] compares.
pub const EDIT_MAX: usize = 128;

/// The number of one-byte edits between `a` and `b` (Levenshtein), without allocating; `None`
/// when either is empty or longer than [`EDIT_MAX`] bytes.
pub fn edit_distance(a: &str, b: &str) -> Option<usize> {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.is_empty() || b.is_empty() || a.len() > EDIT_MAX || b.len() > EDIT_MAX {
        return None;
    }
    let mut row = [0usize; EDIT_MAX + 1];
    for (j, r) in row.iter_mut().enumerate().take(b.len() + 1) {
        *r = j;
    }
    for (i, &x) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diag + usize::from(x != y)).min(up + 1).min(row[j] + 1);
            diag = up;
        }
    }
    Some(row[b.len()])
}

/// Whether `s` is a bare number under a MiB: a size of memory to hold or to limit to that
/// small is never meant (`24` meant as 24 GiB, read as 24 bytes), so the unit is asked for; a
/// larger bare number is bytes.
pub fn unit_forgotten(s: &str) -> bool {
    let s = s.trim();
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<u64>().is_ok_and(|n| n < 1 << 20)
}

/// Parses a size with an optional unit: `512`, `64KiB`, `512MiB`, `2GiB`, `1TiB`, `24GB`.
/// Binary units (`K`, `KiB`, `M`, `MiB`, ...) are powers of 1024; `KB`, `MB`, `GB`, `TB` are
/// powers of 1000.
pub fn parse_size(s: &str) -> Option<u64> {
    parse_with_unit(
        s,
        &[
            ("", 1),
            ("B", 1),
            ("b", 1),
            ("K", 1 << 10),
            ("k", 1 << 10),
            ("KiB", 1 << 10),
            ("kib", 1 << 10),
            ("KIB", 1 << 10),
            ("M", 1 << 20),
            ("m", 1 << 20),
            ("MiB", 1 << 20),
            ("mib", 1 << 20),
            ("MIB", 1 << 20),
            ("G", 1 << 30),
            ("g", 1 << 30),
            ("GiB", 1 << 30),
            ("gib", 1 << 30),
            ("GIB", 1 << 30),
            ("T", 1 << 40),
            ("t", 1 << 40),
            ("TiB", 1 << 40),
            ("tib", 1 << 40),
            ("TIB", 1 << 40),
            ("KB", 1_000),
            ("kB", 1_000),
            ("kb", 1_000),
            ("MB", 1_000_000),
            ("mb", 1_000_000),
            ("GB", 1_000_000_000),
            ("gb", 1_000_000_000),
            ("TB", 1_000_000_000_000),
            ("tb", 1_000_000_000_000),
        ],
    )
}

/// A whole number followed by one of `units` (name, multiplier), checked against overflow.
fn parse_with_unit(s: &str, units: &[(&str, u64)]) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let unit = unit.trim();
    let &(_, mult) = units.iter().find(|(u, _)| *u == unit)?;
    n.checked_mul(mult)
}

fn parse_size_or_off(s: &str, off: u64) -> Option<u64> {
    if s == "off" || s == "none" {
        Some(off)
    } else {
        parse_size(s)
    }
}

/// Parses a duration: `250ms`, `2s`, `1m`, `500us`; a bare number is seconds.
pub fn parse_duration_ns(s: &str) -> Option<u64> {
    parse_with_unit(
        s,
        &[
            ("", 1_000_000_000),
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
            ("us", 1_000),
            ("µs", 1_000),
            ("ns", 1),
            ("m", 60_000_000_000),
            ("min", 60_000_000_000),
        ],
    )
}

fn parse_round(s: &str) -> Option<u32> {
    match s {
        "off" => Some(0),
        "pow2" => Some(1),
        _ => {
            let n: u32 = s.strip_prefix("pow2_")?.parse().ok()?;
            (n.is_power_of_two() && n <= 64).then_some(n)
        }
    }
}

/// Parses `GPUSHIM_CONF`. On any error the whole configuration falls back to the defaults, and
/// the first error is returned to be reported: a half-applied policy would be harder to explain
/// than none.
pub fn parse(text: &str) -> (Conf, Option<ConfError<'_>>) {
    match parse_strict(text) {
        Ok(c) => (c, None),
        Err(e) => (Conf::default(), Some(e)),
    }
}

/// What a configuration asks that it will not get, in words (the shim says it once at start):
/// `limit` is the pool's, so with `pool:off` nothing enforces it.
pub fn unenforced(c: &Conf) -> Option<&'static str> {
    (c.limit > 0 && c.pool == Pool::Off).then_some(
        "limit is enforced by the shim's pool, and pool is off: nothing enforces it (add \
         pool:caching or pool:expandable, or use gpushim run --per-tensor with PyTorch)",
    )
}

pub fn parse_strict(text: &str) -> Result<Conf, ConfError<'_>> {
    let mut conf = Conf::default();
    for item in text.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((key, value)) = item.split_once(':') else {
            return Err(if KEYS.iter().any(|d| d.key == item) {
                ConfError::MissingValue(item)
            } else {
                ConfError::UnknownKey(item)
            });
        };
        let (key, value) = (key.trim(), value.trim());
        let row = KEYS
            .iter()
            .find(|d| d.key == key)
            .ok_or(ConfError::UnknownKey(key))?;
        (row.apply)(&mut conf, value).ok_or(ConfError::BadValue {
            key: row.key,
            value,
            accepted: row.accepted,
        })?;
    }
    Ok(conf)
}

#[cfg(test)]
mod tests;
