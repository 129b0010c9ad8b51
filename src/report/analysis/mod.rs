//! One analysis per command: a trace is opened once and read in at most two passes, every
//! report the command asks for taking its part of each pass, into one value the renderers take.
//!
//! 1. **The run** (every record, in time order): the summary's tallies, the failed allocations
//!    with what was live at each (`oom`), when each device peaked (`peak`), what could mark the
//!    iterations (`leaks`), the columns of the memory-over-time picture (`timeline`). Each
//!    is a tracker fed the same record, after one replay of the live set applied it and one
//!    tracker of the tensors' kinds observed it.
//! 2. **At the marks** (the same descriptor, rewound): the moments the first pass found
//!    (each device's peak, its tensors' peak, NVML's peak) taken as the replay passes them,
//!    their tensors' kinds settled by reading on ([`super::moments`]); the live bytes per line
//!    at each iteration boundary (`leaks`); each column split by kind and line (`timeline`).
//!    A command that needs only moments stops once the last is settled.
//!
//! Where it can, the first pass also does the second's work ([`super::early`]): the summary's
//! and the peaks' moments are taken as their trackers find them, within a budget; the leaks'
//! sampling begins at a sixteenth of the trace, the records before it read again by a second
//! reader of the file; the picture's bands are added as the columns are found
//! ([`super::timeline::bands`]). What it could not do, the second pass does, as before.
//!
//! The passes see the same records at the same indices (the extent the header gave when the
//! trace was opened), so the requests, the moments and the kinds cannot disagree. Memory grows
//! with the live set and the distinct lines, never with the file's length.

mod early_leaks;
mod first_pass;
mod kept;
mod reads;
pub mod saved;
pub mod top;

pub use first_pass::Each;
pub use kept::filter_keeps_any;
pub use reads::{
    fit, leaks, oom, oom_advice, oom_read, peak, peak_read, read_requests, read_requests_again,
    read_run, read_run_again, run_from_requests, run_of, simulate_pool, summarize,
};

use super::early::EarlyMoments;
use super::kinds::KindTracker;
use super::leaks::Leaks;
use super::live::Replay;
use super::oom::{Oom, OomPass};
use super::pass::{Seen, Tracker};
use super::peak::Peak;
use super::summary::Summary;
use super::timeline::Lane;
use super::timeline::bands::Bands;
use super::torch_allocator::{Input, ReplayError};
use crate::trace::reader::{ReadError, ReadOptions, TraceInfo, TraceReader};
use std::path::Path;

/// What a command asks of a trace.
#[derive(Clone, Debug, Default)]
pub struct Wants {
    pub summary: bool,
    pub peak: bool,
    pub oom: bool,
    /// `leaks`, with the boundary the user named (`None`: as found).
    pub leaks: Option<Option<String>>,
    /// The memory-over-time picture, with lines drawn on their own however little they hold
    /// (besides the growing lines `leaks` finds, when asked too).
    pub timeline: Option<Vec<String>>,
    /// `leaks` only when the first pass found a failed allocation (what grew until it).
    pub leaks_only_with_failures: bool,
    /// The requests of PyTorch's allocator, for a replay (`fit`, the page's curve of what
    /// fits): gathered in the first pass where it reads what a replay reads, else read apart.
    pub requests: bool,
    /// The bytes live at the trace's end, and who holds them by call site (`diff`, `top`).
    pub live_at_end: bool,
    /// Where the first pass finds a failed allocation of PyTorch's: the run for a replay of
    /// its allocator ([`Analysis::replay_run`], `oom`'s advice and the batch that fits), read
    /// by the same descriptor rewound where it reads what a replay reads.
    pub replay_if_torch_failed: bool,
    /// A filter that kept nothing is what the trace shows so far, not refused (`top`, whose
    /// program may allocate later): the others refuse it, naming what the trace holds.
    pub nothing_kept_is_an_answer: bool,
}

impl Wants {
    pub fn summary() -> Wants {
        Wants {
            summary: true,
            ..Wants::default()
        }
    }

    pub fn peak() -> Wants {
        Wants {
            peak: true,
            ..Wants::default()
        }
    }

    pub fn oom() -> Wants {
        Wants {
            oom: true,
            ..Wants::default()
        }
    }

    pub fn leaks(boundary: Option<&str>) -> Wants {
        Wants {
            leaks: Some(boundary.map(str::to_string)),
            ..Wants::default()
        }
    }

    /// Everything the page shows.
    pub fn page() -> Wants {
        Wants {
            summary: true,
            peak: true,
            oom: true,
            leaks: Some(None),
            timeline: Some(Vec::new()),
            leaks_only_with_failures: false,
            requests: false,
            live_at_end: false,
            replay_if_torch_failed: false,
            nothing_kept_is_an_answer: false,
        }
    }

    /// What `fit` reads: the requests, the summary for the headroom beside PyTorch's, and
    /// `leaks` (whether the run grows every iteration, which the answers then say first).
    pub fn fit() -> Wants {
        Wants {
            summary: true,
            requests: true,
            leaks: Some(None),
            ..Wants::default()
        }
    }
}

/// What the passes found: each report asked for, and what the trace is missing when it was cut
/// or damaged.
pub struct Analysis {
    /// The trace's header, as read when it was opened.
    pub info: TraceInfo,
    pub summary: Option<Summary>,
    pub peaks: Option<Vec<Peak>>,
    pub ooms: Option<Vec<Oom>>,
    pub leaks: Option<Leaks>,
    pub lanes: Option<Vec<Lane>>,
    pub cut: Option<String>,
    /// The replay's input, when asked for ([`Wants::requests`]).
    pub requests: Option<Result<Input, ReplayError>>,
    /// The bytes live at the trace's end, and who holds them by call site, when asked for
    /// ([`Wants::live_at_end`]).
    pub live_at_end: Option<(u64, Vec<super::sites::Holder>)>,
    /// The run for a replay of PyTorch's allocator, when asked for
    /// ([`Wants::replay_if_torch_failed`]) and the trace has such a failure.
    pub replay_run: Option<Result<super::fit::FitRun, super::fit::FitError>>,
    /// A filter was given and kept no allocation (an answer only where
    /// [`Wants::nothing_kept_is_an_answer`]; else refused).
    pub kept_nothing: bool,
}

/// Opens the trace at `path` once and reads it in the passes `wants` needs.
pub fn analyze(path: &Path, opts: &ReadOptions, wants: &Wants) -> Result<Analysis, ReadError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    analyze_on(path, opts, wants, cores)
}

/// [`analyze`] with `cores` of the machine's for its threads.
fn analyze_on(
    path: &Path,
    opts: &ReadOptions,
    wants: &Wants,
    cores: usize,
) -> Result<Analysis, ReadError> {
    let reader = TraceReader::open_with(path, opts)?;
    analyze_opened(reader, opts, wants, cores)
}

/// [`analyze`] of a trace already open: `reader`, before its first record, reading as `opts`
/// says.
pub fn analyze_reader(
    reader: TraceReader,
    opts: &ReadOptions,
    wants: &Wants,
) -> Result<Analysis, ReadError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    analyze_opened(reader, opts, wants, cores)
}

/// [`analyze_on`] of the trace `reader` opened.
fn analyze_opened(
    reader: TraceReader,
    opts: &ReadOptions,
    wants: &Wants,
    cores: usize,
) -> Result<Analysis, ReadError> {
    // The requests in this read where it reads every record a replay would, else in a read
    // of their own by the same descriptor.
    let gathered = wants.requests && opts.filter.is_empty() && reader.reads_as_replay();
    let pass_wants = Wants {
        requests: gathered,
        ..wants.clone()
    };
    let (mut a, end) = analyze_read(reader, &pass_wants, opts, cores, None)?;
    let torch_failed = a
        .ooms
        .as_ref()
        .is_some_and(|o| o.iter().any(|f| f.api == "torch_allocator"));
    if wants.replay_if_torch_failed && torch_failed {
        a.replay_run = Some(replay_run(opts, end.reader, cores)?);
        return Ok(a);
    }
    a.requests = match end.requests {
        Some(_) => end.requests(),
        None if wants.requests => Some(read_requests_again(&end.reader, opts)),
        None => None,
    };
    Ok(a)
}

/// The run for a replay of PyTorch's allocator (its requests, and the summary that gives the
/// headroom), read by `reader` rewound where it reads what a replay reads, else as `fit` reads
/// it, by the same descriptor.
fn replay_run(
    opts: &ReadOptions,
    mut reader: TraceReader,
    cores: usize,
) -> Result<Result<super::fit::FitRun, super::fit::FitError>, ReadError> {
    if !(opts.filter.is_empty() && reader.reads_as_replay()) {
        return Ok(read_run_again(&reader, opts));
    }
    reader.rewind()?;
    let path = reader.info().path.clone();
    let (a, end) = analyze_read(reader, &Wants::fit(), opts, cores, None)?;
    let run = run_from_requests(end.requests(), &path, a.summary.as_ref(), None, opts);
    Ok(run.map(|r| r.with_growth_of(a.leaks.as_ref())))
}

/// [`analyze`], handing `each` every record of the first pass after the replay applied it (on
/// the first group of trackers' thread); and the reader and the replay as the passes left
/// them (every record read, every definition known). PyTorch's requests are not gathered.
pub fn analyze_each(
    path: &Path,
    opts: &ReadOptions,
    wants: &Wants,
    each: first_pass::Each<'_>,
) -> Result<(Analysis, TraceReader, Replay), ReadError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let reader = TraceReader::open_with(path, opts)?;
    let wants = Wants {
        requests: false,
        ..wants.clone()
    };
    let (a, end) = analyze_read(reader, &wants, opts, cores, Some(each))?;
    Ok((a, end.reader, end.replay))
}

/// What [`analyze_read`] leaves: its reader, and the first pass's replay, kinds and requests.
struct Ended {
    reader: TraceReader,
    replay: Replay,
    kinds: KindTracker,
    requests: Option<crate::report::torch_allocator::Requests>,
}

impl Ended {
    /// The replay's input from the requests the first pass gathered, if it gathered them (the
    /// reader, which read every record, goes with it).
    fn requests(self) -> Option<Result<Input, ReplayError>> {
        let every_device = crate::trace::filter::Filter::default();
        let q = self.requests?;
        Some(q.finish(self.reader, &self.kinds, &every_device))
    }
}

/// [`analyze_on`] of the trace `reader` opened: the passes, and what they found.
fn analyze_read(
    mut reader: TraceReader,
    wants: &Wants,
    opts: &ReadOptions,
    cores: usize,
    each: Option<first_pass::Each<'_>>,
) -> Result<(Analysis, Ended), ReadError> {
    let mut run = first_pass::first_pass(&mut reader, wants, cores, each)?;
    // A filter that kept nothing would read as a run that allocated nothing: refused here,
    // where the pass has read every record through it, not by a read of its own before.
    if !wants.nothing_kept_is_an_answer {
        kept::refused_filter(&reader, opts)?;
    }
    let requests = run.requests.take();
    let (rp, kinds, early) = (
        std::mem::take(&mut run.rp),
        std::mem::take(&mut run.kinds),
        run.early.take(),
    );
    let mut taken = early.map_or_else(Vec::new, |e| e.finish(&reader, &kinds));
    // The moments groups on threads of their own took (the same moment, where two took it).
    taken.append(&mut run.taken);
    // What the first pass alone tells, named from its reader before the second pass rewinds it.
    let mut a = Analysis {
        info: reader.info().clone(),
        cut: reader.stats().cut(),
        ooms: run.oom.map(OomPass::finish),
        summary: None,
        peaks: None,
        leaks: None,
        lanes: None,
        requests: None,
        replay_run: None,
        live_at_end: wants
            .live_at_end
            .then(|| super::sites::live_holders(&reader, &rp)),
        kept_nothing: reader.filter_kept_any() == Some(false),
    };
    if wants.leaks_only_with_failures && a.ooms.as_ref().is_some_and(Vec::is_empty) {
        run.leaks = None;
    }
    let summary = run.summary.map(|p| p.finish(&reader, &rp, &kinds));
    let peaks = run.peak.map(|p| p.finish(&reader, &rp, opts));
    let boundary = wants.leaks.as_ref().and_then(|b| b.as_deref());
    let mut leaks = run.leaks.map(|p| p.finish(&reader, &rp, boundary));
    // The leaks sampled in the first pass, if it sampled what was chosen at the end.
    if let (Some(chosen), Some(e)) = (&leaks, run.early_leaks.take())
        && let Some(sampled) = e.finish(chosen)
    {
        a.leaks = Some(sampled.finish(&reader, &rp, &kinds));
        leaks = None;
    }
    let (columns, early_bands) = run.picture.take().map(|p| (p.columns, p.bands)).unzip();
    let found = columns.map(|p| p.finish(&rp));
    // The picture's bands, from the first pass where it took them, else in the second.
    let mut early_bands = early_bands.flatten().filter(|b| !b.given_up);
    let mut bands = match early_bands {
        Some(_) => None,
        None => found.as_ref().map(Bands::over),
    };
    if leaks.is_none()
        && let (Some(b), Some(found), Some(keep)) = (early_bands.take(), &found, &wants.timeline)
    {
        // The leaks are known: the lanes now, from the reader as the first pass left it.
        a.lanes = Some(b.finish(found, &reader, &rp, &kinds, &drawn(&a, keep)));
    }
    // The moments wanted: those the first pass took, the others taken in the second.
    let (want, mut taken) = wanted(taken, summary.as_ref(), peaks.as_ref());
    if want.is_empty() && leaks.is_none() && bands.is_none() {
        a.summary = summary.map(|s| s.finish(&reader, &taken));
        a.peaks = peaks.map(|p| super::peak::peaks(&reader, p, &taken));
        let end = Ended {
            reader,
            replay: rp,
            kinds,
            requests,
        };
        return Ok((a, end));
    }
    reader.rewind()?;
    let (first_rp, first_kinds) = (rp, kinds);
    let mut moments = EarlyMoments::wanting(&reader, &want);
    let (rp, kinds) = second_pass(&mut reader, &mut moments, &mut leaks, &mut bands);
    let mut moments = moments.finish(&reader, &kinds);
    moments.append(&mut taken);
    a.summary = summary.map(|s| s.finish(&reader, &moments));
    a.peaks = peaks.map(|p| super::peak::peaks(&reader, p, &moments));
    if let Some(p) = leaks {
        a.leaks = Some(p.finish(&reader, &rp, &kinds));
    }
    if let (Some(b), Some(found), Some(keep)) = (bands, &found, &wants.timeline) {
        a.lanes = Some(b.finish(found, &reader, &rp, &kinds, &drawn(&a, keep)));
    }
    // Bands of the first pass whose leaks came from this one (read to its end).
    if let (Some(b), Some(found), Some(keep)) = (early_bands, &found, &wants.timeline) {
        let drawn = drawn(&a, keep);
        a.lanes = Some(b.finish(found, &reader, &first_rp, &first_kinds, &drawn));
    }
    let end = Ended {
        reader,
        replay: first_rp,
        kinds: first_kinds,
        requests,
    };
    Ok((a, end))
}

/// The second pass, over `reader` rewound: the moments the first pass did not take, and the
/// leaks' samples and the picture's bands where it could not take them (a pass of moments
/// alone stops once the last is settled); its replay and kinds where it stopped.
fn second_pass(
    reader: &mut TraceReader,
    moments: &mut EarlyMoments,
    leaks: &mut Option<super::leaks::LeaksSampler>,
    bands: &mut Option<Bands>,
) -> (Replay, KindTracker) {
    let (mut rp, mut kinds, mut batch) = (Replay::default(), KindTracker::default(), Vec::new());
    // Nothing is said of moments in this pass: they were found in the first.
    let said = &mut Vec::new();
    let only_moments = leaks.is_none() && bands.is_none();
    'pass: while reader.next_batch(&mut batch) {
        for (i, r) in batch.iter().enumerate() {
            crate::prefetch::ahead(&batch, i);
            let change = rp.apply(r);
            let run_before = kinds.run();
            let decided = kinds.observe(reader, r);
            let seen = Seen {
                reader,
                rp: &rp,
                kinds: &kinds,
                record: r,
                change,
                decided,
                run_before,
            };
            moments.see(&seen, said);
            if let Some(p) = leaks {
                p.see(&seen, said);
            }
            if let Some(p) = bands {
                p.see(&seen, said);
            }
            if only_moments && moments.done() {
                break 'pass;
            }
        }
    }
    (rp, kinds)
}

/// The lines the picture draws on their own however little they hold: those asked (`keep`)
/// and the growing ones `leaks` found.
fn drawn<'a>(a: &'a Analysis, keep: &'a [String]) -> Vec<&'a str> {
    let growing = a.leaks.iter().filter_map(|l| l.iterations.as_ref());
    let mut drawn: Vec<&str> = keep.iter().map(String::as_str).collect();
    drawn.extend(growing.flat_map(|i| i.growing.iter().map(|g| g.call_site.as_str())));
    drawn
}

/// The moments the summary and the peaks want: those among `taken` (the first pass's), and the
/// others to take in the second pass (their records and devices).
fn wanted(
    taken: Vec<super::moments::Moment>,
    summary: Option<&super::summary::SummaryFound>,
    peaks: Option<&super::peak::PeaksFound>,
) -> (Vec<(u64, u8)>, Vec<super::moments::Moment>) {
    let mut moments = Vec::new();
    let wanted = summary.into_iter().flat_map(|s| s.moments()).chain(
        peaks
            .into_iter()
            .flat_map(|p| &p.wanted)
            .map(|&(device, at, _)| (at, device)),
    );
    let mut used = vec![false; taken.len()];
    for (at, device) in wanted {
        match taken
            .iter()
            .position(|m| m.index == at && m.device == device)
        {
            Some(i) => used[i] = true,
            None => moments.push((at, device)),
        }
    }
    let taken = taken
        .into_iter()
        .zip(used)
        .filter_map(|(m, used)| used.then_some(m))
        .collect();
    (moments, taken)
}

/// The analyses of a job's inputs, in their order, each named: traces analysed as `wants`
/// says, several at once (one core each); saved analyses (`gpushim analyze -o`, one per host)
/// read as saved, one per trace they hold.
pub fn analyze_job(
    paths: &[std::path::PathBuf],
    opts: &ReadOptions,
    wants: &Wants,
) -> Result<Vec<(String, Analysis)>, ReadError> {
    let saved: Vec<bool> = paths.iter().map(|p| saved::is_saved(p)).collect();
    let traces: Vec<&std::path::PathBuf> = paths
        .iter()
        .zip(&saved)
        .filter(|(_, s)| !**s)
        .map(|(p, _)| p)
        .collect();
    let mut read = analyze_in_parallel(&traces, opts, wants).into_iter();
    let mut out = Vec::new();
    for (path, saved) in paths.iter().zip(saved) {
        if !saved {
            let a = read.next().unwrap_or_else(|| {
                Err(ReadError::Io(
                    path.clone(),
                    std::io::Error::other("not read"),
                ))
            })?;
            out.push((crate::files::shown(path).to_string(), a));
            continue;
        }
        let refuse = |why: &str| {
            let m = format!("a saved analysis holds the reports as they were saved: {why}");
            ReadError::Io(path.clone(), std::io::Error::other(m))
        };
        if !opts.filter.is_empty() {
            return Err(refuse(
                "filter the traces when saving (gpushim analyze --device ...)",
            ));
        }
        if wants.leaks.as_ref().is_some_and(Option::is_some) {
            return Err(refuse("--boundary needs the traces themselves"));
        }
        out.extend(saved::load(path)?);
    }
    Ok(out)
}

/// [`analyze`] of each trace, at most as many at once as there are cores, each trace's groups
/// of trackers sharing the cores left to it.
fn analyze_in_parallel(
    traces: &[&std::path::PathBuf],
    opts: &ReadOptions,
    wants: &Wants,
) -> Vec<Result<Analysis, ReadError>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = cores.min(traces.len());
    if workers <= 1 {
        return traces.iter().map(|p| analyze(p, opts, wants)).collect();
    }
    let each = cores / workers;
    let next = AtomicUsize::new(0);
    let done: std::sync::Mutex<Vec<Option<Result<Analysis, ReadError>>>> =
        std::sync::Mutex::new((0..traces.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(p) = traces.get(i) else {
                        break;
                    };
                    let a = analyze_on(p, opts, wants, each);
                    if let Ok(mut d) = done.lock() {
                        d[i] = Some(a);
                    }
                }
            });
        }
    });
    done.into_inner()
        .unwrap_or_default()
        .into_iter()
        .zip(traces)
        .map(|(a, p)| {
            a.unwrap_or_else(|| {
                Err(ReadError::Io(
                    (*p).clone(),
                    std::io::Error::other("not read"),
                ))
            })
        })
        .collect()
}
