#!/usr/bin/env bash
# Horovod's row: try the registry's last release against the project's pinned torch, in a scratch
# environment (never the project's .venv): no fork, no patched source, no git install.
#
#   bash bench/horovod_try.sh [scratch-dir]      # default /tmp/horovod-try; ~3-6 min on 2 cores
#
# Prints the versions, the build's outcome and, when it fails, the first compiler errors; the
# whole log stays in <scratch-dir>/pip.log. bench/RESULTS.md ("Horovod") holds what it printed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRATCH="${1:-/tmp/horovod-try}"
HOROVOD="${HOROVOD_VERSION:-0.28.1}"
TORCH="$(sed -n 's/^torch==//p' "$ROOT/requirements.txt" | head -1)"
TORCH="${TORCH:-2.13.0}"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
python3 -m venv "$SCRATCH/venv"
PY="$SCRATCH/venv/bin/python"
"$PY" -m pip install -q --upgrade pip setuptools wheel cmake >/dev/null 2>&1
"$PY" -m pip install -q "torch==$TORCH" >/dev/null 2>&1 || { echo "torch==$TORCH did not install"; exit 2; }
echo "python $("$PY" -c 'import sys; print(sys.version.split()[0])'), torch $("$PY" -c 'import torch; print(torch.__version__)'), gcc $(gcc -dumpfullversion), cmake $("$SCRATCH/venv/bin/cmake" --version | head -1 | awk '{print $3}')"
# PyTorch only, Gloo controller (no MPI, no NCCL): the smallest build Horovod documents for CPU
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
       HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j2
echo "command: HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 pip install --no-cache-dir --no-build-isolation horovod==$HOROVOD"
start=$(date +%s)
if "$PY" -m pip install --no-cache-dir --no-build-isolation -v "horovod==$HOROVOD" > "$SCRATCH/pip.log" 2>&1; then
  echo "horovod $HOROVOD built in $(( $(date +%s) - start )) s"
  "$PY" -c 'import horovod.torch as hvd; hvd.init(); print("horovod.torch init ok: size", hvd.size())'
  exit 0
fi
echo "horovod $HOROVOD failed to build after $(( $(date +%s) - start )) s; first errors (log: $SCRATCH/pip.log):"
grep -m 8 -E "error:|#error|Error [0-9]|CMake Error" "$SCRATCH/pip.log" | sed 's/^ *//' | cut -c1-240
exit 1
