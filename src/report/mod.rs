//! The reports, in one direction. [`analysis`], on top, opens a trace and reads it in the
//! passes a command needs, the only code that opens or rereads one; every tracker of its passes
//! has one shape ([`pass`]). Below it the reports take what it found: [`summary`], [`peak`],
//! [`leaks`] (with growth per iteration), [`oom`] post-mortems, [`fit`], memory over the run
//! ([`timeline`]), several traces together ([`job`]), what-if replays through the shim's pool
//! ([`pool_replay`]) and through PyTorch's allocator modelled ([`torch_allocator`]), written
//! as text by a layer of its own ([`render`]) that no report uses. Below them
//! what they share: the replay of what is live ([`live`]), the tensors' kinds ([`kinds`]),
//! moments taken during a pass ([`moments`], [`early`]), call sites and ranges named
//! ([`sites`]) with frames from the binaries ([`symbolize`]). Memory grows with the live
//! allocations and the distinct call sites, never with the length of the trace.

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

pub mod pool_replay;
pub mod render;
pub mod sites;
pub mod summary;
pub mod symbolize;
pub mod timeline;
pub mod torch_allocator;
pub mod units;

pub use analysis::filter_keeps_any;
pub use analysis::{leaks, oom, peak, summarize};
pub use leaks::{Growth, Iterations, JobGrowth, JobLeaks, Leaks, combine_leaks};
pub use live::{Change, Live, Replay, replay_each, site_key};
pub use oom::Oom;
pub use peak::{JobPeak, Peak, combine_peaks};
pub use sites::{Holder, merge_holders, range_label, site_label};
