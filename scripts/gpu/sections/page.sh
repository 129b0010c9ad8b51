#!/usr/bin/env bash
# the page of real runs: kinds and growing lines drawn, the peak where `peak` says, size and time to make it.
# On the GPU machine: the two-leak loop (scripts/gpu/torch_two_leaks.py, 30 steps), GPT-2 and
# ResNet-50 training (scripts/gpu/kinds_truth.py) and GPT-2 through an 8 MiB ring, each under
# `gpushim run` with nothing set; then `gpushim report` and `gpushim plot` on each trace. One
# table: records, the page's size and the seconds to write it, its columns, the kinds drawn at
# the tensors' peak, whether every line `leaks` finds growing is a band of its own (with its
# kind), and whether the page's peak is `peak`'s. The pages (and the two-leak loop's trace) are
# left in $OUT/page/pages.tgz (when OUT is set) for the browser check, which runs where a browser is
# (tests/browser/check_page.py --real).
#   bash scripts/gpu.sh page[:RUN,...]   RUN is leaks, gpt2, resnet50 or gpt2-ring
set -euo pipefail
runs=${*:-leaks gpt2 resnet50 gpt2-ring}
work=$(mktemp -d)
keep=${OUT:+$OUT/page}
for r in $runs; do
  conf=()
  case $r in
    leaks) cmd=(python3 scripts/gpu/torch_two_leaks.py 30) ;;
    gpt2-ring) conf=(--conf trace_max:8MiB); cmd=(python3 scripts/gpu/kinds_truth.py gpt2 60) ;;
    *) cmd=(python3 scripts/gpu/kinds_truth.py "$r" 6) ;;
  esac
  if ! "$GPUSHIM_BIN" run "${conf[@]}" --trace "$work/$r.trace" -- "${cmd[@]}" >"$work/$r.out" 2>"$work/$r.err"; then
    echo "$r: run failed"; tail -5 "$work/$r.err"; continue
  fi
  start=$EPOCHREALTIME
  "$GPUSHIM_BIN" report "$work/$r.trace" -o "$work/$r.html" 2>/dev/null
  echo "$r $start $EPOCHREALTIME" >> "$work/seconds"
  "$GPUSHIM_BIN" plot "$work/$r.trace" -o "$work/$r.kinds.png" 2>/dev/null
  "$GPUSHIM_BIN" plot --by line "$work/$r.trace" -o "$work/$r.lines.png" 2>/dev/null
  "$GPUSHIM_BIN" peak --json "$work/$r.trace" > "$work/$r.peak.json"
  "$GPUSHIM_BIN" summary --json "$work/$r.trace" > "$work/$r.summary.json"
done
if [ -n "$keep" ]; then
  # One file: the pages and the two-leak loop's trace.
  mkdir -p "$keep"
  (cd "$work" && tar czf "$keep/pages.tgz" ./*.html $(ls leaks.trace 2>/dev/null)) || true
fi
python3 - "$work" $runs <<'PY'
import json, os, re, sys
work, runs = sys.argv[1], sys.argv[2:]
secs = {}
if os.path.exists(os.path.join(work, "seconds")):
    for l in open(os.path.join(work, "seconds")):
        name, a, b = l.split()
        secs[name] = float(b) - float(a)
MiB = 1 << 20
print(f"{'run':10} {'records':>9} {'page':>8} {'s':>5} {'cols':>5} {'peak ok':>7}  growing drawn  kinds at the tensors' peak")
bad = 0
for r in runs:
    page = os.path.join(work, r + ".html")
    if not os.path.exists(page):
        print(f"{r:10} (no page)"); bad += 1; continue
    text = open(page).read()
    data = json.loads(re.search(r'<script id="gpushim-data" type="application/json">(.*?)</script>', text, re.S).group(1))
    t = data["traces"][0]
    lane = max(t["lanes"], key=lambda l: max(l["columns"]["live"]))
    peak = json.load(open(os.path.join(work, r + ".peak.json")))
    pk = max((p for p in peak if p["device"] == lane["device"]), key=lambda p: p["live_bytes"], default=None)
    peak_ok = pk is not None and lane["peak"] and pk["live_bytes"] == lane["peak"]["bytes"] \
        and lane["columns"]["live"][lane["peak"]["column"]] == pk["live_bytes"]
    labels = {(l["label"], l["kind"]) for l in lane["lines"]}
    growing = t["growing"]
    drawn = sum(1 for g in growing if (g["line"], g["kind"]) in labels)
    for g in growing:
        if (g["line"], g["kind"]) not in labels:
            same = [l["kind"] for l in lane["lines"] if l["label"] == g["line"]]
            print(f"  {r}: not drawn: {g['line'][:100]} ({g['kind']}); lines of that label: {same}")
    c = lane["columns"]
    at = max(range(len(c["live"])), key=lambda i: sum(k[i] for k in c["kinds"]))
    kinds = ", ".join(f"{k['name']} {c['kinds'][i][at] / MiB:.0f}" for i, k in enumerate(data["kinds"]) if c["kinds"][i][at])
    ok = peak_ok and drawn == len(growing) and (r != "leaks" or len(growing) >= 2)
    bad += not ok
    print(f"{r:10} {t['events']:>9} {len(text) / 1024:>6.0f}KB {secs.get(r, float('nan')):>5.2f} {len(c['live']):>5} {str(peak_ok):>7}  {drawn}/{len(growing):<11} {kinds} (MiB)")
print("every page: the peak where `peak` says, every growing line drawn with its kind" if not bad else f"{bad} run(s) off")
sys.exit(1 if bad else 0)
PY
