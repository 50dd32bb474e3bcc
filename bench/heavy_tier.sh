#!/usr/bin/env bash
# The heavy tier (tests marked `heavy`: larger repeats of paths CI runs once) in one command, then
# its table, platform x path:  bash bench/heavy_tier.sh [OUT_DIR] [pytest args]
# Needs root (emulated hosts) and the set-up of scripts/test.sh; 53 tests in ~46 min on 2 cores
# (bench/RESULTS.md, "the heavy tier again"). Run it before a release, after a change to a platform's
# multi-host or fault path, or when a heavy test's file changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/runs/heavy-$(date +%Y%m%d-%H%M%S)}"; shift || true
mkdir -p "$OUT"
cd "$ROOT"
# shellcheck disable=SC1091
source scripts/airflow_env.sh
start=$(date +%s)
rc=0
BENCHMARK_HEAVY_TESTS=1 "$ROOT/.venv/bin/python" -m pytest -p no:cacheprovider -m heavy --timeout=1800 \
    --durations=0 --junitxml="$OUT/heavy.xml" "$@" 2>&1 | tee "$OUT/heavy.log" || rc=$?
"$ROOT/.venv/bin/python" bench/heavy_table.py "$OUT/heavy.xml" | tee "$OUT/table.md"
echo "heavy tier wall time: $(( $(date +%s) - start )) s (log, junit and table in $OUT)"
exit "$rc"
