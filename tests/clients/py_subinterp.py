"""Allocates from the main interpreter once a sub-interpreter exists: no Python frames then
(which interpreter a thread runs cannot be told safely). Exits 3 when this Python has no
sub-interpreter module."""
import ctypes
import sys

try:
    import _interpreters as interpreters  # 3.13
except ImportError:
    try:
        import _xxsubinterpreters as interpreters  # 3.12 and earlier
    except ImportError:
        sys.exit(3)

rt = ctypes.CDLL(sys.argv[1])
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1024)) == 0  # frames: one interpreter
interp = interpreters.create()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(2048)) == 0  # none: two interpreters
