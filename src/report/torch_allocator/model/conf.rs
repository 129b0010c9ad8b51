//! `PYTORCH_CUDA_ALLOC_CONF` (and its newer name `PYTORCH_ALLOC_CONF`), parsed as PyTorch
//! parses it: `key:value` pairs separated by commas, `roundup_power2_divisions` either one
//! number or a list `[256:1,512:2,>:4]` of size boundaries in MiB. docs/torch-allocator.md
//! says what each key does in the allocator.

use std::fmt;

const MIB: u64 = 1 << 20;
/// `roundup_power2_divisions` has one value per power-of-two interval of sizes from 1 MiB to
/// 64 GiB: interval `i` holds sizes of `2^i` MiB up to `2^(i+1)` MiB (the first also every size
/// below 1 MiB, the last every size above).
pub const INTERVALS: usize = 16;

/// The settings of PyTorch's caching allocator that change where memory goes.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchConf {
    /// Blocks this large or larger are never split; `u64::MAX`: no limit (the default).
    pub max_split_size: u64,
    /// A request of `max_split_size` or more takes a cached block at most this much larger
    /// (default 20 MiB).
    pub max_non_split_rounding: u64,
    /// Per interval (see [`INTERVALS`]): round a request up to one of this many equal steps
    /// between two powers of two; 0 or 1: round to 512 bytes only.
    pub roundup_divisions: [u64; INTERVALS],
    /// Fraction of the allowed memory above which cached blocks are freed before a new segment
    /// is taken (0: off). PyTorch applies it only when the program set a memory fraction.
    pub gc_threshold: f64,
    /// Segments that grow by mapping pages instead of one `cudaMalloc` each.
    pub expandable_segments: bool,
    /// Keys PyTorch accepts that do not change where device memory goes (pinned host memory,
    /// locking), kept so the text prints back.
    pub other: Vec<(String, String)>,
}

impl Default for TorchConf {
    fn default() -> Self {
        TorchConf {
            max_split_size: u64::MAX,
            max_non_split_rounding: 20 * MIB,
            roundup_divisions: [0; INTERVALS],
            gc_threshold: 0.0,
            expandable_segments: false,
            other: Vec::new(),
        }
    }
}

/// Why a setting text was refused, in words that name the key and what it accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfError(pub String);

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfError {}

/// Keys PyTorch accepts that leave device memory as it is: the model keeps and ignores them.
const NEUTRAL_KEYS: &[&str] = &[
    "pinned_use_cuda_host_register",
    "pinned_use_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "release_lock_on_cudamalloc",
    "release_lock_on_device_malloc",
    "expandable_segments_handle_type",
    "graph_capture_record_stream_reuse",
];

fn err(msg: String) -> ConfError {
    ConfError(msg)
}

/// The text split as PyTorch splits it: `,`, `:`, `[` and `]` are tokens of their own.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if matches!(c, ',' | ':' | '[' | ']') {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            out.push(c.to_string());
        } else if !c.is_whitespace() {
            word.push(c);
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

struct Tokens {
    t: Vec<String>,
    i: usize,
}

impl Tokens {
    fn next(&mut self, what: &str) -> Result<String, ConfError> {
        let t = self
            .t
            .get(self.i)
            .cloned()
            .ok_or_else(|| err(format!("the text ends where {what} was expected")))?;
        self.i += 1;
        Ok(t)
    }
    fn expect(&mut self, tok: &str, key: &str) -> Result<(), ConfError> {
        let t = self.next(&format!("'{tok}' after {key}"))?;
        if t == tok {
            Ok(())
        } else {
            Err(err(format!("{key}: expected '{tok}', found '{t}'")))
        }
    }
    fn number(&mut self, key: &str) -> Result<u64, ConfError> {
        let t = self.next(&format!("a number for {key}"))?;
        t.parse::<u64>()
            .map_err(|_| err(format!("{key}: '{t}' is not a whole number")))
    }
    fn peek(&self) -> Option<&str> {
        self.t.get(self.i).map(String::as_str)
    }
}

impl TorchConf {
    /// Parses the text as PyTorch does; unlike PyTorch, a key it does not know is an error
    /// (a typo would otherwise replay the defaults without a word).
    pub fn parse(text: &str) -> Result<TorchConf, ConfError> {
        let mut c = TorchConf::default();
        let mut t = Tokens {
            t: tokens(text),
            i: 0,
        };
        while let Some(key) = t.peek().map(str::to_string) {
            t.i += 1;
            match key.as_str() {
                "max_split_size_mb" => {
                    t.expect(":", &key)?;
                    let mb = t.number(&key)?;
                    if mb < 20 {
                        return Err(err(format!(
                            "max_split_size_mb:{mb} is too small: PyTorch refuses values below 20"
                        )));
                    }
                    c.max_split_size = mb.saturating_mul(MIB);
                }
                "max_non_split_rounding_mb" => {
                    t.expect(":", &key)?;
                    let mb = t.number(&key)?;
                    if mb < 20 {
                        return Err(err(format!(
                            "max_non_split_rounding_mb:{mb} is too small: PyTorch refuses values below 20"
                        )));
                    }
                    c.max_non_split_rounding = mb.saturating_mul(MIB);
                }
                "garbage_collection_threshold" => {
                    t.expect(":", &key)?;
                    let v = t.next("a fraction")?;
                    let f: f64 = v.parse().map_err(|_| {
                        err(format!(
                            "garbage_collection_threshold: '{v}' is not a number"
                        ))
                    })?;
                    if !(f > 0.0 && f < 1.0) {
                        return Err(err(format!(
                            "garbage_collection_threshold:{v}: PyTorch accepts a value between 0 and 1, both excluded"
                        )));
                    }
                    c.gc_threshold = f;
                }
                "roundup_power2_divisions" => {
                    t.expect(":", &key)?;
                    c.roundup_divisions = parse_divisions(&mut t)?;
                }
                "expandable_segments" => {
                    t.expect(":", &key)?;
                    let v = t.next("True or False")?;
                    c.expandable_segments = match v.as_str() {
                        "True" | "true" => true,
                        "False" | "false" => false,
                        _ => {
                            return Err(err(format!(
                                "expandable_segments:{v}: PyTorch accepts True or False"
                            )));
                        }
                    };
                }
                "backend" => {
                    t.expect(":", &key)?;
                    let v = t.next("a backend")?;
                    if v != "native" {
                        return Err(err(format!(
                            "backend:{v}: the replay models PyTorch's own caching allocator (backend:native); \
                             cudaMallocAsync hands memory to CUDA's pool, whose rules are CUDA's"
                        )));
                    }
                }
                k if NEUTRAL_KEYS.contains(&k) => {
                    t.expect(":", &key)?;
                    let v = t.next("a value")?;
                    c.other.push((key.clone(), v));
                }
                k => {
                    return Err(err(format!(
                        "unknown key '{k}': the replay knows max_split_size_mb, \
                         max_non_split_rounding_mb, roundup_power2_divisions, \
                         garbage_collection_threshold, expandable_segments and backend:native"
                    )));
                }
            }
            match t.peek() {
                None => {}
                Some(",") => t.i += 1,
                Some(x) => return Err(err(format!("expected ',' between settings, found '{x}'"))),
            }
        }
        Ok(c)
    }

    /// How many steps round a request of `size` bytes (see [`INTERVALS`]).
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as usize;
        let index = log.saturating_sub(20).min(INTERVALS - 1);
        self.roundup_divisions[index]
    }
}

/// `roundup_power2_divisions`: one power of two for every size, or a list of `MiB:steps` with
/// `>:steps` for every interval after the last one named.
fn parse_divisions(t: &mut Tokens) -> Result<[u64; INTERVALS], ConfError> {
    const KEY: &str = "roundup_power2_divisions";
    let mut d = [0u64; INTERVALS];
    if t.peek() != Some("[") {
        let v = t.number(KEY)?;
        if !v.is_power_of_two() {
            return Err(err(format!("{KEY}:{v}: the steps must be a power of two")));
        }
        return Ok([v; INTERVALS]);
    }
    t.i += 1;
    let (mut first, mut last) = (true, 0usize);
    loop {
        let bound = t.next("a size in MiB, '>' or ']'")?;
        if bound == "]" {
            break;
        }
        t.expect(":", KEY)?;
        let v = t.number(KEY)?;
        if v != 0 && !v.is_power_of_two() {
            return Err(err(format!(
                "{KEY}: {bound}:{v}: the steps must be 0 or a power of two"
            )));
        }
        if bound == ">" {
            for x in d.iter_mut().skip(last + 1) {
                *x = v;
            }
        } else {
            let mb: u64 = bound
                .parse()
                .map_err(|_| err(format!("{KEY}: '{bound}' is not a size in MiB or '>'")))?;
            if !mb.is_power_of_two() {
                return Err(err(format!(
                    "{KEY}: the size {mb} MiB is not a power of two"
                )));
            }
            let index = (63 - mb.leading_zeros() as usize).min(INTERVALS - 1);
            if first {
                for x in d.iter_mut().take(index) {
                    *x = v;
                }
                first = false;
            }
            d[index] = v;
            last = index;
        }
        match t.peek() {
            Some("]") => {}
            Some(",") => t.i += 1,
            Some(x) => return Err(err(format!("{KEY}: expected ',' or ']', found '{x}'"))),
            None => return Err(err(format!("{KEY}: the list has no closing ']'"))),
        }
    }
    Ok(d)
}

impl fmt::Display for TorchConf {
    /// The text to give `PYTORCH_CUDA_ALLOC_CONF` for these settings (empty for the defaults).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = TorchConf::default();
        let mut parts: Vec<String> = Vec::new();
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if self.max_split_size != d.max_split_size {
            parts.push(format!("max_split_size_mb:{}", self.max_split_size / MIB));
        }
        if self.max_non_split_rounding != d.max_non_split_rounding {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        if self.roundup_divisions != d.roundup_divisions {
            let r = &self.roundup_divisions;
            if r.iter().all(|&x| x == r[0]) {
                parts.push(format!("roundup_power2_divisions:{}", r[0]));
            } else {
                let list: Vec<String> = r
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("{}:{v}", 1u64 << i))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
            }
        }
        if self.gc_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.gc_threshold
            ));
        }
        for (k, v) in &self.other {
            parts.push(format!("{k}:{v}"));
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_pytorchs() {
        let c = TorchConf::parse("").unwrap();
        assert_eq!(c, TorchConf::default());
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.to_string(), "");
    }

    #[test]
    fn each_key_parses_and_prints_back() {
        let text = "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.6";
        let c = TorchConf::parse(text).unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, 128 * MIB);
        assert_eq!(c.roundup_divisions, [4; INTERVALS]);
        assert_eq!(c.gc_threshold, 0.6);
        assert_eq!(c.to_string(), text);
        assert_eq!(TorchConf::parse(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn a_list_of_divisions_fills_the_intervals_as_pytorch_does() {
        let c = TorchConf::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        // Below the first boundary every interval takes the first value.
        assert_eq!(c.roundup_divisions[0], 1);
        assert_eq!(c.roundup_divisions[7], 1);
        assert_eq!(c.roundup_divisions[8], 1);
        assert_eq!(c.roundup_divisions[9], 2);
        assert_eq!(c.roundup_divisions[10], 4);
        assert_eq!(c.roundup_divisions[11], 8);
        assert_eq!(c.roundup_divisions[15], 8);
        assert_eq!(c.divisions_for(100), 1);
        assert_eq!(c.divisions_for(600 * MIB), 2);
        assert_eq!(c.divisions_for(5000 * MIB), 8);
        assert_eq!(TorchConf::parse(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn bad_values_are_refused_with_the_reason() {
        for (text, words) in [
            ("max_split_size_mb:10", "below 20"),
            ("roundup_power2_divisions:3", "power of two"),
            ("garbage_collection_threshold:1.5", "between 0 and 1"),
            ("expandable_segments:yes", "True or False"),
            ("max_split_size:100", "unknown key"),
            ("backend:cudaMallocAsync", "CUDA's pool"),
            ("roundup_power2_divisions:[256:1", "closing"),
        ] {
            let e = TorchConf::parse(text).unwrap_err().to_string();
            assert!(e.contains(words), "{text}: {e}");
        }
        assert!(TorchConf::parse("pinned_use_cuda_host_register:True,backend:native").is_ok());
    }
}
