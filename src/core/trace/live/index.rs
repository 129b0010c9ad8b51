//! The live set's index from address to slot: an open-addressing table of (address, slot)
//! pairs, probed linearly, an entry taken out by moving the entries behind it back (no
//! tombstones).
//!
//! Every allocation and free of a trace asks it, and a training step frees nearly all it
//! made. The standard library's map cost about a hundred instructions an insertion there
//! (callgrind, the bench's loop trace); here an insertion or a removal is one hash and a
//! probe or two of 16-byte pairs.
//!
//! The hash is [`crate::fasthash`]'s, from the process's random seed, so no trace chooses
//! where its addresses land: keys that differ only above the bits the table indexes by still
//! share a home (whatever the seed), and a run of them costs a lookup its length, as a chain of
//! them would in any table.

use crate::fasthash::SeededState;
use std::hash::BuildHasher;

/// A pair's slot when the place holds none.
const EMPTY: u32 = u32::MAX;
/// The table's places at first.
const FIRST: usize = 16;

#[derive(Clone, Default)]
pub(super) struct AddressIndex {
    /// (address, slot), `EMPTY` slot: no entry; a power of two long, at most half full.
    table: Vec<(u64, u32)>,
    len: usize,
    state: SeededState,
}

impl AddressIndex {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        // The table's length is a power of two (or zero, where nothing is looked up).
        (self.state.hash_one(key) as usize) & self.table.len().wrapping_sub(1)
    }

    /// The place of `key`, or of the empty place where it would go.
    #[inline]
    fn find(&self, key: u64) -> (usize, bool) {
        let mask = self.table.len() - 1;
        let mut i = self.home(key);
        loop {
            let (k, s) = self.table[i];
            if s == EMPTY {
                return (i, false);
            }
            if k == key {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        match self.find(key) {
            (i, true) => Some(self.table[i].1),
            _ => None,
        }
    }

    /// The slot at `key` (`true`: it was there), or else `slot()`'s, put there (`None`: it
    /// gave none, or one the table cannot hold).
    #[inline]
    pub fn entry(&mut self, key: u64, slot: impl FnOnce() -> Option<u32>) -> Option<(u32, bool)> {
        if (self.len + 1) * 2 > self.table.len() {
            self.grow();
        }
        let (i, found) = self.find(key);
        if found {
            return Some((self.table[i].1, true));
        }
        let s = slot().filter(|&s| s != EMPTY)?;
        self.table[i] = (key, s);
        self.len += 1;
        Some((s, false))
    }

    /// Puts `slot` at `key`: the slot there before, if any.
    #[cfg(test)]
    fn insert(&mut self, key: u64, slot: u32) -> Option<u32> {
        match self.entry(key, || Some(slot))? {
            (before, true) => {
                let (i, _) = self.find(key);
                self.table[i].1 = slot;
                Some(before)
            }
            _ => None,
        }
    }

    /// Takes `key` out: its slot, if it had one.
    #[inline]
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let (mut hole, found) = self.find(key);
        if !found {
            return None;
        }
        let slot = self.table[hole].1;
        self.len -= 1;
        // Each entry behind the hole that may sit there (its home is not between the hole
        // and its place, cyclically) moves back into it, and its place becomes the hole.
        let mask = self.table.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let (k, s) = self.table[j];
            if s == EMPTY {
                break;
            }
            let home = self.home(k);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.table[hole] = (k, s);
                hole = j;
            }
        }
        self.table[hole] = (0, EMPTY);
        Some(slot)
    }

    /// Twice the places (or the first ones), every entry placed again.
    #[cold]
    fn grow(&mut self) {
        let places = (self.table.len() * 2).max(FIRST);
        let old = std::mem::replace(&mut self.table, vec![(0, EMPTY); places]);
        self.len = 0;
        for (k, s) in old {
            if s != EMPTY {
                let (i, _) = self.find(k);
                self.table[i] = (k, s);
                self.len += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever the order of insertions and removals, the index answers as a map would,
        /// also where many keys share a home: keys that differ only in their top bits, which
        /// every seed sends to one place, so that removals move long runs back, across the
        /// table's end too.
        #[test]
        fn answers_as_a_map(ops in proptest::collection::vec((0u8..3, 0u64..40, any::<bool>(), 0u32..1000), 0..600)) {
            let mut index = AddressIndex::default();
            let mut map: HashMap<u64, u32> = HashMap::new();
            for (op, k, high, slot) in ops {
                let key = if high { k << 58 } else { k * 512 };
                match op {
                    0 => prop_assert_eq!(index.insert(key, slot), map.insert(key, slot)),
                    1 => prop_assert_eq!(index.remove(key), map.remove(&key)),
                    _ => prop_assert_eq!(index.get(key), map.get(&key).copied()),
                }
                prop_assert_eq!(index.len(), map.len());
            }
            for (k, s) in map {
                prop_assert_eq!(index.get(k), Some(s));
            }
        }
    }
}
