//! Record bodies read from the checkpoint, then the file (or the ring), and decoded: commit
//! words checked, definitions gathered from their data records.

use super::*;

impl TraceReader {
    /// The next record body: the checkpoint's first, then the file's (or the ring's).
    pub(super) fn next_body(&mut self, buf: &mut [u8; RECORD_SIZE]) -> Option<(u64, bool)> {
        if self.checkpoint_at < self.checkpoint.len() {
            *buf = self.checkpoint[self.checkpoint_at];
            self.checkpoint_at += 1;
            return Some(((self.checkpoint_at - 1) as u64, true));
        }
        if self.chunk_at == self.chunk_len && !self.refill() {
            return None;
        }
        let at = self.chunk_at * RECORD_SIZE;
        buf.copy_from_slice(&self.chunk[at..at + RECORD_SIZE]);
        self.chunk_at += 1;
        let index = self.next;
        self.next += 1;
        Some((index, false))
    }

    /// Reads the next records of the file into the chunk, as many as it holds and no further
    /// than the ring's end (where the next lap begins at the first slot): `false` at the end,
    /// or where the file cannot be read (said as damage).
    fn refill(&mut self) -> bool {
        if self.next >= self.end {
            return false;
        }
        let index = self.next;
        let mut n = (self.end - index).min(CHUNK_RECORDS as u64);
        if self.ring > 0 {
            if index % self.ring == 0 && index != self.start {
                let home = io::SeekFrom::Start(HEADER_SIZE as u64);
                if let Err(e) = io::Seek::seek(&mut self.input, home) {
                    self.stop(format!("seek failed: {e}"));
                    return false;
                }
            }
            n = n.min(self.ring - index % self.ring);
        }
        let want = n as usize * RECORD_SIZE;
        self.chunk.resize(CHUNK_RECORDS * RECORD_SIZE, 0);
        let mut got = 0;
        while got < want {
            match self.input.read(&mut self.chunk[got..want]) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.next += 1;
                    self.stop(format!("read failed: {e}"));
                    return false;
                }
            }
        }
        (self.chunk_at, self.chunk_len) = (0, got / RECORD_SIZE);
        if self.chunk_len == 0 {
            // The file is shorter than when it was opened.
            self.next += 1;
            self.stop("read failed: the file ends early (it shrank while being read)".into());
            return false;
        }
        true
    }

    /// The next record when it is a plain one (committed, in the chunk, no definition under
    /// way, not a definition itself): most records, decoded straight from the chunk.
    #[inline]
    fn plain_from_chunk(&mut self) -> Option<Record> {
        if self.chunk_at >= self.chunk_len
            || self.checkpoint_at < self.checkpoint.len()
            || self.pending.is_some()
        {
            return None;
        }
        let at = self.chunk_at * RECORD_SIZE;
        let body: &[u8; RECORD_SIZE] = self.chunk.get(at..at + RECORD_SIZE)?.try_into().ok()?;
        if Record::commit_of(body) != format::commit_tag(self.next) {
            return None;
        }
        let r = Record::decode(body)?;
        if matches!(
            r.kind,
            RecordKind::String
                | RecordKind::Stack
                | RecordKind::StringData
                | RecordKind::StackData
                | RecordKind::Module
                | RecordKind::ModuleBuildId
        ) {
            return None;
        }
        self.chunk_at += 1;
        self.next += 1;
        self.stats.committed += 1;
        Some(r)
    }

    pub(super) fn next_in_file(&mut self) -> Option<Record> {
        if let Some(r) = self.plain_from_chunk() {
            return Some(r);
        }
        let mut buf = [0u8; RECORD_SIZE];
        while let Some((index, in_checkpoint)) = self.next_body(&mut buf) {
            let commit = Record::commit_of(&buf);
            if commit == 0 {
                if buf.iter().all(|&b| b == 0) {
                    self.stats.unused += 1;
                } else {
                    self.stats.torn += 1;
                }
                continue;
            }
            if commit != format::commit_tag(index) && self.ring > 0 && !in_checkpoint {
                // A slot this lap's writer claimed and left unused: an earlier lap's record.
                self.stats.unused += 1;
                continue;
            }
            if commit != format::commit_tag(index) {
                if in_checkpoint {
                    // The checkpoint's checksum matched: it cannot be damaged; skip it whole.
                    self.checkpoint_at = self.checkpoint.len();
                    self.checkpoint_prefix = 0;
                    continue;
                }
                self.stop(format!(
                    "commit word {commit:#06x} does not belong to record {index} \
                     (expected {:#06x}): the file is damaged here",
                    format::commit_tag(index)
                ));
                return None;
            }
            match Record::decode(&buf) {
                Some(r) if matches!(r.kind, RecordKind::StringData | RecordKind::StackData) => {
                    self.stats.committed += 1;
                    if let Some((kind, id, len, mut bytes)) = self.pending.take() {
                        let at = format::record::TIME_NS;
                        bytes.extend_from_slice(&buf[at..at + format::STRING_BYTES_PER_RECORD]);
                        if bytes.len() < len {
                            self.pending = Some((kind, id, len, bytes));
                        } else {
                            bytes.truncate(len);
                            self.define(kind, id, bytes);
                        }
                    }
                }
                Some(r) => {
                    self.stats.committed += 1;
                    let len = match r.kind {
                        RecordKind::String => (r.size as usize).min(format::STRING_MAX),
                        RecordKind::Stack => {
                            (r.size as usize).min(crate::trace::unwind::MAX_FRAMES) * 8
                        }
                        RecordKind::Module => {
                            // Another module at this base: its build-id, if any, follows.
                            self.modules.insert(r.ptr, r.size);
                            self.build_ids.remove(&r.ptr);
                            0
                        }
                        RecordKind::ModuleBuildId => {
                            self.build_ids.insert(r.ptr, r.size);
                            0
                        }
                        _ => 0,
                    };
                    if matches!(r.kind, RecordKind::String | RecordKind::Stack) {
                        if len == 0 {
                            self.define(r.kind, r.ptr, Vec::new());
                        } else {
                            self.pending = Some((r.kind, r.ptr, len, Vec::with_capacity(len)));
                        }
                    }
                    return Some(r);
                }
                None => {
                    self.stop(format!(
                        "record {index} has an unknown kind ({}) or API ({}): the file is damaged \
                         here or was written by a newer gpushim",
                        buf[format::record::KIND],
                        buf[format::record::API]
                    ));
                    return None;
                }
            }
        }
        None
    }
}
