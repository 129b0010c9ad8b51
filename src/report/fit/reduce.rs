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

/// What the run's first device is made of, where the trace says (a trace from an older shim
/// does not).
pub(super) fn device_make(input: &crate::report::torch_allocator::Input) -> Option<DeviceMake> {
    input
        .tables()
        .info()
        .devices
        .iter()
        .flatten()
        .next()
        .copied()
}

/// The blocks of 128 threads the device runs at once: its multiprocessors times the blocks
/// one of them holds (PyTorch's `target_grid_size`); `None` where the trace does not say.
fn target_of(make: DeviceMake) -> Option<u64> {
    let per_multiprocessor = u64::from(make.threads_per_multiprocessor) / BLOCK_THREADS;
    u64::from(make.multiprocessors)
        .checked_mul(per_multiprocessor)
        .filter(|&t| t > 0)
}

/// The staging buffer and semaphore PyTorch's reduction kernel asks to sum `rows` rows of
/// `outputs` contiguous fp32 values on a device running `target` blocks at once, as
/// `setReduceConfig` sizes them: none (0, 0) where each thread sums fewer than 256 values
/// (the rows over 4), where the blocks across the outputs fill the device, or where one block
/// an output is enough.
pub(super) fn staging_sizes(rows: u64, outputs: u64, target: u64) -> (u64, u64) {
    let across = outputs.div_ceil(BLOCK_THREADS);
    let per_thread = rows.div_ceil(4);
    if per_thread < 256 || across == 0 || across > target {
        return (0, 0);
    }
    let blocks = target
        .div_ceil(across)
        .min(per_thread.div_ceil(16))
        .max(per_thread.div_ceil(256));
    if blocks < 2 {
        return (0, 0);
    }
    let staging = 4u64
        .checked_mul(outputs)
        .and_then(|v| v.checked_mul(BLOCK_THREADS))
        .and_then(|v| v.checked_mul(blocks));
    match staging {
        Some(s) => (s, 4 * across),
        None => (u64::MAX, 4 * across),
    }
}

/// A bias's gradient summed over the rows within each thread block in the run (no staging
/// buffer asked), which PyTorch sums through global memory once the rows grow: at a larger
/// batch the same kernel asks a staging buffer and a semaphore the run never showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Latent {
    /// The rows summed in the run.
    rows: u64,
    /// The values summed into (the bias's elements).
    outputs: u64,
    /// The blocks the device runs at once.
    target: u64,
    /// The semaphore's size rather than the staging buffer's.
    semaphore: bool,
}

impl Latent {
    /// A sum of `rows` rows into `outputs` values on a device of `make` that needs no staging
    /// buffer at the run's rows but will at more; `None` where it already needs one (the run
    /// then shows it) or never can (its blocks across the outputs fill the device).
    pub(super) fn new(rows: u64, outputs: u64, make: DeviceMake) -> Option<Latent> {
        let target = target_of(make)?;
        let never = outputs.div_ceil(BLOCK_THREADS) > target || outputs == 0;
        if never || staging_sizes(rows, outputs, target) != (0, 0) {
            return None;
        }
        Some(Latent {
            rows,
            outputs,
            target,
            semaphore: false,
        })
    }

    /// The same reduction's semaphore.
    pub(super) fn semaphore(self) -> Latent {
        Latent {
            semaphore: true,
            ..self
        }
    }

    /// Its bytes at `batch` for a run at `at`: none until the rows call for a staging buffer.
    pub(super) fn at(&self, at: u64, batch: u64) -> u64 {
        // The rows follow the batch, as a tensor of the batch's does.
        let rows = super::resize(super::Scale::Batch, self.rows, at, batch);
        let (staging, semaphore) = staging_sizes(rows, self.outputs, self.target);
        if self.semaphore { semaphore } else { staging }
    }

    /// The least batch at which it asks a staging buffer, for a run at `at` (`None` past
    /// 2^32).
    pub(super) fn first_batch(&self, at: u64) -> Option<u64> {
        let needs = |b: u64| self.at(at, b) > 0;
        let (mut lo, mut hi) = (at, 1u64 << 32);
        if !needs(hi) {
            return None;
        }
        // needs(lo) is false (the run needed none), needs(hi) true: the first between.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if needs(mid) { hi = mid } else { lo = mid }
        }
        Some(hi)
    }
}

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
        let target = target_of(make)?;
        // No global reduction at all where the blocks across the outputs fill the device, nor
        // with a single block per output.
        if blocks < 2 || across > target {
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

    const H200: DeviceMake = DeviceMake {
        multiprocessors: 132,
        threads_per_multiprocessor: 2048,
        memory: 0,
    };

    #[test]
    fn a_bias_summed_within_its_blocks_asks_a_staging_buffer_once_the_rows_grow() {
        // ViT-Base's linear biases on an H200 as real runs asked them: at batch 4 (788 rows)
        // none; at 16 (3,152 rows) 50 blocks an output, for 768 and 3,072 outputs alike, and
        // the patch convolution's bias (3,136 rows) 49.
        let target = 132 * 16;
        assert_eq!(staging_sizes(788, 768, target), (0, 0));
        assert_eq!(staging_sizes(3152, 768, target), (19_660_800, 24));
        assert_eq!(staging_sizes(3152, 3072, target), (78_643_200, 96));
        assert_eq!(staging_sizes(3136, 768, target), (19_267_584, 24));
        let fc2 = Latent::new(788, 768, H200).expect("none at the run's rows");
        assert_eq!(fc2.at(4, 4), 0);
        assert_eq!(fc2.at(4, 16), 19_660_800);
        assert_eq!(fc2.semaphore().at(4, 16), 24);
        assert_eq!(fc2.semaphore().at(4, 5), 0);
        // 197 rows a sample: 985 at 5 (246 values a thread), 1,182 at 6 (296).
        assert_eq!(fc2.first_batch(4), Some(6));
        // A run whose rows already asked one shows it: nothing latent.
        assert_eq!(Latent::new(3152, 768, H200), None);
        // Blocks across the outputs that fill the device never reduce through memory.
        assert_eq!(Latent::new(8, 128 * 2113, H200), None);
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
