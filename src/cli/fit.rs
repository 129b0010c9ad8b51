//! `gpushim fit`: the peak memory at other batch sizes and the largest batch that fits.

use super::output::{fail, print_json};
use gpushim::report::analysis::fit;
use gpushim::report::fit::Ask;
use gpushim::trace::reader::ReadOptions;
use std::process::ExitCode;

pub fn cmd_fit(trace: &std::path::Path, ask: &Ask, json: bool, opts: &ReadOptions) -> ExitCode {
    match fit(trace, ask, opts) {
        Ok(f) if json => {
            print_json(&f);
            ExitCode::SUCCESS
        }
        Ok(f) => {
            print!("{}", gpushim::report::render::fit::render(&f));
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// The run's batch from its command line, said on stderr, or an error that says how to give
/// it.
pub fn batch_of_run(trace: &std::path::Path) -> Result<u64, String> {
    of_run(
        trace,
        "batch",
        "--at 8",
        gpushim::report::fit::batch_from_cmdline,
    )
}

/// The run's sequence length from its command line, said on stderr, or an error that says
/// how to give it (`flag`, as in `--seq-at 512`).
pub fn seq_of_run(trace: &std::path::Path, flag: &str) -> Result<u64, String> {
    of_run(
        trace,
        "sequence length",
        &format!("{flag} 512"),
        gpushim::report::fit::seq_from_cmdline,
    )
}

/// `what` of the run at `trace` as `read` finds it on its command line.
fn of_run(
    trace: &std::path::Path,
    what: &str,
    example: &str,
    read: fn(&[String]) -> Option<(u64, String)>,
) -> Result<u64, String> {
    // The header alone: the trace is opened for reading once, by the fit.
    let header = gpushim::trace::reader::TraceReader::header(trace).map_err(|e| e.to_string())?;
    let cmdline = header.cmdline;
    let shown = gpushim::files::shown(trace);
    match read(&cmdline) {
        Some((n, said)) => {
            eprintln!(
                "fit: {shown}: the run's {what} is {n}, from its command line ({}); {} says \
                 another",
                gpushim::fixedfmt::Escaped(said.as_bytes()),
                example.split(' ').next().unwrap_or(example)
            );
            Ok(n)
        }
        // The reason that decides comes first: with no tensor to replay, no batch helps.
        None if !holds_tensors(trace) => Err(format!(
            "fit: {shown} holds no tensors of PyTorch's caching allocator, so nothing to scale \
             by the batch: record a PyTorch run with tensors on (the default) and fit that"
        )),
        None => Err(format!(
            "fit: the run's {what} is not on its command line ({}); give it, as in \
             `gpushim fit {shown} {example}`",
            gpushim::fixedfmt::Escaped(cmdline.join(" ").as_bytes()),
        )),
    }
}

/// Whether the trace holds a tensor of PyTorch's allocator (read until the first one; a trace
/// that cannot be read is left to the fit to say why).
fn holds_tensors(trace: &std::path::Path) -> bool {
    use gpushim::trace::format::RecordKind;
    gpushim::trace::reader::TraceReader::open(trace).map_or(true, |reader| {
        reader
            .into_iter()
            .any(|r| r.kind == RecordKind::TensorAlloc)
    })
}

/// `gpushim fit` from its options: the batches, the device, and a second run at another batch
/// or sequence length, as asked.
pub fn cmd_fit_of(command: super::args::Cmd, opts: &ReadOptions) -> ExitCode {
    let super::args::Cmd::Fit {
        traces,
        at,
        batch,
        device_memory,
        limit,
        max_batch,
        with,
        with_at,
        with_seq,
        seq_at,
        seq,
        checkpoint,
        checkpoint_way,
        autocast,
        world_size,
        run_world_size,
        shard,
        zero_bucket,
        json,
        ..
    } = command
    else {
        return super::output::fail("not fit's options");
    };
    let Some(trace) = traces.first().cloned() else {
        return super::output::fail("fit: give a trace");
    };
    let several = traces.len() > 1;
    if several && (with.is_some() || seq.is_some() || checkpoint.is_some() || autocast.is_some()) {
        return super::output::fail(
            "fit: several traces answer each rank of a job as it ran (and --world-size); \
             --with, --seq, --checkpoint and --autocast take one trace",
        );
    }
    if let Some(saved) = traces
        .iter()
        .chain(with.as_ref())
        .find(|p| gpushim::report::analysis::saved::is_saved(p))
    {
        return super::output::fail(format!(
            "{} is a saved analysis (gpushim analyze -o): fit replays the run's requests, which \
             only its trace holds: give the trace",
            gpushim::files::shown(saved)
        ));
    }
    let at = match at.map_or_else(|| batch_of_run(&trace), Ok) {
        Ok(at) => at,
        Err(e) => return fail(e),
    };
    let ask = gpushim::report::fit::Ask {
        at,
        batches: batch.map_or_else(
            || {
                vec![
                    at,
                    at.saturating_mul(2),
                    at.saturating_mul(4),
                    at.saturating_mul(8),
                ]
            },
            |b| b.0,
        ),
        device_memory,
        limit,
        max_batch,
        second: None,
        seq: None,
        checkpoint: checkpoint.map(|c| (c != "auto").then_some(c)),
        checkpoint_reentrant: checkpoint_way.map(|w| w == "reentrant"),
        autocast: autocast.map(|a| a.name().to_string()),
        world_size,
        run_world_size,
        shard: shard.map(|s| {
            use super::args::ShardWay;
            use gpushim::report::torch_allocator::ShardWay as Way;
            match s {
                ShardWay::Full => Way::Fsdp2 { reshard: true },
                ShardWay::GradOp => Way::Fsdp2 { reshard: false },
                ShardWay::Zero1 | ShardWay::Zero2 | ShardWay::Zero3 => Way::Zero {
                    stage: match s {
                        ShardWay::Zero1 => 1,
                        ShardWay::Zero2 => 2,
                        _ => 3,
                    },
                    bucket: zero_bucket
                        .map_or(gpushim::report::torch_allocator::BUCKET_ELEMENTS, u64::from),
                },
            }
        }),
    };
    let by_seq = with_seq.is_some() || seq_at.is_some() || seq.is_some();
    let ask = match with {
        None => ask,
        Some(other) if by_seq => {
            let lengths = seq_at
                .map_or_else(|| seq_of_run(&trace, "--seq-at"), Ok)
                .and_then(|at| {
                    with_seq
                        .map_or_else(|| seq_of_run(&other, "--with-seq"), Ok)
                        .map(|o| (at, o))
                });
            let (seq_at, other_seq) = match lengths {
                Ok(l) => l,
                Err(e) => return fail(e),
            };
            gpushim::report::fit::Ask {
                seq: Some(gpushim::report::fit::SeqAsk {
                    at: seq_at,
                    trace: other,
                    other: other_seq,
                    lengths: seq.map_or_else(
                        || vec![seq_at, seq_at.saturating_mul(2), seq_at.saturating_mul(4)],
                        |l| l.0,
                    ),
                }),
                ..ask
            }
        }
        Some(other) => match with_at.map_or_else(|| batch_of_run(&other), Ok) {
            Ok(b) => gpushim::report::fit::Ask {
                second: Some((other, b)),
                ..ask
            },
            Err(e) => return fail(e),
        },
    };
    if several {
        return cmd_fit_ranks(&traces, &ask, json, opts);
    }
    cmd_fit(&trace, &ask, json, opts)
}

/// `fit` of each rank's trace of a job: each one's answer under the run's setting, then the
/// rank that fails first (the smallest largest batch), since the job fails with it.
fn cmd_fit_ranks(
    traces: &[std::path::PathBuf],
    ask: &Ask,
    json: bool,
    opts: &ReadOptions,
) -> ExitCode {
    use gpushim::report::units::human_bytes;
    let mut fits = Vec::new();
    for t in traces {
        match fit(t, ask, opts) {
            Ok(f) => fits.push((gpushim::files::shown(t).to_string(), f)),
            Err(e) => return fail(format!("{}: {e}", gpushim::files::shown(t))),
        }
    }
    // Each rank's largest batch under the run's own setting (its first: the recorded one).
    let largest = |f: &gpushim::report::fit::Fit| {
        f.settings
            .iter()
            .find(|s| s.recorded)
            .map(|s| (s.largest_batch, s.largest_is_the_cap))
    };
    let first = fits
        .iter()
        .filter_map(|(t, f)| largest(f).map(|l| (t, f, l)))
        .min_by_key(|&(_, _, (b, _))| b);
    if json {
        let ranks: Vec<serde_json::Value> = fits
            .iter()
            .map(|(t, f)| serde_json::json!({"trace": t, "fit": f}))
            .collect();
        print_json(&serde_json::json!({
            "ranks": ranks,
            "fails_first": first.map(|(t, _, (b, _))| serde_json::json!({"trace": t, "largest_batch": b})),
        }));
        return ExitCode::SUCCESS;
    }
    for (t, f) in &fits {
        println!("== {t}");
        print!("{}", gpushim::report::render::fit::render(f));
        println!();
    }
    println!(
        "the job's ranks at batch {} (the batch per rank), under each run's setting:",
        ask.at
    );
    for (t, f) in &fits {
        let at = f
            .settings
            .iter()
            .find(|s| s.recorded)
            .and_then(|s| s.rows.iter().find(|r| r.batch == ask.at));
        match largest(f) {
            Some((b, cap)) => println!(
                "  {t}: peak reserved {} at {}, the largest batch that fits {b}{}",
                at.map_or_else(|| "-".into(), |r| human_bytes(r.peak_reserved_bytes)),
                ask.at,
                if cap { " or more" } else { "" }
            ),
            None => println!("  {t}: no answer"),
        }
    }
    if let Some((t, _, (b, _))) = first {
        println!(
            "the rank that fails first: {t}, past batch {b} per rank: the job fits no larger \
             batch than that rank does"
        );
    }
    ExitCode::SUCCESS
}
