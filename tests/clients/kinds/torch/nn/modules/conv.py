from torch import _standin
from torch.nn.modules.module import Module


class Conv2d(Module):
    """A convolution's workspace, as cuDNN's: asked (from this line, as PyTorch asks it), used
    and freed before anything else is asked. When the allocator refuses it, PyTorch tries cuDNN's
    next algorithm, down to those needing none: so does this one, and goes on without it."""

    def __init__(self, per_sample):
        self.per_sample = per_sample
        self.done_without = 0

    def forward(self, x, saved):
        return self._conv_forward(x)

    def _conv_forward(self, x):
        n = self.per_sample * _standin.BATCH
        # KINDS_CONV_ELSEWHERE: the same request from another line (not a convolution's).
        w = _standin.try_empty(n) if _standin.CONV_ELSEWHERE else _standin._lib.standin_malloc(n)
        if w:
            _standin.free(w)
        else:
            self.done_without += 1
        return x
