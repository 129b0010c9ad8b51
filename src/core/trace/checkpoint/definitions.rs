//! The definitions a checkpoint carries (strings, stacks, modules), kept as they came, each
//! once: a ring's definitions reach the summarizer twice, from the recorder's log of them
//! (never overwritten) and from the ring (when the summarizer reads them before a lap).

use crate::trace::format::{RECORD_SIZE, Record, RecordKind};
use std::collections::HashSet;

#[derive(Default)]
pub(crate) struct Definitions {
    /// Bodies verbatim, commit words cleared.
    pub bodies: Vec<[u8; RECORD_SIZE]>,
    /// Strings and stacks kept, by (kind, id); modules by (kind, base, path or build-id).
    seen: HashSet<(u8, u64, u64)>,
    /// Per source (the ring, the recorder's log): the data records that follow a head
    /// already kept are skipped. Each source gives a head and its data in one run, but the log
    /// can end a look between them, and the ring's records come in between.
    skipping: [bool; 2],
    /// The ring's definitions are ignored while the recorder's log holds every one (the log
    /// is whole; a ring's copy can be cut by a lap between a head and its data).
    pub ring_ignored: bool,
}

/// Where a definition came from.
#[derive(Clone, Copy)]
pub(crate) enum Source {
    Ring = 0,
    Log = 1,
}

impl Definitions {
    /// Whether `r` is a definition; if so its body is kept unless it was kept before.
    pub fn take(&mut self, r: &Record, body: &[u8; RECORD_SIZE], from: Source) -> bool {
        use RecordKind::*;
        let ignored = self.ring_ignored && matches!(from, Source::Ring);
        let skipping = &mut self.skipping[from as usize];
        let fresh = match r.kind {
            String | Stack => {
                let fresh = self.seen.insert((r.kind as u8, r.ptr, 0));
                *skipping = !fresh;
                fresh
            }
            StringData | StackData => !*skipping,
            Module | ModuleBuildId => {
                *skipping = false;
                self.seen.insert((r.kind as u8, r.ptr, r.size))
            }
            _ => return false,
        };
        if fresh && !ignored {
            let mut b = *body;
            b[0] = 0;
            b[1] = 0;
            self.bodies.push(b);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::format::Api;

    fn body(kind: RecordKind, ptr: u64, size: u64, tag: u8) -> (Record, [u8; RECORD_SIZE]) {
        let r = Record {
            kind,
            api: Api::Shim,
            device: 0,
            status: 0,
            thread: 0,
            time_ns: u64::from(tag),
            ptr,
            size,
            stream: 0,
        };
        let mut b = [0u8; RECORD_SIZE];
        r.encode_body(&mut b);
        (r, b)
    }

    /// The log ends a look between a stack's head and its data; the ring's copy of the same
    /// stack comes in between: the stack is kept once, whole, its data after its head.
    #[test]
    fn a_definition_split_between_looks_is_kept_once_and_whole() {
        let mut d = Definitions::default();
        let head = body(RecordKind::Stack, 7, 2, 0);
        let data = body(RecordKind::StackData, 0, 0, 1);
        assert!(d.take(&head.0, &head.1, Source::Log));
        // The ring's copy: head and data, both already kept (or about to be).
        assert!(d.take(&head.0, &head.1, Source::Ring));
        assert!(d.take(&data.0, &data.1, Source::Ring));
        // The log's data, next look.
        assert!(d.take(&data.0, &data.1, Source::Log));
        let kinds: Vec<u8> = d.bodies.iter().map(|b| b[2]).collect();
        assert_eq!(
            kinds,
            [RecordKind::Stack as u8, RecordKind::StackData as u8]
        );
        // Not a definition: not taken.
        let alloc = body(RecordKind::Alloc, 1, 1, 2);
        assert!(!d.take(&alloc.0, &alloc.1, Source::Ring));
    }
}
