//! Interning: strings, call stacks and stream handles, each given a small id the first time
//! it is seen, its definition written to the trace before any record refers to it. Lock-free.

use super::*;

/// Bodies of the longest definition: a stack of 64 frames (two per data record) or a string
/// of 256 bytes (16 per data record), and its head.
const BLOB_BODIES: usize = 1 + {
    let stack = crate::trace::unwind::MAX_FRAMES * 8;
    let longest = if stack > format::STRING_MAX {
        stack
    } else {
        format::STRING_MAX
    };
    longest.div_ceil(format::STRING_BYTES_PER_RECORD)
};

impl Recorder {
    /// The id of a string, writing its definition the first time it is seen. Lock-free; 0
    /// when the table is full or recording is off.
    pub fn intern_string(&self, text: &[u8]) -> u64 {
        let text = &text[..text.len().min(format::STRING_MAX)];
        let (id, _) = self.intern(&self.strings, fnv1a(text) | 1, |r: &Self, id| {
            r.write_blob(
                format::RecordKind::String,
                format::RecordKind::StringData,
                id,
                text.len() as u64,
                text,
            )
        });
        id
    }

    /// The id of a call stack, writing its frames the first time it is seen; the flag says
    /// whether this call wrote it. Lock-free; 0 when the table is full or recording is off.
    pub fn intern_stack(&self, frames: &[u64]) -> (u64, bool) {
        let frames = &frames[..frames.len().min(crate::trace::unwind::MAX_FRAMES)];
        self.intern(
            &self.stacks,
            crate::trace::unwind::hash(frames),
            |r: &Self, id| {
                // Only a stack not seen before is written out (the common case finds it).
                let mut bytes = [0u8; 8 * crate::trace::unwind::MAX_FRAMES];
                for (i, f) in frames.iter().enumerate() {
                    bytes[i * 8..i * 8 + 8].copy_from_slice(&f.to_le_bytes());
                }
                r.write_blob(
                    format::RecordKind::Stack,
                    format::RecordKind::StackData,
                    id,
                    frames.len() as u64,
                    &bytes[..frames.len() * 8],
                )
            },
        )
    }

    /// Interning shared by strings and stacks: the first thread to insert `hash` writes the
    /// definition and then marks it ready; others that find the hash wait for ready, so the
    /// definition is always committed before any record that refers to it. Keys are 64-bit
    /// hashes with the low bit set (the callers' hashes are odd): a slot holds 0 (free), the
    /// key with its low bit cleared (claimed: the definition is being written) or the key
    /// (defined), so the common case, a key defined long ago, reads one word. Two different
    /// values colliding would share an id (odds about 2^-40 at 4096).
    fn intern(&self, keys: &[AtomicU64], hash: u64, write: impl FnOnce(&Self, u64)) -> (u64, bool) {
        // Odd, and its claimed form (even) is never 0, the free slot.
        let hash = if hash | 1 == 1 { 3 } else { hash | 1 };
        let claimed = hash & !1;
        let start = (hash >> 20) as usize % keys.len();
        for probe in 0..keys.len() {
            let k = (start + probe) % keys.len();
            let id = (k + 1) as u64;
            // Looked at before it is claimed: nearly every call finds its key, and a plain load
            // leaves the line shared where a compare-exchange would take it from every other
            // core that reads it.
            let mut seen = keys[k].load(Ordering::Acquire);
            if seen == 0 {
                match keys[k].compare_exchange(0, claimed, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        write(self, id);
                        keys[k].store(hash, Ordering::Release);
                        return (id, true);
                    }
                    Err(now) => seen = now,
                }
            }
            if seen == claimed {
                // Another thread is writing the definition: wait for it (a few hundred ns, or
                // longer where it was preempted: then this thread gives the processor up), so
                // that the reference this thread writes next follows the definition.
                for i in 0..200_000u32 {
                    if keys[k].load(Ordering::Acquire) == hash {
                        break;
                    }
                    if i < 1_000 {
                        core::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                return (id, false);
            }
            if seen == hash {
                return (id, false);
            }
        }
        (0, false)
    }

    /// Writes a definition record (`head`, with `id` and `size`) and the `data` records that
    /// carry `bytes`, 16 per record, all claimed together so they are contiguous in the file.
    fn write_blob(
        &self,
        head: format::RecordKind,
        data: format::RecordKind,
        id: u64,
        size: u64,
        bytes: &[u8],
    ) {
        let per = format::STRING_BYTES_PER_RECORD;
        let mut bodies = [[0u8; RECORD_SIZE]; BLOB_BODIES];
        let pieces = bytes.len().div_ceil(per).min(BLOB_BODIES - 1);
        Record {
            kind: head,
            api: format::Api::Shim,
            device: format::DEVICE_UNKNOWN,
            status: 0,
            thread: 0,
            time_ns: self.now_ns(),
            ptr: id,
            size,
            stream: 0,
        }
        .encode_body(&mut bodies[0]);
        for (piece, body) in bytes.chunks(per).zip(&mut bodies[1..=pieces]) {
            body[format::record::KIND] = data as u8;
            body[format::record::API] = format::Api::Shim as u8;
            let at = format::record::TIME_NS;
            body[at..at + piece.len()].copy_from_slice(piece);
        }
        let bodies = &bodies[..=pieces];
        self.log_definition(bodies);
        let Some(first) = self.claim(bodies.len() as u64) else {
            return;
        };
        for (i, body) in bodies.iter().enumerate() {
            self.write_slot(first + i as u64, body);
        }
    }

    /// Appends a record that defines something later records name (a module), kept apart
    /// from the ring as strings and stacks are. Returns whether the ring took it.
    pub fn append_definition(&self, rec: &Record) -> bool {
        let mut body = [0u8; RECORD_SIZE];
        rec.encode_body(&mut body);
        self.log_definition(&[body]);
        self.append(rec)
    }

    /// The interned index of a stream handle (0 for the null stream), and whether this call
    /// interned it first (the caller then records the handle). Lock-free.
    pub fn intern_stream(&self, handle: u64) -> (u16, bool) {
        if handle == 0 {
            return (0, false);
        }
        let start = (handle.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % STREAM_SLOTS;
        for probe in 0..STREAM_SLOTS {
            let k = (start + probe) % STREAM_SLOTS;
            let slot = &self.streams[k];
            // A load first, as in `intern`.
            let seen = slot.load(Ordering::Acquire);
            let found = if seen == 0 {
                slot.compare_exchange(0, handle, Ordering::AcqRel, Ordering::Acquire)
            } else {
                Err(seen)
            };
            match found {
                Ok(_) => return ((k + 1) as u16, true),
                Err(h) if h == handle => return ((k + 1) as u16, false),
                Err(_) => {}
            }
        }
        (STREAM_OVERFLOW, false)
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
