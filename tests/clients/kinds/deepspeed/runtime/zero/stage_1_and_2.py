"""As ZeRO-1 and 2's optimizer (deepspeed/runtime/zero/stage_1_and_2.py), for a model of
16-bit parameters (`param_bytes` in all) on `world` ranks:
- at build, the parameters flattened into one buffer (whole on every rank), the separate ones
  let go; the fp32 master copy of this rank's partition (twice its 16-bit bytes);
- in each backward, the gradient bucket (`bucket_bytes`, the `ipg` buffer), and, for ZeRO-2,
  the partition's gradients (`grads_in_partition`) that each parameter's gradient is copied
  into before it is let go;
- in each step, the gradients' norm (a quarter of the partition, let go), the fp32 gradient
  of the partition, the client optimizer's step on the master copy (its state twice the copy),
  then the step's buffers let go."""
from torch import _standin
from torch._utils import _flatten_dense_tensors
from torch.optim.adam import Adam


class DeepSpeedZeroOptimizer:
    def __init__(self, params, param_bytes, world, stage, bucket_bytes):
        self.flat = self.flatten_dense_tensors_aligned(param_bytes)
        for p in params:
            _standin.free(p)
        self.partition_bytes = param_bytes // world
        self.master = _standin._lib.standin_malloc(2 * self.partition_bytes)
        self.optimizer = Adam([self.master], 2 * 2 * self.partition_bytes, 2 * self.partition_bytes)
        self.stage, self.bucket_bytes = stage, bucket_bytes
        self.bucket = None
        self.grads_in_partition = None

    def flatten_dense_tensors_aligned(self, nbytes):
        return _flatten_dense_tensors(nbytes)

    def backward(self):
        self.setup_buckets()

    def setup_buckets(self):
        self.bucket = _standin._lib.standin_malloc(self.bucket_bytes)

    def reduce_ready_partitions_and_remove_grads(self, grad):
        if self.stage == 2:
            self.copy_grads_in_partition(grad)
        _standin.free(grad)

    def copy_grads_in_partition(self, grad):
        if self.grads_in_partition is None:
            self.grads_in_partition = _standin._lib.standin_malloc(self.partition_bytes)

    def get_flat_partition(self):
        return _standin._lib.standin_malloc(2 * self.partition_bytes)

    def step(self):
        # The partition's work around the client optimizer's: its gradients' norm.
        norm = _standin._lib.standin_malloc(self.partition_bytes // 4)
        _standin.free(norm)
        fp32_grad = self.get_flat_partition()
        self.optimizer.step()
        _standin.free(fp32_grad)
        if self.grads_in_partition is not None:
            _standin.free(self.grads_in_partition)
            self.grads_in_partition = None
        _standin.free(self.bucket)
        self.bucket = None
