"""Code objects replaced at the same place: each round makes a new code object (the template's,
moved down one line; or, with REUSE_CHANGES=name, at line 1001 and named gen0, gen1, ...),
calls it to allocate (its frame where the last round's frame was) and drops it, so CPython
frees the code object and gives the next round's the same address.
Prints how many rounds found their code object at an address an earlier round's had."""
import ctypes
import os
import sys
import types

rt = ctypes.CDLL(sys.argv[1])


def template(malloc, ref, size):
    return malloc(ref, size)


seen, reused = set(), 0
for i in range(30):
    # Round i allocates 4096 * (i + 1) bytes, at line 1000 + i + 1 (or 1001 in gen{i}).
    if os.environ.get("REUSE_CHANGES") == "name":
        name = f"gen{i}"
        names = {"co_name": name, "co_qualname": name} if sys.version_info >= (3, 11) else {"co_name": name}
        code = template.__code__.replace(co_firstlineno=1000, **names)
    else:
        code = template.__code__.replace(co_firstlineno=1000 + i)
    reused += id(code) in seen
    seen.add(id(code))
    gen = types.FunctionType(code, globals(), "gen")
    p = ctypes.c_void_p()
    assert gen(rt.cudaMalloc, ctypes.byref(p), ctypes.c_size_t(4096 * (i + 1))) == 0
    rt.cudaFree(p)
    del gen, code
print(reused, file=sys.stderr)
