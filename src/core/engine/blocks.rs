//! The engine's segments by address: each in a slot that its blocks name (`Block::seg`), so a
//! request reaches its block's segment without a hash probe; a hash map from base address to
//! slot for the calls that name an address; and an ordered set of bases for the few that need
//! order (the segment holding an interior pointer, segments in address order). Blocks are
//! kept in the engine's slab (see `Engine::slab`): an ordered set of every block's address cost
//! a tree descent at each split, merge and neighbour lookup, each a handful of cache misses in
//! a real process, where the program evicts the engine from the caches between two requests.

use crate::fasthash::AddressMap;
use std::collections::BTreeSet;
use std::ops::RangeBounds;

pub(super) struct BlockMap<V> {
    /// Values by slot; `None` while vacant.
    slots: Vec<Option<V>>,
    vacant: Vec<u32>,
    by_address: AddressMap<u64, u32>,
    starts: BTreeSet<u64>,
}

impl<V> BlockMap<V> {
    pub(super) fn new() -> BlockMap<V> {
        BlockMap {
            slots: Vec::new(),
            vacant: Vec::new(),
            by_address: AddressMap::default(),
            starts: BTreeSet::new(),
        }
    }

    /// The slot of the value at `p`.
    pub(super) fn slot(&self, p: &u64) -> Option<u32> {
        self.by_address.get(p).copied()
    }

    /// The value in slot `s` (`None` once it was removed).
    pub(super) fn at(&self, s: u32) -> Option<&V> {
        self.slots.get(s as usize)?.as_ref()
    }

    pub(super) fn at_mut(&mut self, s: u32) -> Option<&mut V> {
        self.slots.get_mut(s as usize)?.as_mut()
    }

    pub(super) fn get(&self, p: &u64) -> Option<&V> {
        self.at(self.slot(p)?)
    }

    pub(super) fn get_mut(&mut self, p: &u64) -> Option<&mut V> {
        self.at_mut(self.slot(p)?)
    }

    /// Puts `v` at `p` (replacing what was there) and returns its slot.
    pub(super) fn insert(&mut self, p: u64, v: V) -> u32 {
        if let Some(s) = self.slot(&p) {
            self.slots[s as usize] = Some(v);
            return s;
        }
        let s = match self.vacant.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(v);
                s
            }
            None => {
                // Slots are segments: far fewer than 2^32.
                self.slots.push(Some(v));
                (self.slots.len() - 1) as u32
            }
        };
        self.starts.insert(p);
        self.by_address.insert(p, s);
        s
    }

    pub(super) fn remove(&mut self, p: &u64) -> Option<V> {
        let s = self.by_address.remove(p)?;
        self.starts.remove(p);
        self.vacant.push(s);
        self.slots[s as usize].take()
    }

    /// The values whose addresses lie in `range`, in address order.
    pub(super) fn range<R: RangeBounds<u64>>(
        &self,
        range: R,
    ) -> impl DoubleEndedIterator<Item = (&u64, &V)> {
        self.starts
            .range(range)
            .filter_map(|p| self.get(p).map(|v| (p, v)))
    }

    /// The value at the highest address at or below `p`.
    pub(super) fn at_or_before(&self, p: u64) -> Option<(u64, &V)> {
        let &q = self.starts.range(..=p).next_back()?;
        self.get(&q).map(|v| (q, v))
    }
}

impl<V> std::ops::Index<&u64> for BlockMap<V> {
    type Output = V;

    fn index(&self, p: &u64) -> &V {
        self.get(p).expect("a value at this address")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_lookups_agree_after_inserts_and_removes() {
        let mut m = BlockMap::new();
        let mut slots = Vec::new();
        for i in [5u64, 1, 9, 3, 7] {
            slots.push(m.insert(i * 512, i));
        }
        assert_eq!(m.at(slots[2]), Some(&9));
        assert_eq!(m.remove(&(3 * 512)), Some(3));
        assert_eq!(m.remove(&(3 * 512)), None);
        assert_eq!(m.at(slots[3]), None);
        // A vacant slot is reused.
        assert_eq!(m.insert(11 * 512, 11), slots[3]);
        assert_eq!(m.remove(&(11 * 512)), Some(11));
        let all: Vec<u64> = m.range(..).map(|(&p, _)| p / 512).collect();
        assert_eq!(all, [1, 5, 7, 9]);
        assert_eq!(
            m.range(..7 * 512).next_back().map(|(&p, _)| p),
            Some(5 * 512)
        );
        assert_eq!(m.at_or_before(7 * 512).map(|(p, _)| p), Some(7 * 512));
        assert_eq!(m.at_or_before(7 * 512 + 100).map(|(p, _)| p), Some(7 * 512));
        assert!(m.at_or_before(511).is_none());
        assert_eq!(m[&(9 * 512)], 9);
        *m.get_mut(&512).unwrap() = 10;
        assert_eq!(m.get(&512), Some(&10));
    }
}
