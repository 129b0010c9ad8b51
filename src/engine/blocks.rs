//! The engine's segments by address: a hash map for the lookup every request makes, and an
//! ordered set of addresses beside it for the few that need order (the segment holding an
//! interior pointer, segments in address order). Blocks are kept in a hash map alone (see
//! `Engine::blocks`): an ordered set of every block's address cost a tree descent at each
//! split, merge and neighbour lookup, each a handful of cache misses in a real process, where
//! the program evicts the engine from the caches between two requests.

use crate::fasthash::FastMap;
use std::collections::BTreeSet;
use std::ops::RangeBounds;

pub(super) struct BlockMap<V> {
    by_address: FastMap<u64, V>,
    starts: BTreeSet<u64>,
}

impl<V> BlockMap<V> {
    pub(super) fn new() -> BlockMap<V> {
        BlockMap {
            by_address: FastMap::default(),
            starts: BTreeSet::new(),
        }
    }

    pub(super) fn get(&self, p: &u64) -> Option<&V> {
        self.by_address.get(p)
    }

    pub(super) fn get_mut(&mut self, p: &u64) -> Option<&mut V> {
        self.by_address.get_mut(p)
    }

    pub(super) fn insert(&mut self, p: u64, v: V) -> Option<V> {
        self.starts.insert(p);
        self.by_address.insert(p, v)
    }

    pub(super) fn remove(&mut self, p: &u64) -> Option<V> {
        let v = self.by_address.remove(p)?;
        self.starts.remove(p);
        Some(v)
    }

    /// The blocks whose addresses lie in `range`, in address order.
    pub(super) fn range<R: RangeBounds<u64>>(
        &self,
        range: R,
    ) -> impl DoubleEndedIterator<Item = (&u64, &V)> {
        self.starts
            .range(range)
            .filter_map(|p| self.by_address.get(p).map(|v| (p, v)))
    }

    /// The block at the highest address at or below `p`.
    pub(super) fn at_or_before(&self, p: u64) -> Option<(u64, &V)> {
        let &q = self.starts.range(..=p).next_back()?;
        self.by_address.get(&q).map(|v| (q, v))
    }
}

impl<V> std::ops::Index<&u64> for BlockMap<V> {
    type Output = V;

    fn index(&self, p: &u64) -> &V {
        &self.by_address[p]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_lookups_agree_after_inserts_and_removes() {
        let mut m = BlockMap::new();
        for i in [5u64, 1, 9, 3, 7] {
            assert!(m.insert(i * 512, i).is_none());
        }
        assert_eq!(m.remove(&(3 * 512)), Some(3));
        assert_eq!(m.remove(&(3 * 512)), None);
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
