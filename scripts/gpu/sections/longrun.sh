#!/usr/bin/env bash
# runs of any length on real models: the iteration found, trace bytes per hour, GPT-2 in 64 MiB against a whole trace.
# Each workload of scripts/gpu/workloads.py (GPT-2, ResNet-50, a transformer; shapes changing
# every step) runs STEPS steps (and its 6 warm-up steps) under the default run (`gpushim run`,
# nothing set); a table gives the steps it ran, the boundaries `leaks` found and what marks
# them, records and trace bytes per step, and trace bytes per hour of that training (the file
# itself stops growing at trace_max, 2 GiB). Then GPT-2 runs LONG steps twice, with trace_max
# 64 MiB (a ring and its checkpoints) and 16 GiB (every record kept), and a second table says
# whether `leaks` (live at exit, what grows), `peak` (live bytes, the call site holding most),
# `oom` and `summary` (calls per API) answer the same, with each file's size and the time
# `gpushim leaks` took. Usage: bash scripts/gpu.sh longrun[:STEPS,LONG]  (default 60, 800)
set -euo pipefail
steps=${1:-60}
long=${2:-800}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf "%-12s %6s %10s %10s %12s %14s  %s\n" workload steps boundaries "records/s" "bytes/step" "MB/hour" "what marks the iteration"
for w in gpt2 resnet50 transformer; do
  "$GPUSHIM_BIN" run --trace "$work/$w.trace" -- python3 scripts/gpu/workloads.py "$w" default "$steps" \
    >"$work/$w.out" 2>&1 || { echo "$w: the run failed"; tail -5 "$work/$w.out"; continue; }
  "$GPUSHIM_BIN" leaks --json "$work/$w.trace" >"$work/$w.leaks.json"
  "$GPUSHIM_BIN" summary --json "$work/$w.trace" >"$work/$w.summary.json"
  python3 - "$w" "$((steps + 6))" "$work/$w.leaks.json" "$work/$w.summary.json" <<'PY'
import json, sys
w, ran = sys.argv[1], int(sys.argv[2])
leaks, summary = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
it = leaks.get("iterations") or {}
h = summary["health"]
records = h["committed"] + h["summarized"]
secs = summary["duration_ns"] / 1e9
mark = it.get("boundary", "none")
print(f"{w:<12} {ran:>6} {it.get('count', 0):>10} {records / secs:>10.0f} {records * 32 / ran:>12.0f} "
      f"{records * 32 / secs * 3600 / 1e6:>14.0f}  {'=' if it.get('count') == ran else '!='} {mark[:110]}")
PY
done
echo
echo "GPT-2, $long steps: a 64 MiB trace against a whole one (16 GiB)"
for t in bounded whole; do
  case $t in bounded) max=64MiB ;; whole) max=16GiB ;; esac
  "$GPUSHIM_BIN" run --conf "trace_max:$max" --trace "$work/$t.trace" -- \
    python3 scripts/gpu/workloads.py gpt2 default "$long" >"$work/$t.out" 2>&1 \
    || { echo "$t: the run failed"; tail -5 "$work/$t.out"; }
done
python3 - "$GPUSHIM_BIN" "$work" <<'PY'
import json, os, subprocess, sys, time
gpushim, work = sys.argv[1], sys.argv[2]
def report(name, trace):
    out = subprocess.run([gpushim, name, "--json", trace], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
rows, answers = [], {}
for t in ("bounded", "whole"):
    trace = os.path.join(work, t + ".trace")
    t0 = time.time()
    leaks = report("leaks", trace)
    secs = time.time() - t0
    peak, oom, summary = report("peak", trace), report("oom", trace), report("summary", trace)
    it = leaks.get("iterations") or {}
    answers[t] = {
        "leaks: live at exit": (leaks["live_at_exit_bytes"], [(h["label"], h["bytes"]) for h in leaks["live_at_exit"][:5]]),
        "leaks: what grows": [(g["call_site"], g["bytes_per_iteration"]) for g in it.get("growing", [])],
        "peak": [(p["device"], p["live_bytes"], p["by_call_site"][0]["label"] if p["by_call_site"] else "") for p in peak],
        "oom": len(oom),
        "summary: calls per API": [(a["api"], a["calls"], a["failed"], a["bytes"]) for a in summary["apis"]],
    }
    h = summary["health"]
    rows.append((t, os.path.getsize(trace), h["summarized"], h["unsummarized"], secs, it.get("count")))
print(f"{'trace':<8} {'file bytes':>14} {'summarized':>12} {'unsummarized':>13} {'leaks s':>8} {'boundaries':>11}")
for r in rows:
    print(f"{r[0]:<8} {r[1]:>14} {r[2]:>12} {r[3]:>13} {r[4]:>8.2f} {r[5]!s:>11}")
same = 0
for k in answers["whole"]:
    ok = answers["whole"][k] == answers["bounded"][k]
    same += ok
    print(f"  {k}: {'the same' if ok else 'DIFFERS'}")
    if not ok:
        print(f"    whole:   {answers['whole'][k]}\n    bounded: {answers['bounded'][k]}")
print(f"{same} of {len(answers['whole'])} answers the same")
PY
