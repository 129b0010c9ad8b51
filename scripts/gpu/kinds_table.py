"""The table of scripts/gpu.sh dist and dskinds: each rank's truth (NAME.RANK.json, written by
scripts/gpu/dist_models.py's say_truth) against `gpushim summary --json` of its trace
(NAME.RANK.summary), in WORK, for each NAME given.

At the end of the program: the truth was taken after the last step; it is set against the
kinds at exit (`kinds_at_exit`: parameters, gradients and optimizer state live on to the end;
a framework's own buffers, such as DDP's buckets, may be freed by Python's shutdown before it,
and are compared at the peak).
At the peak (truths taken with DIST_PEAK): the kinds at the moment of the most bytes allocated,
against `kinds_at_peak`, and the bytes allocated then against `allocated_peak_bytes`.

usage: python3 kinds_table.py WORK NAME...
"""
import glob
import json
import sys

MiB = 1 << 20
LABEL = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer state",
         "communication": "communication"}


def err(got, want):
    # Where the truth is none, the error is said in bytes (a framework's scalars are a few).
    return f"{(got - want) / want * 100:+7.2f}%" if want else f"{got - want:+7d}B"


def kinds_rows(name, rank, when, truth, got):
    """One row a kind the truth has: its bytes in the truth and in gpushim's `got`, with every
    kind gpushim gave then after the first."""
    every = ", ".join(f"{k} {v / MiB:.1f}" for k, v in sorted(got.items()))
    for i, k in enumerate(k for k in LABEL if k in truth):
        g = got.get(k, 0)
        tail = every if i == 0 else ""
        print(f"{name:14} {rank:>4} {when:4} {LABEL[k]:16} {truth[k] / MiB:10.2f} {g / MiB:12.2f} "
              f"{err(g, truth[k]):>9}   {tail}")


def rows(name, truth, summary):
    f = summary["framework"][0]
    end = {k["kind"]: k["bytes"] for k in f.get("kinds_at_exit", [])}
    r = truth["rank"]
    kinds_rows(name, r, "end", truth, end)
    at = truth.get("at_peak")
    if not at:
        return
    kinds_rows(name, r, "peak", at, {k["kind"]: k["bytes"] for k in f.get("kinds_at_peak", [])})
    got = f.get("allocated_peak_bytes", 0)
    print(f"{name:14} {r:>4} {'peak':4} {'allocated':16} {at['allocated'] / MiB:10.2f} "
          f"{got / MiB:12.2f} {err(got, at['allocated']):>9}   "
          f"(PyTorch's requested peak {at.get('requested_peak', 0) / MiB:.2f})")


def main():
    work, names = sys.argv[1], sys.argv[2:]
    print(f"{'run':14} {'rank':>4} {'when':4} {'kind':16} {'truth MiB':>10} {'gpushim MiB':>12} "
          f"{'err':>9}   every kind gpushim gave then (MiB)")
    for name in names:
        for path in sorted(glob.glob(f"{work}/{name}.[0-9]*.json")):
            truth = json.load(open(path))
            try:
                summary = json.load(open(f"{work}/{name}.{truth['rank']}.summary"))
                rows(name, truth, summary)
            except (OSError, ValueError, KeyError, IndexError) as e:
                print(f"{name:14} {truth['rank']:>4} no summary ({e!r})")


main()
