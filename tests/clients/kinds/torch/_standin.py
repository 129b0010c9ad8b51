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

_lib = None
_autograd = None


def load(autograd_path, c10_path):
    global _lib, _autograd
    _autograd = ctypes.CDLL(autograd_path)
    _lib = ctypes.CDLL(c10_path)
    _lib.standin_malloc.restype = ctypes.c_void_p
    _lib.standin_malloc.argtypes = (ctypes.c_size_t,)
    _lib.standin_free.argtypes = (ctypes.c_void_p,)
    _autograd.standin_backward_one.restype = ctypes.c_void_p
    _autograd.standin_backward_one.argtypes = (ctypes.c_size_t,)


def empty(n):
    p = _lib.standin_malloc(n)
    assert p, "out of memory"
    return p


def free(p):
    _lib.standin_free(p)


def backward_tensor(n):
    p = _autograd.standin_backward_one(n)
    assert p, "out of memory"
    return p
