#!/usr/bin/env bash
# Prepare Airflow for this project (idempotent; safe to run before every start):
#   1. create or upgrade the metadata DB (`airflow db migrate`),
#   2. create/resize the pool "training_workers" used by the DAG's train tasks: one slot per
#      GPU, or per CPU core without GPUs (BENCHMARK_TRAINING_SLOTS overrides).
#     bash scripts/airflow_setup.sh            # uses scripts/airflow_env.sh's settings
# Fails (non-zero) when the DB cannot be migrated or the pool cannot be written.
set -euo pipefail
# shellcheck disable=SC1091
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/airflow_env.sh"
mkdir -p "$AIRFLOW_HOME"

airflow db migrate >/dev/null
airflow pools set training_workers "$BENCHMARK_TRAINING_SLOTS" \
  "Training workers of the imdb_benchmark DAG: one slot per GPU (CPU core without GPUs)" >/dev/null
echo "airflow ready: AIRFLOW_HOME=$AIRFLOW_HOME, pool training_workers=$BENCHMARK_TRAINING_SLOTS slots"
