"""Three threads allocate at once, each from a function of its own and with a size of its own,
and keep every block: each allocation's Python frames must be its own thread's. They start
together: the first allocations of all three race the opening of the trace and the first look
for the interpreter."""
import ctypes
import sys
import threading

rt = ctypes.CDLL(sys.argv[1])
kept = []
lock = threading.Lock()
go = threading.Barrier(3)


def grab(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    with lock:
        kept.append(p)


def worker_a():
    go.wait()
    for _ in range(300):
        grab(4096)


def worker_b():
    go.wait()
    for _ in range(300):
        grab(8192)


def main_loop():
    go.wait()
    for _ in range(300):
        grab(12288)


threads = [threading.Thread(target=worker_a), threading.Thread(target=worker_b)]
for t in threads:
    t.start()
main_loop()
for t in threads:
    t.join()
