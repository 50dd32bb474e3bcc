#!/usr/bin/env bash
# Scale-out check of Airflow itself: CeleryExecutor with Redis as broker and PostgreSQL as
# metadata DB and Celery result backend; a Celery worker executes a tiny imdb_benchmark run.
#
#   bash scripts/e2e_celery.sh [ARTIFACTS_DIR]     # default tests/airflow/artifacts; needs root
#
# Everything runs in a private network + PID namespace (Airflow's log servers bind all
# interfaces; nothing here may listen outside loopback), so every process it starts dies with
# it. Inside, PostgreSQL (this machine's server) is reached over its Unix socket, and a Redis
# server of the check's own listens on the namespace's 127.0.0.1:6379. A fresh database
# bench_celery_e2e is created for each check.
# ARTIFACTS_DIR gets result.json (run state, task instances with host/queue/Celery task id,
# the rows of celery_taskmeta; see tests/airflow/celery_driver.py), every component's log and
# run/ (the run's cells/*/result.json and report/summary.json).
# Exit status: the driver's (0 = the DAG run succeeded, 1 = it did not or a component died);
# 2 = not root. Wall time 2-4 min on 2 cores.
# Needs: redis-server; PostgreSQL with its socket in $PGSOCK, user postgres without password;
# celery < 5.7 for apache-airflow-providers-celery 3.26 (celery 5.7 removed what it imports).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ART="$(realpath -m "${1:-$ROOT/tests/airflow/artifacts}")"
PGSOCK="${PGSOCK:-/var/run/postgresql}"
DB=bench_celery_e2e

if [ -z "${E2E_IN_NAMESPACE:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "e2e_celery.sh: needs root for 'unshare --net'" >&2; exit 2; }
  psql -h "$PGSOCK" -U postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1
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

# Each component's pid goes to the driver, which stops waiting as soon as one of them dies.
WATCH=()
start() {  # start NAME CMD...: CMD in the background, output in $ART/NAME.log
  local name="$1"; shift
  "$@" > "$ART/$name.log" 2>&1 &
  WATCH+=(--watch "$name=$!=$ART/$name.log")
}

start redis redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir "$WORK"

# shellcheck disable=SC1091
source "$ROOT/scripts/airflow_env.sh"
export AIRFLOW_HOME="$WORK/airflow_home" BENCHMARK_OUTPUT_ROOT="$WORK/runs"
export AIRFLOW__CORE__EXECUTOR=CeleryExecutor
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg2://postgres@/$DB?host=$PGSOCK"
export AIRFLOW__CELERY__BROKER_URL="redis://127.0.0.1:6379/0"
export AIRFLOW__CELERY__RESULT_BACKEND="db+postgresql://postgres@/$DB?host=$PGSOCK"
export AIRFLOW__CELERY__WORKER_CONCURRENCY=2
export AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT=600
# A short run: check for new work and parse the DAG file often.
export AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC=2
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=10
mkdir -p "$AIRFLOW_HOME" "$BENCHMARK_OUTPUT_ROOT"
bash scripts/airflow_setup.sh > "$ART/airflow_setup.log" 2>&1 \
  || { tail -30 "$ART/airflow_setup.log" >&2; exit 1; }

start api-server airflow api-server
start scheduler airflow scheduler
start dag-processor airflow dag-processor
start celery-worker airflow celery worker --concurrency 2

CONF=$(cat <<JSON
{"profile": "smoke", "backends": ["ddp"], "worker_counts": [1], "epochs": 1, "repeats": 1,
 "train_samples": 200, "test_samples": 100, "max_seq_len": 64}
JSON
)
rc=0
"$ROOT/.venv/bin/python" "$ROOT/tests/airflow/celery_driver.py" --artifacts "$ART" --conf "$CONF" \
  --dsn "dbname=$DB user=postgres host=$PGSOCK" --timeout "${E2E_RUN_TIMEOUT:-240}" "${WATCH[@]}" || rc=$?
# Keep what the run wrote that is small (the run folder itself goes with $WORK).
for f in "$BENCHMARK_OUTPUT_ROOT"/*/cells/*/result.json "$BENCHMARK_OUTPUT_ROOT"/*/report/summary.json; do
  [ -f "$f" ] || continue
  rel="${f#"$BENCHMARK_OUTPUT_ROOT"/*/}"
  mkdir -p "$ART/run/$(dirname "$rel")" && cp "$f" "$ART/run/$rel"
done
exit "$rc"
