#!/usr/bin/env bash
# Is the smoke DAG run slower than at an earlier commit? Both commits' smoke DAG runs, alternating
# on this machine in one go (the same load for both), and their ratio.
#
#   bash bench/smoke_ab.sh <earlier-commit> [rounds]     # default 2 rounds: ~4 x 4 min on 2 cores
#
# The earlier commit runs from a git worktree (/tmp/smoke-ab-<commit>) with this checkout's .venv
# (its `pipelines` put first on PYTHONPATH, so the worktree's code runs, not this one's) and its
# own Airflow home. Prints each run's Airflow run_duration (the `DagRun Finished` line) and the
# median ratio new / earlier; bench/RESULTS.md holds what it printed.
set -euo pipefail
# shellcheck source=bench/ab_worktree.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab_worktree.sh"
ab_worktree smoke-ab "${1:-}" 2 "${2:-}"
run_one() {  # <tree> -> seconds of the DAG run
  local tree="$1" home out
  home="$(mktemp -d /tmp/smoke-ab-home.XXXXXX)"
  out="$(cd "$tree" && AIRFLOW_HOME="$home" BENCHMARK_OUTPUT_ROOT="$home/runs" PYTHONPATH="$tree" \
         SHARED_DATA="${SHARED_DATA:-$ROOT/../shared/data}" \
         SMOKE_SKIP_SETUP=1 bash scripts/smoke.sh 2>&1)" || { echo "$out" | tail -5 >&2; echo "failed"; return; }
  echo "$out" | grep -o "run_duration=[0-9.]*" | tail -1 | cut -d= -f2
  rm -rf "$home"
}
old_s=(); new_s=()
for r in $(seq "$ROUNDS"); do
  o="$(run_one "$TREE")"; n="$(run_one "$ROOT")"
  old_s+=("$o"); new_s+=("$n")
  echo "round $r: $OLD ${o} s, $NEW ${n} s"
done
python3 - "${old_s[*]}" "${new_s[*]}" "$OLD" "$NEW" <<'EOF'
import statistics, sys
old, new = ([float(x) for x in a.split() if x != "failed"] for a in sys.argv[1:3])
if old and new:
    mo, mn = statistics.median(old), statistics.median(new)
    print(f"median DAG run: {sys.argv[3]} {mo:.1f} s, {sys.argv[4]} {mn:.1f} s; ratio new/earlier {mn / mo:.3f}")
EOF
