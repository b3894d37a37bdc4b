#!/bin/bash
# GPU machine: the loss check of model.gdn_scan_precision. Trains the hybrid `base` preset (batch
# 8 × 2048, bf16) for 300 steps on a text corpus with the state scan's products in plain TF32 and
# in split TF32, one after the other, and prints each run's train loss at step 300 and its
# validation losses at 150 and 300.
#   bash scripts/gpu/loss_gdn_scan_precision.sh build-gpu/app/deltadeck 'text:.gpu/corpus/*' [runs dir]
set -euo pipefail
bin=${1:?usage: loss_gdn_scan_precision.sh DELTADECK_BINARY DATA_SOURCE [RUNS_DIR]}
data=${2:?usage: loss_gdn_scan_precision.sh DELTADECK_BINARY DATA_SOURCE [RUNS_DIR]}
runs=${3:-/tmp/gdn-scan-runs}
for p in tf32 fp32; do
  log="$runs/hybrid-base-$p.log"
  mkdir -p "$runs"
  "$bin" train --no-gui --config assets/configs/small.toml --runs-dir "$runs" --set "data.train=[\"$data\"]" \
    --set "name=\"hybrid-base-scan-$p\"" --set model.preset=base --set "model.gdn_scan_precision=\"$p\"" \
    --set train.batch_size=8 --set train.seq_len=2048 --set train.steps=300 --set train.warmup_steps=30 \
    --set train.lr=1e-3 --set run.eval_interval=150 --set run.save_interval=300 > "$log" 2>&1 || { tail -5 "$log"; exit 1; }
  echo "== $p"
  grep -E '^step 300/|^eval step (150|300)' "$log"
  grep -oE '[0-9.]+k? tok/s' "$log" | tail -1
done
