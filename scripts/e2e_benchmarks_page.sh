#!/usr/bin/env bash
# Browser check of the Benchmarks page inside a real Airflow API server: trends with a
# regression alarm, the two-run comparison, links, empty state; screenshots. The output root
# holds a synthetic nightly history (tests/synthetic_history.py); no DAG runs here (the
# scheduler, DAG processor and executor are not started: the page needs only the API server).
# Runs in a private network and PID namespace like scripts/e2e_browser.sh.
#
#   bash scripts/e2e_benchmarks_page.sh [ARTIFACTS_DIR]   # default tests/e2e/artifacts; needs root
#
# ARTIFACTS_DIR gets page_results.json, 1x_*.png screenshots and api_server.log.
# Exit status: the driver's (tests/e2e/page_driver.py; 0 = every step passed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ART="$(realpath -m "${1:-$ROOT/tests/e2e/artifacts}")"

if [ -z "${E2E_IN_NAMESPACE:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "e2e_benchmarks_page.sh: needs root for 'unshare --net'" >&2; exit 2; }
  command -v chromium >/dev/null || { echo "chromium missing: bash scripts/system_deps.sh" >&2; exit 2; }
  export E2E_IN_NAMESPACE=1
  exec unshare --net --pid --fork --kill-child --mount-proc bash "$0" "$ART"
fi

ip link set lo up
cd "$ROOT"
mkdir -p "$ART"
rm -f "$ART"/1?_*.png "$ART"/page_error.png "$ART"/page_results.json
WORK="$(mktemp -d /tmp/e2e-page.XXXXXX)"
# shellcheck disable=SC1091
source "$ROOT/scripts/namespace_cleanup.sh"
cleanup_on_exit "$WORK"
export AIRFLOW_HOME="$WORK/airflow_home" BENCHMARK_OUTPUT_ROOT="$WORK/runs"
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$WORK/airflow_home/airflow.db"
export AIRFLOW__API__WORKERS=1 MLFLOW_UI_URL="http://127.0.0.1:5000"
# shellcheck disable=SC1091
source "$ROOT/scripts/airflow_env.sh"
mkdir -p "$AIRFLOW_HOME"
"$ROOT/.venv/bin/python" "$ROOT/tests/e2e/page_driver.py" --write-history "$BENCHMARK_OUTPUT_ROOT" &
HISTORY_PID=$!
airflow db migrate > "$ART/api_server.log" 2>&1
wait "$HISTORY_PID"
airflow api-server >> "$ART/api_server.log" 2>&1 &
API_PID=$!
rc=0
"$ROOT/.venv/bin/python" "$ROOT/tests/e2e/page_driver.py" --artifacts "$ART" || rc=$?
kill -TERM "$API_PID" 2>/dev/null || true
for _ in $(seq 1 20); do kill -0 "$API_PID" 2>/dev/null || break; sleep 0.5; done
exit "$rc"
