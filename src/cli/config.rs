//! `gpushim config`: the effective configuration and every key it takes.

use super::output::fail;
use gpushim::config;
use gpushim::report::units::{self, human_bytes};
use std::process::ExitCode;

pub fn cmd_config(conf: Option<String>) -> ExitCode {
    let source = if conf.is_some() {
        "the configuration given"
    } else {
        "GPUSHIM_CONF"
    };
    let text = conf
        .or_else(|| std::env::var("GPUSHIM_CONF").ok())
        .unwrap_or_default();
    let c = match config::parse_strict(&text) {
        Ok(c) => c,
        Err(e) => return fail(format!("{source}: {e}")),
    };
    let size = |n: u64, off: u64| {
        if n == off {
            "off".to_string()
        } else {
            human_bytes(n)
        }
    };
    println!("effective configuration (GPUSHIM_CONF=\"{text}\"):");
    println!("  pool       {}", c.pool.name());
    if c.pool == config::Pool::Off && c.limit > 0 {
        println!("             (limit needs a pool: with pool:off it is not enforced)");
    }
    println!(
        "  round      {}",
        match c.round {
            0 => "off".to_string(),
            1 => "pow2".to_string(),
            n => format!("pow2_{n}"),
        }
    );
    println!("  max_split  {}", size(c.max_split, u64::MAX));
    println!("  medium     {}", size(c.medium, 0));
    println!("  release    {}", size(c.release, u64::MAX));
    println!("  limit      {}", size(c.limit, 0));
    println!(
        "  trim       {}",
        match c.trim {
            config::Trim::Auto => "auto".to_string(),
            config::Trim::Off => "off".to_string(),
            config::Trim::After(ns) => units::human_duration(ns),
        }
    );
    println!("  tensors    {}", if c.tensors { "on" } else { "off" });
    println!("  trace_max  {}", human_bytes(c.trace_max));
    println!(
        "  stacks     {}",
        match c.stacks {
            config::Stacks::Off => "off".to_string(),
            config::Stacks::Auto => "auto (python; native where no Python runs)".to_string(),
            config::Stacks::Python => "python".to_string(),
            config::Stacks::Native => "native".to_string(),
            config::Stacks::On => "on (python and native)".to_string(),
            config::Stacks::Every(n) => format!("python, and native for one call in {n}"),
        }
    );
    println!();
    println!("keys (GPUSHIM_CONF=\"key:value,key:value\"):");
    for k in config::KEYS {
        println!("  {:<10} {} [default {}]", k.key, k.meaning, k.default);
        println!("  {:<10} accepts: {}", "", k.accepted);
    }
    println!();
    println!(
        "other variables: GPUSHIM_TRACE=PATTERN|off (%p pid, %h host, %r rank), GPUSHIM_DISABLE=1"
    );
    ExitCode::SUCCESS
}

/// `gpushim lib`: the shim's path for `LD_PRELOAD` by hand, or (`--sources`) the bundled sources.
pub fn cmd_lib(lib: Option<std::path::PathBuf>, sources: bool) -> ExitCode {
    if sources {
        return match gpushim::run::bundled_sources() {
            Some(f) => {
                println!("{f}");
                ExitCode::SUCCESS
            }
            None => super::output::fail(
                "this gpushim carries no shim (built without the bundle-shim feature): its \
                 shim is the libgpushim.so built beside it",
            ),
        };
    }
    match gpushim::run::find_shim(lib.as_deref()) {
        Ok(p) => {
            println!("{}", p.display());
            ExitCode::SUCCESS
        }
        Err(e) => super::output::fail(e),
    }
}
