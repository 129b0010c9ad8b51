"""As DeepSpeed's FP16_UnfusedOptimizer (deepspeed/runtime/fp16/unfused_optimizer.py), which
DeepSpeed wraps the client optimizer in without ZeRO in 16 bits, for parameters of `each`
16-bit bytes:
- at build, an fp32 master copy of every parameter (twice its bytes: `p.clone().float()`, in
  its `__init__`), on which the client optimizer works (its state twice the copies);
- in each step, each parameter's gradient made fp32 (`.to(fp32)`), the client optimizer's step,
  then the fp32 gradients and the model's own let go (DeepSpeed's `zero_grad`)."""
from torch import _standin
from torch.optim.adam import Adam


class FP16_UnfusedOptimizer:
    def __init__(self, params, each):
        self.fp32_groups = [_standin._lib.standin_malloc(2 * each) for _ in params]
        self.each = each
        self.optimizer = Adam(self.fp32_groups, 2 * 2 * each)

    def step(self, grads):
        fp32 = [_standin._lib.standin_malloc(2 * self.each) for _ in grads]
        self.optimizer.step()
        for g in fp32 + grads:
            _standin.free(g)
