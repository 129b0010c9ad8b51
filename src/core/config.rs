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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conf {
    pub pool: Pool,
    /// Round requests up within each power-of-two interval split into this many steps (0: 512 B).
    pub round_divisions: u32,
    /// Blocks larger than this are never split.
    pub max_split: u64,
    /// Requests above 1 MiB and up to 10 MiB share segments of this size (0: each gets a
    /// segment of its own, rounded up to 2 MiB).
    pub medium_segment: u64,
    /// Idle cached memory above this goes back to the device.
    pub release: u64,
    /// Cap on the device memory of this process, 0 for none.
    pub limit: u64,
    /// Largest trace file, in bytes; records past it are dropped and counted as lost.
    pub trace_max: u64,
    /// Record the native call stack of one memory call in this many (per thread); 0 for none.
    pub stack_every: u32,
    /// Record the Python frames (file, line, function) of every allocation made by a thread
    /// running Python.
    pub python_frames: bool,
    /// `stacks:auto` (the default): in a process that runs no CPython, the native stack of
    /// every allocating call instead (a C or C++ program gets its lines with nothing set).
    pub native_without_python: bool,
    /// Cached memory with nothing allocated in it for this long (ns) goes back to the device;
    /// `u64::MAX` keeps it; 0 gives a segment back at the synchronous free that empties it.
    pub trim_ns: u64,
    /// `trim:auto` (the default): 0 when the process has a caching allocator of its own (the
    /// shim decides at the first pooled allocation), else `trim_ns`.
    pub trim_auto: bool,
    /// Record every tensor of PyTorch's caching allocator through its allocator trace.
    pub tensors: bool,
}

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

impl Conf {
    /// The defaults, usable in a `static` (the shim's).
    pub const DEFAULT: Conf = Conf {
        pool: Pool::Off,
        round_divisions: 0,
        max_split: u64::MAX,
        medium_segment: 0,
        release: u64::MAX,
        limit: 0,
        trace_max: 2 * GIB,
        stack_every: 0,
        python_frames: true,
        native_without_python: true,
        trim_ns: 1_000_000_000,
        trim_auto: true,
        tensors: true,
    };
}

impl Default for Conf {
    fn default() -> Self {
        Conf::DEFAULT
    }
}

/// One key of `GPUSHIM_CONF`, as `gpushim config` documents it.
pub struct KeyDoc {
    pub key: &'static str,
    pub accepted: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

pub const KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "pool",
        accepted: "off, caching, expandable",
        default: "off",
        meaning: "caching serves cudaMalloc/cuMemAlloc and the stream-ordered calls from a pool (best fit, split, coalesce, safe reuse); expandable is caching with one segment per device and stream that grows in place through the VMM functions (cuMemCreate/cuMemMap, 2 MiB pages), which fragments less; off passes every call to CUDA and records it",
    },
    KeyDoc {
        key: "round",
        accepted: "off, pow2, pow2_N (N = 1..64, a power of two)",
        default: "off",
        meaning: "round requests up within each power-of-two interval split into N steps",
    },
    KeyDoc {
        key: "max_split",
        accepted: "a size (512MiB) or off",
        default: "off",
        meaning: "cached blocks larger than this are never split",
    },
    KeyDoc {
        key: "medium",
        accepted: "off, or a size of at least 2MiB (20MiB)",
        default: "off",
        meaning: "requests above 1 MiB and up to 10 MiB are cut from shared segments of this size (PyTorch's allocator uses 20 MiB) instead of each getting a segment of its own rounded up to 2 MiB: fewer cudaMalloc calls when sizes change every step",
    },
    KeyDoc {
        key: "release",
        accepted: "a size (2GiB) or off",
        default: "off",
        meaning: "idle cached memory above this goes back to the device",
    },
    KeyDoc {
        key: "limit",
        accepted: "a size above 0 (24GiB) or off",
        default: "off",
        meaning: "cap this process's device memory; allocations past it fail with out-of-memory",
    },
    KeyDoc {
        key: "trim",
        accepted: "auto, a duration (500ms, 2s), 0, or off",
        default: "auto",
        meaning: "cached segments with nothing allocated in them for this long go back to the device once the device has also gone this long without needing fresh memory (a background thread checks every 100 ms; while the program still reserves, what went back would be reserved again and each release waits for the whole device), so memory a program freed becomes usable by other processes; 0 gives a segment back at the cudaFree that empties it, as CUDA does; auto is 0 when the process has a caching allocator of its own (PyTorch's with caching on, RMM, CuPy, JAX's BFC: its cudaFree means give it back) and 1s otherwise; off keeps memory until empty_cache or out-of-memory",
    },
    KeyDoc {
        key: "stacks",
        accepted: "auto, python, native, on (both), N (Python frames, and native stacks of one call in N per thread), or off",
        default: "auto",
        meaning: "what call stacks to record: python, the Python frames (file, line, function) of each allocation by a thread running CPython 3.9-3.13 (no Python frames where they cannot be read safely); native, the return addresses of each memory call (symbolized offline); auto, python, and in a process that runs no CPython (a C or C++ program) the native stack of each allocating call",
    },
    KeyDoc {
        key: "tensors",
        accepted: "on, off",
        default: "on",
        meaning: "record every tensor that PyTorch's own caching allocator hands out and frees (its allocator trace, checked against the segments the shim sees; torch 2.4 to 2.11), with the Python line that made it, beside the segments it takes from CUDA; off records segments only",
    },
    KeyDoc {
        key: "trace_max",
        accepted: "a size (2GiB; 512KiB at least for a ring)",
        default: "2GiB",
        meaning: "largest trace file; the run is never cut off at it: the records form a ring, and what the oldest said (the live allocations and their lines, each device's peak and what held it, every failure, calls per API, growth per iteration, NVML's samples thinned) stays in a checkpoint the reports start from; below 512KiB, records past it are dropped and counted as lost",
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
                write!(f, "unknown key '{k}' (keys: ")?;
                for (i, d) in KEYS.iter().enumerate() {
                    write!(f, "{}{}", if i > 0 { ", " } else { "" }, d.key)?;
                }
                write!(f, ")")
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

fn accepted(key: &str) -> &'static str {
    KEYS.iter()
        .find(|d| d.key == key)
        .map(|d| d.accepted)
        .unwrap_or("")
}

fn static_key(key: &str) -> &'static str {
    KEYS.iter()
        .find(|d| d.key == key)
        .map(|d| d.key)
        .unwrap_or("")
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
        let (key, value) = match item.split_once(':') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => {
                if KEYS.iter().any(|d| d.key == item) {
                    return Err(ConfError::MissingValue(item));
                }
                return Err(ConfError::UnknownKey(item));
            }
        };
        let bad = || ConfError::BadValue {
            key: static_key(key),
            value,
            accepted: accepted(key),
        };
        match key {
            "pool" => {
                conf.pool = match value {
                    "off" => Pool::Off,
                    "caching" => Pool::Caching,
                    "expandable" => Pool::Expandable,
                    _ => return Err(bad()),
                }
            }
            "round" => conf.round_divisions = parse_round(value).ok_or_else(bad)?,
            "max_split" => conf.max_split = parse_size_or_off(value, u64::MAX).ok_or_else(bad)?,
            "release" => conf.release = parse_size_or_off(value, u64::MAX).ok_or_else(bad)?,
            "medium" => {
                conf.medium_segment = parse_size_or_off(value, 0)
                    .filter(|&n| n == 0 || n >= 2 * MIB)
                    .filter(|&n| n > 0 || value == "off" || value == "none")
                    .ok_or_else(bad)?
            }
            // `limit:0` would read as "no memory" but has always meant "no limit": refused, so
            // neither reading is silently taken.
            "limit" => {
                conf.limit = parse_size_or_off(value, 0)
                    .filter(|&n| n > 0 || value == "off" || value == "none")
                    .ok_or_else(bad)?
            }
            "trim" => {
                conf.trim_auto = value == "auto";
                if !conf.trim_auto {
                    conf.trim_ns = if value == "off" {
                        u64::MAX
                    } else {
                        parse_duration_ns(value).ok_or_else(bad)?
                    }
                }
            }
            "trace_max" => {
                conf.trace_max = parse_size(value)
                    .filter(|&n| n >= crate::trace::recorder::MIN_TRACE_BYTES)
                    .ok_or_else(bad)?
            }
            "tensors" => {
                conf.tensors = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(bad()),
                }
            }
            "stacks" => {
                (conf.stack_every, conf.python_frames) = match value {
                    "off" => (0, false),
                    "auto" | "python" => (0, true),
                    "native" => (1, false),
                    "on" => (1, true),
                    n => (
                        n.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(bad)?,
                        true,
                    ),
                };
                conf.native_without_python = value == "auto";
            }
            _ => return Err(ConfError::UnknownKey(key)),
        }
    }
    Ok(conf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("24GB"), Some(24_000_000_000));
        assert_eq!(parse_size("1TiB"), Some(1 << 40));
        assert_eq!(parse_size("GiB"), None);
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size("99999999999999999999T"), None);
    }

    #[test]
    fn medium_takes_a_segment_size_of_at_least_2mib_or_off() {
        assert_eq!(
            parse_strict("medium:20MiB").unwrap().medium_segment,
            20 * MIB
        );
        assert_eq!(parse_strict("medium:off").unwrap().medium_segment, 0);
        assert_eq!(Conf::default().medium_segment, 0);
        assert!(parse_strict("medium:1MiB").is_err());
        assert!(parse_strict("medium:0").is_err());
        assert!(parse_strict("medium:lots").is_err());
    }

    #[test]
    fn a_full_policy_parses() {
        let c = parse_strict(
            "pool:caching, round:pow2_4,max_split:512MiB,release:2GiB,limit:24GiB,trace_max:1GiB",
        )
        .unwrap();
        assert_eq!(c.pool, Pool::Caching);
        assert_eq!(c.round_divisions, 4);
        assert_eq!(c.max_split, 512 * MIB);
        assert_eq!(c.release, 2 * GIB);
        assert_eq!(c.limit, 24 * GIB);
        assert_eq!(c.trace_max, GIB);
        assert_eq!(parse_strict("stacks:on").unwrap().stack_every, 1);
        let c = parse_strict("stacks:native").unwrap();
        assert_eq!((c.stack_every, c.python_frames), (1, false));
        let c = parse_strict("stacks:python").unwrap();
        assert_eq!(
            (c.stack_every, c.python_frames, c.native_without_python),
            (0, true, false)
        );
        let c = parse_strict("stacks:auto").unwrap();
        assert_eq!(
            (c.stack_every, c.python_frames, c.native_without_python),
            (0, true, true)
        );
        assert!(parse_strict("").unwrap().native_without_python);
        let c = parse_strict("stacks:off").unwrap();
        assert_eq!((c.stack_every, c.python_frames), (0, false));
        assert!(
            parse_strict("").unwrap().python_frames,
            "Python frames are on by default"
        );
        assert_eq!(parse_strict("stacks:100").unwrap().stack_every, 100);
        assert!(parse_strict("stacks:0").is_err());
    }

    #[test]
    fn an_unknown_key_names_itself_and_every_known_key_and_falls_back_to_defaults() {
        let (c, e) = parse("limit:1GiB,pol:off");
        assert_eq!(c, Conf::default());
        let msg = e.unwrap().to_string();
        assert!(msg.contains("'pol'"), "{msg}");
        for d in KEYS {
            assert!(msg.contains(d.key), "{msg} should list {}", d.key);
        }
    }

    #[test]
    fn a_bad_value_names_the_key_the_value_and_what_is_accepted() {
        let e = parse_strict("pool:cachng").unwrap_err();
        assert_eq!(
            e.to_string(),
            "'pool:cachng' is not valid (pool takes off, caching, expandable)"
        );
        let e = parse_strict("round:pow2_3").unwrap_err();
        assert!(e.to_string().contains("pow2_N"), "{e}");
        assert_eq!(
            parse_strict("limit").unwrap_err(),
            ConfError::MissingValue("limit")
        );
    }

    #[test]
    fn limit_zero_is_refused_and_trim_takes_durations() {
        assert!(parse_strict("limit:0").is_err());
        assert!(parse_strict("limit:0GiB").is_err());
        assert_eq!(parse_strict("limit:off").unwrap().limit, 0);
        assert_eq!(parse_strict("trim:250ms").unwrap().trim_ns, 250_000_000);
        assert_eq!(parse_strict("trim:2s").unwrap().trim_ns, 2_000_000_000);
        assert_eq!(parse_strict("trim:off").unwrap().trim_ns, u64::MAX);
        assert!(parse_strict("trim:soon").is_err());
        assert!(Conf::default().trim_auto);
        assert!(!parse_strict("trim:2s").unwrap().trim_auto);
        assert!(parse_strict("trim:auto").unwrap().trim_auto);
    }

    #[test]
    fn empty_items_are_ignored() {
        assert_eq!(parse_strict(" , ,").unwrap(), Conf::default());
    }
}
