#!/usr/bin/env bash
# README command (a): set up on a fresh machine and run the benchmark DAG on the smoke profile.
#   bash scripts/smoke.sh                 # embedded defaults: SQLite, local Spark, local MLflow store
#   BENCHMARK_DATASET_SOURCE=/data/aclImdb bash scripts/smoke.sh     # another data source
# Leaves everything in runs/<run_id>/ (snapshot, validation, tokens, cells, report) and the
# MLflow store in runs/mlflow.db (`mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/system_deps.sh --smoke  # Java for Spark; no browser
bash scripts/bootstrap.sh
# shellcheck disable=SC1091
source scripts/airflow_env.sh
bash scripts/airflow_setup.sh
conf="{\"profile\": \"smoke\"${BENCHMARK_CONF_EXTRA:+, $BENCHMARK_CONF_EXTRA}}"
echo "airflow dags test imdb_benchmark -c '$conf'"
start=$(date +%s)
airflow dags test imdb_benchmark -c "$conf"
latest=$(ls -t "$BENCHMARK_OUTPUT_ROOT"/*/config.json 2>/dev/null | head -1 | xargs -r dirname)
echo "smoke benchmark finished in $(( $(date +%s) - start )) s; run folder: ${latest:-none}"
[ -n "$latest" ] && [ -f "$latest/report/report.md" ] && cat "$latest/report/report.md"
exit 0
