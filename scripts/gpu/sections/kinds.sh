#!/usr/bin/env bash
# memory by kind against the truth computed inside the program (parameters, gradients, optimizer state, activations).
# On the GPU machine: scripts/gpu/kinds_truth.py (GPT-2, ResNet-50, and a transformer under fp16
# autocast with a GradScaler; the default loop, gradients kept between steps, frozen layers,
# gradient accumulation, ...) under `gpushim run`, nothing set. Its truth, in requested bytes,
# against `gpushim summary --json`'s tensors by kind at exit and at the tensors' peak:
# parameters, gradients and optimizer state must be within 1% at exit and at the peak (the
# gradients at the peak only where the loop keeps them: with set_to_none they are being
# rebuilt); activations within 5% of what the forward left as the backward began (the truth's
# own moment; their figure at the tensors' peak is shown beside it, not judged: a backward may
# have freed some by then); through a ring (the variant ring), only the kinds at exit. One
# table. Run through scripts/gpu.sh.
#   bash scripts/gpu.sh kinds[:RUN,...]   RUN is MODEL or MODEL-VARIANT (gpt2-keepgrad, ...);
#   the variant ring runs 60 steps through an 8 MiB ring (the trace of any length)
set -euo pipefail
runs=${*:-gpt2 gpt2-keepgrad resnet50 resnet50-keepgrad amp amp-keepgrad gpt2-frozen resnet50-accum gpt2-ckpt resnet50-late amp-twoopt gpt2-ring gpt2-shutdown}
work=$(mktemp -d)
for r in $runs; do
  model=${r%%-*}; variant=""; [ "$model" != "$r" ] && variant=${r#*-}
  # ring: 60 steps through an 8 MiB ring (about 2 s of GPT-2's records), so the early steps are
  # the checkpoint's.
  conf=(); steps=4
  [ "$variant" = ring ] && { conf=(--conf trace_max:8MiB); steps=60; variant=""; }
  if "$GPUSHIM_BIN" run "${conf[@]}" --trace "$work/$r.trace" -- python3 scripts/gpu/kinds_truth.py "$model" $steps $variant \
      >"$work/$r.out" 2>"$work/$r.err"; then
    grep '^TRUTH' "$work/$r.out" | sed 's/^TRUTH //' > "$work/$r.truth"
    "$GPUSHIM_BIN" summary --json "$work/$r.trace" > "$work/$r.summary"
  else
    echo "$r: run failed"; tail -5 "$work/$r.err"
  fi
done
python3 - "$work" $runs <<'PY'
import json, os, sys
work, runs = sys.argv[1], sys.argv[2:]
MiB = 1 << 20
print(f"{'run':16} {'kind':16} {'truth':>11} {'at exit':>11} {'err':>7} {'at peak':>11} {'err':>7}")
print("(activations: 'at exit' holds gpushim's activations at their most, as a backward began, which the truth measures;")
print(" after a shutdown that freed what the program held, 'at exit' is summary's kinds as the program's code ended)")
bad = 0
for r in runs:
    try:
        truth = json.load(open(f"{work}/{r}.truth"))
        s = json.load(open(f"{work}/{r}.summary"))
    except (OSError, ValueError) as e:
        print(f"{r:16} no result ({e})"); bad += 1; continue
    f = s["framework"][0]
    of = lambda key: {k["kind"]: k["bytes"] for k in f.get(key, [])}
    exit_, peak = of("kinds_at_exit"), of("kinds_at_peak")
    # After a shutdown that freed what the program held: the kinds as its code ended.
    if f.get("kinds_before_shutdown"):
        exit_ = {k["kind"]: k["bytes"] for k in f["kinds_before_shutdown"]["kinds"]}
    keep = r.endswith("keepgrad")
    # Through a ring, the kinds at exit come through the checkpoint; the peak and the backward
    # passes lie before the ring's detail, where summary gives no kinds yet (docs/kinds.md).
    ring = r.endswith("ring")
    for kind, limit in (("parameter", 1), ("gradient", 1), ("optimizer_state", 1), ("activation", 5)):
        t = truth[kind]
        cells = []
        for figures, judged in ((exit_, kind != "activation"),
                                (peak, (kind != "gradient" or keep) and kind != "activation" and not ring)):
            v = figures.get(kind, 0)
            err = 100.0 * (v - t) / t if t else 0.0
            ok = abs(err) <= limit
            if judged and not ok:
                bad += 1
            cells.append(f"{v / MiB:10.1f}M {err:+6.2f}%" + ("" if judged else "~") + ("" if ok or not judged else " FAIL"))
        if kind == "activation":
            # What the truth measures: the activations at their most, as the backward begins.
            v = f.get("activations_peak_bytes", 0)
            err = 100.0 * (v - t) / t if t else 0.0
            bad += abs(err) > limit and not ring
            cells[0] = f"{v / MiB:10.1f}M {err:+6.2f}%" + ("~" if ring else "" if abs(err) <= limit else " FAIL")
        print(f"{r:16} {kind:16} {t / MiB:10.1f}M {cells[0]:>20} {cells[1]:>20}")
    if f.get("kinds_before_shutdown"):
        after = ", ".join(f"{k} {v / MiB:.1f}M" for k, v in of("kinds_at_exit").items())
        print(f"{r:16} {'(shutdown)':16} at exit, after Python's shutdown freed what the program held: {after or 'nothing'}")
    rest = {k: v for k, v in peak.items() if k not in ("parameter", "gradient", "optimizer_state", "activation")}
    print(f"{r:16} {'(peak)':16} {truth['peak'] / MiB:10.1f}M gpushim {f['allocated_peak_bytes'] / MiB:.1f}M; "
          f"the rest at the peak: " + ", ".join(f"{k} {v / MiB:.1f}M" for k, v in rest.items())
          + (f"; {s['health']['summarized']} records in the checkpoint" if s["health"].get("summarized") else ""))
print(f"kinds: {bad} outside the bounds (~: not judged there)")
PY
