//! `gpushim top`: a live view of a running program's trace, refreshed.

use super::output::{fail, print_holders};
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
    loop {
        let began = std::time::Instant::now();
        // A process that just started may not have written the header yet (the file is
        // created empty, then sized and filled in, its magic last): asked before the read, so
        // a header finished during a failed read is read again rather than reported.
        let young = shown == 0 && started.elapsed() < std::time::Duration::from_secs(10);
        let pending = young && header_pending(trace);
        // One pass a refresh: the summary, and who holds what is live at the trace's end.
        let wants = gpushim::report::analysis::Wants {
            summary: true,
            live_at_end: true,
            ..Default::default()
        };
        let a = match gpushim::report::analysis::analyze(trace, opts, &wants) {
            Ok(a) => a,
            Err(_) if young && (pending || header_pending(trace)) => {
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            Err(e) => return fail(e),
        };
        let running = a.info.still_running();
        let (Some(s), Some((_, holders))) = (a.summary, a.live_at_end) else {
            return ExitCode::FAILURE;
        };
        if tty {
            print!("\x1b[H\x1b[2J");
        } else if shown > 0 {
            println!();
        }
        println!(
            "{} (pid {}): {} after {}, {} events",
            s.program,
            s.pid,
            if running { "running" } else { "exited" },
            units::human_duration(s.duration_ns),
            s.events
        );
        for d in &s.devices {
            println!(
                "  device {}: live {} in {} allocations, peak {} at {}",
                d.device.map_or("?".to_string(), |d| d.to_string()),
                human_bytes(d.live_bytes_at_end),
                d.live_allocations_at_end,
                human_bytes(d.peak_live_bytes),
                units::human_duration(d.peak_time_ns)
            );
        }
        println!("  live now, by call site:");
        print_holders(&holders, top, "    ");
        shown += 1;
        if !running || count.is_some_and(|c| shown >= c) {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(wait_after(every, began.elapsed()));
    }
}

/// The wait after a refresh whose read took `took`: the interval asked, and never less than
/// the read (each refresh reads the whole trace, and the program watched shares the host).
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
