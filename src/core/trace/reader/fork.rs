//! Reading a batch at a time, and a second reader of the same file from its first record
//! while the first reads on.

use super::*;

/// What a reader's decoder started from, kept so that a second reader of the same open file
/// can start there too.
#[derive(Clone)]
pub(super) struct Template {
    /// The descriptor the trace was opened with, and the file it named then (device, inode).
    fd: std::os::fd::RawFd,
    id: (u64, u64),
    checkpoint: std::sync::Arc<Vec<[u8; RECORD_SIZE]>>,
    first_offset: u64,
    stats: DecodeStats,
    /// The first record index, the end of the extent, a ring's slots (0: none).
    extent: (u64, u64, u64),
    /// How its decoders read (mapped or not, on a thread of their own or not).
    mode: ReadMode,
}

impl Template {
    pub(super) fn of(
        file: &File,
        meta: &std::fs::Metadata,
        checkpoint: &std::sync::Arc<Vec<[u8; RECORD_SIZE]>>,
        first_offset: u64,
        stats: &DecodeStats,
        extent: (u64, u64, u64),
        mode: &ReadMode,
    ) -> Template {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        Template {
            fd: file.as_raw_fd(),
            id: (meta.dev(), meta.ino()),
            checkpoint: checkpoint.clone(),
            first_offset,
            stats: stats.clone(),
            extent,
            mode: mode.clone(),
        }
    }

    /// A decoder of `file` at its first record (the file positioned there, or rewound).
    pub(super) fn decoder(&self, file: File) -> decode::Decoder {
        let prefix = restoring_prefix(&self.checkpoint);
        let (start, end, ring) = self.extent;
        decode::Decoder {
            input: file,
            mode: self.mode.clone(),
            next: start,
            end,
            start,
            ring,
            ckpt: decode::CheckpointRead {
                bodies: self.checkpoint.clone(),
                at: 0,
                prefix,
                first_prefix: prefix,
            },
            stats: self.stats.clone(),
            pending: None,
            order: decode::Reorder::default(),
            drained: false,
            follow: None,
            paused: false,
            first: decode::FirstRead {
                offset: self.first_offset,
                stats: self.stats.clone(),
            },
            chunk: decode::Chunk::default(),
            defs: Vec::new(),
            finished: false,
            batch: 0,
            spares: Default::default(),
            joining: decode::Joining::default(),
        }
    }
}

/// Records a reader handed on by [`TraceReader::next_held`]: a batch of its own, or one it
/// shares with other readers of the same records.
#[derive(Default)]
pub struct Held {
    own: Vec<Record>,
    shared: Option<source::Shared>,
}

impl Held {
    /// The records, in time order.
    pub fn records(&self) -> &[Record] {
        match &self.shared {
            Some(b) => &b.records,
            None => &self.own,
        }
    }

    /// Lets go of a shared batch: the last of its readers keeps its room for the decoder.
    fn release(&mut self, spares: &decode::Spares) {
        if let Some(b) = self.shared.take().and_then(std::sync::Arc::into_inner) {
            spares.give(b.records);
        }
    }
}

impl TraceReader {
    /// The decoder's next batch, its definitions applied and its records counted (for
    /// [`records_read`]); `None` at the end, where the first time what a whole pass decodes is
    /// counted.
    pub(super) fn take_batch(&mut self) -> Option<Vec<Record>> {
        let b = self.take_shared()?;
        let mut b = source::own(b, &self.spares);
        self.apply(std::mem::take(&mut b.defs));
        Some(b.records)
    }

    /// [`TraceReader::take_batch`] as the source hands the batch on, shared with any other
    /// reader of it: counted, and its fields but its definitions taken (applied by the caller).
    fn take_shared(&mut self) -> Option<source::Shared> {
        let Some(b) = self.source.next_shared() else {
            if let Some(f) = &mut self.following {
                f.read_out = true;
            }
            if !self.pass_count.whole_counted {
                // A followed reader's pass ends at each look: each record counted once.
                self.pass_count.whole_counted = self.following.is_none();
                ReadCounts::add(
                    &self.tables.mode.counts.held,
                    self.pass_count
                        .pass_decoded
                        .saturating_sub(self.pass_count.held),
                );
                self.pass_count.held = self.pass_count.held.max(self.pass_count.pass_decoded);
            }
            return None;
        };
        let n = b.records.len() as u64;
        if !self.second {
            ReadCounts::add(&self.tables.mode.counts.decoded, n);
            self.pass_count.pass_decoded = self.pass_count.pass_decoded.saturating_add(n);
        }
        (self.restoring, self.tables.stats, self.next) = (b.restoring, b.stats.clone(), b.next);
        Some(b)
    }

    /// The next records in time order, as [`TraceReader::next_batch`] gives them, but held in
    /// `held` as the decoder handed them on: a batch shared by several readers of the same
    /// records (the page's groups of trackers) is read where it lies, not copied for each.
    /// A filtered reader, or one that has read records one by one, reads its own copy.
    pub fn next_held(&mut self, held: &mut Held) -> bool {
        if self.filtering.is_some() || !self.batch.is_empty() {
            held.release(&self.spares);
            return self.next_batch(&mut held.own);
        }
        loop {
            held.release(&self.spares);
            let Some(b) = self.take_shared() else {
                return false;
            };
            self.apply(b.defs.clone());
            let n = b.records.len();
            held.shared = Some(b);
            if n == 0 {
                continue;
            }
            self.handed_on(n);
            return true;
        }
    }

    /// The next records in time order that the filter keeps, as [`Iterator::next`] returns them
    /// one by one, a batch at a time into `out` (cleared first; its allocation may be replaced):
    /// `false` once every record was returned. The hot loops of the reports read this way, a
    /// record costing them no call. Definitions are applied before the batch's records.
    pub fn next_batch(&mut self, out: &mut Vec<Record>) -> bool {
        out.clear();
        while out.is_empty() {
            if self.batch.is_empty() {
                let Some(records) = self.take_batch() else {
                    return false;
                };
                self.spares.give(std::mem::replace(out, records));
            } else {
                out.extend(self.batch.drain(..));
            }
            self.handed_on(out.len());
            // A checkpoint's state is the whole run's before the ring: filters apply to the
            // records after it.
            if let Some(f) = &mut self.filtering
                && !self.restoring
            {
                let strings = &self.tables.defs.strings;
                out.retain(|r| f.keep(r, strings));
            }
        }
        true
    }

    /// `n` more records handed on: progress said every million or so.
    fn handed_on(&mut self, n: usize) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.since_progress = self.since_progress.saturating_add(n);
        if self.since_progress >= 1 << 20 {
            self.since_progress = 0;
            if let Some(hook) = self.progress {
                hook(self.next, self.end);
            }
        }
    }

    /// What a second reader of this trace reads with: this one's options, but no progress.
    fn second_options(&self) -> ReadOptions {
        ReadOptions {
            filter: self.filter.clone(),
            symbols: self.tables.naming.symbols,
            mode: self.mode.clone(),
            progress: None,
            native_frames: self.tables.naming.native_frames,
            program_frames: self.tables.naming.program_frames,
            ..ReadOptions::default()
        }
    }

    /// `n` more readers of the records this one is about to read, for work on other threads:
    /// this reader's decoder hands each batch it decodes to all of them, shared (read where it
    /// lies with [`TraceReader::next_held`]), so the file is read and decoded once for all.
    /// Only before the first record is read (empty after, or where the decoder cannot have a
    /// thread of its own: one core, or `ReadMode::decode_apart` off). They
    /// read in step, a few batches apart at most: each must be read on (or dropped), and the
    /// others read to their end or dropped before this one is rewound.
    pub fn pairs(&mut self, n: usize) -> Vec<TraceReader> {
        if n == 0 {
            return Vec::new();
        }
        let source::Source::Pending(_) = &self.source else {
            return Vec::new();
        };
        let source::Source::Pending(d) = std::mem::replace(&mut self.source, source::Source::Gone)
        else {
            return Vec::new();
        };
        let (mine, theirs) = match source::Source::start_shared(d, n) {
            Ok(sources) => sources,
            Err(d) => {
                self.source = source::Source::Pending(d);
                return Vec::new();
            }
        };
        self.source = mine;
        let opts = self.second_options();
        let readers: Vec<TraceReader> = theirs
            .into_iter()
            .map(|theirs| {
                let mut reader = TraceReader::with_source(
                    self.tables.info.clone(),
                    (theirs, self.spares.clone()),
                    self.template.clone(),
                    self.tables.stats.clone(),
                    (self.next, self.end),
                    &opts,
                );
                (reader.pass_count.whole_counted, reader.second) = (true, true);
                reader
            })
            .collect();
        if !readers.is_empty() {
            let counts = &self.tables.mode.counts;
            ReadCounts::add(&counts.paired, 1);
            ReadCounts::most(&counts.readers, readers.len() as u64 + 1);
        }
        readers
    }

    /// A second reader of this trace, from its first record: the same file (the descriptor
    /// this one was opened with, opened anew for an offset of its own, and checked to be the
    /// same file), the same extent and checkpoint, the same options but no progress; it reads
    /// the records this one reads, at the same indices, while this one reads on. Counted as a
    /// pass, not an opening.
    pub fn fork(&self) -> Result<TraceReader, ReadError> {
        let t = &self.template;
        let path = self.tables.info.path.clone();
        let io_err = |e| ReadError::Io(path.clone(), e);
        let (file, _) = self.same_file()?;
        let mut d = t.decoder(file);
        d.rewind().map_err(io_err)?;
        let opts = self.second_options();
        let extent = (t.extent.0, self.end);
        let mut reader = TraceReader::at_start(
            self.tables.info.clone(),
            d,
            t.clone(),
            t.stats.clone(),
            extent,
            &opts,
        );
        reader.pass_count.whole_counted = true;
        ReadCounts::add(&self.tables.mode.counts.passes, 1);
        Ok(reader)
    }

    /// The file this reader was opened with, opened anew through its descriptor (an offset of
    /// its own, at its start) and checked to be the same file (device and inode).
    fn same_file(&self) -> Result<(File, std::fs::Metadata), ReadError> {
        let t = &self.template;
        super::opening::reopen(t.fd, t.id)
            .map_err(|e| ReadError::Io(self.tables.info.path.clone(), e))
    }

    /// A reader of this trace as `opts` says (another checkpoint of a ring, another filter),
    /// from its first record: the same file, through the descriptor this one was opened with
    /// (whatever has been renamed or linked since), its header read again. Counted as a pass,
    /// not an opening: a command that needs two reads of a trace (a replay of PyTorch's
    /// allocator reads a lapped ring from its older checkpoint, unfiltered) reads one file.
    pub fn reopen_with(&self, opts: &ReadOptions) -> Result<TraceReader, ReadError> {
        let (file, meta) = self.same_file()?;
        // Counted with this reader's command, whatever the options say of it.
        let counts = self.tables.mode.counts.clone();
        let opts = ReadOptions {
            mode: ReadMode {
                counts: counts.clone(),
                ..opts.mode.clone()
            },
            ..opts.clone()
        };
        let reader =
            TraceReader::of_header(head::header_of(file, meta, &self.tables.info.path)?, &opts)?;
        ReadCounts::add(&counts.passes, 1);
        Ok(reader)
    }
}
