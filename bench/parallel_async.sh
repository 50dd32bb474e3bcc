#!/usr/bin/env bash
# Model parallelism (pipeline-4) and asynchronous training (async) beside plain data parallelism, on one
# host and across 2 emulated hosts at unshaped and 100 Mbit/s links; then the table (bench/parallel_async.py):
#   bash bench/parallel_async.sh [OUT_DIR]       # default bench/results/parallel-async-<UTC stamp>
# Two runs (a run has one cluster kind): "onehost" (this host, loopback) and "hosts" (cluster.kind=emulated,
# 2 hosts of half a core each, the two networks). A run already in OUT_DIR is resumed. Needs root.
# Workload (the same in both runs, the smoke profile's, which learns past 0.65 on a random-init BERT-tiny): 1,200
# reviews, 48 tokens (left truncation), 3 epochs, lr 2e-3, batch 16 per rank (the pipeline's global 32 rows in 4
# microbatches), 2 workers, ddp and spark (TorchDistributor's local mode on one host; its standalone cluster
# on the hosts). BACKENDS overrides the platforms. Then TensorFlow (Keras, MultiWorkerMirroredStrategy; the
# default strategy only, so runs of its own beside ddp: "tf-onehost", "tf-hosts") on the same workload.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${1:-bench/results/parallel-async-$(date -u +%Y%m%dT%H%M%SZ)}"
BACKENDS="${BACKENDS:-[\"ddp\",\"spark\"]}"
mkdir -p "$OUT"
# shellcheck disable=SC1091
source scripts/airflow_env.sh >/dev/null
PY="$ROOT/.venv/bin/python"
COMMON=(--set train_samples=1200 --set test_samples=400 --set max_seq_len=48 --set batch_size=16
        --set batch_policy=per_worker --set learning_rate=2e-3 --set truncation_side=left --set epochs=3
        --set min_class_fraction=0.35 --set repeats=1 --set cell_retries=0
        --set 'worker_counts=[2]' --set 'strategies=["default","pipeline-4","async"]' --set "backends=$BACKENDS")

run() {  # run NAME PROFILE --set ... : one run folder, resumed where it exists
  local name="$1" profile="$2"; shift 2
  local where=(--output "$OUT" --run-id "$name")
  [ ! -f "$OUT/$name/config.json" ] || where=(--run-dir "$OUT/$name")
  echo "== $name: $(date -u +%T)"
  start=$(date +%s)
  "$PY" -m pipelines run --profile "$profile" "${where[@]}" "${COMMON[@]}" "$@" > "$OUT/$name.log" 2>&1 \
    || echo "   $name: some cells failed (see $OUT/$name.log)"
  echo "   $name: $(( $(date +%s) - start )) s"
}

run onehost smoke
run hosts cluster --set cluster.hosts=2 --set cluster.cpu_per_host=0.5 --set 'networks=["unshaped","100mbit"]'
TF=(--set 'strategies=["default"]' --set 'backends=["ddp","tensorflow"]')
run tf-onehost smoke "${TF[@]}"
run tf-hosts cluster --set cluster.hosts=2 --set cluster.cpu_per_host=0.5 --set 'networks=["unshaped","100mbit"]' "${TF[@]}"
"$PY" bench/parallel_async.py "$OUT/onehost" "$OUT/hosts" "$OUT/tf-onehost" "$OUT/tf-hosts" | tee "$OUT/table.md"
