#!/bin/bash
# GPU machine: issue 7's FP8 loss check. Trains assets/configs/dense1b.toml for its 500 steps on a
# text corpus in bf16, then in fp8 (one after the other: the two do not fit on one 80 GB GPU at
# once), and prints each run's train loss at step 500 and validation losses at 250 and 500.
#   bash scripts/gpu/loss_fp8_dense1b.sh build-gpu/app/deltadeck 'text:.gpu/corpus/*' [runs dir]
set -euo pipefail
bin=${1:?usage: loss_fp8_dense1b.sh DELTADECK_BINARY DATA_SOURCE [RUNS_DIR]}
data=${2:?usage: loss_fp8_dense1b.sh DELTADECK_BINARY DATA_SOURCE [RUNS_DIR]}
runs=${3:-/tmp/dense1b-runs}
for p in bf16 fp8; do
  log="$runs/dense1b-$p.log"
  mkdir -p "$runs"
  "$bin" train --no-gui --config assets/configs/dense1b.toml --runs-dir "$runs" --set "data.train=[\"$data\"]" \
    --set "name=\"dense1b-$p\"" --set "train.precision=\"$p\"" > "$log" 2>&1 || { tail -5 "$log"; exit 1; }
  echo "== $p"
  grep -E '^step 500/|^eval step (250|500)' "$log"
done
