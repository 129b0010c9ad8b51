//! `oom` as text: each failed allocation with what held memory then.

use super::holders::holders_text;
use crate::report::oom::*;
use crate::report::units::{self, human_bytes};
use std::fmt::Write as _;

/// Why a request failed while the pool held a free block large enough for it, when the pool's
/// rules say: a request above 1 MiB and up to 10 MiB gets a segment of its own (rounded up to
/// 2 MiB) unless `medium` is set, so free room inside other segments cannot serve it.
fn unused_room(o: &Oom) -> Option<String> {
    const MIB: u64 = 1 << 20;
    (o.largest_free_block >= o.requested_bytes
        && o.requested_bytes > MIB
        && o.requested_bytes <= 10 * MIB)
        .then(|| {
            format!(
                "the pool held a free block of {} but a request above 1 MiB and up to 10 MiB \
                 gets a segment of its own unless medium is set: GPUSHIM_CONF=medium:20MiB cuts \
                 such requests from shared segments (gpushim config medium says more)",
                human_bytes(o.largest_free_block)
            )
        })
}

/// The text `gpushim oom` prints for one trace's failed allocations.
pub fn render_ooms(trace: &str, ooms: &[Oom]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}: {} failed allocation(s)", trace, ooms.len());
    for o in ooms {
        let _ = writeln!(
            out,
            "at {}: {} of {} failed with {} on device {}{}",
            units::human_duration(o.time_ns),
            o.api,
            human_bytes(o.requested_bytes),
            error_name_of(o.status, &o.api),
            o.device,
            if o.limit_hit {
                " (the pool's limit, not the device)"
            } else {
                ""
            }
        );
        if let Some(site) = &o.request_site {
            let _ = writeln!(out, "  asked for at {site}");
        }
        let _ = writeln!(
            out,
            "  live {}, reserved {}, cached (reserved, not live) {}, largest free block in the pool {}",
            human_bytes(o.live_bytes),
            human_bytes(o.reserved_bytes),
            human_bytes(o.cached_bytes),
            human_bytes(o.largest_free_block)
        );
        if !o.steps.is_empty() {
            let _ = writeln!(out, "  one failure, in {} steps:", o.steps.len());
            for (k, st) in o.steps.iter().enumerate() {
                let what = if st.api == "torch_allocator" {
                    "PyTorch raised out of memory for the tensor".to_string()
                } else if k > 0 {
                    let before = o.steps[k - 1].reserved_bytes;
                    let gave = before.saturating_sub(st.reserved_bytes);
                    format!(
                        "{} of {} failed again{} ({} reserved)",
                        st.api,
                        human_bytes(st.requested_bytes),
                        if gave > 0 {
                            format!(
                                ", after PyTorch gave back {} of its cache",
                                human_bytes(gave)
                            )
                        } else {
                            String::new()
                        },
                        human_bytes(st.reserved_bytes)
                    )
                } else {
                    format!(
                        "{} of {} failed ({} reserved)",
                        st.api,
                        human_bytes(st.requested_bytes),
                        human_bytes(st.reserved_bytes)
                    )
                };
                let _ = writeln!(out, "    {}: {what}", units::human_duration(st.time_ns));
            }
        }
        if let Some(f) = o.device_free_bytes {
            let _ = writeln!(out, "  CUDA said {} free at the failure", human_bytes(f));
        }
        if let Some(why) = unused_room(o) {
            let _ = writeln!(out, "  {why}");
        }
        if !is_out_of_memory(o.status) && !o.limit_hit && o.api != "torch_allocator" {
            let _ = writeln!(
                out,
                "  not out of memory: no memory freed would have served it; what the code says \
                 is what to mend"
            );
            if o.holders.is_empty() {
                continue;
            }
        }
        if !o.by_kind.0.is_empty() {
            let _ = writeln!(out, "  PyTorch's tensors by kind: {}", o.by_kind.line());
        }
        let _ = writeln!(out, "  holding the most:");
        if o.holders.is_empty() {
            let _ = writeln!(out, "    nothing: no allocation was live");
        }
        out.push_str(&holders_text(&o.holders, 5, "    "));
    }
    out
}
