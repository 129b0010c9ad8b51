//! `gpushim fit`: the peak memory at other batch sizes and the largest batch that fits.

use super::output::{fail, print_json};
use gpushim::report::fit::{Ask, fit};
use gpushim::trace::reader::ReadOptions;
use std::process::ExitCode;

pub fn cmd_fit(trace: &std::path::Path, ask: &Ask, json: bool, opts: &ReadOptions) -> ExitCode {
    match fit(trace, ask, opts) {
        Ok(f) if json => {
            print_json(&f);
            ExitCode::SUCCESS
        }
        Ok(f) => {
            print!("{}", gpushim::report::fit::render(&f));
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
    let reader = gpushim::trace::reader::TraceReader::open(trace).map_err(|e| e.to_string())?;
    let cmdline = &reader.info().cmdline;
    let shown = gpushim::files::shown(trace);
    match read(cmdline) {
        Some((n, said)) => {
            eprintln!(
                "fit: {shown}: the run's {what} is {n}, from its command line ({}); {} says \
                 another",
                gpushim::fixedfmt::Escaped(said.as_bytes()),
                example.split(' ').next().unwrap_or(example)
            );
            Ok(n)
        }
        None => Err(format!(
            "fit: the run's {what} is not on its command line ({}); give it, as in \
             `gpushim fit {shown} {example}`",
            gpushim::fixedfmt::Escaped(cmdline.join(" ").as_bytes()),
        )),
    }
}
