//! The reports, all over one replay of what is live ([`live::Replay`]): [`summary`], [`peak`],
//! [`leaks`] (with growth per iteration), [`oom`] post-mortems, what-if replays under other pool
//! settings ([`simulate`]); call sites and ranges named ([`sites`]) with frames from the binaries
//! ([`symbolize`]). Decoding streams: memory grows with the live allocations and the distinct
//! call sites, never with the length of the trace. Reports that need a moment found by a first
//! pass (the peak) read the trace twice.

pub mod analysis;
pub mod device_memory;
pub mod early;
pub mod fit;
pub mod job;
pub mod kinds;
pub mod leaks;
pub mod live;
pub mod moments;
pub mod oom;
pub mod owners;
pub mod pass;
pub mod peak;

pub mod simulate;
pub mod sites;
pub mod summary;
pub mod symbolize;
pub mod timeline;
pub mod torch_replay;
pub mod units;

pub use analysis::filter_keeps_any;
pub use analysis::{leaks, oom, peak, summarize};
pub use leaks::{Growth, Iterations, JobGrowth, JobLeaks, Leaks, combine_leaks};
pub use live::{Change, Live, Replay, replay_each, site_key};
pub use oom::Oom;
pub use peak::{JobPeak, Peak, combine_peaks};
pub use sites::{Holder, merge_holders, range_label, site_label};
