//! A report of one trace by its path: an analysis asking for that report alone, and the run
//! `fit` replays (PyTorch's requests with the summary beside them). The reports themselves take
//! what an analysis found, never a path.

use super::{Analysis, Wants, analyze, analyze_reader};
use crate::report::fit::{Ask, Fit, FitError, FitRun};
use crate::report::leaks::Leaks;
use crate::report::oom::Oom;
use crate::report::peak::Peak;
use crate::report::summary::Summary;
use crate::report::torch_allocator::{self, Input, ReplayError};
use crate::trace::reader::{ReadError, ReadOptions, TraceReader};
use std::path::Path;

/// The summary of the trace at `path`.
pub fn summarize(path: &Path, opts: &ReadOptions) -> Result<Summary, ReadError> {
    let a = analyze(path, opts, &Wants::summary())?;
    a.summary
        .ok_or_else(|| ReadError::Io(path.to_path_buf(), std::io::Error::other("no summary")))
}

/// The moment of peak live memory on each device, and what was live then.
pub fn peak(path: &Path, opts: &ReadOptions) -> Result<Vec<Peak>, ReadError> {
    peak_read(path, opts).map(|(p, _)| p)
}

/// [`peak`], and what the trace is missing when it was cut or damaged (the peak may have been
/// among what is missing).
pub fn peak_read(
    path: &Path,
    opts: &ReadOptions,
) -> Result<(Vec<Peak>, Option<String>), ReadError> {
    let a = analyze(path, opts, &Wants::peak())?;
    Ok((a.peaks.unwrap_or_default(), a.cut))
}

/// Every failed allocation, with what held memory at that moment.
pub fn oom(path: &Path, opts: &ReadOptions) -> Result<Vec<Oom>, ReadError> {
    oom_read(path, opts).map(|(o, _)| o)
}

/// [`oom`], and what the trace is missing when it was cut or damaged (a failure may have been
/// among what is missing).
pub fn oom_read(path: &Path, opts: &ReadOptions) -> Result<(Vec<Oom>, Option<String>), ReadError> {
    let a = analyze(path, opts, &Wants::oom())?;
    Ok((a.ooms.unwrap_or_default(), a.cut))
}

/// What was live at exit by call site, and what grew every iteration (iterations bounded by
/// `boundary` where given).
pub fn leaks(path: &Path, boundary: Option<&str>, opts: &ReadOptions) -> Result<Leaks, ReadError> {
    let a = analyze(path, opts, &Wants::leaks(boundary))?;
    a.leaks
        .ok_or_else(|| ReadError::Io(path.to_path_buf(), std::io::Error::other("no leaks")))
}

/// The fit of the trace at `path`.
pub fn fit(path: &Path, ask: &Ask, opts: &ReadOptions) -> Result<Fit, FitError> {
    use crate::report::fit::{batches_asked, fit_run, second_runs_asked};
    batches_asked(ask)?; // before the trace is read
    let run = read_run(path, opts)?;
    second_runs_asked(ask)?; // before the second runs are read
    let batch = ask.second.as_ref().map(|(p, _)| read_requests(p, opts));
    let seq = ask.seq.as_ref().map(|s| read_requests(&s.trace, opts));
    let run = run.with_second_runs(batch.transpose()?, seq.transpose()?);
    fit_run(&run, ask, opts)
}

/// Reads the run at `path` for [`crate::report::fit::fit_run`]: one analysis, its requests and
/// its summary (for the headroom) from one read, of a ring's checkpoint with the most records
/// after it.
pub fn read_run(path: &Path, opts: &ReadOptions) -> Result<FitRun, FitError> {
    torch_allocator::devices_only(opts)?; // before the trace is read
    let whole = run_options(opts);
    let mut a = analyze(path, &whole, &Wants::fit()).map_err(ReplayError::Read)?;
    run_of(&mut a, opts)
}

/// [`read_run`] of the trace `of` reads, by the descriptor it was opened with (one file, one
/// opening, whatever the reports beside it read with).
pub fn read_run_again(of: &TraceReader, opts: &ReadOptions) -> Result<FitRun, FitError> {
    torch_allocator::devices_only(opts)?;
    let whole = run_options(opts);
    let reader = of.reopen_with(&whole).map_err(ReplayError::Read)?;
    let mut a = analyze_reader(reader, &whole, &Wants::fit()).map_err(ReplayError::Read)?;
    run_of(&mut a, opts)
}

/// What [`read_run`] reads with: of a ring's checkpoints, the one with the most records after
/// it.
fn run_options(opts: &ReadOptions) -> ReadOptions {
    ReadOptions {
        longest_ring: true,
        ..opts.clone()
    }
}

/// The run for a fit from an analysis: its requests where it asked for them
/// ([`Wants::requests`], taken), else read from its trace now; the headroom from its summary,
/// when it has one; what grew every iteration, from its leaks.
pub fn run_of(a: &mut Analysis, opts: &ReadOptions) -> Result<FitRun, FitError> {
    let requests = a.requests.take();
    let run = run_from_requests(
        requests,
        &a.info.path,
        a.summary.as_ref(),
        a.cut.clone(),
        opts,
    )?;
    Ok(run.with_growth_of(a.leaks.as_ref()))
}

/// The requests of PyTorch's allocator in the trace at `path`, for a replay. Errors: the trace
/// cannot be read, or has no tensors of PyTorch's allocator (with why, when the trace says).
pub fn read_requests(path: &Path, opts: &ReadOptions) -> Result<Input, ReplayError> {
    let only = torch_allocator::devices_only(opts)?;
    let reader = TraceReader::open_with(path, &torch_allocator::as_replay(opts))?;
    torch_allocator::read_by(reader, &only)
}

/// [`read_requests`] of the trace `of` reads, by the descriptor it was opened with (one file,
/// one opening, whatever the reports beside it read with).
pub fn read_requests_again(of: &TraceReader, opts: &ReadOptions) -> Result<Input, ReplayError> {
    let only = torch_allocator::devices_only(opts)?;
    let reader = of.reopen_with(&torch_allocator::as_replay(opts))?;
    torch_allocator::read_by(reader, &only)
}

/// The advice for the first failed tensor of the trace at `path`: `None` when the trace has
/// none (or holds no tensors: see [`ReplayError::NoTensors`] for why). A failure older than
/// the records the ring still holds is [`ReplayError::FailureSummarized`].
pub fn oom_advice(
    path: &Path,
    opts: &ReadOptions,
) -> Result<Option<torch_allocator::OomAdvice>, ReplayError> {
    match read_requests(path, opts) {
        Ok(input) => torch_allocator::oom_advice_of(&input),
        Err(e) => Err(e.for_failure()),
    }
}

/// The trace at `path` replayed through the shim's own pool under each policy text
/// (GPUSHIM_CONF syntax), every policy checked before the trace is read: the run's own row
/// first, then one a policy.
pub fn simulate_pool(
    path: &Path,
    policies: &[String],
    opts: &ReadOptions,
) -> Result<Vec<crate::report::pool_replay::PoolOutcome>, crate::report::pool_replay::SimulateError>
{
    use crate::report::pool_replay::{policies as parsed, simulate};
    let parsed = parsed(policies)?;
    Ok(simulate(TraceReader::open_with(path, opts)?, parsed))
}

/// The run for a fit from the requests an analysis gathered (else those of the trace at
/// `path`, read now), its summary (the headroom) and what its trace is missing (`cut`).
pub fn run_from_requests(
    requests: Option<Result<Input, ReplayError>>,
    path: &Path,
    summary: Option<&Summary>,
    cut: Option<String>,
    opts: &ReadOptions,
) -> Result<FitRun, FitError> {
    let input = match requests {
        Some(r) => r?,
        None => read_requests(path, opts)?,
    };
    Ok(crate::report::fit::run_from(input, summary, cut))
}
