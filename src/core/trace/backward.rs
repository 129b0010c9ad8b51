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
//! `AccumulateGrad` (it has no forward op), a forward [`KEPT`] numbers or more older than one
//! recorded since in its place (see [`Forwards`]).

use crate::trace::format::{self, Record, RecordKind};

/// Forward sequence numbers kept: a number is forgotten once one this much newer is recorded
/// (a training step makes thousands).
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

/// Forward sequence number -> (thread, stack) of the first tensor allocated with it, `None`
/// once two threads recorded it: a table by the number's low bits, each entry with its number.
/// Every stack of a run's forward records a number (most one more than the last), so this is
/// asked at every tensor: a lookup is one index, where an ordered map of a million numbers
/// was a search of a deep tree, most of a real trace's reading. The table doubles while a
/// number would take the place of one less than [`KEPT`] older and a quarter of it is taken,
/// up to [`KEPT`] places: the numbers of a run, one after another, are then kept until one
/// [`KEPT`] newer takes their place (the newer stays); numbers far apart (a trace's claims,
/// not a run's) do not grow the table, the older forgotten, so its size follows the numbers
/// recorded, not their values.
#[derive(Default)]
struct Forwards {
    /// (number, thread, stack, state): state 0 empty, 1 one thread's, 2 two threads'.
    table: Vec<(u64, u16, u64, u8)>,
    /// Places taken.
    taken: usize,
}

/// The table's first size.
const FORWARDS_FIRST: usize = 1 << 12;

impl Forwards {
    #[inline]
    fn place(&self, sequence: u64) -> usize {
        (sequence as usize) & self.table.len().wrapping_sub(1)
    }

    /// Who recorded `sequence`, if it is kept.
    fn get(&self, sequence: u64) -> Option<Option<(u16, u64)>> {
        match self.table.get(self.place(sequence)) {
            Some(&(n, thread, stack, 1)) if n == sequence => Some(Some((thread, stack))),
            Some(&(n, _, _, 2)) if n == sequence => Some(None),
            _ => None,
        }
    }

    /// `thread` recorded `sequence` with `stack`: the first to, or another thread too.
    fn record(&mut self, sequence: u64, thread: u16, stack: u64) {
        loop {
            let (place, len) = (self.place(sequence), self.table.len());
            let Some(e) = self.table.get_mut(place) else {
                self.grow();
                continue;
            };
            match *e {
                (_, _, _, 0) => {
                    *e = (sequence, thread, stack, 1);
                    self.taken += 1;
                }
                (n, t, _, 1) if n == sequence && t != thread => e.3 = 2,
                (n, _, _, _) if n == sequence => {}
                (n, _, _, _)
                    if n.abs_diff(sequence) < KEPT as u64
                        && len < KEPT
                        && self.taken.saturating_mul(4) >= len =>
                {
                    self.grow();
                    continue;
                }
                // The older of two numbers sharing a place is forgotten.
                (n, _, _, _) if n < sequence => *e = (sequence, thread, stack, 1),
                _ => {}
            }
            return;
        }
    }

    /// Twice the places (at least [`FORWARDS_FIRST`]), every entry put in again.
    #[cold]
    fn grow(&mut self) {
        let size = (self.table.len() * 2).clamp(FORWARDS_FIRST, KEPT);
        // Written whole here rather than allocated zeroed: a zeroed allocation is the kernel's
        // zero page until written, and each first write after a read was a copy-on-write fault
        // that flushed every core's TLB (the decoder's thread shares the memory), a tenth of
        // `summary` on a real model's trace.
        let mut table = Vec::with_capacity(size);
        table.resize(size, (0, 0, 0, 0));
        let old = std::mem::replace(&mut self.table, table);
        self.taken = 0;
        for e in old.into_iter().filter(|e| e.3 != 0) {
            let place = self.place(e.0);
            if let Some(slot) = self.table.get_mut(place)
                && (slot.3 == 0 || slot.0 < e.0)
            {
                if slot.3 == 0 {
                    self.taken += 1;
                }
                *slot = e;
            }
        }
    }
}

/// The joins of one pass, made where the records are decoded (the decoder's thread): each
/// batch's definitions told first ([`BackwardJoins::define_string`],
/// [`BackwardJoins::define_stack`]), then its records joined in
/// order, each join made for the first time handed on as a definition
/// ([`Join`]: the reader puts its stack together from the stacks it holds, [`joined_frames`]).
/// What it keeps of the definitions is a stack's first frame and the strings that name a
/// backward function, not the stacks.
#[derive(Default)]
pub struct BackwardJoins {
    forward: Forwards,
    /// Stack id -> its first frame, as defined so far.
    firsts: crate::fasthash::FastMap<u64, u64>,
    /// String ids whose text begins `<backward>`, as defined so far.
    backward_strings: crate::fasthash::FastMap<u64, ()>,
    /// Stack id -> whether it is a backward function's frame (as the definitions said when it
    /// was first asked).
    is_backward: crate::fasthash::FastMap<u64, bool>,
    /// (backward stack, forward stack) -> the joined stack's id.
    joined: crate::fasthash::FastMap<(u64, u64), u64>,
}

/// A joined stack made for the first time: its id, the backward stack's and the forward's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Join {
    pub id: u64,
    pub backward: u64,
    pub forward: u64,
}

/// The frames of a joined stack: the backward function's, then the forward's (as many as a
/// stack holds, and one more).
pub fn joined_frames(
    stacks: &crate::fasthash::FastMap<u64, Vec<u64>>,
    backward: u64,
    forward: u64,
) -> Vec<u64> {
    let mut frames = stacks.get(&backward).cloned().unwrap_or_default();
    frames.extend(stacks.get(&forward).into_iter().flatten().copied());
    frames.truncate(crate::trace::unwind::MAX_FRAMES + 1);
    frames
}

impl BackwardJoins {
    /// Whether [`BackwardJoins::apply`] may change `r`: a `StackRef` with the autograd
    /// sequence number of its op, or a checkpoint's site with its forward's stack (the
    /// decoder's loop asks this of every record, the rest only of these).
    #[inline]
    pub fn may_join(r: &Record) -> bool {
        match r.kind {
            RecordKind::StackRef => sequence_of(r) != 0,
            RecordKind::Restore => restored_site(r),
            _ => false,
        }
    }

    /// A string defined (or defined again).
    pub fn define_string(&mut self, id: u64, text: &str) {
        if text.starts_with("<backward>") {
            self.backward_strings.insert(id, ());
        } else {
            crate::fasthash::remove_if_any(&mut self.backward_strings, &id);
        }
    }

    /// A stack defined (or defined again).
    pub fn define_stack(&mut self, id: u64, frames: &[u64]) {
        match frames.first() {
            Some(&f) => {
                self.firsts.insert(id, f);
            }
            None => {
                self.firsts.remove(&id);
            }
        }
    }

    /// `r` made as reports should see it: a backward tensor's `StackRef` names the joined
    /// stack; every other record unchanged. Changed in place (a record returned by value came
    /// back through memory and stalled the loop at every stack); the join, when made for the
    /// first time.
    pub fn apply(&mut self, r: &mut Record) -> Option<Join> {
        // A checkpoint's live backward tensors carry the forward stack their join found.
        if r.kind == RecordKind::Restore && restored_site(r) {
            if self.is_backward(r.ptr) {
                let made;
                (r.ptr, made) = self.joined(r.ptr, r.time_ns);
                return made;
            }
            return None;
        }
        let sequence = sequence_of(r);
        if r.kind != RecordKind::StackRef || sequence == 0 {
            return None;
        }
        let backward = self.is_backward(r.ptr);
        if !backward {
            self.forward.record(sequence, r.thread, r.ptr);
            return None;
        }
        let Some(Some((_, forward))) = self.forward.get(sequence) else {
            return None;
        };
        let made;
        (r.ptr, made) = self.joined(r.ptr, forward);
        made
    }

    /// Whether stack `id` is a backward function's frame.
    fn is_backward(&mut self, id: u64) -> bool {
        let (firsts, strings) = (&self.firsts, &self.backward_strings);
        *self.is_backward.entry(id).or_insert_with(|| {
            firsts
                .get(&id)
                .and_then(|&f| format::as_py_frame(f))
                .is_some_and(|(s, _)| strings.contains_key(&s))
        })
    }

    /// The id of the stack joining `backward` and `forward`, and the join if made now.
    fn joined(&mut self, backward: u64, forward: u64) -> (u64, Option<Join>) {
        let next = JOINED_BASE + self.joined.len() as u64;
        let id = *self.joined.entry((backward, forward)).or_insert(next);
        let made = (id == next).then_some(Join {
            id,
            backward,
            forward,
        });
        (id, made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::format::{Api, DEVICE_UNKNOWN};
    use std::collections::HashMap;

    /// `r` as the join leaves it, `strings` and `stacks` defined first, a joined stack made
    /// put in `stacks` as the reader puts it.
    fn applied(
        j: &mut BackwardJoins,
        mut r: Record,
        stacks: &mut crate::fasthash::FastMap<u64, Vec<u64>>,
        strings: &HashMap<u64, String>,
    ) -> Record {
        for (&id, text) in strings {
            j.define_string(id, text);
        }
        for (&id, frames) in stacks.iter() {
            j.define_stack(id, frames);
        }
        if let Some(made) = j.apply(&mut r) {
            let frames = joined_frames(stacks, made.backward, made.forward);
            stacks.insert(made.id, frames);
        }
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

    #[test]
    fn a_forward_is_forgotten_only_for_one_kept_or_more_newer() {
        let mut f = Forwards::default();
        for n in 0..10_000u64 {
            f.record(n, 0, n + 100);
        }
        // The table grew to keep each of them.
        assert!((0..10_000u64).all(|n| f.get(n) == Some(Some((0, n + 100)))));
        let far = KEPT as u64;
        f.record(far + 5, 0, 7);
        assert_eq!(f.get(5), None, "a number KEPT newer takes its place");
        assert_eq!(f.get(far + 5), Some(Some((0, 7))));
        // An older number does not put out a newer one in its place.
        f.record(5, 0, 8);
        assert_eq!(f.get(far + 5), Some(Some((0, 7))));
        assert_eq!(f.get(5), None);
    }

    #[test]
    fn numbers_far_apart_do_not_grow_the_table() {
        // A trace's claims, not a run: two numbers half of KEPT apart share a place of the
        // first table; the newer is kept, the table not grown to tell them apart.
        let mut f = Forwards::default();
        f.record(7, 0, 1);
        f.record(7 + (KEPT as u64) / 2, 0, 2);
        assert_eq!(f.table.len(), FORWARDS_FIRST);
        assert_eq!(f.get(7 + (KEPT as u64) / 2), Some(Some((0, 2))));
        assert_eq!(f.get(7), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, ..proptest::prelude::ProptestConfig::default() })]

        /// The numbers of a run (one after another, recorded in any order, by any threads) are
        /// all kept, each with the first thread and stack that recorded it, or none once a
        /// second thread did; a number not recorded is unknown.
        #[test]
        fn a_runs_numbers_are_all_kept(
            base in 0u64..(1 << 40),
            n in 1u64..20_000,
            records in proptest::collection::vec((0u64..20_000, 0u16..3, 1u64..50), 0..300),
        ) {
            let mut f = Forwards::default();
            let mut model: HashMap<u64, Option<(u16, u64)>> = HashMap::new();
            // The run itself, in order, by thread 0; then more records of its numbers.
            for i in 0..n {
                f.record(base + i, 0, i + 1);
                model.insert(base + i, Some((0, i + 1)));
            }
            for &(i, thread, stack) in &records {
                let i = i % n;
                f.record(base + i, thread, stack);
                let e = model.entry(base + i).or_insert(Some((thread, stack)));
                if e.is_some_and(|(t, _)| t != thread) {
                    *e = None;
                }
            }
            for i in 0..n {
                proptest::prop_assert_eq!(f.get(base + i), model.get(&(base + i)).copied());
            }
            proptest::prop_assert_eq!(f.get(base + n), None);
            proptest::prop_assert!(f.table.len() <= (4 * n as usize).next_power_of_two().max(FORWARDS_FIRST));
        }
    }
}
