#!/usr/bin/env bash
# Browser end-to-end check: a full Airflow (standalone) runs a tiny imdb_benchmark, Chromium
# checks the UI (login, trigger form, Benchmarks page). Everything runs in a private network
# and PID namespace, so no server of it listens outside that namespace's loopback (Airflow's
# log servers bind all interfaces) and nothing outlives the script.
#
#   bash scripts/e2e_browser.sh [ARTIFACTS_DIR]      # default tests/e2e/artifacts; needs root
#
# Uses scripts/airflow_env.sh and scripts/airflow_setup.sh (the project's Airflow settings);
# what must be private to this check, AIRFLOW_HOME and the output root, lives in a temporary
# folder, deleted at the end. ARTIFACTS_DIR gets results.json, the screenshots,
# airflow.log (standalone's output) and, on failure, the task logs.
# Exit status: the driver's (0 = all steps passed; tests/e2e/ui_driver.py says which failed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ART="$(realpath -m "${1:-$ROOT/tests/e2e/artifacts}")"

if [ -z "${E2E_IN_NAMESPACE:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "e2e_browser.sh: needs root for 'unshare --net' (private network)" >&2; exit 2; }
  command -v chromium >/dev/null || { echo "e2e_browser.sh: chromium missing: bash scripts/system_deps.sh" >&2; exit 2; }
  export E2E_IN_NAMESPACE=1
  # --pid --fork --kill-child: this script is PID 1 there; when it ends, every process left ends.
  exec unshare --net --pid --fork --kill-child --mount-proc bash "$0" "$ART"
fi

ip link set lo up
cd "$ROOT"
mkdir -p "$ART"
rm -f "$ART"/0?_*.png "$ART"/results.json "$ART"/failed_task_logs.txt  # 1?_*.png: e2e_benchmarks_page.sh
WORK="$(mktemp -d /tmp/e2e-airflow.XXXXXX)"
# shellcheck disable=SC1091
source "$ROOT/scripts/namespace_cleanup.sh"
cleanup_on_exit "$WORK"

# Private to this check (airflow_env.sh keeps values already set): home and outputs in $WORK.
export AIRFLOW_HOME="$WORK/airflow_home" BENCHMARK_OUTPUT_ROOT="$WORK/runs"
# Production-style metadata DB: this machine's PostgreSQL, reached over its Unix socket (the
# namespace has no route to the host's 127.0.0.1:5432), in a fresh database. E2E_DB=sqlite
# keeps Airflow's SQLite default instead (the `airflow dags test` tests cover that one).
if [ "${E2E_DB:-postgres}" = postgres ]; then
  PGSOCK="${PGSOCK:-/var/run/postgresql}"
  psql -h "$PGSOCK" -U postgres -qc "DROP DATABASE IF EXISTS bench_ui_e2e" >/dev/null
  psql -h "$PGSOCK" -U postgres -qc "CREATE DATABASE bench_ui_e2e" >/dev/null
  export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg2://postgres@/bench_ui_e2e?host=$PGSOCK"
fi
# shellcheck disable=SC1091
source "$ROOT/scripts/airflow_env.sh"
mkdir -p "$AIRFLOW_HOME" "$BENCHMARK_OUTPUT_ROOT"
bash "$ROOT/scripts/airflow_setup.sh" > "$ART/airflow_setup.log" 2>&1 \
  || { echo "airflow_setup.sh failed; see $ART/airflow_setup.log" >&2; tail -20 "$ART/airflow_setup.log" >&2; exit 1; }

# Rank 0 stalls after its epoch-1 checkpoint so the driver's SIGKILL lands there (retry test):
# the loop's epoch-end hook, armed with the test-only fault injection module.
# Two repeats of one cell run at once (2 pool slots): the host lock must serialise their timing.
export PIPELINES_EPOCH_END_HOOK=tests.fault_injection:hold FAULT_HOLD_AFTER_EPOCH=1 FAULT_HOLD_CELL=ddp-w1-r0
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
airflow standalone > "$ART/airflow.log" 2>&1 &
AIRFLOW_PID=$!

CONF=$(cat <<EOF
{"profile": "smoke", "backends": ["ddp"], "worker_counts": [1], "epochs": 2, "repeats": 2,
 "train_samples": 200, "test_samples": 100, "max_seq_len": 64}
EOF
)
rc=0
"$ROOT/.venv/bin/python" "$ROOT/tests/e2e/ui_driver.py" --artifacts "$ART" --conf "$CONF" --kill-training || rc=$?

kill -TERM "$AIRFLOW_PID" 2>/dev/null || true
for _ in $(seq 1 20); do kill -0 "$AIRFLOW_PID" 2>/dev/null || break; sleep 0.5; done
if [ "$rc" != 0 ]; then
  cp -r "$AIRFLOW_HOME/logs" "$ART/airflow_task_logs" 2>/dev/null || true
fi
exit "$rc"
