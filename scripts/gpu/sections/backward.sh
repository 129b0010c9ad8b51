#!/usr/bin/env bash
# backward tensors name the forward line that made their backward function.
# On the GPU machine: scripts/gpu/backward_lines.py (four forward ops on lines marked FWD(name))
# and GPT-2 from transformers (scripts/gpu/workloads.py) under `gpushim run`, nothing set. From
# `gpushim events`: every tensor allocated on PyTorch's autograd thread (a stack whose first
# frame is a backward function), how many are joined to a forward line, and per backward
# function the lines of the small model it is joined to, each checked against the op that makes
# such a function (AddmmBackward0: fc1/fc2; ThresholdBackward0: relu; MulBackward0 and
# SigmoidBackward0: gate). Run through scripts/gpu.sh.
set -euo pipefail
work=$(mktemp -d)
"$GPUSHIM_BIN" run --trace "$work/small.trace" -- python3 scripts/gpu/backward_lines.py 5 >/dev/null 2>"$work/small.err" \
  || { echo "small model: run failed"; tail -5 "$work/small.err"; exit 1; }
"$GPUSHIM_BIN" run --trace "$work/gpt2.trace" -- python3 scripts/gpu/workloads.py gpt2 default 8 >/dev/null 2>"$work/gpt2.err" \
  || { echo "gpt2: run failed"; tail -5 "$work/gpt2.err"; }
"$GPUSHIM_BIN" events --quiet "$work/small.trace" > "$work/small.csv"
[ -f "$work/gpt2.trace" ] && "$GPUSHIM_BIN" events --quiet "$work/gpt2.trace" > "$work/gpt2.csv" || true
python3 - "$work" <<'PY'
import collections, csv, os, re, sys
work = sys.argv[1]
marks = {}
for n, line in enumerate(open("scripts/gpu/backward_lines.py"), 1):
    m = re.search(r"FWD\((\w+)\)", line)
    if m:
        marks[n] = m.group(1)
expect = {"AddmmBackward0": {"fc1", "fc2"}, "ThresholdBackward0": {"relu"},
          "ReluBackward0": {"relu"}, "MulBackward0": {"gate"}, "SigmoidBackward0": {"gate"}}
failed = False
print(f"{'workload':9} {'backward tensors':>16} {'joined to a line':>17}")
joins = collections.defaultdict(collections.Counter)
for name in ("small", "gpt2"):
    path = os.path.join(work, name + ".csv")
    if not os.path.exists(path):
        print(f"{name:9} (no trace)")
        continue
    total = joined = 0
    for row in csv.DictReader(open(path)):
        if row["kind"] != "stack_ref" or "(autograd's backward)" not in row["text"].split(" < ")[0]:
            continue
        total += 1
        frames = row["text"].split(" < ")
        if len(frames) > 1:
            joined += 1
        if name == "small":
            fn = frames[0].split(" (")[0]
            lines = [int(m.group(1)) for f in frames[1:] for m in [re.search(r"backward_lines\.py:(\d+)", f)] if m]
            joins[fn][marks.get(lines[0], f"line {lines[0]}") if lines else "-"] += 1
    print(f"{name:9} {total:>16} {joined:>8} ({100 * joined / max(total, 1):.0f}%)")
print()
print(f"{'backward function':22} {'joined to (allocations)':40} check")
for fn, lines in sorted(joins.items()):
    want = expect.get(fn)
    got = {k for k in lines if k != "-"}
    ok = "-" if want is None else ("ok" if got and got <= want else "WRONG")
    failed |= ok == "WRONG"
    print(f"{fn:22} {', '.join(f'{k} ({v})' for k, v in lines.most_common()):40} {ok}")
sys.exit(1 if failed else 0)
PY
