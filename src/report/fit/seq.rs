//! The sequence length as a second axis. One run cannot tell a tensor that grows with the
//! sequence from one that grows with the batch (both are a factor of its bytes), nor one that
//! grows with the square of the length (attention's scores, where the attention materializes
//! them) from one that grows with the length: a second run of the program at another length
//! can. Its i-th request of a line is this run's i-th of the same line; the ratio of the two
//! sizes against the ratio of the lengths says how each follows the length: not at all, in
//! proportion, with its square, or on the line through both sizes (a part fixed, a part that
//! grows). Each request is resized to the length asked, then to the batch by its kind, and
//! the run replayed as for the batch alone.

use super::{Labels, Row, Scale, largest, on_line, resize};
use crate::report::torch_allocator::{self, Bounds, Input, model::TorchConf};
use serde::Serialize;

/// A second run of the program at another sequence length.
#[derive(Clone, Debug)]
pub struct SeqAsk {
    /// The run's own sequence length.
    pub at: u64,
    /// The second run's trace and length.
    pub trace: std::path::PathBuf,
    pub other: u64,
    /// The lengths to show.
    pub lengths: Vec<u64>,
}

/// How one request's size follows the sequence length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SeqScale {
    /// No counterpart found in the second run: as its kind says (a kind that grows with the
    /// batch grows in proportion to the length, as a model's activations do; the rest keeps).
    ByKind {
        grows: bool,
    },
    Same,
    Linear,
    Square,
    /// On the line through `here` bytes at the run's length and `there` at the other's.
    Line {
        here: u64,
        there: u64,
    },
}

/// What the second run said of the run's requests, and the peaks at each length asked.
#[derive(Clone, Debug, Serialize)]
pub struct SeqAxis {
    pub at: u64,
    pub trace: String,
    pub other: u64,
    /// Requests (and their bytes at the run's length) by how they follow the length.
    pub same: (u64, u64),
    pub linear: (u64, u64),
    pub square: (u64, u64),
    pub line: (u64, u64),
    /// With no counterpart found in the second run: as their kinds say.
    pub by_kind: (u64, u64),
    pub lengths: Vec<SeqRow>,
}

/// One length: under each setting, the peaks at the run's batch and the largest batch that
/// fits.
#[derive(Clone, Debug, Serialize)]
pub struct SeqRow {
    pub length: u64,
    pub settings: Vec<SeqSetting>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SeqSetting {
    pub setting: String,
    /// At the run's batch.
    pub row: Row,
    /// The largest batch that fits at this length (0: not even one).
    pub largest_batch: u64,
}

/// How a request of `here` bytes at length `at` that was `there` at `other` follows the length.
fn classify(here: u64, there: u64, at: u64, other: u64) -> SeqScale {
    let (h, t, a, o) = (
        u128::from(here),
        u128::from(there),
        u128::from(at),
        u128::from(other),
    );
    // Products of sizes and lengths a trace or a caller gives: past 2^128 they are unequal.
    let equal = |x: Option<u128>, y: Option<u128>| x.is_some() && x == y;
    if here == there {
        SeqScale::Same
    } else if equal(t.checked_mul(a), h.checked_mul(o)) {
        SeqScale::Linear
    } else if equal(
        t.checked_mul(a).and_then(|v| v.checked_mul(a)),
        h.checked_mul(o).and_then(|v| v.checked_mul(o)),
    ) {
        SeqScale::Square
    } else {
        SeqScale::Line { here, there }
    }
}

/// `size` at length `len` for a request recorded at length `at` that follows it as `s`.
fn resize_seq(s: SeqScale, size: u64, at: u64, other: u64, len: u64) -> u64 {
    // Saturating: a length or size near 2^64 gives u64::MAX bytes, which no device serves.
    let times = |num: Option<u128>, den: Option<u128>| match (num, den) {
        (Some(n), Some(d)) => u128::from(size)
            .checked_mul(n)
            .and_then(|v| u64::try_from(v.div_ceil(d.max(1))).ok())
            .unwrap_or(u64::MAX),
        _ => u64::MAX,
    };
    let (l, a) = (u128::from(len), u128::from(at));
    match s {
        SeqScale::ByKind { grows: false } | SeqScale::Same => size,
        SeqScale::ByKind { grows: true } | SeqScale::Linear => times(Some(l), Some(a)),
        SeqScale::Square => times(l.checked_mul(l), a.checked_mul(a)),
        SeqScale::Line { here, there } => on_line(here, there, at, other, len).unwrap_or(size),
    }
}

/// The lengths asked can be answered: the second run at another length, every length at
/// least 1.
pub(super) fn lengths_asked(ask: &SeqAsk) -> Result<(), super::FitError> {
    if ask.other == ask.at {
        return Err(super::FitError::Batch(format!(
            "the second run's sequence length ({}) is the run's own: give a run at another length",
            ask.other
        )));
    }
    if ask.at == 0 || ask.lengths.contains(&0) {
        return Err(super::FitError::Batch(
            "a sequence length is at least 1".into(),
        ));
    }
    Ok(())
}

/// The run's requests (`input`, with `second` the run at another length) at each length
/// asked, under each of `confs`, at the run's batch `batch` and searched for the largest batch
/// up to `max_batch`; `scale` says how each follows the batch.
#[allow(clippy::too_many_arguments)]
pub(super) fn axis(
    (input, second): (&Input, &Input),
    ask: &SeqAsk,
    scale: &super::Scales,
    batch: u64,
    max_batch: u64,
    confs: &[&TorchConf],
    bounds: &Bounds,
) -> Result<SeqAxis, super::FitError> {
    lengths_asked(ask)?;
    let seq = paired(input, second, ask.at, ask.other, scale);
    let (mut same, mut linear, mut square, mut line, mut by_kind) =
        ((0, 0), (0, 0), (0, 0), (0, 0), (0, 0));
    for ((size, _), s) in input.requests().zip(&seq) {
        let tally: &mut (u64, u64) = match s {
            SeqScale::ByKind { .. } => &mut by_kind,
            SeqScale::Same => &mut same,
            SeqScale::Linear => &mut linear,
            SeqScale::Square => &mut square,
            SeqScale::Line { .. } => &mut line,
        };
        tally.0 += 1;
        tally.1 = tally.1.saturating_add(size);
    }
    // Each size below reads of a request only how it follows the length and the batch.
    let repeating = input.repeating(|n| (seq.get(n).copied(), scale.get(n)));
    let lengths = ask
        .lengths
        .iter()
        .map(|&len| {
            let settings = confs
                .iter()
                .map(|conf| {
                    let at_batch = |b: u64| -> Row {
                        let events = input
                            .resized(|n, size, _| {
                                let s = seq.get(n).copied().unwrap_or(SeqScale::Same);
                                let sized = resize_seq(s, size, ask.at, ask.other, len);
                                resize(scale.get(n).unwrap_or(Scale::Fixed), sized, batch, b)
                            })
                            .knowing(repeating);
                        let o = torch_allocator::replay_resized(input, &events, conf, bounds);
                        Row {
                            batch: b,
                            peak_reserved_bytes: o.peak_reserved_bytes,
                            peak_allocated_bytes: o.peak_allocated_bytes,
                            failures: o.failures,
                            workspaces_done_without: o.done_without,
                        }
                    };
                    let threads = super::largest::threads_per_setting();
                    let (largest_batch, _) = largest(&at_batch, max_batch, threads);
                    SeqSetting {
                        setting: conf.to_string(),
                        row: at_batch(batch),
                        largest_batch,
                    }
                })
                .collect();
            SeqRow {
                length: len,
                settings,
            }
        })
        .collect();
    Ok(SeqAxis {
        at: ask.at,
        trace: crate::files::shown(&ask.trace).to_string(),
        other: ask.other,
        same,
        linear,
        square,
        line,
        by_kind,
        lengths,
    })
}

/// How far ahead in a line's requests of the second run a counterpart is looked for.
const LOOK_AHEAD: usize = 8;

/// Each request of the run paired with its counterpart in the second run, and how it follows
/// the length. A line's requests pair in order, but one run may make a request the other does
/// not (a library's choice by shape), and many layers share a line (each `nn.Linear`'s
/// backward): so the counterpart is the first of the next few of its line whose size is the
/// request's, or its length's multiple or square multiple. Failing that, the next one when the
/// line has as many requests in both runs (a part fixed, a part growing); else the request's
/// kind decides (`scale`).
fn paired(
    input: &Input,
    second: &Input,
    at: u64,
    other: u64,
    scale: &super::Scales,
) -> Vec<SeqScale> {
    use std::collections::HashMap;
    let (mine, labels) = (Labels::of(input), Labels::of(second));
    let mut theirs: HashMap<&str, Vec<u64>> = HashMap::new();
    for ((size, _), label) in second.requests().zip(labels.iter()) {
        theirs.entry(label).or_default().push(size);
    }
    let mut count: HashMap<&str, usize> = HashMap::new();
    for label in mine.iter() {
        *count.entry(label).or_default() += 1;
    }
    let mut next: HashMap<&str, usize> = HashMap::new();
    input
        .requests()
        .zip(mine.iter())
        .enumerate()
        .map(|(n, ((here, _), label))| {
            let by_kind = SeqScale::ByKind {
                grows: scale.get(n) == Some(Scale::Batch),
            };
            let Some(sizes) = theirs.get(label) else {
                return by_kind;
            };
            let j = next.entry(label).or_default();
            let ahead = sizes.get(*j..).unwrap_or(&[]);
            let clean = ahead.iter().take(LOOK_AHEAD).position(|&there| {
                !matches!(classify(here, there, at, other), SeqScale::Line { .. })
            });
            let same_count = count.get(label) == Some(&sizes.len());
            match (clean, ahead.first()) {
                (Some(i), _) => {
                    *j += i + 1;
                    classify(here, ahead[i], at, other)
                }
                (None, Some(&there)) if same_count => {
                    *j += 1;
                    classify(here, there, at, other)
                }
                _ => by_kind,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{SeqScale, classify, resize_seq};

    #[test]
    fn each_request_follows_the_length_as_its_two_sizes_say() {
        assert_eq!(classify(100, 100, 512, 1024), SeqScale::Same);
        assert_eq!(classify(100, 200, 512, 1024), SeqScale::Linear);
        assert_eq!(classify(100, 400, 512, 1024), SeqScale::Square);
        let line = classify(100, 300, 512, 1024);
        assert_eq!(
            line,
            SeqScale::Line {
                here: 100,
                there: 300
            }
        );
        assert_eq!(resize_seq(SeqScale::Linear, 100, 512, 1024, 2048), 400);
        assert_eq!(resize_seq(SeqScale::Square, 100, 512, 1024, 2048), 1600);
        // 100 at 512, 300 at 1024: 700 at 2048, 0 (never below) far below.
        assert_eq!(resize_seq(line, 100, 512, 1024, 2048), 700);
        assert_eq!(resize_seq(line, 100, 512, 1024, 1), 0);
        assert_eq!(
            resize_seq(SeqScale::ByKind { grows: false }, 100, 512, 1024, 2048),
            100
        );
        assert_eq!(
            resize_seq(SeqScale::ByKind { grows: true }, 100, 512, 1024, 2048),
            400
        );
        // Sizes and lengths near 2^64 saturate rather than wrap.
        assert_eq!(
            resize_seq(SeqScale::Square, u64::MAX, 1, 2, 1 << 20),
            u64::MAX
        );
        assert_eq!(
            resize_seq(SeqScale::Square, u64::MAX, 1, 2, u64::MAX),
            u64::MAX
        );
        assert!(matches!(
            classify(u64::MAX, u64::MAX - 1, u64::MAX, u64::MAX - 2),
            SeqScale::Line { .. }
        ));
    }
}
