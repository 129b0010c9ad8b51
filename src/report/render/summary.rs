//! `summary` as text: a section per part of the summary.

use crate::report::summary::*;
use crate::report::units::{human_bytes, human_duration};
use std::fmt::Write as _;

impl Summary {
    pub fn render(&self) -> String {
        let mut o = String::new();
        self.render_calls(&mut o);
        self.render_devices(&mut o);
        self.render_held(&mut o);
        super::device_memory::render(&mut o, &self.device_memory);
        if let Some(why) = &self.tensors_off {
            let _ = writeln!(o, "tensors: not recorded: {why}");
        }
        self.render_pool(&mut o);
        self.render_misc(&mut o);
        self.render_health(&mut o);
        o
    }

    /// The trace's process, its events, and the calls per API.
    fn render_calls(&self, o: &mut String) {
        let rank = self
            .run
            .rank
            .map(|r| format!(", rank {r}"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "{}: {} (pid {} on {}{rank})",
            self.run.path, self.run.program, self.run.pid, self.run.host
        );
        let _ = writeln!(
            o,
            "{} events over {}",
            self.events,
            human_duration(self.duration_ns)
        );
        if !self.run.parallel.is_empty() {
            // The world as the run's environment said it: the frames do not say it.
            let world = match (self.run.rank, self.run.world_size) {
                (Some(r), Some(n)) => format!("; rank {r} of {n} (its WORLD_SIZE)"),
                (None, Some(n)) => format!("; {n} ranks (its WORLD_SIZE)"),
                _ => "; the world size not said (no WORLD_SIZE in its environment)".into(),
            };
            let sharding = self
                .run
                .sharding
                .as_ref()
                .map_or(String::new(), |s| format!(", {s}"));
            let _ = writeln!(
                o,
                "data parallel, from the frames: {}{sharding}{world}",
                self.run.parallel.join(", ")
            );
        }
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "{:<30} {:>10} {:>8} {:>14}",
            "API", "calls", "failed", "bytes"
        );
        for a in &self.apis {
            let _ = writeln!(
                o,
                "{:<30} {:>10} {:>8} {:>14}",
                a.api,
                a.calls,
                a.failed,
                if a.bytes > 0 {
                    human_bytes(a.bytes)
                } else {
                    "-".into()
                }
            );
        }
    }

    /// Each device's peaks and fragmentation, and PyTorch's own figures. One figure per
    /// meaning: the device's live memory counts every allocating call (PyTorch's tensors, not
    /// its segments, beside what libraries took); reserved and fragmentation are the shim's
    /// pool's, shown only where it served; PyTorch's allocated and reserved are its own.
    fn render_devices(&self, o: &mut String) {
        let _ = writeln!(o);
        for d in &self.devices {
            let name = d
                .device
                .map(|d| format!("device {d}"))
                .unwrap_or_else(|| "device ?".into());
            let pooled = self.pool.iter().any(|p| Some(p.device) == d.device);
            let torch = self.framework.iter().any(|f| Some(f.device) == d.device);
            let what = if torch && !pooled {
                " (PyTorch's tensors and every other allocation: its unused cache not counted)"
            } else {
                ""
            };
            let _ = write!(
                o,
                "{name}: peak live {} at {}{what}, live at end {} in {} allocations",
                human_bytes(d.peak_live_bytes),
                human_duration(d.peak_time_ns),
                human_bytes(d.live_bytes_at_end),
                d.live_allocations_at_end
            );
            if !pooled {
                let _ = writeln!(o, "; {} failed for lack of memory", d.ooms);
                continue;
            }
            let _ = writeln!(o);
            let _ = writeln!(
                o,
                "{:width$}  the pool's peak reserved {}, when {} was live: {:.1}% of it held \
                 nothing (fragmentation); {} failed for lack of memory",
                "",
                human_bytes(d.peak_reserved_bytes),
                human_bytes(d.live_at_reserved_peak_bytes),
                d.fragmentation_at_peak * 100.0,
                d.ooms,
                width = crate::report::units::column(name.len())
            );
        }
        for f in &self.framework {
            let _ = writeln!(
                o,
                "PyTorch on device {}: allocated (its tensors) {} at peak, {} at exit ({} \
                 tensors); reserved (its cache) {} at peak, {} at exit, of which {} held no \
                 tensor at exit; {} segments taken, {} given back, {} out of memory",
                f.device,
                human_bytes(f.allocated_peak_bytes),
                human_bytes(f.allocated_at_end_bytes),
                f.tensors_at_end,
                human_bytes(f.reserved_peak_bytes),
                human_bytes(f.reserved_at_end_bytes),
                human_bytes(f.cached_unused_at_end_bytes),
                f.segments_taken,
                f.segments_given_back,
                f.ooms
            );
            if !f.kinds_at_peak.0.is_empty() {
                let _ = writeln!(
                    o,
                    "  tensors by kind at their peak: {}",
                    f.kinds_at_peak.line()
                );
            }
            if f.activations_peak_bytes > 0 {
                let _ = writeln!(
                    o,
                    "  activations at their most: {} (as a backward began)",
                    human_bytes(f.activations_peak_bytes)
                );
            }
            if let Some(b) = &f.kinds_before_shutdown {
                let _ = writeln!(
                    o,
                    "  tensors by kind as the program's code ended ({}, its last allocation \
                     with Python frames): {}",
                    human_duration(b.time_ns),
                    b.kinds.line()
                );
            }
            if !f.kinds_at_exit.0.is_empty() {
                let when = if self.health.running {
                    "now (the process is still running)"
                } else if f.kinds_before_shutdown.is_some() {
                    "at exit, after Python's shutdown freed what the program still held"
                } else {
                    "at exit"
                };
                let _ = writeln!(o, "  tensors by kind {when}: {}", f.kinds_at_exit.line());
            }
        }
    }

    /// What each owner held at exit (or now, in a running process).
    fn render_held(&self, o: &mut String) {
        let mut devices: Vec<u8> = self.held_at_exit.iter().map(|h| h.device).collect();
        devices.dedup();
        for d in devices {
            let parts: Vec<String> = self
                .held_at_exit
                .iter()
                .filter(|h| h.device == d && h.bytes > 0)
                .map(|h| format!("{} {}", h.owner, human_bytes(h.bytes)))
                .collect();
            if !parts.is_empty() {
                let when = if self.health.running {
                    "now"
                } else {
                    "at exit"
                };
                let _ = writeln!(o, "held {when} on device {d}: {}", parts.join(", "));
            }
        }
    }

    /// What the shim's pool did, and whether the process left the legacy stream.
    fn render_pool(&self, o: &mut String) {
        for p in &self.pool {
            let _ = writeln!(
                o,
                "pool on device {}: {} segments reserved ({}), {} released, {} splits, {} waits for the GPU, {} out-of-memory retries",
                p.device,
                p.segments_reserved,
                human_bytes(p.bytes_reserved),
                p.segments_released,
                p.splits,
                p.waits,
                p.oom_retries
            );
            if p.checkpoints > 0 {
                let _ = writeln!(
                    o,
                    "pool on device {}: {} checkpoints (a CUDA event after work that may still use \
                     freed blocks; a block waits until the GPU passes it), passed after {} \
                     (median), {} (longest)",
                    p.device,
                    p.checkpoints,
                    human_duration(p.checkpoint_pass_median_ns),
                    human_duration(p.checkpoint_pass_max_ns)
                );
            }
        }
        match (&self.streams_left_legacy, self.pool.is_empty()) {
            (Some(s), _) => {
                let _ = writeln!(
                    o,
                    "pool: the process left the legacy stream (CUDA's default stream, which runs \
                     all work in order) at {} ({}, stream {:#x}{}): from then on a block freed \
                     with cudaFree waited for the GPU to pass it before reuse, as work on other \
                     streams may still use it",
                    human_duration(s.time_ns),
                    s.api,
                    s.stream,
                    s.site
                        .as_ref()
                        .map(|x| format!(", at {x}"))
                        .unwrap_or_default()
                );
            }
            (None, false) => {
                let _ = writeln!(
                    o,
                    "pool: all work on the legacy stream: blocks freed with cudaFree were reused at once"
                );
            }
            (None, true) => {}
        }
    }

    /// Pinned host memory, frees of unknown pointers, Python frames.
    fn render_misc(&self, o: &mut String) {
        if self.pinned_host_peak_bytes > 0 {
            let _ = writeln!(
                o,
                "pinned host memory: peak {}",
                human_bytes(self.pinned_host_peak_bytes)
            );
        }
        if self.unmatched_frees > 0 {
            let _ = writeln!(
                o,
                "{} frees of pointers not allocated in this trace",
                self.unmatched_frees
            );
        }
        if let Some(p) = &self.python_frames {
            let _ = write!(
                o,
                "Python frames: {} of {} allocations",
                p.allocations_with, p.allocations
            );
            if p.allocations_with < p.allocations {
                let _ = write!(
                    o,
                    " (the others were made where Python frames cannot be read: a thread not \
                     running Python, interpreter start or exit)"
                );
            }
            let _ = writeln!(o);
        }
    }

    /// The trace's own health: records, losses, checkpoint, damage.
    fn render_health(&self, o: &mut String) {
        let h = &self.health;
        let _ = writeln!(
            o,
            "trace: {} records, {} torn, {} lost, {} missing past the end of the file{}",
            h.committed,
            h.torn,
            h.lost,
            h.truncated,
            if h.clean_exit {
                ""
            } else if h.running {
                "; the process is still running"
            } else {
                "; the process did not exit cleanly"
            }
        );
        if h.summarized > 0 || h.unsummarized > 0 {
            let _ = writeln!(
                o,
                "trace of any length: {} earlier records summarized in its checkpoint (the \
                 reports cover them; the records above are the recent ones in detail){}",
                h.summarized,
                if h.unsummarized > 0 {
                    format!(
                        "; {} records left the ring before they were summarized (raise \
                         trace_max)",
                        h.unsummarized
                    )
                } else {
                    String::new()
                }
            );
        }
        if h.summarized_late > 0 {
            let _ = writeln!(
                o,
                "{} records were written after the summarizer passed their place (their \
                 threads were held up between taking the place and writing it): summarized \
                 late, after records that followed them",
                h.summarized_late
            );
        }
        if h.summed > 0 {
            let _ = writeln!(
                o,
                "the checkpoint had no room to list {} live allocations ({}) one by one: they \
                 are summed by call site, and a later free of one is not matched (raise \
                 trace_max)",
                h.summed,
                human_bytes(h.summed_bytes)
            );
        }
        if let Some(why) = &h.checkpoint_refused {
            let _ = writeln!(
                o,
                "the trace lies: {why}; its checkpoint is not read, and what it summarized is \
                 counted as left the ring"
            );
        }
        if h.checkpoints_failed > 0 {
            let _ = writeln!(
                o,
                "{} checkpoints did not fit their slot (raise trace_max): the records between \
                 the last one written and the ring's oldest are counted as left the ring",
                h.checkpoints_failed
            );
        }
        if let Some(w) = &h.live_figures {
            let _ = writeln!(o, "live figures above: {w}");
        }
        if let Some(d) = &h.damage {
            let _ = writeln!(o, "damage: {d}");
        }
    }
}
