//! A fast hasher for the decoders' maps keyed by addresses and ids (no untrusted keys reach
//! them in a way that matters: a trace crafted to collide only slows its own decoding).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

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

pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

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
}
