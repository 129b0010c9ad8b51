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
    let reader = gpushim::trace::reader::TraceReader::open(trace).map_err(|e| e.to_string())?;
    let cmdline = &reader.info().cmdline;
    match gpushim::report::fit::batch_from_cmdline(cmdline) {
        Some((n, said)) => {
            eprintln!(
                "fit: the run's batch is {n}, from its command line ({}); --at says another",
                gpushim::fixedfmt::Escaped(said.as_bytes())
            );
            Ok(n)
        }
        None => Err(format!(
            "fit: the run's batch is not on its command line ({}); give it, as in \
             `gpushim fit {} --at 8`",
            gpushim::fixedfmt::Escaped(cmdline.join(" ").as_bytes()),
            gpushim::files::shown(trace)
        )),
    }
}
