#!/usr/bin/env bash
# README command (a): set up on a fresh machine and run the benchmark DAG on the smoke profile.
#   bash scripts/smoke.sh                 # embedded defaults: SQLite, local Spark, local MLflow store
#   BENCHMARK_DATASET_SOURCE=/data/aclImdb bash scripts/smoke.sh     # another data source
#   BENCHMARK_CONF_EXTRA='"epochs": 2' bash scripts/smoke.sh         # more trigger params (JSON members)
#   SMOKE_SKIP_SETUP=1 bash scripts/smoke.sh   # skip system_deps.sh and bootstrap.sh (machine already
#                                              # set up, e.g. in tests); airflow_setup.sh still runs
# Leaves everything in runs/<run_id>/ (snapshot, validation, tokens, cells, report) and the
# MLflow store in runs/mlflow.db (`mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`).
# The whole output of `airflow dags test` is kept in $AIRFLOW_HOME/logs/smoke/smoke-<UTC time>.log.
# A failed run (dags test exits non-zero or the DAG run failed) ends with the log's path and, as the
# last line, the first failed task and its error (plugins/dag_failure.py), then exits non-zero:
#   smoke run failed: task ingest: DataSourceError: dataset_source='/nonexistent': path does not exist ...
#   smoke run failed: refused before any task ran: ParamValidationError: Invalid input for param epochs: ...
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ "${SMOKE_SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/system_deps.sh --smoke  # Java for Spark; no browser
  bash scripts/bootstrap.sh
fi
# shellcheck disable=SC1091
source scripts/airflow_env.sh
bash scripts/airflow_setup.sh
conf="{\"profile\": \"smoke\"${BENCHMARK_CONF_EXTRA:+, $BENCHMARK_CONF_EXTRA}}"
log="$AIRFLOW_HOME/logs/smoke/smoke-$(date -u +%Y%m%dT%H%M%SZ).log"
mkdir -p "$(dirname "$log")"
echo "airflow dags test imdb_benchmark -c '$conf'   (output also in $log)"
start=$(date +%s)
set +e
airflow dags test imdb_benchmark -c "$conf" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ] || grep -q "DagRun Finished:.*state=failed" "$log"; then
  # the first failed task and its error, from the metadata DB, the task logs and this output
  if ! why="$(python plugins/dag_failure.py imdb_benchmark --output "$log" 2>>"$log" | tail -n 1)"; then
    why="airflow dags test exited $rc; ${why:-plugins/dag_failure.py found no error}"
  fi
  echo "smoke run failed after $(( $(date +%s) - start )) s; full output: $log"
  echo "smoke run failed: $why"
  [ "$rc" -ne 0 ] && exit "$rc"
  exit 1
fi
latest=$(ls -t "$BENCHMARK_OUTPUT_ROOT"/*/config.json 2>/dev/null | head -1 | xargs -r dirname)
echo "smoke benchmark finished in $(( $(date +%s) - start )) s; run folder: ${latest:-none}"
[ -n "$latest" ] && [ -f "$latest/report/report.md" ] && cat "$latest/report/report.md"
exit 0
