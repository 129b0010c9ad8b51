//! The `gpushim` command: runs programs under the shim and decodes their traces. The commands
//! live in [`cli`], one module each.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
