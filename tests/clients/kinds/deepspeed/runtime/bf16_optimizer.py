"""As DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py), which wraps the client
optimizer for ZeRO-1 in bf16 with fp32 gradient accumulation, for a model of 16-bit parameters
(`param_bytes` in all) on `world` ranks. Its set-up (`_setup_for_real_optimizer`):
- the parameters flattened into one buffer (whole on every rank, through torch's
  `_flatten_dense_tensors`), the separate ones let go;
- the fp32 master copy of this rank's partition (`clone().float()`: twice its 16-bit bytes);
- by its last line, the fp32 buffer every gradient accumulates into (twice the whole model);
each backward's gradients are added into that buffer and let go; each step runs the client
optimizer on the master copy (its state twice the copy)."""
from torch import _standin
from torch._utils import _flatten_dense_tensors
from torch.optim.adam import Adam


class BF16_Optimizer:
    def __init__(self, params, param_bytes, world):
        self._setup_for_real_optimizer(params, param_bytes, world)
        self.optimizer = Adam([self.master], 2 * 2 * (param_bytes // world))

    def _setup_for_real_optimizer(self, params, param_bytes, world):
        self.flat = self._flatten_dense_tensors_aligned(param_bytes)
        for p in params:
            _standin.free(p)
        self.master = _standin._lib.standin_malloc(2 * (param_bytes // world))
        self.fp32_groups_gradients_flat = _standin._lib.standin_malloc(2 * param_bytes)

    def _flatten_dense_tensors_aligned(self, nbytes):
        return _flatten_dense_tensors(nbytes)

    def accumulate_hp_grads_and_remove_lp(self, grad):
        _standin.free(grad)

    def step(self):
        self.optimizer.step()
