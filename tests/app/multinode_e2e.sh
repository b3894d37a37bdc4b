#!/usr/bin/env bash
# Two deltadeck processes × 2 CPU ranks each meet over a loopback TCPStore (world size 4): they end
# with the weights of one process running 4 ranks as threads. Then a node is killed mid-run: node 0
# stops within the collective timeout with an error naming the rank and operation, the run is
# recorded as failed and its last checkpoint stays loadable. Last, SIGTERM reaches node 1 alone:
# node 0 learns of it through the store and the whole run stops at one step with a checkpoint. A
# second run of the same config is recorded under a new name, and node 1 logs under that name. A
# run with node-local runs folders and a shared run.checkpoint_dir resumes on both nodes.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
python=${2:-}
make_corpus "$work/corpus/jugs.txt" 300 'pack my box with five dozen liquor jugs'
cat > "$work/run.toml" <<TOML
name = "multi"
[model]
family = "gpt"
$TINY_MODEL_KEYS
[data]
train = ["text:$work/corpus/*.txt"]
val = 0.05
[train]
steps = 12
batch_size = 4
seq_len = 32
warmup_steps = 2
eval_batches = 2
[run]
log_interval = 4
eval_interval = 0
save_interval = 0
threads = 1
devices = "cpu:2"
collective_timeout_s = 20
TOML
port=$((20000 + RANDOM % 20000))

# 1. Reference: one process, 4 ranks as threads.
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/ref" --set 'run.devices="cpu:4"' \
  > "$work/ref.out" 2>&1 || { cat "$work/ref.out"; fail "4-thread reference run failed"; }

# 2. Two processes of 2 ranks.
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/multi" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
  --master-port "$port" > "$work/node1.out" 2>&1 &
pids+=($!)
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/multi" --nnodes 2 --node-rank 0 \
  --master-port "$port" > "$work/node0.out" 2>&1 || { cat "$work/node0.out" "$work/node1.out"; fail "node 0 failed"; }
wait "${pids[0]}" || { cat "$work/node1.out"; fail "node 1 failed"; }
grep -q "4 ranks (Gloo)" "$work/node0.out" || { cat "$work/node0.out"; fail "node 0 did not see 4 ranks"; }
grep -q "node 1 finished at step 12" "$work/multi/multi.node1.log" || { cat "$work/multi/multi.node1.log"; fail "node 1 log"; }
[ "$(sqlite3 "$work/multi/deltadeck.db" "SELECT count(*) FROM runs")" = 1 ] || fail "node 1 wrote to the database"
ref_ck="$work/ref/multi/checkpoints/step_00000012"
multi_ck="$work/multi/multi/checkpoints/step_00000012"
[ -f "$multi_ck/model.safetensors" ] || fail "no final checkpoint from node 0"
if [ -n "$python" ] && "$python" -c "import safetensors" 2> /dev/null; then
  "$python" - "$ref_ck" "$multi_ck" <<'PY' || fail "2×2 processes differ from 4 threads"
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1] + "/model.safetensors"), load_file(sys.argv[2] + "/model.safetensors")
worst = max(float((a[k] - b[k]).norm() / a[k].norm()) for k in a)
print("2 processes x 2 ranks vs 1 process x 4 ranks: worst relative weight error %.3g" % worst)
assert worst <= 1e-6, worst
PY
fi

# 2b. The same config again in the same runs folder: node 0 records the run as multi-2 (the name is
#     taken), and node 1 logs under that name, not into the first run's log.
port=$((port + 1))
lines_before=$(wc -l < "$work/multi/multi.node1.log")
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/multi" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
  --master-port "$port" --set train.steps=4 > "$work/again1.out" 2>&1 &
pids+=($!)
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/multi" --nnodes 2 --node-rank 0 \
  --master-port "$port" --set train.steps=4 > "$work/again0.out" 2>&1 \
  || { cat "$work/again0.out" "$work/again1.out"; fail "node 0 failed the second run"; }
wait "${pids[-1]}" || { cat "$work/again1.out"; fail "node 1 failed the second run"; }
[ "$(sqlite3 "$work/multi/deltadeck.db" "SELECT name FROM runs ORDER BY id DESC LIMIT 1")" = multi-2 ] \
  || fail "the second run was not recorded as multi-2"
grep -q "node 1 finished at step 4" "$work/multi/multi-2.node1.log" 2> /dev/null \
  || { ls "$work/multi"; cat "$work/multi/multi.node1.log"; fail "node 1 did not log under the recorded name multi-2"; }
[ "$(wc -l < "$work/multi/multi.node1.log")" = "$lines_before" ] || fail "node 1 wrote the second run into multi.node1.log"

# 3. Kill node 1 mid-run: node 0 stops within the collective timeout, marks the run failed, and
#    its last checkpoint is intact.
port=$((port + 1))
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/kill" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
  --master-port "$port" --set train.steps=100000 --set run.save_interval=5 --set run.collective_timeout_s=5 \
  > "$work/k1.out" 2>&1 &
victim=$!
pids+=($victim)
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/kill" --nnodes 2 --node-rank 0 \
  --master-port "$port" --set train.steps=100000 --set run.save_interval=5 --set run.collective_timeout_s=5 \
  > "$work/k0.out" 2>&1 &
node0=$!
pids+=($node0)
for _ in $(seq 1 600); do
  [ -d "$work/kill/multi/checkpoints/step_00000010" ] && break
  sleep 0.1
done
[ -d "$work/kill/multi/checkpoints/step_00000010" ] || { cat "$work/k0.out"; fail "no checkpoint before the kill"; }
kill -9 "$victim"
start=$(date +%s)
set +e
wait "$node0"
rc=$?
set -e
took=$(( $(date +%s) - start ))
[ "$rc" = 1 ] || { cat "$work/k0.out"; fail "node 0 exited $rc after its peer died, expected 1"; }
[ "$took" -le 30 ] || fail "node 0 took ${took}s to stop (timeout 5 s)"
db="$work/kill/deltadeck.db"
[ "$(sqlite3 "$db" "SELECT status FROM runs")" = failed ] || fail "run not marked failed"
msg=$(sqlite3 "$db" "SELECT message FROM runs")
echo "$msg" | grep -q "rank [0-9] of 4 on" || fail "failure message does not name the rank: $msg"
newest=$(ls -d "$work"/kill/multi/checkpoints/step_* | grep -v '\.tmp$' | sort | tail -1)
"$bin" export multi --runs-dir "$work/kill" --out "$work/kill-export" > /dev/null 2>&1 \
  || fail "the last checkpoint ($newest) does not load after the failure"
# 4. SIGTERM to node 1 only: every rank stops at the same step boundary, the run is "stopped" with
#    a checkpoint of that step.
port=$((port + 1))
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/term" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
  --master-port "$port" --set train.steps=100000 > "$work/t1.out" 2>&1 &
node1=$!
pids+=($node1)
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/term" --nnodes 2 --node-rank 0 \
  --master-port "$port" --set train.steps=100000 > "$work/t0.out" 2>&1 &
node0=$!
pids+=($node0)
for _ in $(seq 1 600); do
  grep -q "^step 8/" "$work/t0.out" 2>/dev/null && break
  sleep 0.1
done
kill -TERM "$node1"
for _ in $(seq 1 600); do kill -0 "$node0" 2>/dev/null || break; sleep 0.1; done
kill -0 "$node0" 2>/dev/null && { cat "$work/t0.out"; fail "node 0 still running 60 s after node 1 got SIGTERM"; }
set +e
wait "$node0"
rc0=$?
wait "$node1"
rc1=$?
set -e
db="$work/term/deltadeck.db"
[ "$(sqlite3 "$db" "SELECT status FROM runs")" = stopped ] || { cat "$work/t0.out" "$work/t1.out"; fail "run not stopped after SIGTERM to node 1 (node 0 exit $rc0, node 1 exit $rc1)"; }
grep -q "stop requested on node 1" "$work/t0.out" || { cat "$work/t0.out"; fail "node 0 does not say node 1 asked to stop"; }
stop_step=$(sqlite3 "$db" "SELECT max(step) FROM checkpoints")
grep -q "node 1 stopped at step $stop_step" "$work/term/multi.node1.log" \
  || { cat "$work/term/multi.node1.log"; fail "node 1 did not stop at step $stop_step"; }
# 5. Resume that run on both nodes (--resume latest, the shared runs folder): it continues from the
#    stop checkpoint to a new step count and finishes on both nodes.
target=$((stop_step + 4))
port=$((port + 1))
"$bin" train --no-gui --runs-dir "$work/term" --resume latest --set train.steps=$target --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
  --master-port "$port" > "$work/r1.out" 2>&1 &
node1=$!
pids+=($node1)
"$bin" train --no-gui --runs-dir "$work/term" --resume latest --set train.steps=$target --nnodes 2 --node-rank 0 \
  --master-port "$port" > "$work/r0.out" 2>&1 || { cat "$work/r0.out" "$work/r1.out"; fail "resumed node 0 failed"; }
wait "$node1" || { cat "$work/r1.out"; fail "resumed node 1 failed"; }
grep -q "resumed from .*step_$(printf %08d "$stop_step")" "$work/r0.out" || { cat "$work/r0.out"; fail "node 0 did not resume from step $stop_step"; }
[ "$(sqlite3 "$db" "SELECT status FROM runs")" = finished ] || fail "resumed run not finished"
grep -q "node 1 finished at step $target" "$work/term/multi.node1.log" || { cat "$work/term/multi.node1.log"; fail "node 1 did not finish at step $target"; }
# 6. A save of the last step cut short between its two renames left it as step_X.old. Node 1 starts
#    first and finds it under that name; node 0 renames it back before they meet. Both must name the
#    same checkpoint at the rendezvous and resume from it.
last=$work/term/multi/checkpoints/step_$(printf %08d "$target")
mv "$last" "$last.old" || fail "cannot move $last aside"
target2=$((target + 2))
port=$((port + 1))
"$bin" train --no-gui --runs-dir "$work/term" --resume latest --set train.steps=$target2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
  --master-port "$port" > "$work/o1.out" 2>&1 &
node1=$!
pids+=($node1)
sleep 2
"$bin" train --no-gui --runs-dir "$work/term" --resume latest --set train.steps=$target2 --nnodes 2 --node-rank 0 \
  --master-port "$port" > "$work/o0.out" 2>&1 || { cat "$work/o0.out" "$work/o1.out" "$work/term/multi.node1.log"; fail "node 0 failed resuming a moved-aside checkpoint"; }
wait "$node1" || { cat "$work/o1.out" "$work/term/multi.node1.log"; fail "node 1 failed resuming a moved-aside checkpoint"; }
grep -q "renamed $last.old back to $last" "$work/o0.out" || { cat "$work/o0.out"; fail "node 0 did not rename the checkpoint back"; }
grep -q "node 1 finished at step $target2" "$work/term/multi.node1.log" || { cat "$work/term/multi.node1.log"; fail "node 1 did not finish at step $target2"; }

# 7. Launched by torchrun (--no-python, one process a node): its agent on node 0 serves the store
#    and both nodes join it as clients, keys under this attempt's prefix.
torchrun_note="torchrun not checked (no torch in $python)"
if [ -n "$python" ] && "$python" -c "import torch.distributed.run" 2> /dev/null; then
  port=$((port + 1))
  for k in 1 0; do
    "$python" -m torch.distributed.run --no-python --nnodes 2 --nproc-per-node 1 --node-rank $k \
      --master-addr 127.0.0.1 --master-port "$port" "$bin" train --no-gui --config "$work/run.toml" \
      --runs-dir "$work/torchrun" --set train.steps=6 > "$work/tr$k.out" 2>&1 &
    pids+=($!)
  done
  n=${#pids[@]}
  wait "${pids[$((n - 1))]}" || { cat "$work/tr0.out" "$work/tr1.out"; fail "node 0 under torchrun failed"; }
  wait "${pids[$((n - 2))]}" || { cat "$work/tr1.out"; fail "node 1 under torchrun failed"; }
  grep -q "4 ranks (Gloo)" "$work/tr0.out" || { cat "$work/tr0.out"; fail "node 0 under torchrun did not see 4 ranks"; }
  grep -q "torchrun environment" "$work/tr0.out" || { cat "$work/tr0.out"; fail "node 0 did not read torchrun's variables"; }
  [ "$(sqlite3 "$work/torchrun/deltadeck.db" "SELECT status || ' ' || (SELECT max(step) FROM checkpoints) FROM runs")" = "finished 6" ] \
    || fail "the torchrun run is not recorded finished at step 6"
  grep -q "node 1 finished at step 6" "$work/torchrun/multi.node1.log" || fail "node 1 under torchrun did not finish"
  torchrun_note="torchrun's two agents: finished at step 6"
fi

# 8. Runs folders on each node's own disk (the database on node 0's only) and the checkpoints in a
#    folder both share (run.checkpoint_dir): a run saves there, then both nodes resume it with
#    --resume latest; node 1 has no database and learns the run, its config and its checkpoint from
#    node 0. Renaming such a run is refused, export finds its checkpoints, delete removes them.
shared="$work/shared-ckpt"
# node_pair NAME ARGS1... -- ARGS0...: node 1 (ARGS1) then node 0 (ARGS0) of one two-node launch, on
# the next port, both to their end; their exit codes in rc1 and rc0, their output in NAME1.out, NAME0.out.
node_pair() {
  local name=$1 a1=() a0=()
  shift
  while [ "$1" != "--" ]; do a1+=("$1"); shift; done
  shift
  a0=("$@")
  port=$((port + 1))
  "$bin" train --no-gui "${a1[@]}" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" \
    > "$work/${name}1.out" 2>&1 &
  pids+=($!)
  set +e
  "$bin" train --no-gui "${a0[@]}" --nnodes 2 --node-rank 0 --master-port "$port" > "$work/${name}0.out" 2>&1
  rc0=$?
  wait "${pids[-1]}"
  rc1=$?
  set -e
}
new_run=(--config "$work/run.toml" --set "run.checkpoint_dir=\"$shared\"" --set train.steps=6)
node_pair c --runs-dir "$work/local1" "${new_run[@]}" -- --runs-dir "$work/local0" "${new_run[@]}"
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || { cat "$work/c0.out" "$work/c1.out"; fail "the run with run.checkpoint_dir: exit codes $rc0 and $rc1"; }
[ -f "$shared/multi/checkpoints/step_00000006/model.safetensors" ] || { ls -R "$shared" "$work/local0"; fail "no checkpoint under run.checkpoint_dir"; }
[ ! -e "$work/local0/multi/checkpoints" ] || fail "checkpoints written beside the database too"
[ ! -e "$work/local1/deltadeck.db" ] || fail "node 1 created a database"
node_pair cr --runs-dir "$work/local1" --resume latest --set train.steps=10 -- \
  --runs-dir "$work/local0" --resume latest --set train.steps=10
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || { cat "$work/cr0.out" "$work/cr1.out"; fail "resuming from run.checkpoint_dir: exit codes $rc0 and $rc1"; }
grep -q "resumed from $shared/multi/checkpoints/step_00000006" "$work/cr0.out" || { cat "$work/cr0.out"; fail "node 0 did not resume from the shared checkpoint"; }
grep -q "node 1 finished at step 10" "$work/local1/multi.node1.log" || { cat "$work/local1/multi.node1.log"; fail "node 1 did not finish the resumed run at step 10"; }
[ ! -e "$work/local1/deltadeck.db" ] || fail "node 1 created a database when resuming"
[ "$(sqlite3 "$work/local0/deltadeck.db" "SELECT status || ' ' || (SELECT max(step) FROM checkpoints) FROM runs")" = "finished 10" ] \
  || fail "the run is not recorded finished at step 10"
# A resume that names no run node 0 knows: both nodes stop at once, node 1 with node 0's reason.
node_pair cx --runs-dir "$work/local1" --resume no-such-run -- --runs-dir "$work/local0" --resume no-such-run
[ "$rc0" != 0 ] && [ "$rc1" = 2 ] || { cat "$work/cx0.out" "$work/cx1.out"; fail "a resume of an unknown run: exit codes $rc0 and $rc1"; }
grep -q "node 0 .*no-such-run" "$work/cx1.out" || { cat "$work/cx1.out"; fail "node 1 does not give node 0's reason"; }
# Nodes asked to do different things (node 0 a resume, node 1 a new run): both stop at once, saying so.
node_pair cm --config "$work/run.toml" --runs-dir "$work/local1" -- --runs-dir "$work/local0" --resume latest
[ "$rc0" = 2 ] && [ "$rc1" = 2 ] || { cat "$work/cm0.out" "$work/cm1.out"; fail "nodes running different commands: exit codes $rc0 and $rc1"; }
grep -q "node 0 runs --resume latest and node 1 runs a new run" "$work/cm1.out" || { cat "$work/cm1.out"; fail "node 1 does not say the commands differ"; }
[ "$(sqlite3 "$work/local0/deltadeck.db" "SELECT count(*) FROM runs")" = 1 ] || fail "a refused launch recorded a run"
# A new run node 1 cannot start (its config is refused there): node 0 records nothing.
node_pair cb --config "$work/run.toml" --runs-dir "$work/local1" --set train.steps=0 -- \
  --config "$work/run.toml" --runs-dir "$work/local0"
[ "$rc0" = 2 ] && [ "$rc1" = 2 ] || { cat "$work/cb0.out" "$work/cb1.out"; fail "a config node 1 refuses: exit codes $rc0 and $rc1"; }
grep -q "node 1: cannot start the run's config" "$work/cb0.out" || { cat "$work/cb0.out"; fail "node 0 does not name node 1's refusal"; }
[ "$(sqlite3 "$work/local0/deltadeck.db" "SELECT count(*) FROM runs")" = 1 ] || fail "a run node 1 refused was recorded"
# A node 0 that cannot record the run (its runs folder is a file): node 1 stops at once with its reason.
touch "$work/not-a-folder"
node_pair cf --config "$work/run.toml" --runs-dir "$work/local1" -- --config "$work/run.toml" --runs-dir "$work/not-a-folder"
[ "$rc0" != 0 ] && [ "$rc1" = 2 ] || { cat "$work/cf0.out" "$work/cf1.out"; fail "node 0 unable to record: exit codes $rc0 and $rc1"; }
grep -q "node 0 could not record the run" "$work/cf1.out" || { cat "$work/cf1.out"; fail "node 1 does not give node 0's reason"; }
if "$bin" runs rename multi other --runs-dir "$work/local0" > "$work/crename.out" 2>&1; then fail "renamed a run whose checkpoints lie in run.checkpoint_dir"; fi
grep -q "run.checkpoint_dir" "$work/crename.out" || { cat "$work/crename.out"; fail "the refused rename does not say why"; }
"$bin" export multi --runs-dir "$work/local0" --out "$work/c-export" > /dev/null 2>&1 || fail "export did not find the run's checkpoints in run.checkpoint_dir"
"$bin" runs delete multi --runs-dir "$work/local0" --yes > "$work/cdelete.out" 2>&1 || { cat "$work/cdelete.out"; fail "delete failed"; }
[ ! -e "$shared/multi" ] || { ls -R "$shared"; fail "delete left the run's folder in run.checkpoint_dir"; }

echo "multinode e2e: ok (node 0 stopped ${took}s after its peer was killed: $msg; SIGTERM on node 1 stopped the run at step $stop_step; resumed on both nodes to step $target, then from a moved-aside checkpoint to $target2; node-local runs folders with a shared run.checkpoint_dir resumed to step 10; $torchrun_note)"
