//! The engine's blocks (and segments) by address: a hash map for the lookups every request
//! makes, and an ordered set of addresses alone for the few that need order (a block's
//! neighbour before it, a segment's blocks, the block holding an interior pointer). In a real process the program
//! runs between two requests and evicts the engine from the caches, so each map descent is a
//! handful of cache misses: an ordered map of whole blocks cost about 15 of them per request;
//! a hash lookup is one or two, and the set of addresses packs eight times more per node.

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

    /// The block at the highest address below `p` (`Some` even if it does not end at `p`).
    pub(super) fn before(&self, p: u64) -> Option<(u64, &V)> {
        let &q = self.starts.range(..p).next_back()?;
        self.by_address.get(&q).map(|v| (q, v))
    }

    /// The block at the highest address at or below `p`.
    pub(super) fn at_or_before(&self, p: u64) -> Option<(u64, &V)> {
        let &q = self.starts.range(..=p).next_back()?;
        self.by_address.get(&q).map(|v| (q, v))
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.by_address.values_mut()
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
        assert_eq!(m.before(7 * 512).map(|(p, _)| p), Some(5 * 512));
        assert_eq!(m.at_or_before(7 * 512).map(|(p, _)| p), Some(7 * 512));
        assert_eq!(m.at_or_before(7 * 512 + 100).map(|(p, _)| p), Some(7 * 512));
        assert!(m.before(512).is_none());
        assert_eq!(m[&(9 * 512)], 9);
        *m.get_mut(&512).unwrap() = 10;
        assert_eq!(m.get(&512), Some(&10));
        assert_eq!(m.values_mut().count(), 4);
    }
}
