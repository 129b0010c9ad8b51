//! The reports, all over one replay of what is live ([`analysis::Replay`]): [`summary`],
//! peak, leaks and OOM post-mortems ([`analysis`]), what-if replays under other pool settings
//! ([`simulate`]), and frames named from the binaries ([`symbolize`]).

pub mod analysis;
pub mod simulate;
pub mod summary;
pub mod symbolize;
