//! Tensors PyTorch's autograd thread allocates, joined to the line of the forward that made
//! their backward function. No Python runs on that thread, so the shim records one frame there
//! (file `<backward>`, the node's class, `MmBackward0`) and one more than the node's autograd
//! sequence number; a tensor allocated by a thread running Python records the sequence number
//! its thread's next node takes. An op of the forward makes its node, then allocates its
//! output: the two numbers are equal exactly when the tensor is that node's op's output. The
//! reader then names the backward tensor by a stack of both: the backward frame, then the
//! forward's frames.
//!
//! Where it cannot be known, nothing is joined: a sequence number two threads running Python
//! both recorded (each thread counts its own), a node whose op allocated nothing (a view), an
//! `AccumulateGrad` (it has no forward op), a forward older than the last [`KEPT`] numbers.

use crate::trace::format::{self, Record, RecordKind};
use std::collections::{BTreeMap, HashMap};

/// Forward sequence numbers kept, the most recent (a training step makes thousands).
pub const KEPT: usize = 1 << 20;
/// The ids the reader gives joined stacks: above any id the trace's own table gives.
pub const JOINED_BASE: u64 = 1 << 62;

/// Whether a checkpoint's record is a live allocation's site with its forward's stack.
fn restored_site(r: &Record) -> bool {
    r.status == format::restore::SITE && r.time_ns != 0
}

/// The sequence number a `StackRef`'s `size` carries above its frame count (0: none).
pub fn sequence_of(stack_ref: &Record) -> u64 {
    stack_ref.size >> 8
}

#[derive(Default)]
pub struct BackwardJoins {
    /// Forward sequence number -> (thread, stack) of the first tensor allocated with it; `None`
    /// once two threads recorded it.
    forward: BTreeMap<u64, Option<(u16, u64)>>,
    /// Stack id -> whether it is a backward function's frame.
    is_backward: crate::fasthash::FastMap<u64, bool>,
    /// (backward stack, forward stack) -> the joined stack's id.
    joined: HashMap<(u64, u64), u64>,
}

impl BackwardJoins {
    /// Whether [`BackwardJoins::apply`] may change `r`: a `StackRef` with the autograd
    /// sequence number of its op, or a checkpoint's site with its forward's stack (the
    /// reader's loop asks this of every record, the rest only of these).
    #[inline]
    pub fn may_join(r: &Record) -> bool {
        match r.kind {
            RecordKind::StackRef => sequence_of(r) != 0,
            RecordKind::Restore => restored_site(r),
            _ => false,
        }
    }

    /// `r` made as reports should see it: a backward tensor's `StackRef` names the joined
    /// stack (defined in `stacks` on first use); every other record unchanged. Changed in
    /// place: a record returned by value came back through memory and stalled the reader's
    /// loop at every stack.
    pub fn apply(
        &mut self,
        r: &mut Record,
        stacks: &mut crate::fasthash::FastMap<u64, Vec<u64>>,
        strings: &HashMap<u64, String>,
    ) {
        // A checkpoint's live backward tensors carry the forward stack their join found.
        if r.kind == RecordKind::Restore && restored_site(r) {
            if self.is_backward(r.ptr, stacks, strings) {
                r.ptr = self.joined(r.ptr, r.time_ns, stacks);
            }
            return;
        }
        let sequence = sequence_of(r);
        if r.kind != RecordKind::StackRef || sequence == 0 {
            return;
        }
        let backward = self.is_backward(r.ptr, stacks, strings);
        if !backward {
            let e = self
                .forward
                .entry(sequence)
                .or_insert(Some((r.thread, r.ptr)));
            if e.is_some_and(|(t, _)| t != r.thread) {
                *e = None;
            }
            while self.forward.len() > KEPT {
                self.forward.pop_first();
            }
            return;
        }
        let Some(Some((_, forward))) = self.forward.get(&sequence).copied() else {
            return;
        };
        r.ptr = self.joined(r.ptr, forward, stacks);
    }

    /// Whether stack `id` is a backward function's frame.
    fn is_backward(
        &mut self,
        id: u64,
        stacks: &crate::fasthash::FastMap<u64, Vec<u64>>,
        strings: &HashMap<u64, String>,
    ) -> bool {
        *self.is_backward.entry(id).or_insert_with(|| {
            stacks
                .get(&id)
                .and_then(|f| f.first())
                .and_then(|&f| format::as_py_frame(f))
                .and_then(|(s, _)| strings.get(&s))
                .is_some_and(|s| s.starts_with("<backward>"))
        })
    }

    /// The id of the stack joining `backward` and `forward`, defined in `stacks` on first use.
    fn joined(
        &mut self,
        backward: u64,
        forward: u64,
        stacks: &mut crate::fasthash::FastMap<u64, Vec<u64>>,
    ) -> u64 {
        let next = JOINED_BASE + self.joined.len() as u64;
        let id = *self.joined.entry((backward, forward)).or_insert(next);
        if id == next {
            let mut frames = stacks.get(&backward).cloned().unwrap_or_default();
            frames.extend(stacks.get(&forward).into_iter().flatten().copied());
            frames.truncate(crate::trace::unwind::MAX_FRAMES + 1);
            stacks.insert(id, frames);
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::format::{Api, DEVICE_UNKNOWN};

    /// `r` as the join leaves it.
    fn applied(
        j: &mut BackwardJoins,
        mut r: Record,
        stacks: &mut crate::fasthash::FastMap<u64, Vec<u64>>,
        strings: &HashMap<u64, String>,
    ) -> Record {
        j.apply(&mut r, stacks, strings);
        r
    }

    fn stack_ref(thread: u16, stack: u64, sequence: u64) -> Record {
        Record {
            kind: RecordKind::StackRef,
            api: Api::Shim,
            device: DEVICE_UNKNOWN,
            status: 0,
            thread,
            time_ns: 0,
            ptr: stack,
            size: 1 | sequence << 8,
            stream: 0,
        }
    }

    #[test]
    fn equal_numbers_join_and_a_number_two_threads_recorded_joins_nothing() {
        let strings: HashMap<u64, String> = [
            (1, "<backward>\0MmBackward0".to_string()),
            (2, "train.py\0step".to_string()),
        ]
        .into();
        let mut stacks: crate::fasthash::FastMap<u64, Vec<u64>> = [
            (10, vec![format::py_frame(1, 0)]),
            (20, vec![format::py_frame(2, 6)]),
            (21, vec![format::py_frame(2, 7)]),
        ]
        .into_iter()
        .collect();
        let mut j = BackwardJoins::default();
        // Thread 0 runs the forward: numbers 5 and 6; thread 2 records 6 too.
        for r in [
            stack_ref(0, 20, 5),
            stack_ref(0, 21, 6),
            stack_ref(2, 21, 6),
        ] {
            assert_eq!(
                applied(&mut j, r, &mut stacks, &strings),
                r,
                "forward records pass unchanged"
            );
        }
        let joined = applied(&mut j, stack_ref(1, 10, 5), &mut stacks, &strings);
        assert!(joined.ptr >= JOINED_BASE);
        assert_eq!(
            stacks[&joined.ptr],
            vec![format::py_frame(1, 0), format::py_frame(2, 6)]
        );
        // The same pair again: the same joined stack.
        assert_eq!(
            applied(&mut j, stack_ref(1, 10, 5), &mut stacks, &strings).ptr,
            joined.ptr
        );
        // Number 6 is ambiguous, 9 unknown: the backward frame alone.
        for n in [6, 9, 0] {
            assert_eq!(
                applied(&mut j, stack_ref(1, 10, n), &mut stacks, &strings).ptr,
                10,
                "{n}"
            );
        }
    }
}
