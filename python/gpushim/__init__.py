"""gpushim from Python: the shim library's path, PyTorch's pluggable allocator, and a trace's
records.

The work is done by the ``gpushim`` command installed with this package (it carries
libgpushim.so inside it); this module finds it and talks to it.

    import gpushim
    gpushim.library_path()            # the libgpushim.so that `gpushim run` preloads
    gpushim.torch_allocator()         # PyTorch allocates through the shim's pool
    for r in gpushim.records("gpushim-python.1234.trace"):
        ...                           # one dict per record
    df = gpushim.dataframe("gpushim-python.1234.trace")   # with pandas installed
"""

import collections
import json
import os
import shutil
import subprocess
import sys
import sysconfig

__all__ = ["command", "library_path", "torch_allocator", "records", "dataframe"]


def command():
    """The path of the ``gpushim`` command installed with this package."""
    name = "gpushim"
    here = os.path.dirname(os.path.abspath(__file__))
    # The environment's scripts folder; beside the interpreter; TARGET/bin for
    # `pip install --target TARGET`.
    for folder in (
        sysconfig.get_path("scripts"),
        os.path.dirname(sys.executable),
        os.path.join(os.path.dirname(here), "bin"),
    ):
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        "the gpushim command is not installed next to this Python (pip install gpushim, or "
        "pip install . in a clone)"
    )


def library_path():
    """The libgpushim.so that ``gpushim run`` preloads (written out of the command once)."""
    out = subprocess.run([command(), "lib"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip() or "gpushim lib failed")
    return out.stdout.strip()


def torch_allocator():
    """Makes PyTorch allocate CUDA memory through the shim's pool (its pluggable allocator),
    so every tensor is one record in the trace. Call it before the first CUDA allocation; run
    the program under ``gpushim run`` so the calls are recorded. Returns the allocator."""
    import torch

    too_late = (
        "gpushim.torch_allocator() must come before the first CUDA allocation: PyTorch "
        "cannot change its allocator once it has allocated. Call it at the top of the "
        "program, before any tensor is moved to the GPU."
    )
    if torch.cuda.is_initialized() and torch.cuda.memory_allocated() > 0:
        raise RuntimeError(too_late)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        library_path(), "gpushim_alloc", "gpushim_free"
    )
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        # PyTorch's own refusal ("Can't swap an already initialized allocator").
        raise RuntimeError(f"{too_late} (PyTorch: {e})") from e
    return allocator


_ALLOCATING = {"alloc", "alloc_async", "managed_alloc", "host_alloc", "phys_create", "tensor_alloc", "tensor_oom"}
# A stack is recorded just after its call, other threads' records possibly in between: this
# many records are held back to find it.
_STACK_WINDOW = 64


def records(trace):
    """Every record of a trace, in time order, as one dict each: what ``gpushim events --json``
    prints (every record but the definitions of strings, stacks and modules): time_ns, thread,
    kind, api, device, status, ptr, size, stream, and text where the record has it. An
    allocation also carries ``frames``, its stack as the reports show it (innermost first: the
    Python line that made it), when one was recorded. Streams the command's output."""
    proc = subprocess.Popen(
        [command(), "events", "--json", "--quiet", os.fspath(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    held = collections.deque()
    waiting = {}  # thread -> its latest allocation still without a stack
    # The command writes a stack's words at its id's first stack_ref only (ptr is the id).
    stacks = {}
    try:
        for line in proc.stdout:
            if not line.strip():
                continue
            r = json.loads(line)
            if r["kind"] == "stack_ref":
                if r.get("text"):
                    stacks[r["ptr"]] = r["text"].split(" < ")
                owner = waiting.pop(r["thread"], None)
                if owner is not None and r["ptr"] in stacks:
                    owner["frames"] = stacks[r["ptr"]]
            elif r["kind"] in _ALLOCATING:
                waiting[r["thread"]] = r
            else:
                waiting.pop(r["thread"], None)
            held.append(r)
            while len(held) > _STACK_WINDOW:
                done = held.popleft()
                if waiting.get(done["thread"]) is done:
                    del waiting[done["thread"]]
                yield done
        while held:
            yield held.popleft()
    finally:
        proc.stdout.close()
        err = proc.stderr.read()
        proc.stderr.close()
        code = proc.wait()
    if code != 0:
        raise RuntimeError(err.strip() or f"gpushim events exited with {code}")


def dataframe(trace):
    """The records of a trace as a pandas DataFrame (needs pandas: pip install gpushim[pandas])."""
    try:
        import pandas
    except ImportError as e:
        raise ImportError("gpushim.dataframe() needs pandas: pip install pandas") from e
    return pandas.DataFrame.from_records(list(records(trace)))


def main(argv=None):
    """``python -m gpushim ARGS``: the command, with the same arguments and exit code."""
    args = sys.argv[1:] if argv is None else argv
    return subprocess.call([command(), *args])
