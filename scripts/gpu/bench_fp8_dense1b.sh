#!/bin/bash
# GPU machine: issue 7's FP8 comparison on the dense 1B model (assets/configs/dense1b.toml's shape:
# d 2048, 18 layers of 16 heads × 128, SwiGLU 5632, no QK-norm), batch 8 × 2048 on random tokens:
# `bench train` in bf16 and in fp8, one after the other, then the fp8 / bf16 ratio of tokens/s.
#   bash scripts/gpu/bench_fp8_dense1b.sh build-gpu/app/deltadeck [extra bench train arguments]
# Extra arguments go to both runs, e.g. --steps 10 --warmup 3, --set data.document_attention=false
# (fixed shape: the step is a CUDA graph).
set -euo pipefail
bin=${1:?usage: bench_fp8_dense1b.sh DELTADECK_BINARY [extra bench train arguments]}
shift
declare -A tps
for p in bf16 fp8; do
  out=$("$bin" bench train --family gpt --preset base --precision $p --batch 8 --seq-len 2048 \
    --set model.d=2048 --set model.L=18 --set model.attn_heads=16 --set model.attn_kv_heads=16 \
    --set model.attn_head_dim=128 --set model.ffn_hidden=5632 --set model.qk_norm=false "$@" 2>&1)
  echo "$out" | grep -E '^\| gpt' || { echo "$out" | tail -5; exit 1; }
  tps[$p]=$(echo "$out" | grep -oE '"tokens_per_s":[0-9.]+' | cut -d: -f2)
done
python3 -c "print(f'fp8 / bf16 tokens/s: {${tps[fp8]} / ${tps[bf16]}:.3f}x')"
