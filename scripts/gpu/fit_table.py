"""The table of scripts/gpu.sh fit: predicted (gpushim fit --json) against real runs (the
TRUTH lines of fit_truth.py in truth.jsonl); a peak counts as off past FIT_WITHIN percent (3; the
what-if sections ask 5).
usage: fit_table.py WORK MODEL..."""
import json
import os
import sys

work, models = sys.argv[1], sys.argv[2:]
GiB = 1 << 30
within = float(os.environ.get("FIT_WITHIN", "3"))
truth = [json.loads(l) for l in open(os.path.join(work, "truth.jsonl")) if l.strip()]
print(f"{'model':9} {'setting':25} {'batch':>5} {'predicted':>10} {'real':>10} {'err':>7}   largest under 20 GiB: predicted, real")
bad = 0
for m in models:
    path = os.path.join(work, m + ".fit.json")
    if not os.path.exists(path):
        print(f"{m:9} (no prediction)"); bad += 1; continue
    fit = json.load(open(path))
    for s in fit["settings"]:
        name = s["setting"] or "(defaults)"
        mine = [t for t in truth if t.get("model") == m and t.get("setting") == s["setting"]]
        for r in s["rows"][1:]:
            real = next((t for t in mine if t["batch"] == r["batch"] and not t.get("limit")), None)
            if real is None or real.get("oom"):
                print(f"{m:9} {name:25} {r['batch']:>5} {r['peak_reserved_bytes'] / GiB:>9.2f}G {'?':>10}"); bad += 1; continue
            err = (r["peak_reserved_bytes"] - real["reserved"]) / real["reserved"]
            bad += abs(err) > within / 100
            print(f"{m:9} {name:25} {r['batch']:>5} {r['peak_reserved_bytes'] / GiB:>9.2f}G {real['reserved'] / GiB:>9.2f}G {100 * err:>+6.2f}%")
        runs = {t["batch"]: not t.get("oom") for t in mine if t.get("limit")}
        if not runs:
            continue  # no largest batch looked for under this setting
        p = s["largest_batch"]
        fits = [b for b, ok in runs.items() if ok]
        fails = [b for b, ok in runs.items() if not ok]
        lo, hi = (max(fits) if fits else None), (min(fails) if fails else None)
        if lo is not None and hi == lo + 1:
            real, off = str(lo), abs(p - lo)
        else:
            real, off = f"{lo}..{hi}", None
        ok = off is not None and off <= 1
        bad += not ok
        print(f"{m:9} {name:25} {'':>5} {'':>10} {'':>10} {'':>7}   {p}, {real}{'' if ok else '  OFF'}")
print(f"every peak within {within:g}%, every largest batch within one" if not bad else f"{bad} off")
sys.exit(1 if bad else 0)
