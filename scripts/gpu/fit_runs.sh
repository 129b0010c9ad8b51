# Real runs for the fit sections (sourced by scripts/gpu/sections/fit.sh and fitckpt.sh): each a
# fresh process of scripts/gpu/fit_truth.py, 3 steps, with whatever FIT_* the caller set;
# each appends its TRUTH line to the file named by $truth.

# fit_setup NAME: the section's folder $work ($OUT/NAME when OUT is set, else a new one), its
# truth file $truth, and $limit (20 GiB, as set_per_process_memory_fraction holds PyTorch).
fit_setup() {
  work=${OUT:+$OUT/$1}
  work=${work:-$(mktemp -d)}
  mkdir -p "$work"
  limit=$((20 << 30))
  truth="$work/truth.jsonl"
  touch "$truth"
}

# fit_traced MODEL BATCH [FIT_ARGS...]: MODEL run at BATCH under `gpushim run`, then `gpushim
# fit` of its trace at 1x, 4x and 8x the batch under $limit (FIT_ARGS added), into
# $work/MODEL.fit.json; fails, saying so, where the traced run failed.
fit_traced() {
  local m=$1 b=$2
  shift 2
  "$GPUSHIM_BIN" run --trace "$work/$m.trace" -- python3 scripts/gpu/fit_truth.py run "$m" "$b" 3 \
    >/dev/null 2>"$work/$m.err" || { echo "$m: traced run failed"; tail -3 "$work/$m.err"; return 1; }
  "$GPUSHIM_BIN" fit "$work/$m.trace" --at "$b" --batch "$b,$((4 * b)),$((8 * b))" \
    --limit "$limit" "$@" --json > "$work/$m.fit.json"
}

# fit_predicted MODEL SETTING: the largest batch $work/MODEL.fit.json says under SETTING.
fit_predicted() {
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(next(s['largest_batch'] for s in d['settings'] if s['setting'] == sys.argv[2]))" "$work/$1.fit.json" "$2"
}

# fit_one MODEL BATCH SETTING [LIMIT]: one run; says whether it ran (not out of memory).
fit_one() {
  local line
  line=$(PYTORCH_CUDA_ALLOC_CONF=$3 python3 scripts/gpu/fit_truth.py run "$1" "$2" 3 ${4:-} 2>/dev/null | grep '^TRUTH' | sed 's/^TRUTH //') || true
  [ -n "$line" ] || { echo "$1 batch $2 '$3': the run failed" >&2; return 2; }
  echo "$line" >> "$truth"
  ! grep -q '"oom": true' <<< "$line"
}

# fit_largest MODEL PREDICTED SETTING LIMIT: the truth about a predicted largest batch: it runs
# and the next does not, or step up or down until so (three steps at most).
fit_largest() {
  local n
  if fit_one "$1" "$2" "$3" "$4"; then
    for n in 1 2 3; do fit_one "$1" $(($2 + n)) "$3" "$4" || break; done
  else
    for n in 1 2 3; do [ $(($2 - n)) -ge 1 ] || break; ! fit_one "$1" $(($2 - n)) "$3" "$4" || break; done
  fi
  return 0
}
