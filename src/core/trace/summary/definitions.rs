//! The definitions a checkpoint carries (strings, stacks, modules), kept as they came, each
//! once: a ring's definitions reach the summarizer twice, from the recorder's log of them
//! (never overwritten) and from the ring (when the summarizer reads them before a lap).

use crate::trace::format::{RECORD_SIZE, Record, RecordKind};
use std::collections::HashSet;

#[derive(Default)]
pub(super) struct Definitions {
    /// Bodies verbatim, commit words cleared.
    pub bodies: Vec<[u8; RECORD_SIZE]>,
    /// Strings and stacks kept, by (kind, id); modules by (kind, base, path or build-id).
    seen: HashSet<(u8, u64, u64)>,
    /// The data records that follow a head already kept are skipped.
    skipping: bool,
}

impl Definitions {
    /// Whether `r` is a definition; if so its body is kept unless it was kept before.
    pub fn take(&mut self, r: &Record, body: &[u8; RECORD_SIZE]) -> bool {
        use RecordKind::*;
        let fresh = match r.kind {
            String | Stack => {
                let fresh = self.seen.insert((r.kind as u8, r.ptr, 0));
                self.skipping = !fresh;
                fresh
            }
            StringData | StackData => !self.skipping,
            Module | ModuleBuildId => {
                self.skipping = false;
                self.seen.insert((r.kind as u8, r.ptr, r.size))
            }
            _ => return false,
        };
        if fresh {
            let mut b = *body;
            b[0] = 0;
            b[1] = 0;
            self.bodies.push(b);
        }
        true
    }
}
