//! Blocks whose parameters were made among buffers: a module's buffers (a batch norm's running
//! mean and variance, its count of batches) are moved to the device with its parameters, in
//! the order its modules were registered, but take no gradient, and FSDP2 leaves them whole on
//! every rank (`fully_shard` cuts parameters only). Neither a period of the sizes nor a run of
//! places whose sizes are a block's gradients then says a block's parameters: each block's are
//! found among the places after the block before's, passing over what its gradients do not ask.

use super::units::{PARAMETERS_MOST, Units};
use std::collections::BTreeMap;

/// The blocks' parameters among `sizes` (the model's parameters and buffers, in the order they
/// were made), each block's gradients in the first backward being `gradients[k]` and the
/// root's (the first backward's gradients outside every block's) `root`. Block by block, from
/// the first place whose size the first block's gradients have, then from the place after the
/// block before's last: the places are taken in order while a gradient of their size is still
/// wanted and passed over (a buffer) otherwise, until every gradient has its place, passing
/// over at most three times as many places as the block has gradients (a batch norm has three
/// buffers for its two parameters, and the walk passes over the block before's last). A buffer of a parameter's size may be taken for it (a
/// batch norm's running mean for its weight, a block's for the block after's): each unit's
/// sizes are the same either way, and so are the shards FSDP2 makes of them. Then the root's
/// parameters are the other places whose sizes its gradients have, in order; the rest are
/// buffers, in no unit. `None` where a block's are not found.
pub(super) fn unit_sizes_among_buffers(
    sizes: &[u64],
    gradients: &[Vec<u64>],
    root: &[u64],
) -> Option<Units> {
    let n = sizes.len();
    if gradients.len() < 2 || gradients.iter().any(Vec::is_empty) || n > PARAMETERS_MOST {
        return None;
    }
    let first = counts(&gradients[0]);
    let mut at = sizes.iter().position(|s| first.contains_key(s))?;
    let (mut places, mut block) = (Vec::new(), Vec::new());
    for g in gradients {
        let mut left = counts(g);
        let (mut wanted, mut passed, start) = (g.len(), 0usize, places.len());
        while wanted > 0 {
            let size = *sizes.get(at)?;
            match left.get_mut(&size) {
                Some(c) if *c > 0 => {
                    *c -= 1;
                    wanted -= 1;
                    places.push(at);
                }
                _ => passed += 1,
            }
            if passed > 3 * g.len() {
                return None;
            }
            at += 1;
        }
        block.push(places[start..].iter().map(|&j| sizes[j]).collect());
    }
    let mut theirs = vec![false; n];
    for &p in &places {
        theirs[p] = true;
    }
    let mut left = counts(root);
    let root_places: Vec<usize> = (0..n)
        .filter(|&i| !theirs[i])
        .filter(|&i| match left.get_mut(&sizes[i]) {
            Some(c) if *c > 0 => {
                *c -= 1;
                true
            }
            _ => false,
        })
        .collect();
    Some(Units::with_root(sizes, block, places, root_places))
}

/// How many of each size `sizes` has.
fn counts(sizes: &[u64]) -> BTreeMap<u64, usize> {
    let mut c = BTreeMap::new();
    for &s in sizes {
        *c.entry(s).or_insert(0) += 1;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::super::units::unit_sizes_by_gradients;
    use super::unit_sizes_among_buffers;

    /// A batch norm: its weight and bias (`c` each), then its running mean and variance (`c`
    /// each, no gradient) and its count of batches (8 bytes).
    fn norm(c: u64) -> [u64; 5] {
        [c, c, c, c, 8]
    }

    #[test]
    fn blocks_made_among_buffers_are_found_from_their_gradients() {
        // As a ResNet's: a stem (a convolution of 90 and a norm of 4), a first block with a
        // part of its own (a convolution of 70 and a norm of 16), a second block, a last
        // layer of 30 and 5.
        let mut sizes = vec![90];
        sizes.extend(norm(4));
        let block = |sizes: &mut Vec<u64>, first: bool| {
            sizes.push(if first { 40 } else { 60 });
            sizes.extend(norm(4));
            sizes.push(50);
            sizes.extend(norm(16));
            if first {
                sizes.push(70);
                sizes.extend(norm(16));
            }
        };
        block(&mut sizes, true);
        block(&mut sizes, false);
        sizes.extend([30, 5]);
        // The gradients, as the backward makes them (last op first).
        let grads = vec![
            vec![16, 16, 70, 16, 16, 50, 4, 4, 40],
            vec![16, 16, 50, 4, 4, 60],
        ];
        let root = [5, 30, 4, 4, 90];
        assert!(unit_sizes_by_gradients(&sizes, &grads).is_none());
        let u = unit_sizes_among_buffers(&sizes, &grads, &root).unwrap();
        let sorted = |v: &[u64]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v
        };
        // Each block's sizes are its gradients' (the stem's norm, of the first's size, taken
        // for the first's: the unit's sizes are the same either way), its places in order.
        for (b, g) in u.block.iter().zip(&grads) {
            assert_eq!(sorted(b), sorted(g));
        }
        assert_eq!(
            u.places,
            vec![1, 2, 6, 12, 13, 14, 15, 16, 18, 19, 20, 24, 25, 26, 30]
        );
        // The root: the stem's convolution and two of its norm's, the last layer; every other
        // buffer is in no unit.
        assert_eq!(u.root, vec![90, 4, 4, 30, 5]);
        assert_eq!(
            u.root_places,
            vec![0, 3, 4, sizes.len() - 2, sizes.len() - 1]
        );
        // Blocks of buffers alone (more than three times a block's gradients passed over): not
        // told.
        let mut spread = vec![40];
        spread.extend([8; 7]);
        spread.extend([50, 60, 8, 50, 60]);
        let two = vec![vec![50, 40], vec![60, 50]];
        assert!(unit_sizes_among_buffers(&spread, &two, &[60]).is_none());
        spread.remove(1);
        let u = unit_sizes_among_buffers(&spread, &two, &[60]).unwrap();
        assert_eq!(u.places, vec![0, 7, 8, 10]);
        assert_eq!(u.root_places, vec![11]);
        // A block whose gradients are not among the places: not told.
        let wrong = vec![grads[0].clone(), vec![16, 16, 99]];
        assert!(unit_sizes_among_buffers(&sizes, &wrong, &root).is_none());
    }
}
