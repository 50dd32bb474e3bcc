#!/usr/bin/env bash
# GPU check: the study's setting (full IMDB 25k/25k, 20 epochs, seq 128, batch 32 per GPU) through
# the project's own training loop on one device; prints samples/s, s/epoch, the 20-epoch total and
# its ratio to the study's 499 s (DDP, 2 GPUs). See bench/gpu_check.py for what is measured.
#
#   bash scripts/gpu_check.sh prepare                 # CPU machine: token shards -> runs/gpu_check/data
#   bash scripts/gpu_check.sh wheels                  # pydantic wheels for a GPU host without it (PyPI)
#   bash scripts/gpu_check.sh pack                    # -> runs/gpu_check/gpu_check.tgz (code + shards + wheels)
#   bash scripts/gpu_check.sh run --device cuda       # GPU host: the default option matrix
#   bash scripts/gpu_check.sh run --bf16 --fused-adamw --data-on-gpu --cuda-graphs   # one option set
#   bash scripts/gpu_check.sh gpu                     # GPU host: the one prepared check (below)
#   bash scripts/gpu_check.sh gpu --tiny --device cpu --compile-backend aot_eager   # the same, tiny, CPU
#
# `gpu`: prepare first if DIR/data has no shards, then 20 epochs of the whole step in one CUDA
# graph (bf16+whole-graph), the previous best (bf16+fused+gpu-data+cuda-graphs) and the whole
# step with the compiled model (bf16+compile+whole-graph): at most 200 s each and 450 s in all,
# preparing included (~5 min expected on an H200); one table: 20-epoch seconds, ratio to the
# study's 499 s, test accuracy, the whole step's check against the loop's step.
# --tiny: 72 train / 48 test reviews (40 held out), seq 32, 2 epochs, batch 32 (a last batch of 8).
#
# Options: --work DIR (default runs/gpu_check: DIR/data, DIR/results, DIR/wheels); prepare:
# --train-samples --test-samples --validation-samples --seq-len --seed --shared --shard-rows;
# run: --device --epochs --batch-size --lr --matrix --target-epochs --study-seconds --threads
# --bf16 --fused-adamw --data-on-gpu --compile --cuda-graphs --dynamic --whole-graph
# --compile-backend --verify-steps --cell-timeout --time-budget; wheels: --python-version (default 3.12, the
# GPU image's). PYTHON picks the interpreter (default: the project's .venv if present, else
# python3). Needs only torch, transformers, pandas, pyarrow and pydantic on the GPU host;
# without pydantic there, `run` unpacks DIR/wheels (made by `wheels`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

usage() { sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
command="$1"; shift

WORK="$ROOT/runs/gpu_check"
PYVER=3.12
PREP_ARGS=(); RUN_ARGS=(); TINY_PREP=(); TINY_RUN=()
GPU_MATRIX="bf16+whole-graph,bf16+fused+gpu-data+cuda-graphs,bf16+compile+whole-graph"
GPU_BUDGET=450  # seconds for `gpu`, preparing included (the device lends 15 min in all)
while [ $# -gt 0 ]; do
  case "$1" in
    --work) WORK="$2"; shift 2 ;;
    --tiny)  # given first, so any explicit option after it still wins
      TINY_PREP=(--train-samples 72 --test-samples 48 --validation-samples 40 --seq-len 32)
      TINY_RUN=(--epochs 2 --batch-size 32); shift ;;
    --python-version) PYVER="$2"; shift 2 ;;
    --train-samples|--test-samples|--validation-samples|--seq-len|--seed|--shared|--shard-rows)
      PREP_ARGS+=("$1" "$2"); shift 2 ;;
    --device|--epochs|--batch-size|--lr|--matrix|--target-epochs|--study-seconds|--threads|--compile-backend|\
    --verify-steps|--cell-timeout|--time-budget)
      RUN_ARGS+=("$1" "$2"); shift 2 ;;
    --bf16|--fused|--fused-adamw|--gpu-data|--data-on-gpu|--compile|--cuda-graphs|--dynamic|--whole-graph)
      RUN_ARGS+=("$1"); shift ;;
    -h|--help) usage 0 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; usage ;;
  esac
done
DATA="$WORK/data"; RESULTS="$WORK/results"; WHEELS="$WORK/wheels"
PREP_ARGS=(${TINY_PREP[@]+"${TINY_PREP[@]}"} ${PREP_ARGS[@]+"${PREP_ARGS[@]}"})
RUN_ARGS=(${TINY_RUN[@]+"${TINY_RUN[@]}"} ${RUN_ARGS[@]+"${RUN_ARGS[@]}"})

do_prepare() {
  "$PYTHON" "$ROOT/bench/gpu_check.py" prepare --out "$DATA" ${PREP_ARGS[@]+"${PREP_ARGS[@]}"}
}

ensure_pydantic() {  # the GPU image has no pydantic: unpack the carried wheels (plain zip files)
  "$PYTHON" -c "import pydantic" 2>/dev/null && return 0
  compgen -G "$WHEELS/*.whl" >/dev/null || {
    echo "gpu_check.sh: pydantic is not installed for $PYTHON and $WHEELS has no wheels:" \
         "run 'bash scripts/gpu_check.sh wheels' where PyPI is reachable and copy $WHEELS along" >&2
    exit 1
  }
  local site="$WORK/site"
  rm -rf "$site"; mkdir -p "$site"
  "$PYTHON" - "$site" "$WHEELS"/*.whl <<'EOF'
import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
EOF
  export PYTHONPATH="$PYTHONPATH:$site"
  "$PYTHON" -c "import pydantic" || { echo "gpu_check.sh: the wheels in $WHEELS do not import here" >&2; exit 1; }
}

do_run() {
  ensure_pydantic
  "$PYTHON" "$ROOT/bench/gpu_check.py" run --data "$DATA" --out "$RESULTS" ${RUN_ARGS[@]+"${RUN_ARGS[@]}"}
}

do_gpu() {  # the one prepared device check: the whole-step graphs beside the previous best
  local start=$SECONDS
  if [ -f "$DATA/gpu_check_data.json" ]; then echo "gpu_check.sh: using the shards in $DATA"; else do_prepare; fi
  RUN_ARGS=(--device cuda --epochs 20 --matrix "$GPU_MATRIX" --cell-timeout 200
            --time-budget $((GPU_BUDGET - (SECONDS - start))) ${RUN_ARGS[@]+"${RUN_ARGS[@]}"})
  do_run
  echo "gpu_check.sh: gpu check took $((SECONDS - start)) s (results: $RESULTS/gpu_check.json)"
}

do_wheels() {  # the versions installed here (requirements.txt pins), for CPython $PYVER x86-64 Linux
  local specs
  specs=$("$PYTHON" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in
      ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")))
EOF
)
  mkdir -p "$WHEELS"
  # shellcheck disable=SC2086
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" $specs
  ls -l "$WHEELS"
}

do_pack() {  # one tarball to copy to the GPU host: the code the run needs, the shards, the wheels
  [ -f "$DATA/gpu_check_data.json" ] || { echo "gpu_check.sh: no shards in $DATA: run prepare first" >&2; exit 1; }
  local bundle="$WORK/gpu_check.tgz" stage
  stage=$(mktemp -d)
  mkdir -p "$stage/bench" "$stage/scripts" "$stage/runs/gpu_check"
  (cd "$ROOT" && tar cf - --exclude=__pycache__ pipelines) | tar xf - -C "$stage"
  cp "$ROOT/bench/gpu_check.py" "$stage/bench/"; cp "$ROOT/scripts/gpu_check.sh" "$stage/scripts/"
  cp -r "$DATA" "$stage/runs/gpu_check/data"
  [ -d "$WHEELS" ] && cp -r "$WHEELS" "$stage/runs/gpu_check/wheels"
  tar czf "$bundle" -C "$stage" .
  rm -rf "$stage"
  echo "bundle: $bundle ($(du -h "$bundle" | cut -f1)); on the GPU host:"
  echo "  mkdir gpu_check && tar xzf gpu_check.tgz -C gpu_check && cd gpu_check && bash scripts/gpu_check.sh gpu"
}

case "$command" in
  prepare) do_prepare ;;
  run) do_run ;;
  both) do_prepare; do_run ;;
  gpu) do_gpu ;;
  wheels) do_wheels ;;
  pack) do_pack ;;
  -h|--help|help) usage 0 ;;
  *) echo "gpu_check.sh: unknown command $command (prepare | run | both | gpu | wheels | pack)" >&2; usage ;;
esac
