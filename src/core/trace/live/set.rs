//! The live allocations by address, as the replay keeps them: each in a slot of a vector, an
//! index from address to slot beside it.
//!
//! The replay's hot path is four records per allocation (made, its caller, its stack, freed),
//! and three of them ask for the allocation just made or the one being freed. Kept in a map of
//! whole entries, each of those was a probe of a table of 64-byte buckets; here the index's
//! places are 16 bytes ([`AddressIndex`]), the allocation most recently made is found without
//! hashing (its caller and its stack follow it), and a free reads its slot once. The slots
//! freed are reused first, so a loop's allocations stay in the same few cache lines.

use super::Live;
use super::index::AddressIndex;

/// Live allocations by address: [`LiveSet::get`] and [`LiveSet::iter`] as a map's.
#[derive(Clone, Default)]
pub struct LiveSet {
    /// Address to slot.
    index: AddressIndex,
    /// The allocations, by slot; `None`: a slot free for reuse.
    slots: Vec<Option<(u64, Live)>>,
    /// The slots free, the latest freed last.
    free: Vec<u32>,
    /// The latest allocation put in, and its slot (its caller and stack records follow it).
    last: (u64, u32),
    /// The slot of the latest allocation taken out.
    taken: u32,
}

impl LiveSet {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    /// The slot of `ptr`, the latest put in found without hashing.
    #[inline]
    fn slot_of(&self, ptr: u64) -> Option<usize> {
        let (p, s) = self.last;
        let s = s as usize;
        if p == ptr && matches!(self.slots.get(s), Some(Some((q, _))) if *q == ptr) {
            return Some(s);
        }
        self.index.get(ptr).map(|s| s as usize)
    }

    #[inline]
    pub fn get(&self, ptr: &u64) -> Option<&Live> {
        let s = self.slot_of(*ptr)?;
        self.slots.get(s)?.as_ref().map(|(_, l)| l)
    }

    #[inline]
    pub fn get_mut(&mut self, ptr: &u64) -> Option<&mut Live> {
        let s = self.slot_of(*ptr)?;
        self.slots.get_mut(s)?.as_mut().map(|(_, l)| l)
    }

    /// The place of the latest allocation put in: an index, each live allocation's own while
    /// it lives (reused once it is freed), so that a tracker can keep what it knows of each
    /// live allocation in a vector by place rather than in a map by address.
    #[inline]
    pub fn last_put(&self) -> u32 {
        self.last.1
    }

    /// The place the latest allocation taken out had.
    #[inline]
    pub fn last_taken(&self) -> u32 {
        self.taken
    }

    pub fn contains_key(&self, ptr: &u64) -> bool {
        self.slot_of(*ptr).is_some()
    }

    /// Puts `live` at `ptr`; what was there before, if anything (freed by a route the trace
    /// did not see).
    #[inline]
    pub fn insert(&mut self, ptr: u64, live: Live) -> Option<Live> {
        let (slots, free) = (&mut self.slots, &mut self.free);
        let (s, was) = self.index.entry(ptr, || {
            free.pop().or_else(|| {
                // More live at once than a u32 counts cannot come from a trace the reader
                // bounds, but a slot is never shared: past it (u32::MAX is the index's mark
                // for an empty place), none is kept and no slot is made.
                let s = u32::try_from(slots.len()).ok().filter(|&s| s != u32::MAX)?;
                slots.push(None);
                Some(s)
            })
        })?;
        self.last = (ptr, s);
        let old = self.slots.get_mut(s as usize)?.replace((ptr, live));
        if was { old.map(|(_, l)| l) } else { None }
    }

    /// Takes out the allocation at `ptr`, copied into `out`; whether there was one.
    #[inline]
    pub fn remove_into(&mut self, ptr: &u64, out: &mut Live) -> bool {
        let Some(s) = self.index.remove(*ptr) else {
            return false;
        };
        let Some(slot) = self.slots.get_mut(s as usize) else {
            return false;
        };
        match slot {
            Some((_, l)) => {
                *out = *l;
                *slot = None;
                self.free.push(s);
                self.taken = s;
                true
            }
            None => false,
        }
    }

    /// Takes out the allocation at `ptr`.
    pub fn remove(&mut self, ptr: &u64) -> Option<Live> {
        let mut l = Live::default();
        self.remove_into(ptr, &mut l).then_some(l)
    }

    /// Every live allocation and its address, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &Live)> {
        self.slots.iter().flatten().map(|(p, l)| (p, l))
    }

    /// Every live allocation with its place and address.
    pub fn iter_placed(&self) -> impl Iterator<Item = (u32, &u64, &Live)> {
        let placed = self.slots.iter().zip(0u32..);
        placed.filter_map(|(s, i)| s.as_ref().map(|(p, l)| (i, p, l)))
    }

    pub fn values(&self) -> impl Iterator<Item = &Live> {
        self.slots.iter().flatten().map(|(_, l)| l)
    }
}

impl FromIterator<(u64, Live)> for LiveSet {
    fn from_iter<I: IntoIterator<Item = (u64, Live)>>(iter: I) -> Self {
        let mut set = LiveSet::default();
        for (p, l) in iter {
            set.insert(p, l);
        }
        set
    }
}

impl std::fmt::Debug for LiveSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn live(size: u64) -> Live {
        Live {
            size,
            ..Live::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever the order of puts, takes and changes, the set holds what a map would,
        /// and the latest put is found as any other.
        #[test]
        fn holds_what_a_map_holds(ops in proptest::collection::vec((0u8..4, 0u64..24, 1u64..1000), 0..400)) {
            let mut set = LiveSet::default();
            let mut map: HashMap<u64, Live> = HashMap::new();
            for (op, ptr, size) in ops {
                match op {
                    0 => prop_assert_eq!(set.insert(ptr, live(size)), map.insert(ptr, live(size))),
                    1 => prop_assert_eq!(set.remove(&ptr), map.remove(&ptr)),
                    2 => {
                        if let (Some(a), Some(b)) = (set.get_mut(&ptr), map.get_mut(&ptr)) {
                            a.stack = size;
                            b.stack = size;
                        }
                    }
                    _ => prop_assert_eq!(set.get(&ptr), map.get(&ptr)),
                }
                prop_assert_eq!(set.len(), map.len());
                prop_assert_eq!(set.contains_key(&ptr), map.contains_key(&ptr));
            }
            let mut held: Vec<(u64, Live)> = set.iter().map(|(&p, &l)| (p, l)).collect();
            let mut want: Vec<(u64, Live)> = map.into_iter().collect();
            held.sort_by_key(|&(p, _)| p);
            want.sort_by_key(|&(p, _)| p);
            prop_assert_eq!(held, want);
        }
    }

    #[test]
    fn a_freed_slot_is_used_again_before_the_set_grows() {
        let mut set = LiveSet::default();
        for p in 1..=8 {
            set.insert(p, live(p));
        }
        for _ in 0..100 {
            assert_eq!(set.remove(&3), Some(live(3)));
            set.insert(3, live(3));
        }
        assert_eq!(set.slots.len(), 8);
        // Each live allocation keeps its place; a place freed is the next one put in's.
        let places: Vec<(u32, u64)> = set.iter_placed().map(|(i, &p, _)| (i, p)).collect();
        assert_eq!(places.len(), 8);
        assert!(
            places
                .iter()
                .all(|&(i, p)| set.slot_of(p) == Some(i as usize))
        );
        set.remove(&5);
        let freed = set.last_taken();
        set.insert(50, live(50));
        assert_eq!(set.last_put(), freed);
        // The latest put is found through its slot: a stale hint (its address freed and put
        // elsewhere) is not believed.
        set.remove(&3);
        set.insert(9, live(9));
        set.insert(3, live(30));
        set.last = (3, 2);
        assert_eq!(set.get(&9), Some(&live(9)));
        assert_eq!(set.get(&3), Some(&live(30)));
    }
}
