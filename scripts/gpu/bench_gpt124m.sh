#!/bin/bash
# GPU machine: `deltadeck bench train` on issue 7's GPT-2-124M llama shape, matched to
# `torch_reference.py --style llama --batch 16 --seq 1024` exactly (123,587,328 parameters: 12
# layers, d 768, 12 heads of 64, SwiGLU 2048, vocab 50304, tied embeddings, no QK-norm, dense causal
# batches).
#   bash scripts/gpu/bench_gpt124m.sh build-gpu/app/deltadeck [--profile] [--steps N] ...
set -euo pipefail
bin=${1:?usage: bench_gpt124m.sh DELTADECK_BINARY [extra bench train arguments]}
shift
"$bin" bench train --family gpt --preset base --precision bf16 --batch 16 --seq-len 1024 \
  --set model.vocab_size=50304 --set model.L=12 --set model.d=768 --set model.attn_heads=12 \
  --set model.attn_kv_heads=12 --set model.attn_head_dim=64 --set model.ffn_hidden=2048 \
  --set model.tie_embeddings=true --set model.qk_norm=false --set data.document_attention=false "$@"
