#!/usr/bin/env bash
# Scale-out check of Airflow itself: CeleryExecutor with Redis as broker and PostgreSQL as
# metadata DB and Celery result backend; a Celery worker executes a tiny imdb_benchmark run.
#
#   bash scripts/e2e_celery.sh [ARTIFACTS_DIR]     # default tests/scaleout/artifacts; needs root
#
# Everything runs in a private network + PID namespace (Airflow's log servers bind all
# interfaces; nothing here may listen outside loopback). Inside it, PostgreSQL (this machine's
# server) is reached over its Unix socket, and a Redis server of the check's own listens on the
# namespace's 127.0.0.1:6379. A fresh database bench_celery_e2e is created for the check.
# ARTIFACTS_DIR gets result.json (run state, task states, Celery results) and the logs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ART="$(realpath -m "${1:-$ROOT/tests/scaleout/artifacts}")"
PGSOCK="${PGSOCK:-/var/run/postgresql}"
DB=bench_celery_e2e

if [ -z "${E2E_IN_NAMESPACE:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "e2e_celery.sh: needs root for 'unshare --net'" >&2; exit 2; }
  psql -h "$PGSOCK" -U postgres -qc "DROP DATABASE IF EXISTS $DB" >/dev/null
  psql -h "$PGSOCK" -U postgres -qc "CREATE DATABASE $DB" >/dev/null
  export E2E_IN_NAMESPACE=1
  exec unshare --net --pid --fork --kill-child --mount-proc bash "$0" "$ART"
fi

ip link set lo up
cd "$ROOT"
mkdir -p "$ART"
rm -f "$ART"/*.log "$ART"/result.json
WORK="$(mktemp -d /tmp/e2e-celery.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir "$WORK" \
  > "$ART/redis.log" 2>&1 &

# shellcheck disable=SC1091
source "$ROOT/scripts/airflow_env.sh"
export AIRFLOW_HOME="$WORK/airflow_home" BENCHMARK_OUTPUT_ROOT="$WORK/runs"
export AIRFLOW__CORE__EXECUTOR=CeleryExecutor
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg2://postgres@/$DB?host=$PGSOCK"
export AIRFLOW__CELERY__BROKER_URL="redis://127.0.0.1:6379/0"
export AIRFLOW__CELERY__RESULT_BACKEND="db+postgresql://postgres@/$DB?host=$PGSOCK"
export AIRFLOW__CELERY__WORKER_CONCURRENCY=2
export AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT=600
mkdir -p "$AIRFLOW_HOME" "$BENCHMARK_OUTPUT_ROOT"
bash scripts/airflow_setup.sh > "$ART/airflow_setup.log" 2>&1 \
  || { tail -30 "$ART/airflow_setup.log" >&2; exit 1; }

airflow api-server > "$ART/api-server.log" 2>&1 &
airflow scheduler > "$ART/scheduler.log" 2>&1 &
airflow dag-processor > "$ART/dag-processor.log" 2>&1 &
airflow celery worker --concurrency 2 > "$ART/celery-worker.log" 2>&1 &

DATA="$(realpath -m "${SHARED_DATA:-$ROOT/../shared/data}")"
CONF=$(cat <<JSON
{"profile": "smoke", "backends": ["ddp"], "worker_counts": [1], "epochs": 1, "repeats": 1,
 "train_samples": 200, "test_samples": 100, "max_seq_len": 64,
 "dataset_source": "$DATA/imdb", "tokenizer_source": "$DATA/bert-tiny", "model_source": "$DATA/bert-tiny"}
JSON
)
"$ROOT/.venv/bin/python" "$ROOT/tests/scaleout/celery_driver.py" --artifacts "$ART" --conf "$CONF" \
  --dsn "dbname=$DB user=postgres host=$PGSOCK"
