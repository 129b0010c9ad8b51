#!/usr/bin/env bash
# a real run that grows until the device is out, read from a small ring: every report answers, as from the whole trace.
# On the GPU machine: scripts/gpu/ring_oom.py (GPT-2, batch 4 x 512, keeping every step's logits
# until CUDA is out of memory; all but FREE_GIB of the device taken first, default 40: some 90
# steps) runs twice under `gpushim run`: through a 4 MiB ring (`trace_max:4MiB`, the least it
# takes, lapped a few times before the failure: what long runs always are) and into a whole
# trace (16 GiB). Every report is run on both: summary, leaks, peak, oom, fit, the page, and
# the page at the run's batch (`report --at`, which runs `fit`'s model). One table: each
# report's exit status and seconds on the ring, whether it panicked, and its answer from the
# ring beside the whole trace's (`fit`'s failures per batch count what its replay meets over
# the records it replays: through the ring, the last steps only). The two traces are left in
# $OUT/ringoom/ when OUT is set.
#   bash scripts/gpu.sh ringoom[:FREE_GIB]
set -euo pipefail
export FREE_GIB=${1:-40}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in ring whole; do
  case $t in ring) max=4MiB ;; whole) max=16GiB ;; esac
  # The run dies of its out-of-memory error (exit status 1): expected.
  "$GPUSHIM_BIN" run --conf "trace_max:$max" --trace "$work/$t.trace" -- \
    python3 scripts/gpu/ring_oom.py --batch-size 4 >"$work/$t.out" 2>"$work/$t.err" || true
  grep -q "OutOfMemoryError" "$work/$t.err" || { echo "$t: the run did not run out of memory"; tail -5 "$work/$t.err"; }
  for r in summary leaks peak oom fit; do
    s=$EPOCHREALTIME
    "$GPUSHIM_BIN" "$r" --json "$work/$t.trace" >"$work/$t.$r.json" 2>"$work/$t.$r.err" \
      && rc=0 || rc=$?
    echo "$t $r $rc $s $EPOCHREALTIME" >>"$work/runs"
  done
  for r in report report-at; do
    args=(); [ $r = report-at ] && args=(--at 4)
    s=$EPOCHREALTIME
    "$GPUSHIM_BIN" report "${args[@]}" "$work/$t.trace" -o "$work/$t.$r.html" >/dev/null 2>"$work/$t.$r.err" \
      && rc=0 || rc=$?
    echo "$t $r $rc $s $EPOCHREALTIME" >>"$work/runs"
  done
  # The traces kept for a look elsewhere, when OUT is set.
  [ -n "${OUT:-}" ] && mkdir -p "$OUT/ringoom" && cp "$work/$t.trace" "$OUT/ringoom/"
  echo "$t steps $(grep -c '^STEP' "$work/$t.out") $(stat -c %s "$work/$t.trace" 2>/dev/null || echo 0)" >>"$work/steps"
done
python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
MiB = 1 << 20
runs = {}
for l in open(os.path.join(work, "runs")):
    t, r, rc, a, b = l.split()
    err = open(os.path.join(work, f"{t}.{r}.err"), errors="replace").read()
    runs[t, r] = (int(rc), float(b) - float(a), "panicked" in err, err.strip().splitlines()[-1:] or [""])
def load(t, r):
    try:
        return json.load(open(os.path.join(work, f"{t}.{r}.json")))
    except (OSError, ValueError):
        return None
for l in open(os.path.join(work, "steps")):
    t, _, n, size = l.split()
    h = (load(t, "summary") or {}).get("health", {})
    print(f"{t}: {n} steps before the failure, trace file {int(size) / MiB:.1f} MiB, "
          f"{h.get('committed')} records in detail, {h.get('summarized')} summarized, "
          f"{h.get('unsummarized')} lost to the summarizer")
def answer(t, r):
    d = load(t, r)
    if d is None:
        return "-"
    if r == "summary":
        failed = sum(a["failed"] for a in d["apis"])
        return f"failed calls {failed}; live at exit " + ", ".join(
            f"{x['device']}: {x['live_bytes_at_end'] / MiB:.0f} MiB" for x in d["devices"])
    if r == "leaks":
        g = (d.get("iterations") or {}).get("growing") or []
        top = max(g, key=lambda x: x["bytes_per_iteration"]) if g else None
        return f"{len(g)} growing; most {top['bytes_per_iteration'] / MiB:.0f} MiB/it at {top['call_site'][:60]}" if top else "none growing"
    if r == "peak":
        return "; ".join(f"device {p['device']}: {p['live_bytes'] / MiB:.0f} MiB" for p in d)
    if r == "oom":
        if not d:
            return "no failure"
        f = d[0]
        return (f"{len(d)} failure(s); {f['requested_bytes'] / MiB:.0f} MiB asked at "
                f"{f['request_site'][:50]}; live {f['live_bytes'] / MiB:.0f} MiB")
    if r == "fit":
        s = d["settings"][0]
        return f"at {d['at']}: largest batch {s['largest_batch']}; rows {[(x['batch'], x['failures']) for x in s['rows']]}"
    return ""
print(f"{'report':10} {'ring rc':>7} {'s':>6} {'panic':>5}  answer (ring | whole)")
bad = 0
for r in ("summary", "leaks", "peak", "oom", "fit", "report", "report-at"):
    rc, s, panic, last = runs.get(("ring", r), (None, 0, False, [""]))
    wrc = runs.get(("whole", r), (None,))[0]
    ring, whole = answer("ring", r), answer("whole", r)
    ok = rc == 0 and wrc == 0 and not panic
    bad += not ok
    same = "same" if ring == whole else "differs"
    print(f"{r:10} {rc!s:>7} {s:>6.2f} {str(panic):>5}  {same}: {ring}")
    if ring != whole:
        print(f"{'':32}whole: {whole}")
    if rc != 0:
        print(f"{'':32}{last[0][:200]}")
print(f"{7 - bad} of 7 reports answered on both traces without a panic")
PY
