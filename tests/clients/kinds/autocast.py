"""A model of residual layers on the stand-ins for PyTorch (tests/fit_autocast.rs), run in 32
bits or as under torch.autocast to 16 bits: what `gpushim fit --autocast bf16` predicts from the
32-bit run, this program does in `amp`, in PyTorch's order.

Per step: the batch (taking no gradient) plus a position parameter (an add: 32 bits); LAYERS
layers of a normalization (32 bits, keeping its input), a matrix product with the layer's weight
(keeping the normalization's output and the weight), and the residual add (of a 32-bit input
and the product: 32 bits); a loss keeping the last output. The backward in reverse: the loss's
gradient; per layer the product's two gradients (its input's, and its weight's, the weight's
`.grad` until the optimizer's step), then the normalization's; the position's gradient.

Under `amp` the product runs in 16 bits: just before it, a 16-bit copy of the normalization's
output and of the weight (by cast nodes), kept for its backward instead of the 32-bit output,
which goes once the product has run; its output half; its gradients made in 16 bits and cast
back to 32 by the cast nodes (both live a moment), the copies let go after its backward.

usage: autocast.py LIBTORCH_CPU LIBC10_CUDA STEPS [amp] [--batch-size N]"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

batch = 1
if "--batch-size" in sys.argv[:-1]:
    batch = int(sys.argv[sys.argv.index("--batch-size") + 1])
    os.environ["KINDS_BATCH"] = str(batch)

from torch import _standin  # noqa: E402

_standin.load(sys.argv[1], sys.argv[2])

from torch.nn.modules.module import Module  # noqa: E402
from torch.optim.adam import Adam  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
LAYERS = 3
MM, CAST, ADD, NORM, LOSS = range(5)
steps = int(sys.argv[3])
amp = "amp" in sys.argv[4:]

autograd = ctypes.CDLL(sys.argv[1])
autograd.standin_forward_op.restype = ctypes.c_void_p
autograd.standin_forward_op.argtypes = (ctypes.c_int, ctypes.c_size_t)
autograd.standin_backward_node.restype = ctypes.c_void_p
autograd.standin_backward_node.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
autograd.standin_link.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
autograd.standin_link_leaf.argtypes = (ctypes.c_size_t,)
autograd.standin_link_none.argtypes = (ctypes.c_size_t,)
nodes = 0  # nodes made so far: the next one's index
S = 256 * KiB * batch  # an activation, 32 bits
W = 1 * MiB  # a weight, 32 bits
P = 256 * KiB  # the position parameter


def op(kind, size, inputs):
    """An op's node of `kind`, its inputs' sources (a node's index, "leaf" or None), then its
    output of `size` bytes: (the node's index, the tensor)."""
    global nodes
    p = autograd.standin_forward_op(kind, size)
    assert p, "out of memory"
    me = nodes
    nodes += 1
    for src in inputs:
        if src is None:
            autograd.standin_link_none(me)
        elif src == "leaf":
            autograd.standin_link_leaf(me)
        else:
            autograd.standin_link(me, src)
    return me, p


def grad(node, size):
    g = autograd.standin_backward_node(node, size)
    assert g, "out of memory"
    return g


class Layer(Module):
    def __init__(self):
        self.weight = _standin.empty(W)
        self.grad = None

    def forward(self, x, saved):
        x_node, x_t = x
        norm, h = op(NORM, S, [x_node])
        if amp:
            hc = op(CAST, S // 2, [norm])  # the normalization's output in 16 bits
            wc = op(CAST, W // 2, ["leaf"])  # the weight's copy
            mm, y = op(MM, S // 2, [hc[0], wc[0]])
            _standin.free(h)  # its copy is kept instead
            saved.append((x_t, norm, None, mm, hc, wc))
        else:
            mm, y = op(MM, S, [norm, "leaf"])
            saved.append((x_t, norm, h, mm, None, None))
        out = op(ADD, S, [x_node, mm])
        _standin.free(y)  # the add keeps nothing
        return out

    def backward(self, g, kept):
        x_t, norm, h, mm, hc, wc = kept
        if amp:
            gh16 = grad(mm, S // 2)
            gh = grad(hc[0], S)  # cast back to 32 bits
            _standin.free(gh16)
            gw16 = grad(mm, W // 2)
            self.grad = grad(wc[0], W)
            _standin.free(hc[1])
            _standin.free(wc[1])
            _standin.free(gw16)
        else:
            gh = grad(mm, S)
            self.grad = grad(mm, W)
            _standin.free(h)
        gx = grad(norm, S)
        _standin.free(x_t)  # the normalization's input, kept for it
        _standin.free(gh)
        _standin.free(g)
        return gx


class Net(Module):
    def __init__(self):
        self.layers = [Layer() for _ in range(LAYERS)]
        self.pos = _standin.empty(P)
        self.grad = None

    def forward(self, batch_t, saved):
        x = op(ADD, S, [None, "leaf"])  # the batch plus the position parameter
        self.first = x[0]
        for layer in self.layers:
            x = layer(x, saved)
        return x


model = Net()
opt = Adam(model.layers, 2 * MiB)
for step in range(steps):
    batch_t = _standin.empty(S)
    saved = []
    x_node, x_t = model(batch_t, saved)
    loss_node, loss = op(LOSS, 4 * KiB * batch, [x_node])
    g = grad(loss_node, S)
    _standin.free(x_t)  # the loss's input, kept for it
    for layer, kept in zip(reversed(model.layers), reversed(saved)):
        g = layer.backward(g, kept)
    model.grad = grad(model.first, P)
    _standin.free(g)
    opt.step()
    for m in model.layers + [model]:
        _standin.free(m.grad)
        m.grad = None
    _standin.free(loss)
    _standin.free(batch_t)
print("trained", steps)
