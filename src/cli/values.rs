//! The values the command line takes beyond plain numbers and paths: sizes, fractions, lists
//! of batches, a device by its name.

pub fn size_arg(s: &str) -> Result<u64, String> {
    // `--device-memory 24` means 24 GB, not bytes: the unit is asked for.
    if gpushim::config::unit_forgotten(s) {
        return Err(format!(
            "'{s}' has no unit: write one, as in {s}GiB, {s}GB or {s}MiB (a bare number would be \
             bytes)"
        ));
    }
    gpushim::config::parse_size(s)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            format!("'{s}' is not a size: write a number and a unit, e.g. 40GiB or 512MiB")
        })
}

/// Batches asked of `fit`.
#[derive(Clone, Debug)]
pub struct Batches(pub Vec<u64>);

/// `8,16,32`, `8:64` (doubling) or `8:64:8` (a step).
pub fn batches_arg(s: &str) -> Result<Batches, String> {
    let bad =
        || format!("'{s}' is not a list of batches: write 8,16,32 or 8:64 (doubling) or 8:64:8");
    // The two mistakes people make, each said for what it is.
    let words: Vec<&str> = s.split([',', ':']).map(str::trim).collect();
    if words.iter().any(|w| w.parse::<u64>() == Ok(0)) {
        return Err(format!("'{s}': a batch is at least 1"));
    }
    if let [a, b, ..] = words[..]
        && s.contains(':')
        && let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>())
        && a > b
    {
        return Err(format!(
            "'{s}' runs down from {a} to {b}: a range goes from the smaller batch to the larger, \
             as in {b}:{a}"
        ));
    }
    let num = |t: &str| t.trim().parse::<u64>().ok().filter(|&n| n > 0);
    let out: Vec<u64> = if let Some((a, rest)) = s.split_once(':') {
        let (b, step) = match rest.split_once(':') {
            Some((b, st)) => (num(b).ok_or_else(bad)?, Some(num(st).ok_or_else(bad)?)),
            None => (num(rest).ok_or_else(bad)?, None),
        };
        let mut v = Vec::new();
        let mut x = num(a).ok_or_else(bad)?;
        while x <= b && v.len() < 1000 {
            v.push(x);
            x = match step {
                Some(st) => x.saturating_add(st),
                None => x.saturating_mul(2),
            };
        }
        v
    } else {
        s.split(',')
            .map(|t| num(t).ok_or_else(bad))
            .collect::<Result<_, _>>()?
    };
    if out.is_empty() {
        return Err(bad());
    }
    Ok(Batches(out))
}

/// A size, or a GPU's name: its memory as PyTorch reports the device's total capacity.
pub fn device_arg(s: &str) -> Result<u64, String> {
    const GIB: f64 = (1u64 << 30) as f64;
    let known: &[(&str, f64)] = &[
        ("h200", 139.8),
        ("h100", 79.19),
        ("a100-80", 79.15),
        ("a100-40", 39.39),
        ("l40s", 44.39),
        ("a10", 22.07),
        ("l4", 22.03),
        ("rtx4090", 23.65),
        ("rtx3090", 23.69),
        ("v100-32", 31.74),
        ("v100-16", 15.77),
        ("t4", 14.75),
    ];
    let name = s.to_ascii_lowercase().replace([' ', '_'], "-");
    if let Some((_, gib)) = known.iter().find(|(n, _)| *n == name) {
        return Ok((gib * GIB) as u64);
    }
    size_arg(s).map_err(|why| {
        if why.contains("has no unit") {
            return why;
        }
        format!(
            "'{s}' is neither a size (24GiB, 40GB) nor a GPU known here ({})",
            known.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )
    })
}

pub fn fraction_arg(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|f| *f > 0.0 && *f <= 1.0)
        .ok_or_else(|| format!("'{s}' is not a fraction above 0 and at most 1"))
}

/// The export formats; `memory-viz-html` is still understood, to say why it is no longer
/// written, and not shown.
pub fn export_formats() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    clap::builder::PossibleValuesParser::new([
        PossibleValue::new("perfetto"),
        PossibleValue::new("memory-viz"),
        PossibleValue::new("memory-viz-html").hide(true),
        PossibleValue::new("rmm"),
    ])
}

/// How `flamegraph` colours its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FlameColor {
    Kind,
    Name,
}

/// How `fit --shard` shards: FSDP2's `reshard_after_forward` True or False, or DeepSpeed's
/// ZeRO-1 or ZeRO-2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ShardWay {
    Full,
    GradOp,
    Zero1,
    Zero2,
    Zero3,
}

/// The 16-bit type of `fit --autocast`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Autocast {
    Bf16,
    Fp16,
}

impl Autocast {
    /// As the flag takes it.
    pub fn name(self) -> &'static str {
        match self {
            Autocast::Bf16 => "bf16",
            Autocast::Fp16 => "fp16",
        }
    }
}

/// What `plot` stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlotBy {
    Kind,
    Line,
    Total,
}
