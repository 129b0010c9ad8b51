//! The `gpushim` command: runs programs under the shim and decodes their traces. The commands
//! live in [`cli`], one module each.

mod cli;

fn main() -> std::process::ExitCode {
    let code = cli::main();
    if std::env::var_os("GPUSHIM_READS").is_some_and(|v| v == "1") {
        // How many times the command opened a trace and read one through (the tests and the
        // benchmark count them: a report reads its trace in a known number of passes).
        let (opened, passes) = gpushim::trace::reader::reads();
        eprintln!("gpushim: opened {opened} trace file(s), read {passes} pass(es)");
    }
    code
}
