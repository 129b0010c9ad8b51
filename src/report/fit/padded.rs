//! FSDP2's parameters of a first dimension below the world, at another world size. FSDP2 cuts
//! a parameter along its first dimension, padded to a multiple of the world: one whose first
//! dimension is 1 (a vision transformer's position embedding and class token, `(1, ...)`)
//! keeps that one row on every rank at any world, its shard the whole parameter; its gathered
//! copy is the world times it; and its unit's all-gather buffers (the world times the unit's
//! shards) and reduce-scatter output (the unit's shards) hold it so. Resizing by `N/M` shrinks
//! all of those where none shrinks or the gathered copy grows.
//!
//! A trace holds sizes, not shapes: such a parameter is told where its shard is the size of a
//! parameter made whole before FSDP wrapped the model and no whole parameter is the world
//! times it (a shard that could be either is resized as any other), and its unit by the sums
//! of consecutive shards (FSDP2 cuts a unit's parameters one after another) that FSDP's own
//! requests show.

use std::collections::{BTreeMap, BTreeSet};

/// The run's shards as FSDP2 cut them, in order, and the whole parameters made before it
/// wrapped the model.
pub(super) struct Cut {
    pub(super) shards: Vec<u64>,
    pub(super) wholes: Vec<u64>,
    /// The sizes of the requests FSDP's own code made (its buffers, its gradients' shards).
    pub(super) own_sizes: BTreeSet<u64>,
}

/// Sizes at world `run` that are not `run/asked` of themselves at world `asked`, with their
/// size there: a kept row's shard (the same), its gathered copy (the world times it), and its
/// unit's sums and all-gather buffers.
pub(super) fn kept_rows(cut: &Cut, run: u64, asked: u64) -> BTreeMap<u64, u64> {
    let mut sizes = BTreeMap::new();
    if run < 2 || asked == 0 {
        return sizes;
    }
    let wholes: BTreeSet<u64> = cut.wholes.iter().copied().collect();
    let kept: BTreeSet<u64> = cut
        .shards
        .iter()
        .copied()
        .filter(|&s| {
            s > 0 && wholes.contains(&s) && s.checked_mul(run).is_some_and(|d| !wholes.contains(&d))
        })
        .collect();
    if kept.is_empty() {
        return sizes;
    }
    let at = |i: usize| kept.contains(&cut.shards[i]);
    let (Some(first), Some(last)) = (
        (0..cut.shards.len()).find(|&i| at(i)),
        (0..cut.shards.len()).rev().find(|&i| at(i)),
    ) else {
        return sizes;
    };
    let rows: u64 = (first..=last)
        .filter(|&i| at(i))
        .map(|i| cut.shards[i])
        .fold(0u64, u64::saturating_add);
    let shard_sizes: BTreeSet<u64> = cut.shards.iter().copied().collect();
    for &s in &kept {
        sizes.insert(s, s);
        // Its gathered copy, unless another parameter's shard is of that size.
        if let (Some(n), Some(m)) = (s.checked_mul(run), s.checked_mul(asked))
            && !shard_sizes.contains(&n)
        {
            sizes.insert(n, m);
        }
    }
    // The unit's sums: a run of consecutive shards around every kept row.
    let mut prefix = vec![0u64];
    for &s in &cut.shards {
        prefix.push(prefix.last().copied().unwrap_or(0).saturating_add(s));
    }
    let ends: BTreeSet<u64> = prefix[last + 1..].iter().copied().collect();
    let unit = |u: u64| {
        prefix[..=first]
            .iter()
            .any(|&p| ends.contains(&p.saturating_add(u)))
    };
    let resized = |u: u64| {
        let rest = u128::from(u.saturating_sub(rows)) * u128::from(run);
        let rest = u64::try_from(rest.div_ceil(u128::from(asked))).unwrap_or(u64::MAX);
        rest.saturating_add(rows)
    };
    for &x in &cut.own_sizes {
        if sizes.contains_key(&x) {
            continue;
        }
        if unit(x) {
            sizes.insert(x, resized(x));
        } else if x % run == 0 && unit(x / run) {
            sizes.insert(x, resized(x / run).saturating_mul(asked));
        }
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_kept_on_every_rank_is_not_resized_and_its_unit_follows() {
        // Two blocks of a 4-byte shard (8 bytes whole each), then a root of a 3-byte row (its
        // whole 3 bytes: first dimension 1) and a 10-byte shard (20 whole), at 2 ranks.
        let cut = Cut {
            shards: vec![4, 4, 3, 10],
            wholes: vec![3, 20, 8, 8],
            own_sizes: [4, 8, 6, 13, 26].into_iter().collect(),
        };
        let at4 = kept_rows(&cut, 2, 4);
        assert_eq!(at4.get(&3), Some(&3), "{at4:?}");
        assert_eq!(at4.get(&6), Some(&12), "the gathered row grows: {at4:?}");
        // The root's shards (13 bytes at 2: the row and 10) are 3 + 5 at 4, its all-gather
        // buffer 4 x 8.
        assert_eq!(at4.get(&13), Some(&8), "{at4:?}");
        assert_eq!(at4.get(&26), Some(&32), "{at4:?}");
        // The blocks' shards and buffers, and the root's other shard, resize as any other.
        for other in [4, 8, 10] {
            assert!(!at4.contains_key(&other), "{other}: {at4:?}");
        }
    }

    #[test]
    fn a_shard_that_could_be_a_halved_whole_is_not_taken_for_a_row() {
        // A 3-byte shard with wholes of 3 and 6 bytes: a kept row or half of the 6.
        let cut = Cut {
            shards: vec![3, 3],
            wholes: vec![3, 6],
            own_sizes: [6].into_iter().collect(),
        };
        assert!(kept_rows(&cut, 2, 4).is_empty());
    }
}
