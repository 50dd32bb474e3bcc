# shellcheck shell=bash
# Airflow settings for this project. Source it (do not run it):
#     source scripts/airflow_env.sh && bash scripts/airflow_setup.sh && airflow standalone
# Paths are computed from this file's location, so any clone works. Values already set in the
# environment win (e.g. AIRFLOW_HOME=/tmp/x source scripts/airflow_env.sh for a throw-away home).
# The metadata DB is SQLite in $AIRFLOW_HOME (Airflow's default) unless
# AIRFLOW__DATABASE__SQL_ALCHEMY_CONN is set (e.g. PostgreSQL on 127.0.0.1:5432).

_bench_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
_bench_python="$_bench_root/.venv/bin/python"
[ -x "$_bench_python" ] || _bench_python="$(command -v python3)"

export AIRFLOW_HOME="${AIRFLOW_HOME:-$_bench_root/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$_bench_root/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$_bench_root/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export AIRFLOW__CORE__EXECUTOR="${AIRFLOW__CORE__EXECUTOR:-LocalExecutor}"
# The default parallelism (32) starts 32 worker processes; training cells are heavy anyway.
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-4}"
export AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG="${AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG:-4}"
# Importing the DAG and the plugin is fast, but a loaded 2-core box can stretch it.
export AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT="${AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT:-60}"
# Loopback only: the API server binds 0.0.0.0 by default. Tasks reach it at the same address.
export AIRFLOW__API__HOST="${AIRFLOW__API__HOST:-127.0.0.1}"
export AIRFLOW__API__PORT="${AIRFLOW__API__PORT:-8080}"
: "${AIRFLOW__CORE__EXECUTION_API_SERVER_URL:=http://$AIRFLOW__API__HOST:$AIRFLOW__API__PORT/execution/}"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL

# `airflow` on PATH; `pipelines` is installed in the venv (scripts/bootstrap.sh: pip install -e .),
# so the scheduler, the tasks and Spark's workers import it without PYTHONPATH.
export PATH="$_bench_root/.venv/bin:$PATH"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$_bench_python}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$_bench_python}"
export TOKENIZERS_PARALLELISM=false

# Size of the pool "training_workers" (scripts/airflow_setup.sh): GPUs, else CPU cores.
if [ -z "${BENCHMARK_TRAINING_SLOTS:-}" ]; then
  _bench_gpus="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)"
  if [ "${_bench_gpus:-0}" -gt 0 ] 2>/dev/null; then
    BENCHMARK_TRAINING_SLOTS="$_bench_gpus"
  else
    BENCHMARK_TRAINING_SLOTS="$(nproc)"
  fi
fi
export BENCHMARK_TRAINING_SLOTS

# Defaults for DAG params left empty (read by the DAG when a run starts, and by the UI plugin):
# run folders under <project>/runs; the local IMDB copy and BERT-tiny when ../shared/data has them.
export BENCHMARK_OUTPUT_ROOT="${BENCHMARK_OUTPUT_ROOT:-$_bench_root/runs}"
_bench_shared="${SHARED_DATA:-$_bench_root/../shared/data}"
if [ -z "${BENCHMARK_DATASET_SOURCE:-}" ] && [ -d "$_bench_shared/imdb" ]; then
  BENCHMARK_DATASET_SOURCE="$(cd "$_bench_shared/imdb" && pwd)"
  export BENCHMARK_DATASET_SOURCE
fi
if [ -d "$_bench_shared/bert-tiny" ]; then
  _bench_tiny="$(cd "$_bench_shared/bert-tiny" && pwd)"
  export BENCHMARK_TOKENIZER_SOURCE="${BENCHMARK_TOKENIZER_SOURCE:-$_bench_tiny}"
  export BENCHMARK_MODEL_SOURCE="${BENCHMARK_MODEL_SOURCE:-$_bench_tiny}"
fi
unset _bench_root _bench_python _bench_gpus _bench_shared _bench_tiny
