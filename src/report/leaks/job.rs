//! `leaks` as text, and the leaks of a job's traces together.

use super::Leaks;
use crate::report::sites::{Holder, merge_holders};
use serde::Serialize;
use std::collections::BTreeMap;

/// A call site growing in one or more ranks of a job.
#[derive(Clone, Debug, Serialize)]
pub struct JobGrowth {
    pub call_site: String,
    /// How many traces it grows in.
    pub traces: usize,
    /// Its growth per iteration, added up over those traces.
    pub bytes_per_iteration: u64,
    /// The traces it grows in, as they are named (a rank's, where it grows on some ranks
    /// only: a leak of one rank's own code or data).
    pub in_traces: Vec<String>,
}

/// The leaks of a job's traces together.
#[derive(Clone, Debug, Serialize)]
pub struct JobLeaks {
    pub traces: usize,
    pub live_at_exit_bytes: u64,
    pub live_at_exit: Vec<Holder>,
    /// Traces that did not exit cleanly.
    pub unclean: Vec<String>,
    pub growing: Vec<JobGrowth>,
}

pub fn combine_leaks(all: &[(String, Leaks)]) -> JobLeaks {
    let mut growing: BTreeMap<&str, (u64, Vec<String>)> = BTreeMap::new();
    for (name, it) in all
        .iter()
        .filter_map(|(n, l)| l.iterations.as_ref().map(|it| (n, it)))
    {
        for g in &it.growing {
            let e = growing.entry(g.call_site.as_str()).or_default();
            e.0 = e.0.saturating_add(g.bytes_per_iteration);
            e.1.push(name.clone());
        }
    }
    let mut growing: Vec<JobGrowth> = growing
        .into_iter()
        .map(|(call_site, (bytes, in_traces))| JobGrowth {
            call_site: call_site.to_string(),
            traces: in_traces.len(),
            bytes_per_iteration: bytes,
            in_traces,
        })
        .collect();
    growing.sort_by_key(|g| std::cmp::Reverse(g.bytes_per_iteration));
    JobLeaks {
        traces: all.len(),
        live_at_exit_bytes: all.iter().map(|(_, l)| l.live_at_exit_bytes).sum(),
        live_at_exit: merge_holders(all.iter().flat_map(|(_, l)| &l.live_at_exit)),
        unclean: all
            .iter()
            .filter(|(_, l)| !l.clean_exit)
            .map(|(t, _)| t.clone())
            .collect(),
        growing,
    }
}
