//! A trace read as its program writes it (`top`): the reader, the replay and the summary's
//! tally kept from one look to the next, each look reading only the records written since
//! (see [`crate::trace::reader::TraceReader::open_following`]); a ring that lapped past the
//! records not yet read is read anew.

use crate::report::Replay;
use crate::report::sites::Holder;
use crate::report::summary::{DeviceSummary, SummaryPass};
use crate::trace::reader::{Look, ReadError, ReadOptions, SETTLED_AFTER, TraceReader};
use std::path::{Path, PathBuf};

/// A trace being watched.
pub struct Watch {
    path: PathBuf,
    opts: ReadOptions,
    reader: TraceReader,
    rp: Replay,
    summary: SummaryPass,
    said: Vec<crate::report::pass::Said>,
}

/// What a look found: the program, whether it still runs, and what `top` shows of it.
pub struct Glance {
    pub program: String,
    pub pid: u32,
    pub running: bool,
    pub duration_ns: u64,
    pub events: u64,
    pub devices: Vec<DeviceSummary>,
    /// Who holds what is live now, by call site.
    pub holders: Vec<Holder>,
    /// A filter was given and has kept no allocation so far (the program may make one later).
    pub kept_nothing: bool,
}

impl Watch {
    /// Opens the trace at `path` to watch (its records are read at the first look).
    pub fn open(path: &Path, opts: &ReadOptions) -> Result<Watch, ReadError> {
        let reader = TraceReader::open_following(path, opts)?;
        Ok(Watch {
            path: path.to_path_buf(),
            opts: opts.clone(),
            summary: SummaryPass::reading(&reader),
            reader,
            rp: Replay::default(),
            said: Vec::new(),
        })
    }

    /// Reads the records written since the last look: what the trace says now. Two looks,
    /// [`SETTLED_AFTER`] apart: what was claimed at the first is final at the second, so every
    /// record claimed before this call is read (but those the reorder window keeps back).
    pub fn look(&mut self) -> Result<Glance, ReadError> {
        self.read_on()?;
        if self.reader.writing() {
            std::thread::sleep(SETTLED_AFTER);
            self.read_on()?;
        }
        let info = self.reader.info();
        let (duration_ns, events, devices) = self.summary.so_far(&self.rp);
        Ok(Glance {
            program: info.program.clone(),
            pid: info.pid,
            running: self.reader.writing(),
            duration_ns,
            events,
            devices,
            holders: crate::report::sites::live_holders(&self.reader, &self.rp).1,
            kept_nothing: self.reader.filter_kept_any() == Some(false),
        })
    }

    /// One look, and the records it lets be read applied.
    fn read_on(&mut self) -> Result<(), ReadError> {
        if self.reader.look()? == Look::Lapped {
            *self = Watch::open(&self.path, &self.opts)?;
        }
        let mut batch = Vec::new();
        while self.reader.next_batch(&mut batch) {
            for r in &batch {
                self.rp.apply(r);
                self.summary
                    .see_parts(&self.reader, &self.rp, r, &mut self.said);
                self.said.clear();
            }
        }
        Ok(())
    }
}
