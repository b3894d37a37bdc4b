#!/bin/bash
# GPU machine with two GPUs (issue 6): the same small hybrid run, fp32, as 1 process × 2 rank threads
# and as 2 processes × 1 GPU meeting over a loopback TCPStore (NCCL), then the worst relative
# difference of their final weights. Run from the repository root with carry [".gpu"]:
#   bash scripts/gpu/two_process_nccl.sh build-gpu/app/deltadeck
set -euo pipefail
bin=${1:?usage: two_process_nccl.sh DELTADECK_BINARY}
work=$(mktemp -d)
export NCCL_NVLS_ENABLE=0  # the machines' NVLink multicast stays off
cat > "$work/run.toml" <<TOML
name = "nccl2"
[model]
family = "hybrid"
preset = "tiny"
[data]
train = ["text:$PWD/.gpu/corpus/*"]
val = 0.01
[train]
steps = 30
batch_size = 8
seq_len = 256
warmup_steps = 5
precision = "fp32"
[run]
log_interval = 10
eval_interval = 0
save_interval = 0
TOML
port=$((20000 + RANDOM % 20000))
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/threads" --set 'run.devices="0,1"' \
  > "$work/threads.out" 2>&1 || { cat "$work/threads.out"; exit 1; }
CUDA_VISIBLE_DEVICES=1 "$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/procs" --nnodes 2 \
  --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" --set 'run.devices="0"' > "$work/p1.out" 2>&1 &
p1=$!
CUDA_VISIBLE_DEVICES=0 "$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/procs" --nnodes 2 \
  --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" --set 'run.devices="0"' > "$work/p0.out" 2>&1 \
  || { cat "$work/p0.out" "$work/p1.out"; exit 1; }
wait "$p1" || { cat "$work/p1.out"; exit 1; }
echo "--- 1 process x 2 threads"; grep -E 'ranks|^step (10|20|30)/' "$work/threads.out"
echo "--- 2 processes x 1 GPU (node 0)"; grep -E 'ranks|^step (10|20|30)/' "$work/p0.out"
python3 - "$work/threads/nccl2/checkpoints/step_00000030/model.safetensors" \
  "$work/procs/nccl2/checkpoints/step_00000030/model.safetensors" <<'PY'
import json, struct, sys, torch
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.float32)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
worst = max(float((a[k] - b[k]).norm() / a[k].norm().clamp_min(1e-30)) for k in a)
print("2 processes x 1 GPU vs 1 process x 2 threads: %d tensors, worst relative weight difference %.3g" % (len(a), worst))
PY
