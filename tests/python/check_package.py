"""The Python package as a user gets it (pip install . into a fresh environment), checked from
that environment on the CUDA simulator. Run by scripts/test.sh:

    .venv-check/bin/python tests/python/check_package.py SIM_DIR WORK_DIR

Prints one line per check and a closing "package: N passed, M failed"; exits 1 on a failure.
"""

import os
import subprocess
import sys

import gpushim

sim, work = sys.argv[1], sys.argv[2]
env = dict(os.environ, LD_LIBRARY_PATH=sim, HOME=os.path.join(work, "home"))
os.environ["HOME"] = env["HOME"]
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("ok    " if ok else "FAILED ") + name + ("" if ok else f": {detail}"))


cmd = gpushim.command()
check("the command is installed beside this Python", os.path.dirname(cmd) == os.path.dirname(sys.executable), cmd)

lib = gpushim.library_path()
check("the shim comes out of the installed command", os.path.isfile(lib) and lib.endswith(".so"), lib)
check("the shim's path has no link in it", os.path.realpath(lib) == lib, lib)

# A cache folder another user could write is passed over, and nothing is written there.
open_cache = os.path.join(work, "open-cache")
os.makedirs(open_cache)
os.chmod(open_cache, 0o777)
out = subprocess.run([cmd, "lib"], env=dict(env, XDG_CACHE_HOME=open_cache), capture_output=True, text=True)
check("an XDG_CACHE_HOME others can write is passed over",
      out.returncode == 0 and not out.stdout.startswith(open_cache) and os.listdir(open_cache) == [],
      out.stdout + out.stderr)

# A link planted where the shim goes is replaced by a file of the user's, never followed.
theirs = os.path.join(work, "theirs.so")
with open(lib, "rb") as src, open(theirs, "wb") as dst:
    dst.write(src.read())
os.remove(lib)
os.symlink(theirs, lib)
again = gpushim.library_path()
check("a link planted where the shim goes is replaced",
      again == lib and os.path.isfile(lib) and not os.path.islink(lib), again)


def fingerprint(root):
    """build.rs's fingerprint of what the shim compiles: FNV-1a (64 bits) over each file of
    shim/, src/core/, Cargo.toml and Cargo.lock in order of its relative path: the path, a NUL,
    the contents, a NUL."""
    files = []
    for part in ("shim", "src/core", "Cargo.toml", "Cargo.lock"):
        p = os.path.join(root, part)
        if os.path.isfile(p):
            files.append(part)
        for d, _, names in os.walk(p):
            files += [os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/") for n in names]
    h = 0xCBF29CE484222325
    for rel in sorted(files):
        with open(os.path.join(root, rel), "rb") as f:
            body = f.read()
        for b in rel.encode() + b"\0" + body + b"\0":
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
carried = subprocess.run([cmd, "lib", "--sources"], capture_output=True, text=True).stdout.strip()
check("the carried shim was built from the checkout's sources (not a stale build)",
      carried == fingerprint(repo), f"carried {carried!r}, sources {fingerprint(repo)}")

trace = os.path.join(work, "pkg.%p.trace")
out = subprocess.run(
    [sys.executable, "-m", "gpushim", "run", "--conf", "pool:caching,stacks:on", "--trace", trace,
     os.path.join(sim, "train_loop"), "5"],
    env=env, capture_output=True, text=True,
)
check("python -m gpushim run records the example", out.returncode == 0 and "trace" in out.stderr, out.stderr)

traces = [os.path.join(work, f) for f in os.listdir(work) if f.startswith("pkg.") and f.endswith(".trace")]
check("one trace written", len(traces) == 1, traces)

recs = list(gpushim.records(traces[0])) if traces else []
allocs = [r for r in recs if r["kind"] == "alloc" and r["api"] == "cudaMalloc"]
# 1 weights + 5 steps of (6 activations + 1 leak)
check("records() gives every allocation", len(allocs) == 36, len(allocs))
check("records carry their fields", all({"time_ns", "ptr", "size", "device"} <= set(r) for r in recs[:50]))
framed = [r for r in allocs if r.get("frames")]
check("allocations carry the frames the reports show", len(framed) == len(allocs)
      and all("train_loop.c" in " ".join(r["frames"]) for r in framed), framed[:1])

try:
    import pandas  # noqa: F401
    df = gpushim.dataframe(traces[0])
    check("dataframe() with pandas", len(df) == len(recs), len(df))
except ImportError:
    try:
        gpushim.dataframe(traces[0])
        check("dataframe() without pandas says what to install", False, "no error")
    except ImportError as e:
        check("dataframe() without pandas says what to install", "pip install pandas" in str(e), e)

bad = subprocess.run([sys.executable, "-m", "gpushim", "summary", os.path.join(work, "nosuch.trace")],
                     capture_output=True, text=True)
check("python -m gpushim passes the exit code through", bad.returncode == 2, bad.returncode)

passed = sum(results)
print(f"package: {passed} passed, {len(results) - passed} failed")
sys.exit(0 if passed == len(results) else 1)
