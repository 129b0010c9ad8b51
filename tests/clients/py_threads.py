"""Three threads allocate at once, each from a function of its own and with a size of its own,
and keep every block: each allocation's Python frames must be its own thread's."""
import ctypes
import sys
import threading

rt = ctypes.CDLL(sys.argv[1])
kept = []
lock = threading.Lock()


def grab(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    with lock:
        kept.append(p)


def worker_a():
    for _ in range(300):
        grab(4096)


def worker_b():
    for _ in range(300):
        grab(8192)


def main_loop():
    for _ in range(300):
        grab(12288)


threads = [threading.Thread(target=worker_a), threading.Thread(target=worker_b)]
for t in threads:
    t.start()
main_loop()
for t in threads:
    t.join()
