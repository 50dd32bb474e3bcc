#!/usr/bin/env bash
# The one-host Spark and Ray cells (standing and per-job) at an earlier commit and at this checkout,
# alternating on this machine in one go (the same load for both): where each cell listened and what
# its launch cost (bench/cell_listeners.py), and the median launch per cell and commit.
#
#   bash bench/isolation_ab.sh <earlier-commit> [rounds]     # default 1 round: ~2 x 4 min on 2 cores
#
# The earlier commit runs from a git worktree (/tmp/isolation-ab-<commit>) with this checkout's .venv
# (its `pipelines` first on PYTHONPATH, so the worktree's code runs). bench/RESULTS.md holds what it printed.
set -euo pipefail
# shellcheck source=bench/ab_worktree.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab_worktree.sh"
ab_worktree isolation-ab "${1:-}" 1 "${2:-}"
OUT="$(mktemp -d /tmp/isolation-ab.XXXXXX)"
# shellcheck disable=SC1091
source "$ROOT/scripts/airflow_env.sh"
run_one() {  # <tree> <run id>
  (cd "$1" && PYTHONPATH="$1" "$ROOT/.venv/bin/python" -m pipelines run --profile smoke --output "$OUT/runs" \
     --run-id "$2" --set train_samples=200 --set test_samples=100 --set epochs=1 --set 'worker_counts=[2]' \
     --set 'backends=["spark","ray","spark_per_job","ray_per_job"]' --set spark_master=embedded \
     --set "tracking.mlflow_tracking_uri=sqlite:///$OUT/mlflow.db" > "$OUT/$2.log" 2>&1) \
    || { tail -5 "$OUT/$2.log" >&2; echo "$2 failed (log: $OUT/$2.log)" >&2; }
}
runs=()
for r in $(seq "$ROUNDS"); do
  run_one "$TREE" "$OLD-r$r"; run_one "$ROOT" "$NEW-r$r"
  runs+=("$OUT/runs/$OLD-r$r" "$OUT/runs/$NEW-r$r")
done
"$ROOT/.venv/bin/python" "$ROOT/bench/cell_listeners.py" --medians "${runs[@]}"
