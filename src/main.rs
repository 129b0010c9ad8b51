//! The `gpushim` command: runs programs under the shim and decodes their traces. The commands
//! live in [`cli`], one module each.

mod cli;

/// A request the system cannot serve ends the command with one line, not a backtrace and an
/// abort (see `gpushim::memory`).
#[global_allocator]
static ALLOC: gpushim::memory::Alloc = gpushim::memory::Alloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
