#!/usr/bin/env bash
# Every experiment script in smoke mode (CPU, tiny models, synthetic data, 2 steps), then a pass table with times.
#   bash scripts/experiments/smoke_all.sh [NAME ...]      (default: all; JOBS=2 runs two at a time)
# Logs: runs/smoke/logs/<name>.log. Exits 1 when any experiment fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in scripts/experiments/*.sh; do
    n=$(basename "$f" .sh)
    [[ "$n" == _* || "$n" == smoke_all ]] || names+=("$n")
  done
fi
logs=runs/smoke/logs
mkdir -p "$logs"
jobs_max="${JOBS:-1}"

run_one() {  # NAME -> writes $logs/NAME.{log,result}
  local n="$1" t0 rc ms
  t0=$(date +%s%N)
  SMOKE=1 bash "scripts/experiments/$n.sh" >"$logs/$n.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s %d.%d\n' "$rc" $((ms / 1000)) $((ms % 1000 / 100)) >"$logs/$n.result"
}

for n in "${names[@]}"; do
  [ -f "scripts/experiments/$n.sh" ] || { echo "no such experiment: $n" >&2; exit 2; }
  rm -f "$logs/$n.result"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  echo "[smoke_all] $n ..." >&2
  run_one "$n" &
done
wait

fail=0
printf '\n| experiment | smoke | seconds |\n|---|---|---|\n'
for n in "${names[@]}"; do
  read -r rc secs <"$logs/$n.result" || { rc=1; secs=0; }
  if [ "$rc" = 0 ]; then st=pass; else st="FAIL (exit $rc, $logs/$n.log)"; fail=1; fi
  printf '| %s | %s | %s |\n' "$n" "$st" "$secs"
done
exit $fail
