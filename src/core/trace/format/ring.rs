//! A trace of any length: the records form a ring, and a helper thread of the traced process
//! keeps what the oldest records said in a checkpoint.
//!
//! The ring holds `CAPACITY` slots; record `i` (the `i`-th claimed) lives in slot
//! `i % CAPACITY` and carries the commit word of `i`, so a slot left over from an earlier lap is
//! told from a record of this one. The checkpoint area after the ring holds two slots, written
//! in turn; a descriptor in the header says which records a checkpoint covers. A checkpoint is
//! itself a stream of records (definitions verbatim, then `Restore` and `Holding` records and
//! the live allocations), so the reader decodes it as it decodes the ring: the newest
//! checkpoint first, then every ring record from the index it covers on.

/// Bytes of one checkpoint descriptor in the header.
pub const DESCRIPTOR_BYTES: usize = 32;

/// The largest checkpoint slot a writer lays out (a checkpoint of a million live allocations
/// and 16,384 deep stacks fits): a reader believes no larger one.
pub const MAX_CHECKPOINT_SLOT: u64 = 256 << 20;

/// Where the checkpoint area of a ring of `capacity` records starts: the first 4 KiB boundary
/// after the records (`None` past 2^64).
pub fn checkpoint_area(capacity: u64) -> Option<u64> {
    capacity
        .checked_mul(super::RECORD_SIZE as u64)?
        .checked_add(super::HEADER_SIZE as u64)?
        .checked_next_multiple_of(4096)
}

/// A checkpoint descriptor: `seq` is written last (0: empty), so a reader that finds the
/// same non-zero `seq` before and after reading the slot read a whole checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Which checkpoint this is (1, 2, ...); the larger of the two is the newest.
    pub seq: u64,
    /// Records in the slot.
    pub records: u64,
    /// Every ring record with a smaller index is in the checkpoint.
    pub covered: u64,
    /// A checksum of the slot's records (FNV-1a of their bytes, see [`checksum`]).
    pub checksum: u64,
}

impl Descriptor {
    pub fn decode(b: &[u8]) -> Descriptor {
        let at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        Descriptor {
            seq: at(0),
            records: at(8),
            covered: at(16),
            checksum: at(24),
        }
    }
}

/// The checksum of a checkpoint's bytes.
pub fn checksum(bytes: &[u8]) -> u64 {
    checksum_on(CHECKSUM_START, bytes)
}

/// Where [`checksum`] starts: a checkpoint read in pieces goes on from it with
/// [`checksum_on`].
pub const CHECKSUM_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The checksum `h` of the bytes before, taken on through `bytes`.
pub fn checksum_on(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
