#!/usr/bin/env bash
# One-shot `airflow-init` service of docker-compose.yaml: create or upgrade Airflow's metadata DB
# and create/resize the pool "training_workers" (one slot per GPU in the fleet; default: this
# container's CPU count). Idempotent: safe on every `docker compose up`.
set -euo pipefail
slots="${BENCHMARK_TRAINING_SLOTS:-$(nproc)}"
airflow db migrate
airflow pools set training_workers "$slots" \
  "Training workers of the imdb_benchmark DAG: one slot per GPU (CPU core without GPUs)"
echo "airflow-init: metadata DB migrated, pool training_workers=$slots slots"
