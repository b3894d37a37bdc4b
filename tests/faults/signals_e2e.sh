#!/usr/bin/env bash
# Guarantee 5 (docs/reliability.md) on the real program: SIGTERM or SIGINT arriving during the
# forward pass, the backward pass, the optimizer step (DELTADECK_FAULT raises it there, on one rank of
# two for some), during a checkpoint write (DELTADECK_IO_FAULT) or at a random moment while metrics
# are committed: every rank stops at the next step boundary with a checkpoint of that step and the
# database committed, status `stopped` (`preempted` under Slurm or DELTADECK_PREEMPTIBLE=1), exit 0,
# within 30 s. A second signal exits at once (128 + signal) with committed state intact: the last
# checkpoint loads and the run resumes from it.
source "$(dirname "$0")/e2e_common.sh"

# $1 name, $2 expected status, $3 expected stop step, then env assignments and extra arguments
# (after --). Runs 8 steps with no periodic checkpoint unless the arguments add one.
expect_stop() {
  local name=$1 status=$2 step=$3
  shift 3
  local envs=()
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "$#" -gt 0 ] && shift
  local d="$work/$name" t0 rc
  t0=$(now_ms)
  set +e
  env "${envs[@]}" "$bin" train "${tiny[@]}" --runs-dir "$d" --set train.steps=8 --set run.save_interval=0 "$@" \
    > "$d.out" 2>&1
  rc=$?
  set -e
  local took=$(( $(now_ms) - t0 ))
  [ "$rc" = 0 ] || { cat "$d.out"; fail "$name: exited $rc"; }
  [ "$took" -lt 30000 ] || fail "$name: took $took ms"
  local db="$d/deltadeck.db"
  [ "$(q "$db" 'PRAGMA integrity_check')" = ok ] || fail "$name: integrity_check"
  [ "$(q "$db" "SELECT status FROM runs")" = "$status" ] \
    || { cat "$d.out"; fail "$name: status $(q "$db" "SELECT status FROM runs"), expected $status"; }
  grep -q "at step $step:" "$d.out" || { tail -3 "$d.out"; fail "$name: did not stop at step $step"; }
  valid_checkpoint "$d" demo "$step" || fail "$name: no loadable checkpoint of step $step"
  [ "$(q "$db" "SELECT count(*) FROM checkpoints WHERE step = $step")" = 1 ] || fail "$name: checkpoint not recorded"
  [ "$(q "$db" "SELECT count(DISTINCT step) FROM metrics WHERE key='loss' AND step <= $step")" = "$step" ] \
    || fail "$name: metric rows missing"
  echo "$name: $status at step $step in $took ms"
}

expect_stop forward stopped 3 DELTADECK_FAULT="sigterm@forward,step=3"
expect_stop backward stopped 3 DELTADECK_FAULT="sigint@backward,step=3"
expect_stop optimizer-2ranks stopped 4 DELTADECK_FAULT="sigterm@optimizer,rank=0,step=4" -- --set 'run.devices="cpu:2"'
expect_stop slurm-preempted preempted 3 SLURM_JOB_ID=4242 DELTADECK_FAULT="sigterm@backward,rank=1,step=3" \
  -- --set 'run.devices="cpu:2"'
expect_stop flag-preempted preempted 5 DELTADECK_PREEMPTIBLE=1 DELTADECK_FAULT="sigterm@forward,step=5"
# SIGINT is the user's, never a preemption; so is SIGHUP (the terminal went away).
expect_stop slurm-sigint stopped 3 SLURM_JOB_ID=4242 DELTADECK_FAULT="sigint@forward,step=3"
expect_stop hangup stopped 3 SLURM_JOB_ID=4242 DELTADECK_FAULT="sighup@backward,step=3"
# Under nohup (SIGHUP ignored when the program starts) a hangup changes nothing: the run finishes.
d="$work/nohup"
nohup "$bin" train "${tiny[@]}" --runs-dir "$d" --set train.steps=40 --set run.save_interval=0 > "$d.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "^step " "$d.out" && break; sleep 0.1; done
kill -HUP "$pid"
wait "$pid" || { cat "$d.out"; fail "nohup: exited $?"; }
[ "$(q "$d/deltadeck.db" "SELECT status FROM runs")" = finished ] || { tail -3 "$d.out"; fail "nohup: not finished"; }
echo "nohup: a hangup mid-run, run finished"

# The operations of one save (the first), to aim at the middle of saves below.
DELTADECK_IO_FAULT=trace "$bin" train "${tiny[@]}" --runs-dir "$work/trace" --set train.steps=2 \
  --set run.save_interval=2 > /dev/null 2> "$work/trace.err" || fail "trace run"
per_save=$(grep -c '^io op' "$work/trace.err")
# During a checkpoint write (the periodic one of step 2): the save completes, the run stops there.
expect_stop during-save stopped 2 DELTADECK_IO_FAULT="sigterm@op=$((per_save / 2))" -- --set run.save_interval=2

# During database commits: SIGTERM from outside at a random moment of a longer run.
d="$work/commit"
"$bin" train "${tiny[@]}" --runs-dir "$d" --set train.steps=2000 --set run.save_interval=0 > "$d.out" 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 1 300); do
  [ "$(q "$d/deltadeck.db" "SELECT count(*) FROM metrics WHERE key='loss'" 2>/dev/null || echo 0)" -ge 20 ] && break
  sleep 0.05
done
sleep "0.$((RANDOM % 9 + 1))"
t0=$(now_ms)
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
took=$(( $(now_ms) - t0 ))
[ "$rc" = 0 ] || { cat "$d.out"; fail "commit: exited $rc"; }
[ "$took" -lt 30000 ] || fail "commit: took $took ms after SIGTERM"
step=$(sed -nE "s/^run 'demo' stopped at step ([0-9]+):.*/\1/p" "$d.out")
[ -n "$step" ] || { tail -3 "$d.out"; fail "commit: not stopped"; }
[ "$(q "$d/deltadeck.db" 'PRAGMA integrity_check')" = ok ] || fail "commit: integrity_check"
[ "$(q "$d/deltadeck.db" "SELECT count(DISTINCT step) FROM metrics WHERE key='loss'")" = "$step" ] \
  || fail "commit: loss rows are not exactly steps 1..$step"
valid_checkpoint "$d" demo "$step" || fail "commit: no checkpoint of step $step"
echo "commit: stopped at step $step, $took ms after SIGTERM"

# A second signal exits at once; what was committed stays: during a step...
d="$work/second"
set +e
DELTADECK_FAULT="sigterm2@backward,step=3" "$bin" train "${tiny[@]}" --runs-dir "$d" --set train.steps=8 \
  --set run.save_interval=2 > "$d.out" 2>&1
rc=$?
set -e
[ "$rc" = 143 ] || { cat "$d.out"; fail "second signal: exited $rc, expected 143"; }
grep -q "second stop signal: exiting now" "$d.out" || fail "second signal: no message"
[ "$(q "$d/deltadeck.db" 'PRAGMA integrity_check')" = ok ] || fail "second signal: integrity_check"
valid_checkpoint "$d" demo 2 || fail "second signal: checkpoint of step 2 lost"
"$bin" train --no-gui --log-format text --runs-dir "$d" --resume latest > "$d.resume.out" 2>&1 \
  || { cat "$d.resume.out"; fail "second signal: resume failed"; }
grep -q "resuming from .*step_00000002$" "$d.resume.out" || fail "second signal: not resumed from step 2"
one_current_row_each "$d/deltadeck.db" || fail "second signal: duplicate current rows after the resume"

# ... and in the middle of the stop's own checkpoint: the partial save is skipped, step 2 stays.
d="$work/second-save"
set +e
DELTADECK_FAULT="sigterm@forward,step=3" DELTADECK_IO_FAULT="sigterm@op=$((per_save + per_save / 2))" \
  "$bin" train "${tiny[@]}" --runs-dir "$d" --set train.steps=8 --set run.save_interval=2 > "$d.out" 2>&1
rc=$?
set -e
[ "$rc" = 143 ] || { cat "$d.out"; fail "second signal in a save: exited $rc, expected 143"; }
[ -d "$d/demo/checkpoints/step_00000003.tmp" ] || fail "second signal in a save: expected a partial step 3"
"$bin" train --no-gui --log-format text --runs-dir "$d" --resume latest > "$d.resume.out" 2>&1 \
  || { cat "$d.resume.out"; fail "second signal in a save: resume failed"; }
grep -q "skipped .*step_00000003.tmp: an unfinished save" "$d.resume.out" || fail "partial save not reported"
grep -q "resuming from .*step_00000002$" "$d.resume.out" || fail "second signal in a save: not resumed from 2"
[ "$(q "$d/deltadeck.db" "SELECT status FROM runs")" = finished ] || fail "second signal in a save: not finished"
# A corpus file truncated under a running process: the next read of its mapping faults (SIGBUS),
# and the process says which file and byte before it ends with the signal (exit 128 + 7).
d="$work/truncated"
mkdir -p "$work/big"
for i in $(seq 1 40000); do printf 'pack my box with five dozen liquor jugs %d\n%%\n' "$i"; done > "$work/big/big.txt"
set +e
"$bin" train "${tiny[@]}" --set "data.train=[\"text:$work/big/*.txt\"]" --runs-dir "$d" --set train.steps=1000000 \
  > "$d.out" 2>&1 &
pid=$!
for _ in $(seq 300); do [ "$(grep -c "^step " "$d.out")" -ge 3 ] && break; sleep 0.1; done
: > "$work/big/big.txt"
for _ in $(seq 600); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2> /dev/null; then kill -9 "$pid"; fail "truncated corpus: the run went on for a minute"; fi
wait "$pid"
rc=$?
set -e
[ "$rc" = 135 ] || { tail -5 "$d.out"; fail "truncated corpus: exited $rc, expected 135 (SIGBUS)"; }
grep -q "bus error reading $work/big/big.txt at byte [0-9]*: the file is shorter than when the run opened it" \
  "$d.out" || { tail -5 "$d.out"; fail "truncated corpus: the file was not named"; }

echo "signals e2e: ok"
