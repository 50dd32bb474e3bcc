#!/usr/bin/env bash
# Create .venv and install the project's pinned dependencies (idempotent).
# torch comes first from the CPU wheel: otherwise pip resolves a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PY" -m venv "$ROOT/.venv"
fi
VPY="$ROOT/.venv/bin/python"
stamp="$ROOT/.venv/.requirements.sha256"
want="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-tensorflow.txt" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q "torch==2.13.0"
  "$VPY" -m pip install -q -r "$ROOT/requirements.txt"
  # the TensorFlow platform's set: co-installs with the pinned one, kept apart for the image's size
  "$VPY" -m pip install -q -r "$ROOT/requirements.txt" -r "$ROOT/requirements-tensorflow.txt"
  echo "$want" > "$stamp"
fi
# The project itself, editable: dags/, plugins/, bench/ and every worker process import
# `pipelines` from this checkout without sys.path or PYTHONPATH edits.
if [ "$(cd / && "$VPY" -c 'import pipelines, pathlib; print(pathlib.Path(pipelines.__file__).resolve().parent.parent)' 2>/dev/null)" != "$ROOT" ]; then
  "$VPY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
fi
"$VPY" -c "import torch, airflow, pyspark, great_expectations, mlflow, determined, ray, transformers, keras_hub; print('deps ok: torch', torch.__version__, 'airflow', airflow.__version__)"
