"""Tables for scripts/gpu.sh multi.

  multi_report.py ddp DIR          the DDP runs listed in DIR/runs against DIR/baseline.out
  multi_report.py apis < JSON      a `gpushim summary --json` trace's calls per API
  multi_report.py step FILE        a train_bench.py RESULT: ms/step and last loss"""
import json
import os
import re
import sys

RESULT = re.compile(r"RESULT (\{.*?\})")


def results(path):
    # Ranks print at once, so their lines may interleave: find every object.
    return [json.loads(m) for m in RESULT.findall(open(path, errors="replace").read())]


def losses(path):
    out = {}
    for m in re.finditer(r"^LOSS (\d+) (\S+)$", open(path, errors="replace").read(), re.M):
        out[int(m.group(1))] = float(m.group(2))
    return out


def ddp(d):
    base = losses(os.path.join(d, "baseline.out"))
    print(f"{'run':<16} {'GPUSHIM_CONF':<22} {'torch':<8} {'env':<34} {'exit':>4} {'steps':>5} "
          f"{'max |dloss|':>11} {'ms/step r0':>10} {'ms/step r1':>10} {'traces':>6}")
    for line in open(os.path.join(d, "runs")):
        label, rc, conf, mode, leak, *env = line.split()
        out = os.path.join(d, label + ".out")
        ls = losses(out)
        diff = max((abs(ls[k] - base[k]) for k in ls if k in base), default=float("nan"))
        ms = {r["rank"]: r["step_ms"] for r in results(out)}
        traces = len([f for f in os.listdir(d) if f.startswith(label + "-") and f.endswith(".trace")])
        extra = " ".join(env + ([f"leak {leak} MiB/step"] if leak != "0" else [])) or "-"
        print(f"{label:<16} {conf:<22} {mode:<8} {extra:<34} {rc:>4} {len(ls):>5} {diff:>11.2e} "
              f"{ms.get(0, '-'):>10} {ms.get(1, '-'):>10} {traces:>6}")
        if rc != "0":
            err = open(os.path.join(d, label + ".err"), errors="replace").readlines()[-5:]
            print("  stderr tail:", "".join(err))


def ab(d):
    import statistics
    runs = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".out"):
            continue
        conf, _, rnd = f[:-4].rpartition("-")
        for r in results(os.path.join(d, f)):
            runs.setdefault(conf, []).append(r["step_ms"])
    base = statistics.median(runs.get("none", [float("nan")]))
    print(f"{'set-up':<14} {'ms/step (each rank, each round)':<60} {'median':>7} {'vs none':>8}")
    for conf in ("none", "off", "caching"):
        v = runs.get(conf, [])
        m = statistics.median(v) if v else float("nan")
        print(f"{conf:<14} {' '.join(f'{x:.2f}' for x in v):<60} {m:>7.2f} {m / base:>7.3f}x")


def apis():
    s = json.load(sys.stdin)
    for a in s["apis"]:
        print(f"    {a['api']:<24} {a['calls']:>7} calls {a.get('bytes', 0) / 2**20:>10.1f} MiB")


def step(path):
    r = results(path)
    if not r:
        print("failed")
    else:
        print(f"{r[0]['step_ms']:.2f} ms/step, loss {r[0]['loss_last']:.6f}")


if __name__ == "__main__":
    {"ddp": lambda: ddp(sys.argv[2]), "ab": lambda: ab(sys.argv[2]), "apis": apis,
     "step": lambda: step(sys.argv[2])}[sys.argv[1]]()
