//! The `gpushim` command: runs programs under the shim and decodes their traces. The commands
//! live in [`cli`], one module each.

mod cli;

/// A request the system cannot serve ends the command with one line, not a backtrace and an
/// abort (see `gpushim::memory`).
#[global_allocator]
static ALLOC: gpushim::memory::Alloc = gpushim::memory::Alloc;

fn main() -> std::process::ExitCode {
    let code = cli::main();
    if std::env::var_os("GPUSHIM_READS").is_some_and(|v| v == "1") {
        // How many times the command opened a trace and read one through (the tests and the
        // benchmark count them: a report reads its trace in a known number of passes).
        let (opened, passes) = gpushim::trace::reader::reads();
        let (held, decoded) = gpushim::trace::reader::records_read();
        // Against a whole pass's records, where a pass was read to its end.
        let times = match held {
            0 => String::new(),
            _ => format!(": {:.2} times their records", decoded as f64 / held as f64),
        };
        eprintln!("gpushim: opened {opened} trace file(s), read {passes} pass(es){times}");
        let (reading, at_end) = gpushim::report::early::moments_taken();
        if reading + at_end > 0 {
            eprintln!(
                "gpushim: {reading} moment(s) taken as the trace was read, {at_end} at its end"
            );
        }
        let visited = gpushim::report::early::moments_visited();
        if visited > 0 {
            eprintln!("gpushim: the moments being taken looked at {visited} record(s)");
        }
        let (copies, copied) = gpushim::report::early::replay_copies();
        if copies > 0 {
            eprintln!("gpushim: the moments copied the replay {copies} time(s), {copied} entries");
        }
        let sampled = gpushim::report::analysis::leaks_sampled_reading();
        if sampled > 0 {
            eprintln!("gpushim: {sampled} time(s) the leaks were sampled as the trace was read");
        }
        let (replays, events, passed) = gpushim::report::torch_allocator::replays_counted();
        if replays > 0 {
            eprintln!(
                "gpushim: {replays} replay(s) of PyTorch's allocator applied {events} events, \
                 passed over {passed} as repeats"
            );
        }
        let (paired, readers) = gpushim::trace::reader::paired();
        if paired > 0 {
            eprintln!("gpushim: {paired} pass(es) read by {readers} threads at once");
        }
        // Where a first pass's time went: a thread whose CPU time is near the pass's is what
        // the pass waited for. The decoding threads are every pass's (a second pass, a second
        // reader of the first part), the trackers' the first pass's.
        let (wall, tracking, most) = gpushim::report::analysis::first_pass_times();
        if wall > 0.0 {
            let decoding = gpushim::trace::reader::decoding_cpu_s();
            eprintln!(
                "gpushim: first pass {wall:.2} s; CPU: decoding {decoding:.2} s (every pass), \
                 trackers {tracking:.2} s (the busiest thread {most:.2} s)"
            );
        }
    }
    code
}
