//! The trace file format, shared by the writer (the shim) and the reader (the command).
//!
//! A trace is one file: a 4 KiB header followed by fixed-size 32-byte records, all little-endian.
//! Record `i` lives at `HEADER_SIZE + i * RECORD_SIZE`. Writers claim an index with one atomic
//! add on the header's `claimed` counter, fill the record, and store the commit word last with
//! release ordering. A record whose commit word does not match its index was claimed but never
//! finished (the process died in between): the reader counts it as torn and decodes nothing from
//! it.

mod kinds;
/// The codes of a `Restore` record: the checkpoint's own format, kept with the rest of it.
pub use crate::trace::checkpoint::codes as restore;
pub mod ring;

pub use kinds::{Api, RecordKind, graph, tensors_off};

/// First eight bytes of every trace.
pub const MAGIC: [u8; 8] = *b"GPUSHIM\0";
/// Bumped whenever the layout of the header or of a record changes.
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 4096;
pub const RECORD_SIZE: usize = 32;

/// Byte offsets of the header fields.
pub mod header {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const RECORD_SIZE: usize = 12;
    pub const HEADER_SIZE: usize = 16;
    pub const PID: usize = 20;
    pub const RANK: usize = 24;
    pub const FLAGS: usize = 28;
    /// `CLOCK_REALTIME` at the moment the clock origin was taken, in ns since the Unix epoch.
    pub const START_REALTIME_NS: usize = 32;
    /// `CLOCK_MONOTONIC` origin: record timestamps are ns since this instant.
    pub const START_MONOTONIC_NS: usize = 40;
    /// Atomic: records claimed so far (the next free index).
    pub const CLAIMED: usize = 64;
    /// Atomic: records lost because the trace reached its size cap.
    pub const LOST: usize = 72;
    /// Atomic: the largest number of records the file may hold (in a ring: the ring's slots).
    pub const CAPACITY: usize = 80;
    /// Non-zero when the records form a ring (see [`super::ring`]): record `i` lives in slot
    /// `i % CAPACITY`, and what the oldest said is kept in the newest checkpoint.
    pub const RING: usize = 88;
    /// Atomic: records that left the ring before the summarizer read them (it fell behind).
    pub const SUMMARY_LOST: usize = 96;
    /// File offset of the checkpoint area (two slots, one after the other).
    pub const CHECKPOINT_AREA: usize = 104;
    /// Bytes of one checkpoint slot.
    pub const CHECKPOINT_SLOT_BYTES: usize = 112;
    /// Atomic: checkpoints that did not fit their slot (or could not be written).
    pub const CHECKPOINTS_FAILED: usize = 120;
    /// Atomic: definitions (strings, stacks, modules) the shim could not keep apart from the
    /// ring (its log of them was full): one the ring overwrote before it was summarized is
    /// lost, and the reports say so where they would name it.
    pub const DEFINITIONS_DROPPED: usize = 3456;
    /// Atomic: ring records the summarizer found empty when it passed their slot and read
    /// later, once written (a writer held up between claiming its slot and writing it): they
    /// are in the checkpoints from then on, applied after records that followed them.
    pub const SUMMARY_LATE: usize = 3464;
    /// What each device is made of, as CUDA said (one 8-byte word per CUDA ordinal, up to
    /// [`DEVICES_MAX`]): its streaming multiprocessors in the low 32 bits, the most threads
    /// one of them runs at once in the high 32; 0 where not known. PyTorch sizes its
    /// reductions' grids by them, and with them the scratch buffers of a global reduction
    /// (see `docs/fit.md`). Zero in traces from before it was kept.
    pub const DEVICES: usize = 3472;
    pub const DEVICES_MAX: usize = 16;
    /// Each device's memory as CUDA counts it (`cuDeviceTotalMem`: the total `cudaMemGetInfo`
    /// and PyTorch give), one 8-byte word per CUDA ordinal up to [`DEVICES_MAX`]; 0 where not
    /// known. NVML's total is larger by what the driver keeps for itself, which no process
    /// can allocate: `fit`'s limit is this one (see `docs/fit.md`).
    pub const DEVICE_MEMORY: usize = 3600;
    /// Two checkpoint descriptors of [`super::ring::DESCRIPTOR_BYTES`] each (see
    /// [`super::ring::Descriptor`]).
    pub const CHECKPOINTS: usize = 2304;
    /// NUL-separated `NAME=value` settings of the program's libraries at the start (PyTorch's
    /// `PYTORCH_ALLOC_CONF`, `PYTORCH_CUDA_ALLOC_CONF`): `simulate --torch` replays them.
    /// Empty in traces from before it was kept.
    pub const ENV: usize = 2432;
    pub const ENV_LEN: usize = 1024;
    pub const HOST: usize = 128;
    pub const HOST_LEN: usize = 64;
    pub const PROGRAM: usize = 192;
    pub const PROGRAM_LEN: usize = 64;
    /// NUL-separated command line, truncated to fit.
    pub const CMDLINE: usize = 256;
    pub const CMDLINE_LEN: usize = 2048;
}

/// Header flag: the process reached `exit` and closed the trace cleanly.
pub const FLAG_CLEAN_EXIT: u32 = 1;

/// Byte offsets inside a record.
pub mod record {
    /// u16 commit word, written last. Equals [`super::commit_tag`] of the record's index.
    pub const COMMIT: usize = 0;
    pub const KIND: usize = 2;
    pub const API: usize = 3;
    pub const DEVICE: usize = 4;
    pub const STATUS: usize = 5;
    pub const THREAD: usize = 6;
    pub const TIME_NS: usize = 8;
    pub const PTR: usize = 16;
    /// Low 48 bits: size in bytes. High 16 bits: interned stream index (0 when no stream).
    pub const SIZE_STREAM: usize = 24;
}

/// The largest size a record holds exactly (256 TiB); larger sizes are clamped to it.
pub const SIZE_MAX: u64 = (1 << 48) - 1;

/// The commit word for record `index`: never zero, and different for neighbouring records, so a
/// record copied to the wrong place or left over from garbage is caught.
pub const fn commit_tag(index: u64) -> u16 {
    (index as u16 & 0x7fff) | 0x8000
}

/// Bytes of string text one `StringData` record carries.
pub const STRING_BYTES_PER_RECORD: usize = 16;
/// Longest string stored; longer ones are cut.
pub const STRING_MAX: usize = 256;

/// Bytes of a build-id the shim records (GNU ld writes 20, a SHA-1; `--build-id=0x...` any
/// number): its hex text fits in a string.
pub const BUILD_ID_MAX: usize = 64;

/// Device number used when the device is not known.
pub const DEVICE_UNKNOWN: u8 = 0xff;

/// Status stored for a result code that does not fit in a byte.
pub const STATUS_OTHER: u8 = 0xff;

pub const fn status_byte(code: i32) -> u8 {
    if code >= 0 && code < STATUS_OTHER as i32 {
        code as u8
    } else {
        STATUS_OTHER
    }
}

/// One decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: RecordKind,
    pub api: Api,
    pub device: u8,
    /// The CUDA result code, as [`status_byte`] stored it.
    pub status: u8,
    pub thread: u16,
    pub time_ns: u64,
    pub ptr: u64,
    pub size: u64,
    pub stream: u16,
}

impl Record {
    /// Encodes everything but the commit word, which the writer stores last.
    /// Whether the call failed: a CUDA result code other than success. PyTorch's segment
    /// records use the byte to say "pages mapped" instead (see `SegmentReserve`).
    pub fn failed(&self) -> bool {
        self.status != 0
            && !(self.api == Api::Torch
                && matches!(
                    self.kind,
                    RecordKind::SegmentReserve | RecordKind::SegmentRelease
                ))
    }

    /// A PyTorch segment record of pages mapped or unmapped in an expandable segment.
    pub fn mapped_pages(&self) -> bool {
        self.api == Api::Torch
            && self.status == 1
            && matches!(
                self.kind,
                RecordKind::SegmentReserve | RecordKind::SegmentRelease
            )
    }

    pub fn encode_body(&self, out: &mut [u8; RECORD_SIZE]) {
        out[record::KIND] = self.kind as u8;
        out[record::API] = self.api as u8;
        out[record::DEVICE] = self.device;
        out[record::STATUS] = self.status;
        out[record::THREAD..record::THREAD + 2].copy_from_slice(&self.thread.to_le_bytes());
        out[record::TIME_NS..record::TIME_NS + 8].copy_from_slice(&self.time_ns.to_le_bytes());
        out[record::PTR..record::PTR + 8].copy_from_slice(&self.ptr.to_le_bytes());
        let size_stream = self.size.min(SIZE_MAX) | (u64::from(self.stream) << 48);
        out[record::SIZE_STREAM..record::SIZE_STREAM + 8]
            .copy_from_slice(&size_stream.to_le_bytes());
    }

    /// Decodes a committed record body; `None` when the kind or API byte is not one we know.
    // Always inlined: called, its record comes back through memory, and reading it there
    // stalled the decoder's loop (store forwarding) for longer than the decoding took.
    #[inline(always)]
    pub fn decode(bytes: &[u8; RECORD_SIZE]) -> Option<Record> {
        let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let size_stream = u64_at(record::SIZE_STREAM);
        Some(Record {
            kind: RecordKind::from_u8(bytes[record::KIND])?,
            api: Api::from_u8(bytes[record::API])?,
            device: bytes[record::DEVICE],
            status: bytes[record::STATUS],
            thread: u16_at(record::THREAD),
            time_ns: u64_at(record::TIME_NS),
            ptr: u64_at(record::PTR),
            size: size_stream & SIZE_MAX,
            stream: (size_stream >> 48) as u16,
        })
    }

    #[inline]
    pub fn commit_of(bytes: &[u8; RECORD_SIZE]) -> u16 {
        u16::from_le_bytes([bytes[record::COMMIT], bytes[record::COMMIT + 1]])
    }
}

/// A stack frame that is a Python frame rather than a return address: the top byte is this
/// tag (no user-space address has it), bits 24..56 hold the id of the interned string
/// `file\0function`, bits 0..24 the line. Stacks list Python frames first, innermost first,
/// then any native frames.
pub const PY_FRAME_TAG: u64 = 0xfe << 56;

/// The stack frame of a Python frame (see [`PY_FRAME_TAG`]); a line past 2^24 - 1 saturates.
pub fn py_frame(string_id: u64, line: u32) -> u64 {
    PY_FRAME_TAG | ((string_id & 0xffff_ffff) << 24) | u64::from(line.min(0xff_ffff))
}

/// The string id and line of a Python frame; `None` for a native frame.
pub fn as_py_frame(frame: u64) -> Option<(u64, u32)> {
    (frame >> 56 == PY_FRAME_TAG >> 56)
        .then_some(((frame >> 24) & 0xffff_ffff, frame as u32 & 0xff_ffff))
}

#[cfg(test)]
mod tests;
