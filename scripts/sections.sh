# Sourced (not run) by scripts/gpu.sh and scripts/bench.sh: a script's sections, each a file
# DIR/NAME.sh whose second line says what it measures.
#   list_sections DIR ENTRY        prints the sections and what each measures
#   check_sections DIR ENTRY S...  exits 2 naming a section that is not there
#   run_sections DIR S...          runs each (NAME or NAME:ARG,ARG), then one table of what ran

section_what() { sed -n '2s/^# //p' "$1/$2.sh"; }

list_sections() {
  echo "usage: bash $2 SECTION[:ARG,...] ..."
  local f n
  for f in "$1"/*.sh; do
    n=$(basename "$f" .sh)
    printf '  %-10s %s\n' "$n" "$(section_what "$1" "$n")"
  done
}

check_sections() {
  local dir=$1 entry=$2 s
  shift 2
  for s in "$@"; do
    [ -f "$dir/${s%%:*}.sh" ] || { echo "no section '${s%%:*}': run bash $entry for the list" >&2; exit 2; }
  done
}

run_sections() {
  local dir=$1 s name start result
  local -a args rows=()
  shift
  for s in "$@"; do
    name=${s%%:*}; args=()
    [ "$s" != "$name" ] && IFS=, read -r -a args <<< "${s#*:}"
    echo; echo "=== $name: $(section_what "$dir" "$name")"
    start=$SECONDS
    if bash "$dir/$name.sh" "${args[@]}"; then result=ok; else result="failed ($?)"; fi
    rows+=("| $name | $(section_what "$dir" "$name") | $result | $((SECONDS - start)) |")
  done
  echo
  echo "| section | what it measures | result | seconds |"
  echo "|---|---|---|---:|"
  printf '%s\n' "${rows[@]}"
}
