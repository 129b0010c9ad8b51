"""The stand-in allocator's calls: tensors from the c10 stand-in, and a backward pass's tensor
from the libtorch_cpu stand-in's engine thread."""
import ctypes
import os

# The batch: the tensors that follow it (the input, the forward's activations and
# temporaries, the loss and its gradient) are this many times their size (tests/fit.rs).
BATCH = int(os.environ.get("KINDS_BATCH", "1"))
# The sequence length, as a factor: the input, the forward's activations and temporaries and
# the loss are this many times their size too; with KINDS_ATTENTION each layer also keeps a
# tensor of attention's scores, SEQ squared times its size (tests/fit.rs).
SEQ = int(os.environ.get("KINDS_SEQ", "1"))
ATTENTION = os.environ.get("KINDS_ATTENTION") is not None
# Rows a sample of a global reduction in the backward (KINDS_REDUCE=N: as an nn.Linear's bias
# gradient summed over the batch's N-row samples), and the device's multiprocessors PyTorch
# sizes its grid by (the simulator's: GPUSHIM_SIM_MULTIPROCESSORS, else an H100's 132).
REDUCE_ROWS = int(os.environ.get("KINDS_REDUCE", "0"))
MULTIPROCESSORS = int(os.environ.get("GPUSHIM_SIM_MULTIPROCESSORS", "132"))
# KINDS_BIAS set: each linear layer has a bias of 4,096 fp32 values, its output made by an
# AddmmBackward0 node, whose backward makes the weight's gradient, then the bias's, summed over
# the output's rows (192 a sample): within thread blocks below 1,021 rows, through a staging
# buffer from there on.
# KINDS_BIAS=16: the node's gradients in 16 bits, as under autocast (half the weight's and the
# bias's sizes; the output's bytes then hold 384 rows a sample).
BIAS = os.environ.get("KINDS_BIAS") is not None
BIAS16 = os.environ.get("KINDS_BIAS") == "16"
# KINDS_CONV's workspace asked from this file instead of the convolution's line.
CONV_ELSEWHERE = os.environ.get("KINDS_CONV_ELSEWHERE") is not None

_lib = None
_autograd = None


def load(autograd_path, c10_path):
    global _lib, _autograd
    _autograd = ctypes.CDLL(autograd_path)
    _lib = ctypes.CDLL(c10_path)
    _lib.standin_malloc.restype = ctypes.c_void_p
    _lib.standin_malloc.argtypes = (ctypes.c_size_t,)
    _lib.standin_free.argtypes = (ctypes.c_void_p,)
    _lib.standin_free_deferred.argtypes = (ctypes.c_void_p,)
    _lib.standin_use_stream.argtypes = (ctypes.c_ulonglong,)
    _autograd.standin_backward_one.restype = ctypes.c_void_p
    _autograd.standin_backward_one.argtypes = (ctypes.c_size_t,)
    _autograd.standin_backward_split.restype = ctypes.c_void_p
    _autograd.standin_backward_split.argtypes = (ctypes.c_size_t,)
    _autograd.standin_forward_op.restype = ctypes.c_void_p
    _autograd.standin_forward_op.argtypes = (ctypes.c_int, ctypes.c_size_t)
    _autograd.standin_backward_node.restype = ctypes.c_void_p
    _autograd.standin_backward_node.argtypes = (ctypes.c_size_t, ctypes.c_size_t)


_nodes = [0]  # the forward's nodes made so far: the next one's index


def forward_addmm(n):
    """A linear map's output of `n` bytes, made by an AddmmBackward0 node: (its node's index,
    the tensor)."""
    p = _autograd.standin_forward_op(5, n)
    assert p, "out of memory"
    _nodes[0] += 1
    return _nodes[0] - 1, p


def backward_node(node, n):
    """A tensor of `n` bytes made by the forward's node `node` on the engine thread."""
    p = _autograd.standin_backward_node(node, n)
    assert p, "out of memory"
    return p


def empty(n):
    p = _lib.standin_malloc(n)
    assert p, "out of memory"
    return p


def try_empty(n):
    """A tensor, or None where the allocator refuses it."""
    return _lib.standin_malloc(n) or None


def free(p):
    _lib.standin_free(p)


def free_deferred(p):
    """Let go of a tensor whose block another stream still uses (as after `record_stream`):
    the free is asked for now and completes at the allocator's next `process_events`."""
    _lib.standin_free_deferred(p)


def backward_tensor(n):
    p = _autograd.standin_backward_one(n)
    assert p, "out of memory"
    return p


def backward_split(n):
    """The gradient of a split tensor, its views' gradients joined (SplitWithSizesBackward0)."""
    p = _autograd.standin_backward_split(n)
    assert p, "out of memory"
    return p


def reduction_sizes(rows, outputs):
    """The staging buffer and semaphore PyTorch's reduction kernel (Reduce.cuh) allocates to
    sum `rows` rows of `outputs` contiguous fp32 values (blocks of 32 x 4 threads, 4 outputs
    a thread: 128 outputs a block), on a device of MULTIPROCESSORS x 2048 threads; (0, 0)
    where it sums within the blocks."""
    across = -(-outputs // 128)
    per_thread = -(-rows // 4)
    target = MULTIPROCESSORS * (2048 // 128)
    if per_thread < 256 or across > target:
        return 0, 0
    blocks = max(min(-(-target // across), -(-per_thread // 16)), -(-per_thread // 256))
    if blocks < 2:
        return 0, 0
    return 4 * outputs * blocks * 128, 4 * across


def reduce_sum(rows, outputs):
    """A global reduction: its staging buffer and semaphore asked together (one line), freed
    once the kernel is launched."""
    size, semaphore = reduction_sizes(rows, outputs)
    if size:
        buffer, sem = empty(size), empty(semaphore)
        # KINDS_REDUCE_KEPT: the pair outlives another request, as no reduction's does (a
        # tensor and a scalar made together, like a loss and its count).
        other = empty(4096) if os.environ.get("KINDS_REDUCE_KEPT") else None
        free(sem)
        free(buffer)
        if other:
            free(other)
