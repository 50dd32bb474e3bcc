#!/usr/bin/env bash
# The what-if model's validation campaign (bench/whatif_validate.py says what each axis fits and predicts):
#   bash bench/whatif_validate.sh [CAMPAIGN_DIR] [run ...]
# trains the runs below into CAMPAIGN_DIR (default bench/results/whatif-<UTC stamp>; a run already there
# is resumed, its finished cells kept), then prints the error table. Name runs to train only those
# (hosts links core1 epochs3 epochs1 strategies). Needs root (emulated hosts). BACKENDS overrides the platforms.
# Every run: the cluster profile's loop on a tiny workload (320 reviews, 32 tokens, 1 epoch, batch 16 per
# rank), emulated hosts at half a core each (cluster.cpu_per_host=0.5) unless the run is about that share.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CAMPAIGN="${1:-bench/results/whatif-$(date -u +%Y%m%dT%H%M%SZ)}"
shift || true
RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=(hosts links core1 epochs3 epochs1 strategies)
BACKENDS="${BACKENDS:-[\"ddp\",\"determined\",\"deepspeed\",\"spark\",\"ray\"]}"
mkdir -p "$CAMPAIGN"
# shellcheck disable=SC1091
source scripts/airflow_env.sh >/dev/null
PY="$ROOT/.venv/bin/python"
COMMON=(--set train_samples=320 --set test_samples=160 --set max_seq_len=32 --set batch_size=16
        --set batch_policy=per_worker --set repeats=1 --set cell_retries=0)

run() {  # run NAME --set ... : one run folder of the campaign, resumed where it exists
  local name="$1"; shift
  local where=(--output "$CAMPAIGN" --run-id "$name")
  [ ! -f "$CAMPAIGN/$name/config.json" ] || where=(--run-dir "$CAMPAIGN/$name")
  echo "== $name: $(date -u +%T)"
  start=$(date +%s)
  "$PY" -m pipelines run --profile cluster "${where[@]}" "${COMMON[@]}" --set "backends=$BACKENDS" "$@" \
    > "$CAMPAIGN/$name.log" 2>&1 || echo "   $name: some cells failed (see $CAMPAIGN/$name.log)"
  echo "   $name: $(( $(date +%s) - start )) s"
}

for name in "${RUNS[@]}"; do
  case "$name" in
    hosts) run hosts --set cluster.hosts=4 --set cluster.cpu_per_host=0.5 --set 'worker_counts=[1,2,3,4]' \
             --set 'networks=["unshaped"]' --set epochs=1 ;;
    links) run links --set cluster.hosts=2 --set cluster.cpu_per_host=0.5 --set 'worker_counts=[2]' \
             --set 'networks=["unshaped","1gbit","100mbit","50mbit"]' --set epochs=1 ;;
    core1) run core1 --set cluster.hosts=2 --set 'worker_counts=[1,2]' --set 'networks=["unshaped"]' --set epochs=1 ;;
    epochs3) run epochs3 --set cluster.hosts=2 --set cluster.cpu_per_host=0.5 --set 'worker_counts=[1,2]' \
               --set 'networks=["unshaped"]' --set epochs=3 ;;
    epochs1) run epochs1 --set cluster.hosts=2 --set cluster.cpu_per_host=0.5 --set 'worker_counts=[1,2]' \
               --set 'networks=["unshaped"]' --set epochs=1 ;;  # right after epochs3: the job axis's fit
    strategies) BACKENDS='["ddp","spark","ray"]' run strategies --set cluster.hosts=2 \
                  --set cluster.cpu_per_host=0.5 --set 'worker_counts=[2]' --set 'networks=["100mbit"]' \
                  --set 'strategies=["default","fp16","powersgd-r2"]' --set epochs=1 ;;
    *) echo "unknown run $name (hosts links core1 epochs3 epochs1 strategies)" >&2; exit 2 ;;
  esac
done
"$PY" bench/whatif_validate.py "$CAMPAIGN" --json "$CAMPAIGN/validation.json"
