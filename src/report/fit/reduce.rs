//! The scratch buffers of PyTorch's global reductions, which follow the batch only up to a cap.
//!
//! A reduction over many rows (the gradient of an `nn.Linear`'s bias: the sum over batch x
//! sequence rows of the output's gradient) splits each output's rows across thread blocks
//! and sums the blocks' partial results through global memory: PyTorch's reduction kernel
//! (`aten/src/ATen/native/cuda/Reduce.cuh`) allocates a staging buffer of
//! `4 x outputs x blocks_per_output x 128` bytes (fp32 partial sums, 32 threads x 4 outputs
//! each per block) and at once a semaphore of `4 x blocks_across_outputs` bytes, both freed
//! when the kernel is launched. The blocks per output are
//! `max(min(ceil(target / blocks_across), ceil(v / 16)), ceil(v / 256))`, `v` the values each
//! thread sums (the rows over 4) and `target` the device's multiprocessors times the blocks
//! of 128 threads one runs at once: the buffer grows with the rows (padded to 64 of them)
//! until the device is full, then stays, then grows again sixteen times further on.
//!
//! Resized in proportion, ViT-B/16's two MLP bias reductions per layer came out 2.3 times
//! their real size at 8x the batch, which landed in other cached blocks: +3.6% peak reserved
//! under the defaults on an H100. Resized as PyTorch sizes them, +1.1% (docs/gpu-checks.md).

use crate::report::torch_allocator::staging_shape;
use crate::trace::reader::DeviceMake;

/// Threads of the reduction's block in the configuration recognized here (32 x 4).
const BLOCK_THREADS: u64 = 128;

/// One global reduction's staging buffer as the run had it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reduction {
    /// Bytes per block of each output.
    unit: u64,
    /// Blocks per output in the run.
    blocks: u64,
    /// Where the device's size caps them: `ceil(target / blocks across the outputs)`.
    cap: u64,
}

impl Reduction {
    /// The request of `size` bytes followed at once, from the same line, by one of `next`
    /// bytes: a global reduction's staging buffer and its semaphore, when their sizes fit the
    /// configuration recognized here, on a device of `make`.
    pub(super) fn recognize(size: u64, next: u64, make: DeviceMake) -> Option<Reduction> {
        let (unit, blocks) = staging_shape(size, next)?;
        let across = next / 4;
        let per_multiprocessor = u64::from(make.threads_per_multiprocessor) / BLOCK_THREADS;
        let target = u64::from(make.multiprocessors).checked_mul(per_multiprocessor)?;
        // No global reduction at all where the blocks across the outputs fill the device, nor
        // with a single block per output.
        if blocks < 2 || target == 0 || across > target {
            return None;
        }
        Some(Reduction {
            unit,
            blocks,
            cap: target.div_ceil(across),
        })
    }

    /// The buffer's bytes at `batch` for a run at `at`. The rows grow with the batch; the
    /// run's blocks say the values per thread only to within 16 (a block per 16 of them) and,
    /// once capped, not at all: taken as the least that gives the run's blocks.
    pub(super) fn at(&self, at: u64, batch: u64) -> u64 {
        let grow = |blocks: u64| -> u64 {
            let v = u128::from(blocks) * u128::from(batch);
            u64::try_from(v.div_ceil(u128::from(at.max(1)))).unwrap_or(u64::MAX)
        };
        let blocks = if self.blocks > self.cap {
            // Past the cap by the values per thread (a block per 256): in proportion.
            grow(self.blocks).max(self.cap)
        } else {
            let by_values = grow(self.blocks);
            by_values.min(self.cap).max(by_values.div_ceil(16))
        };
        self.unit.saturating_mul(blocks.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: DeviceMake = DeviceMake {
        multiprocessors: 132,
        threads_per_multiprocessor: 2048,
        memory: 0,
    };

    #[test]
    fn a_linear_bias_reduction_grows_with_the_rows_until_the_device_is_full() {
        // ViT-B/16's MLP biases on an H100, batch 8 (1,576 rows): 768 outputs (6 blocks
        // across, 25 blocks each) and 3,072 (24 across, 25 each), as the run recorded them.
        let fc2 = Reduction::recognize(9_830_400, 24, H100).expect("fc2's bias");
        let fc1 = Reduction::recognize(39_321_600, 96, H100).expect("fc1's bias");
        assert_eq!((fc2.blocks, fc2.cap), (25, 352));
        assert_eq!((fc1.blocks, fc1.cap), (25, 88));
        // At 64 the real run had 197 blocks (12,608 rows) and the cap, 88: 77,463,552 and
        // 138,412,032 bytes. From 8, 200 blocks (the rows known to within 64 of 1,600).
        assert_eq!(fc2.at(8, 64), 200 * 393_216);
        assert_eq!(fc1.at(8, 64), 138_412_032);
        // Capped in the run at 32 (99 blocks would be asked; 88 given): still 88 at 64.
        let capped = Reduction::recognize(138_412_032, 96, H100).expect("capped");
        assert_eq!(capped.at(32, 64), 138_412_032);
        // Sixteen times further the values per thread grow the blocks again.
        assert_eq!(capped.at(32, 32 * 32), 88 * 2 * 1_572_864);
    }

    #[test]
    fn other_pairs_are_not_reductions() {
        // A semaphore of odd bytes, a buffer that is not a whole number of blocks, a single
        // block, a semaphore larger than the grid allows, a grid that already fills the device.
        assert_eq!(Reduction::recognize(9_830_400, 23, H100), None);
        assert_eq!(Reduction::recognize(9_830_401, 24, H100), None);
        assert_eq!(Reduction::recognize(393_216, 24, H100), None);
        assert_eq!(Reduction::recognize(1 << 40, 4 * 65_536, H100), None);
        assert_eq!(Reduction::recognize(3 * 16_384 * 8_452, 8_452, H100), None);
        assert_eq!(Reduction::recognize(u64::MAX, 4, H100), None);
    }
}
