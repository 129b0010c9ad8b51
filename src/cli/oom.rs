//! `gpushim oom`: each failed allocation, with what the device held at that moment.

use super::output::{fail, print_holders, print_json};
use gpushim::report::summary::{self, human_bytes};
use gpushim::trace::reader::ReadOptions;
use std::path::PathBuf;
use std::process::ExitCode;

pub fn cmd_oom(traces: &[PathBuf], json: bool, opts: &ReadOptions) -> ExitCode {
    for t in traces {
        let ooms = match gpushim::report::oom(t, opts) {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        if json {
            print_json(&ooms);
            continue;
        }
        println!("{}: {} failed allocation(s)", t.display(), ooms.len());
        for o in &ooms {
            println!(
                "at {}: {} of {} failed with {} on device {}{}",
                summary::human_duration(o.time_ns),
                o.api,
                human_bytes(o.requested_bytes),
                o.status,
                o.device,
                if o.limit_hit {
                    " (the pool's limit, not the device)"
                } else {
                    ""
                }
            );
            if let Some(site) = &o.request_site {
                println!("  asked for at {site}");
            }
            println!(
                "  live {}, reserved {}, cached (reserved, not live) {}, largest free block in the pool {}",
                human_bytes(o.live_bytes),
                human_bytes(o.reserved_bytes),
                human_bytes(o.cached_bytes),
                human_bytes(o.largest_free_block)
            );
            if let Some(f) = o.device_free_bytes {
                println!("  the device said {} free", human_bytes(f));
            }
            println!("  holding the most:");
            print_holders(&o.holders, 5, "    ");
        }
    }
    ExitCode::SUCCESS
}
