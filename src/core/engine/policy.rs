//! What shapes the engine: its size classes and the knobs of `GPUSHIM_CONF` ([`Policy`]), and
//! how a request's size is rounded.

use crate::config::Conf;

/// The pool key of allocations that are not stream-ordered (`cudaMalloc`, `cuMemAlloc`): no
/// stream has it, so no stream may reuse a block freed into it before its fence passed.
pub const SYNC_KEY: u64 = u64::MAX;

/// The smallest block; every size is a multiple of it.
pub const GRANULE: u64 = 512;
/// Requests up to this size are "small" and come from small segments.
pub const SMALL_REQUEST: u64 = 1 << 20;
/// The size of a small segment.
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Large segments are multiples of this.
pub const LARGE_SEGMENT_ROUND: u64 = 2 << 20;
/// With `medium`, requests above [`SMALL_REQUEST`] and up to this share segments.
pub const MEDIUM_REQUEST: u64 = 10 << 20;

/// The knobs of `GPUSHIM_CONF` that shape the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub round_divisions: u32,
    pub max_split: u64,
    /// Segment size shared by requests above 1 MiB and up to [`MEDIUM_REQUEST`]; 0 for none.
    pub medium_segment: u64,
    pub release: u64,
    /// Per device, 0 for none.
    pub limit: u64,
    /// Large blocks come from one segment per device and stream that grows in place (mapped
    /// page by page behind a reserved address range) instead of new segments.
    pub expandable: bool,
    /// A synchronous free (`cudaFree`) that leaves a segment with nothing allocated gives it
    /// back at once, as CUDA would (`trim:0`).
    pub release_on_free: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::from(&Conf::default())
    }
}

impl From<&Conf> for Policy {
    fn from(c: &Conf) -> Self {
        Policy {
            round_divisions: c.round,
            max_split: c.max_split,
            medium_segment: c.medium,
            release: c.release,
            limit: c.limit,
            expandable: c.pool == crate::config::Pool::Expandable,
            release_on_free: c.trim == crate::config::Trim::After(0),
        }
    }
}

/// The largest request the engine serves (64 PiB, far past any device). Larger ones fail as
/// out of memory, as CUDA answers them, before any rounding could wrap around 2^64.
pub const MAX_REQUEST: u64 = 1 << 56;

/// The size a request is served with: a multiple of [`GRANULE`], and with `divisions` > 0
/// rounded up to one of `divisions` steps of its power-of-two interval (PyTorch's
/// `roundup_power2_divisions`), which makes sizes that vary a little share blocks. `None` when
/// the rounded size does not fit in 64 bits (every size above [`MAX_REQUEST`] is refused
/// before this is asked).
pub fn round_size(size: u64, divisions: u32) -> Option<u64> {
    let size = size.max(1);
    let base = size.checked_next_multiple_of(GRANULE)?;
    if divisions <= 1 || size <= GRANULE * u64::from(divisions) {
        return if divisions == 1 {
            base.checked_next_power_of_two()
        } else {
            Some(base)
        };
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = (floor / u64::from(divisions)).max(GRANULE);
    size.checked_next_multiple_of(step)
}
