#!/usr/bin/env bash
# README command (b): set up everything on a fresh machine, then run the whole test suite.
#   bash scripts/test.sh [pytest args]      e.g.  bash scripts/test.sh -m "not e2e"
# The docker-compose stack e2e (tests/compose, 5-10 min, needs root) is part of it: opt out
# with  BENCHMARK_COMPOSE_E2E=0 bash scripts/test.sh
# Tests marked `heavy` (over ~1 min each, their path covered by a shorter test) are left out, to keep
# CI near 45 min on 2 cores: BENCHMARK_HEAVY_TESTS=1 bash scripts/test.sh runs them too (so does
# pytest on their file). A -m of your own narrows further: -m "not slow" runs "not heavy and (not slow)".
# With CI=true a skip that tests/conftest.py's ALLOWED_SKIPS does not list fails the run.
set -euo pipefail
export BENCHMARK_COMPOSE_E2E="${BENCHMARK_COMPOSE_E2E:-1}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/system_deps.sh
bash scripts/compose_plugin.sh  # tests/compose/test_compose.py: `docker compose config`
# The whole suite with the stack e2e: its images (minutes of pip and apt, cold) are built in the
# background from here on, while .venv is made and the tests run; the stack test, which pytest runs
# last (tests/conftest.py), waits for that build (a lock) and then finds every layer cached. Held back
# (E2E_CPU_SHARES: a CPU cgroup of low weight) so the build takes the CPU the tests leave idle, not half
# of it: a niceness would not do, as each session of the build's is a scheduling group of its own.
# (The whole stack in the background was tried: its dozen idle services then burn more CPU beside the
# tests than the stack's own run takes at the end: bench/RESULTS.md, "The compose stack beside the tests".)
whole_suite=1
for a in "$@"; do [ ! -e "${a%%::*}" ] || whole_suite=""; done
if [ "$BENCHMARK_COMPOSE_E2E" = 1 ] && [ -n "$whole_suite" ] && [ "$(id -u)" = 0 ]; then
  mkdir -p tests/compose/artifacts/prebuild
  E2E_CPU_SHARES=64 setsid -f bash scripts/compose_e2e.sh --build-only tests/compose/artifacts/prebuild \
    > tests/compose/artifacts/prebuild/compose_e2e.out 2>&1 < /dev/null
  echo "compose stack e2e: images building in the background (tests/compose/artifacts/prebuild/compose_e2e.out)"
fi
bash scripts/bootstrap.sh
bash scripts/services.sh
# shellcheck disable=SC1091
source scripts/airflow_env.sh
# Lint: undefined names, unused imports, syntax errors, Airflow 3 migration rules (AIR3).
"$ROOT/.venv/bin/ruff" check --select F,E9,AIR3 pipelines dags plugins tests bench
# pytest keeps only the last -m, so the caller's -m EXPR (the last, as pytest would) is combined with
# this script's own: -m "not heavy and (EXPR)"; with BENCHMARK_HEAVY_TESTS=1, -m EXPR alone.
marker=""; args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m) [ $# -ge 2 ] || { echo "scripts/test.sh: -m needs an expression" >&2; exit 4; }
        marker="($2)"; shift 2 ;;
    -m?*) marker="(${1#-m})"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ "${BENCHMARK_HEAVY_TESTS:-0}" != 1 ]; then marker="not heavy${marker:+ and $marker}"; fi
select=(); [ -z "$marker" ] || select=(-m "$marker")
exec "$ROOT/.venv/bin/python" -m pytest --durations=25 --timeout=1200 "${select[@]}" ${args[@]+"${args[@]}"}
