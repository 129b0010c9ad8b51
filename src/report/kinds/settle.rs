//! A moment's kinds: reading on from the moment until each live tensor is known to be a
//! temporary (freed within the run that made it) or to have outlived its run.

use super::Kind;
use super::tracker::KindTracker;
use crate::fasthash::FastMap;
use crate::trace::format::Record;
use crate::trace::reader::{TraceReader, TraceTables};

impl KindTracker {
    /// The kinds of the live tensors `ptrs` (their stacks beside them) at a moment: `window`
    /// holds the records read just after it (where the `StackRef`s of its last tensors lie),
    /// and the reader reads on from there until each tensor is known: freed within the run
    /// that made it (a temporary) or outliving it. It reads no further than the end of the runs
    /// still going on.
    pub fn settle(
        &mut self,
        reader: &mut TraceReader,
        ptrs: impl IntoIterator<Item = (u64, u64)>,
        window: &[Record],
    ) -> FastMap<u64, Kind> {
        let mut freed = FastMap::default();
        for r in window {
            if let Some((ptr, k)) = self.observe(reader, r) {
                freed.entry(ptr).or_insert(k);
            }
        }
        let mut s = self.settling(reader, ptrs, &freed);
        while !s.open.is_empty() {
            let Some(r) = reader.next() else {
                break;
            };
            let before = self.run;
            let decided = self.observe(reader, &r);
            self.settle_on(&mut s, decided, before);
        }
        self.settled(reader, s)
    }

    /// The first step of [`KindTracker::settle`], once the window after the moment is read: `freed`
    /// holds the first kind decided at each address in the window (the address may be handed
    /// out again and freed again within it; the first free is the live tensor's).
    pub fn settling(
        &self,
        tables: &TraceTables,
        ptrs: impl IntoIterator<Item = (u64, u64)>,
        freed: &FastMap<u64, Kind>,
    ) -> Settling {
        let mut s = Settling::default();
        for (ptr, stack) in ptrs {
            if let Some(&k) = freed.get(&ptr) {
                s.known.insert(ptr, k);
                continue;
            }
            match self.so_far(ptr) {
                Some(k) => {
                    s.known.insert(ptr, k);
                }
                None if self.made_live(ptr) => {
                    s.open.insert(ptr, ());
                }
                None => {
                    s.known.insert(ptr, self.lasting(tables, ptr, stack));
                }
            }
        }
        s
    }

    /// One record read on after the window: `decided` is what [`KindTracker::observe`] said of it,
    /// `run_before` the run before it.
    pub fn settle_on(&self, s: &mut Settling, decided: Option<(u64, Kind)>, run_before: u64) {
        if let Some((ptr, k)) = decided
            && s.open.remove(&ptr).is_some()
        {
            s.known.insert(ptr, k);
        }
        if self.run != run_before {
            // A new run began: every tensor of the old one still live outlived it.
            s.open.retain(|&ptr, _| match self.so_far(ptr) {
                Some(k) => {
                    s.known.insert(ptr, k);
                    false
                }
                None => true,
            });
        }
    }

    /// The kinds once read on as far as needed (or to the end of the trace).
    pub fn settled(&self, tables: &TraceTables, s: Settling) -> FastMap<u64, Kind> {
        let mut out = s.known;
        for (ptr, _) in s.open {
            out.insert(ptr, self.lasting(tables, ptr, 0));
        }
        out
    }
}

/// The kinds of a moment's live tensors while they are being settled: those known, and those
/// whose run still goes on.
#[derive(Debug, Default)]
pub struct Settling {
    pub known: FastMap<u64, Kind>,
    pub open: FastMap<u64, ()>,
}
