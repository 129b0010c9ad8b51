"""Allocates while the interpreter exits: in an atexit handler and in a finalizer that runs
during finalization. The program must end normally."""
import atexit
import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])


def grab(n):
    p = ctypes.c_void_p()
    return rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))


class Late:
    def __del__(self):
        grab(3072)


atexit.register(grab, 2048)
holder = Late()  # finalized at interpreter exit
grab(1024)
