//! A fast hasher for maps keyed by addresses and ids, one word at a time.
//!
//! The reports' maps ([`FastMap`]) hold keys a trace chooses: addresses, stack ids, sizes.
//! Multiplying by a known odd constant is a bijection, so with a known starting state anyone
//! could pick a million keys whose hashes share their low bits and make every lookup walk all
//! of them (a few megabytes of trace, hours of reading). Each process therefore starts its
//! hashes from a random seed ([`SeededState`]): keys that differ only above the bits a table
//! indexes by still collide (whatever the seed), but there are at most 2^26 / n of them for a
//! table of n entries, so no trace makes a map's work grow faster than its entries. (The
//! shim's ring summarizer, which uses the same maps, draws the seed on its own helper thread.)
//! [`AddressMap`] keeps the fixed start for the pool's own addresses (the engine, which the
//! shim runs on allocation paths where nothing may take a lock or read randomness).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::OnceLock;

const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// Multiply-rotate, one word at a time.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // The product's entropy is in its high bits; the table indexes by the low ones.
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }

    fn write_u16(&mut self, v: u16) {
        self.write_u64(u64::from(v));
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// A map whose keys a trace chooses: hashed from this process's random seed.
pub type FastMap<K, V> = HashMap<K, V, SeededState>;

/// A set whose members a trace chooses, hashed as [`FastMap`]'s keys.
pub type FastSet<K> = std::collections::HashSet<K, SeededState>;

/// `key`'s entry taken out of `map`, an empty map not hashed into: the reports keep maps of
/// what is under way on a thread (a failure, a chain of frees, a kind decided) that are
/// nearly always empty, and every record asks them.
#[inline]
pub fn remove_if_any<K: std::hash::Hash + Eq, V>(map: &mut FastMap<K, V>, key: &K) -> Option<V> {
    if map.is_empty() {
        return None;
    }
    map.remove(key)
}

/// A map of the pool's own addresses: hashed from a fixed start (no randomness read).
pub type AddressMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Builds [`FastHasher`]s that start from this process's seed.
#[derive(Clone, Copy, Debug)]
pub struct SeededState(u64);

impl Default for SeededState {
    fn default() -> Self {
        SeededState(process_seed())
    }
}

impl BuildHasher for SeededState {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

/// A random word drawn once per process (from the standard library's own random keys).
fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        std::collections::hash_map::RandomState::new().hash_one(0x6770_7573_6869_6d75_u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_addresses_spread_over_the_table() {
        let mut m: FastMap<u64, u64> = FastMap::default();
        for i in 0..100_000u64 {
            m.insert(0x7f00_0000_0000 + i * 512, i);
        }
        assert_eq!(m.len(), 100_000);
        assert_eq!(m[&(0x7f00_0000_0000 + 777 * 512)], 777);
    }

    /// Keys chosen against the fixed start: `j x K^-1`, whose products with `K` are `j`, so
    /// every bit a table of up to 2^26 entries indexes by (and hashbrown's tag) is the same.
    fn crafted(n: u64) -> impl Iterator<Item = u64> {
        let mut inverse = K;
        for _ in 0..6 {
            inverse = inverse.wrapping_mul(2u64.wrapping_sub(K.wrapping_mul(inverse)));
        }
        assert_eq!(K.wrapping_mul(inverse), 1);
        (1..=n).map(move |j| j.wrapping_mul(inverse))
    }

    fn buckets(state: &impl BuildHasher, keys: impl Iterator<Item = u64>) -> usize {
        let low: std::collections::BTreeSet<u64> =
            keys.map(|k| state.hash_one(k) & 0xffff).collect();
        low.len()
    }

    #[test]
    fn keys_crafted_to_collide_collide_only_without_the_seed() {
        // From the fixed start, 20,000 crafted keys fall in one of 65,536 buckets...
        let fixed = BuildHasherDefault::<FastHasher>::default();
        assert_eq!(buckets(&fixed, crafted(20_000)), 1);
        // ...from the process's seed they spread as random keys would (about 17,300 buckets).
        let seeded = SeededState::default();
        assert!(buckets(&seeded, crafted(20_000)) > 10_000);
        // One seed for the process: two maps of it agree.
        assert_eq!(
            SeededState::default().hash_one(42u64),
            seeded.hash_one(42u64)
        );
    }
}
