"""Memory kept from inside a library's frames: a context manager of the standard library
(contextlib, a Python file of the interpreter's own) calls the program's generator, which
allocates; the program keeps the block every step."""
import contextlib
import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])
kept = []


@contextlib.contextmanager
def workspace(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    yield p


def step():
    with workspace(1 << 16) as p:
        kept.append(p)


for i in range(10):
    step()
