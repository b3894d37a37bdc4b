#!/usr/bin/env bash
# Guarantee 9 (docs/reliability.md), two processes: one process of a two-process run (one CPU rank
# each, over a loopback TCPStore) is killed with SIGKILL; the other stops within the collective
# timeout plus a minute, naming the rank and the operation, the run is recorded `failed`, and its
# last checkpoint is intact (it loads, checksums verified).
source "$(dirname "$0")/e2e_common.sh"
timeout_s=5
port=$((20000 + RANDOM % 20000))
args=(train "${tiny[@]}" --runs-dir "$work/runs" --set train.steps=100000 --set run.save_interval=3
      --set run.collective_timeout_s=$timeout_s --nnodes 2 --master-addr 127.0.0.1 --master-port "$port")
"$bin" "${args[@]}" --node-rank 1 > "$work/node1.out" 2>&1 &
victim=$!
pids+=("$victim")
"$bin" "${args[@]}" --node-rank 0 > "$work/node0.out" 2>&1 &
node0=$!
pids+=("$node0")
for _ in $(seq 1 600); do
  [ -d "$work/runs/demo/checkpoints/step_00000006" ] && break
  sleep 0.1
done
[ -d "$work/runs/demo/checkpoints/step_00000006" ] || { cat "$work/node0.out" "$work/node1.out"; fail "no checkpoint"; }
kill -9 "$victim"
t0=$(now_ms)
wait "$victim" 2> /dev/null || true  # reaped here, so bash's "Killed" report is dropped
set +e
wait "$node0"
rc=$?
set -e
took=$(( $(now_ms) - t0 ))
[ "$rc" = 1 ] || { cat "$work/node0.out"; fail "node 0 exited $rc, expected 1"; }
[ "$took" -lt $(( (timeout_s + 60) * 1000 )) ] || fail "node 0 took $took ms to stop"
db="$work/runs/deltadeck.db"
[ "$(q "$db" "SELECT status FROM runs")" = failed ] || fail "run not recorded as failed"
msg=$(q "$db" "SELECT message FROM runs")
echo "$msg" | grep -q "rank 0 of 2" || fail "the error does not name the rank: $msg"
echo "$msg" | grep -qE "averaging|summing|broadcast|gather|agree|command|waiting" || fail "the error does not name the operation: $msg"
last=$(ls -d "$work"/runs/demo/checkpoints/step_* | grep -v '\.tmp$' | sort | tail -1)
valid_checkpoint "$work/runs" demo "$(basename "$last" | sed 's/step_0*//')" || fail "the last checkpoint $last does not load"
[ "$(q "$db" 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
echo "dead node e2e: ok (node 0 stopped ${took} ms after its peer was killed: $msg)"
