//! The free blocks of one pool, by size class: a list per class, linked through the blocks
//! themselves (`Block::link`), and a bitmap of the classes that hold any. A request finds its
//! class and the next non-empty ones with a few bit operations instead of descending an
//! ordered tree, and a block goes in or out of its list by changing its neighbours' links. In
//! a real process the program evicts the engine from the caches between two requests, so what
//! a request costs is the number of cache lines it touches: a tree of (size, stamp, address)
//! keys cost about ten per descent and a request made several (measured: ~2 µs of
//! engine time per allocation inside PyTorch); a list head, two bitmap words and the blocks
//! themselves are a handful.
//!
//! Classes: every size up to 1 MiB in 512-byte steps has its own (all block sizes are multiples
//! of [`super::GRANULE`], so such a class holds blocks of one size, newest first: the first
//! usable block of the first class that has one is the best fit); above 1 MiB, 32 classes per
//! doubling, whose lists are searched whole for the smallest block (newest first among equal).

/// Exact classes: one per 512-byte step up to 1 MiB.
const EXACT: usize = 2048;
/// Classes above: 32 per doubling, for every size a `u64` can hold.
pub(super) const CLASSES: usize = EXACT + (55 - 11) * 32;
const WORDS: usize = CLASSES / 64;

use super::PoolKey;

/// The class of a block of `size` bytes; classes grow with size.
pub(super) fn class_of(size: u64) -> usize {
    let g = size >> 9;
    if g < EXACT as u64 {
        return g as usize;
    }
    // 2^e <= g < 2^(e+1), e >= 11: the five bits below the top one pick the class.
    let e = 63 - g.leading_zeros() as usize;
    let m = ((g >> (e - 5)) & 31) as usize;
    EXACT + (e - 11) * 32 + m
}

/// Whether every block of class `c` has the same size (given sizes in 512-byte multiples).
pub(super) fn exact(c: usize) -> bool {
    c < EXACT
}

/// The smallest size of class `c`.
pub(super) fn class_floor(c: usize) -> u64 {
    if c < EXACT {
        return (c as u64) << 9;
    }
    let e = (c - EXACT) / 32 + 11;
    let m = ((c - EXACT) % 32) as u64;
    ((32 + m) << (e - 5)) << 9
}

pub(super) struct Bins {
    /// The newest block of each class (its slot in the engine's slab; 0: none).
    heads: Vec<u32>,
    /// Which classes hold blocks, and which words of that hold any bit.
    words: [u64; WORDS],
    summary: u64,
}

impl Default for Bins {
    fn default() -> Bins {
        Bins {
            heads: vec![0; CLASSES],
            words: [0; WORDS],
            summary: 0,
        }
    }
}

impl Bins {
    pub(super) fn head(&self, c: usize) -> u32 {
        self.heads[c]
    }

    pub(super) fn set_head(&mut self, c: usize, p: u32) {
        self.heads[c] = p;
        let (w, bit) = (c / 64, 1u64 << (c % 64));
        if p == 0 {
            self.words[w] &= !bit;
            if self.words[w] == 0 {
                self.summary &= !(1u64 << w);
            }
        } else {
            self.words[w] |= bit;
            self.summary |= 1u64 << w;
        }
    }

    /// The first class at or above `from` that holds a block.
    pub(super) fn next_class(&self, from: usize) -> Option<usize> {
        if from >= CLASSES {
            return None;
        }
        let w = from / 64;
        let here = self.words[w] & (u64::MAX << (from % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = if w + 1 >= 64 {
            0
        } else {
            self.summary & (u64::MAX << (w + 1))
        };
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }
}

/// Every pool's free blocks, grouped by device and size kind: a search looks at each pool of
/// its group (one per stream that freed blocks of that kind), in stream order, with no tree
/// descent (an ordered map of pool keys cost a few cold lines per request).
pub(super) struct Pools {
    /// Index `device * 2 + small`: the group's pools, by stream.
    groups: Vec<Vec<(u64, Bins)>>,
}

impl Default for Pools {
    fn default() -> Pools {
        Pools {
            groups: (0..512).map(|_| Vec::new()).collect(),
        }
    }
}

fn group_of(device: u8, small: bool) -> usize {
    device as usize * 2 + usize::from(small)
}

impl Pools {
    /// The pools of a device and size kind, by stream.
    pub(super) fn group(&self, device: u8, small: bool) -> &[(u64, Bins)] {
        &self.groups[group_of(device, small)]
    }

    pub(super) fn get_mut(&mut self, key: PoolKey) -> Option<&mut Bins> {
        let g = &mut self.groups[group_of(key.device, key.small)];
        let at = g.binary_search_by_key(&key.stream, |&(s, _)| s).ok()?;
        Some(&mut g[at].1)
    }

    /// The pool of `key`, made if it has none yet.
    pub(super) fn make(&mut self, key: PoolKey) -> &mut Bins {
        let g = &mut self.groups[group_of(key.device, key.small)];
        let at = match g.binary_search_by_key(&key.stream, |&(s, _)| s) {
            Ok(at) => at,
            Err(at) => {
                g.insert(at, (key.stream, Bins::default()));
                at
            }
        };
        &mut g[at].1
    }

    /// Every pool, with its key.
    pub(super) fn iter(&self) -> impl Iterator<Item = (PoolKey, &Bins)> {
        self.groups.iter().enumerate().flat_map(|(g, pools)| {
            pools.iter().map(move |(stream, bins)| {
                let key = PoolKey {
                    device: (g / 2) as u8,
                    small: g % 2 == 1,
                    stream: *stream,
                };
                (key, bins)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_grow_with_size_and_their_floors_bound_them() {
        let mut last = 0;
        let mut size = 512u64;
        while size < (1u64 << 62) {
            for s in [size, size + 512, size / 2 * 3 / 512 * 512, size * 2 - 512] {
                let c = class_of(s);
                assert!(c < CLASSES, "{s}");
                assert!(
                    class_floor(c) <= s,
                    "{s}: class {c} starts at {}",
                    class_floor(c)
                );
                assert!(c + 1 == CLASSES || class_floor(c + 1) > s, "{s}");
            }
            let c = class_of(size);
            assert!(c >= last, "{size}");
            last = c;
            size = size / 8 * 9 / 512 * 512 + 512;
        }
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
        // One class per size up to 1 MiB.
        assert_eq!(class_of(1 << 20), 2048);
        assert_eq!(class_of((1 << 20) - 512), 2047);
        assert!(exact(2047) && !exact(2048));
        // 32 classes per doubling above.
        assert_eq!(class_of(2 << 20), 2048 + 32);
    }

    #[test]
    fn the_bitmap_finds_the_next_class_that_holds_a_block() {
        let mut b = Bins::default();
        assert_eq!(b.next_class(0), None);
        for c in [5, 64, 700, CLASSES - 1] {
            b.set_head(c, 4096 + c as u32);
        }
        assert_eq!(b.next_class(0), Some(5));
        assert_eq!(b.next_class(5), Some(5));
        assert_eq!(b.next_class(6), Some(64));
        assert_eq!(b.next_class(65), Some(700));
        assert_eq!(b.next_class(701), Some(CLASSES - 1));
        b.set_head(700, 0);
        assert_eq!(b.next_class(65), Some(CLASSES - 1));
        b.set_head(CLASSES - 1, 0);
        assert_eq!(b.next_class(65), None);
        assert_eq!(b.next_class(CLASSES), None);
        assert_eq!(b.head(64), 4096 + 64);
        b.set_head(5, 0);
        b.set_head(64, 0);
        assert_eq!((b.summary, b.next_class(0)), (0, None));
    }
}
