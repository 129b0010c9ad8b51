//! `gpushim top`: a live view of a running program's trace, refreshed.

use super::output::{fail, print_holders};
use gpushim::report::analysis::top::{Glance, Watch};
use gpushim::report::units::{self, human_bytes};
use gpushim::trace::reader::ReadOptions;
use std::path::Path;
use std::process::ExitCode;

/// Whether `path` looks like a trace whose header is still being written: missing, shorter
/// than the magic, or with the magic still zero.
fn header_pending(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    use std::os::unix::fs::OpenOptionsExt;
    // Without blocking: a FIFO under the trace's name must not stall the view.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    match opened {
        Err(_) => true,
        Ok(f) if !f.metadata().is_ok_and(|m| m.is_file()) => false,
        Ok(mut f) => f.read_exact(&mut magic).is_err() || magic == [0; 8],
    }
}

pub fn cmd_top(
    trace: &Path,
    interval: &str,
    count: Option<u64>,
    top: usize,
    opts: &ReadOptions,
) -> ExitCode {
    let every = match gpushim::trace::filter::parse_time(interval) {
        Ok(ns) if ns > 0 => std::time::Duration::from_nanos(ns),
        Ok(_) => return fail("--interval must be more than 0"),
        Err(e) => return fail(format!("--interval: {e}")),
    };
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut shown = 0u64;
    let started = std::time::Instant::now();
    // Each refresh reads only what was written since the last (a filter's state too: the
    // reader keeps it); GPUSHIM_TOP_WHOLE=1 reads the whole trace at each (the tests compare
    // the two).
    let whole = std::env::var_os("GPUSHIM_TOP_WHOLE").is_some_and(|v| v == "1");
    let mut watch: Option<Watch> = None;
    let mut said_waiting = false;
    loop {
        let began = std::time::Instant::now();
        // A process that just started may not have written the header yet (the file is
        // created empty, then sized and filled in, its magic last): asked before the read, so
        // a header finished during a failed read is read again rather than reported.
        let young = shown == 0 && started.elapsed() < std::time::Duration::from_secs(10);
        let pending = young && header_pending(trace);
        let glance = if whole {
            glance_whole(trace, opts)
        } else {
            match &mut watch {
                Some(w) => w.look(),
                None => Watch::open(trace, opts).and_then(|w| watch.insert(w).look()),
            }
            .map_err(|e| e.to_string())
        };
        let g = match glance {
            Ok(g) => g,
            Err(_) if young && (pending || header_pending(trace)) => {
                if !said_waiting {
                    // Never silent: a name that is wrong is said at once, not after the wait.
                    eprintln!(
                        "gpushim: top: no trace at {} yet (missing, empty or its header not yet \
                         written): waiting up to 10 s for the program to write it",
                        gpushim::files::shown(trace)
                    );
                    said_waiting = true;
                }
                watch = None;
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            Err(e) => return fail(e),
        };
        if tty {
            print!("\x1b[H\x1b[2J");
        } else if shown > 0 {
            println!();
        }
        show(&g, top);
        shown += 1;
        if !g.running || count.is_some_and(|c| shown >= c) {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(wait_after(every, began.elapsed()));
    }
}

/// What a refresh shows, from the whole trace read again: the summary, and who holds what is
/// live at the trace's end, in one pass.
fn glance_whole(trace: &Path, opts: &ReadOptions) -> Result<Glance, String> {
    let wants = gpushim::report::analysis::Wants {
        summary: true,
        live_at_end: true,
        // As reading on shows it: a filter that has kept nothing yet shows nothing live.
        nothing_kept_is_an_answer: true,
        ..Default::default()
    };
    let a = gpushim::report::analysis::analyze(trace, opts, &wants).map_err(|e| e.to_string())?;
    let running = a.info.still_running();
    let (Some(s), Some((_, holders))) = (a.summary, a.live_at_end) else {
        return Err("the trace's summary was not made".into());
    };
    Ok(Glance {
        program: s.run.program,
        pid: s.run.pid,
        running,
        duration_ns: s.duration_ns,
        events: s.events,
        devices: s.devices,
        holders,
        kept_nothing: a.kept_nothing,
    })
}

/// One refresh's lines.
fn show(g: &Glance, top: usize) {
    println!(
        "{} (pid {}): {} after {}, {} events",
        g.program,
        g.pid,
        if g.running { "running" } else { "exited" },
        units::human_duration(g.duration_ns),
        g.events
    );
    for d in &g.devices {
        println!(
            "  device {}: live {} in {} allocations, peak {} at {}",
            d.device.map_or("?".to_string(), |d| d.to_string()),
            human_bytes(d.live_bytes_at_end),
            d.live_allocations_at_end,
            human_bytes(d.peak_live_bytes),
            units::human_duration(d.peak_time_ns)
        );
    }
    if g.kept_nothing {
        // Not refused as the reports refuse it: the program may yet allocate what it keeps.
        println!(
            "  the filters (--device, --thread, --stream, --from, --to, --range) keep no allocation {}",
            if g.running { "yet" } else { "of the run" }
        );
    }
    println!("  live now, by call site:");
    print_holders(&g.holders, top, "    ");
}

/// The wait after a refresh whose read took `took`: the interval asked, and never less than
/// the read (the program watched shares the host).
fn wait_after(every: std::time::Duration, took: std::time::Duration) -> std::time::Duration {
    every.max(took)
}

#[cfg(test)]
mod tests {
    use super::wait_after;
    use std::time::Duration;

    #[test]
    fn a_refresh_waits_the_interval_and_never_less_than_its_read_took() {
        let ms = Duration::from_millis;
        assert_eq!(wait_after(ms(2000), ms(300)), ms(2000));
        assert_eq!(wait_after(ms(500), ms(1800)), ms(1800));
    }
}
