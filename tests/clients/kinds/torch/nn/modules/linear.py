from torch import _standin
from torch.nn.modules.module import Module

KiB = 1 << 10
MiB = 1 << 20


_workspace = []


class Linear(Module):
    def __init__(self, nbytes):
        self.weight = _standin.empty(nbytes)
        self.grad = None
        # KINDS_BIAS: a bias of 4,096 fp32 values, its gradient kept as the weight's is.
        self.bias = _standin.empty(16 * KiB) if _standin.BIAS else None
        self.bias_grad = None
        self.node = None

    def forward(self, x, saved):
        if not _workspace:
            # As PyTorch's first matrix product with a bias on a thread: cuBLASLt's 1 MiB
            # workspace, kept for the whole run.
            _workspace.append(_standin.empty(1 * MiB))
        n = _standin.BATCH * _standin.SEQ
        t = _standin.empty(512 * KiB * n)  # a temporary of the forward
        _standin.free(t)
        if _standin.ATTENTION:
            # Attention's scores, kept for the backward: the square of the length.
            saved.append(_standin.empty(16 * KiB * _standin.BATCH * _standin.SEQ**2))
        if _standin.BIAS:
            # The product and its bias, made by the op's node: 192 rows of 4,096 a sample.
            self.node, a = _standin.forward_addmm(3 * MiB * n)
        else:
            a = _standin.empty(3 * MiB * n)  # kept for the backward: an activation
        saved.append(a)
        return a
