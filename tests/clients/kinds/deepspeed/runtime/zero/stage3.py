"""As ZeRO-3's optimizer (deepspeed/runtime/zero/stage3.py), for partitions of 16-bit
parameters (`partitions`, `partition_bytes` in all on this rank):
- at build, the partitions packed into one buffer (`defragment`); the fp32 master copy of it
  (`_create_fp32_partitions`); then, in `_setup_for_real_optimizer`, the gradient bucket
  (`bucket_bytes`, the `ipg` buffer) and, last, the flat buffer of this rank's gradients,
  both kept for the run;
- each parameter's gradient, once made in the backward, reduced into the bucket and its
  partition written into the gradients' buffer, then let go;
- in each step, the gradients' norm (a quarter of the partition, let go), the client
  optimizer's step on the master copy (its state twice the copy), then the small parameters
  it keeps whole gathered again (`_post_step`, 64 KiB), the copy before let go."""
from deepspeed.runtime.utils import defragment
from deepspeed.runtime.zero import partition_parameters as zp
from torch import _standin
from torch.optim.adam import Adam

# The bytes of the small parameters ZeRO-3 keeps gathered (below its persistence threshold).
PERSISTENT = 64 << 10


class DeepSpeedZeroOptimizer_Stage3:
    def __init__(self, partitions, partition_bytes, bucket_bytes):
        self.partition_bytes = partition_bytes
        self._create_fp16_partitions_with_defragmentation(partitions)
        self._setup_for_real_optimizer(bucket_bytes)

    def _create_fp16_partitions_with_defragmentation(self, partitions):
        self.flat = defragment(partitions, self.partition_bytes)

    def _create_fp32_partitions(self):
        self.master = _standin._lib.standin_malloc(2 * self.partition_bytes)

    def _setup_for_real_optimizer(self, bucket_bytes):
        self._create_fp32_partitions()
        self.optimizer = Adam([self.master], 2 * 2 * self.partition_bytes, 2 * self.partition_bytes)
        self.bucket = _standin._lib.standin_malloc(bucket_bytes)
        self.grad_partitions_flat_buffer = _standin._lib.standin_malloc(self.partition_bytes)

    def reduce_partition_and_remove_grads(self, grad):
        _standin.free(grad)

    def step(self):
        # The partition's work around the client optimizer's: its gradients' norm.
        norm = _standin._lib.standin_malloc(self.partition_bytes // 4)
        _standin.free(norm)
        self.optimizer.step()
        self._post_step()

    def _post_step(self):
        # The small parameters ZeRO-3 keeps whole, gathered again (the old copy let go).
        old = getattr(self, "persistent", None)
        self.persistent = zp.fetch(PERSISTENT)
        if old is not None:
            zp.release(old)
