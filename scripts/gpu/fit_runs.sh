# Real runs for the fit sections (sourced by scripts/gpu/sections/fit.sh and fitckpt.sh): each a
# fresh process of scripts/gpu/fit_truth.py, 3 steps, with whatever FIT_* the caller set;
# each appends its TRUTH line to the file named by $truth.

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
