#!/usr/bin/env bash
# The desktop app after a run fails, under Xvfb (docs/reliability.md, guarantee 9's front end):
# 1. A run fails mid-way (DELTADECK_FAULT throws at step 30; its checkpoint is step 20). The window
#    stays on the failure. Then, as after a multi-GPU failure (faked: a machine without a GPU cannot
#    make one), this process may no longer use the GPU: Start and an in-process resume of the run
#    (run.devices = "auto", which counts as a GPU run once a GPU is listed) are refused with the
#    reason, and "Resume in a new process" starts `deltadeck train --resume` as a process of its
#    own. It must finish the run (without the fault, which is not passed on), the database must
#    hold every step once, and the app's Runs view must show the resumed history, a value per step.
# 2. A 2-rank CPU run: the per-rank view shows both ranks' step time and data wait, live and in Runs.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
need_xvfb
make_corpus "$work/corpus/fox.txt" 200 'the quick brown fox jumps over the lazy dog'
config() {  # config NAME DEVICES STEPS
  cat <<TOML
name = "$1"
[model]
$TINY_MODEL_KEYS
[data]
train = ["text:$work/corpus/*.txt"]
val = 0.05
[train]
steps = $3
batch_size = 4
seq_len = 32
warmup_steps = 5
eval_batches = 2
[run]
devices = "$2"
log_interval = 1
eval_interval = 25
save_interval = 20
threads = 1
TOML
}
app() {  # app CONFIG SCRIPT OUT
  run_gui "$work/runs" "$1" "$2" "$3"
}

# ---- 1. a failure, the GPU blocked, a resume in a new process
config fails auto 40 > "$work/fails.toml"
cat > "$work/fail.txt" <<SCRIPT
start
wait_end 90
tab runs
focus latest
wait_rows 1 60
fake_gpu_block rank 1 failed in a multi-GPU run (rank 1 of 2: averaging gradients failed: NCCL error)
tab live
frames 3
start expect_fail
resume -1 expect_refused
key escape
resume_new_process
wait_children 120
tab runs
wait_rows 1 60
expect_series focused loss 40 60
expect_series focused val_loss 2 30
SCRIPT
DELTADECK_FAULT="throw@step,step=30" app "$work/fails.toml" "$work/fail.txt" "$work/fail.out"
grep -q "^gui script: resume refused: Not resumed here: this process can no longer use the GPU: rank 1 failed" \
  "$work/fail.out" || fail "the in-process resume was not refused for the GPU"
grep -q "^gui script: resume process [0-9]* of run 'fails' exited with status 0" "$work/fail.out" \
  || { cat "$work/runs/fails.resume.log" 2>/dev/null; fail "the resume process did not finish the run"; }
db="$work/runs/deltadeck.db"
[ "$(sqlite3 "$db" 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(sqlite3 "$db" "SELECT count(*) FROM runs")" = 1 ] || fail "the refused start recorded a run"
[ "$(sqlite3 "$db" "SELECT status FROM runs WHERE name='fails'")" = finished ] || fail "the run did not finish"
[ "$(sqlite3 "$db" "SELECT count(DISTINCT step) || ' ' || count(*) FROM metrics WHERE key='loss' AND superseded=0")" = "40 40" ] \
  || fail "the resumed run's loss rows are not one per step 1..40"
grep -q "resumed from .*step_00000020" "$work/runs/fails.resume.log" || fail "the resume process did not start from step 20"

# ---- 2. the per-rank view of a 2-rank CPU run
config ranks cpu:2 60 > "$work/ranks.toml"
cat > "$work/ranks.txt" <<SCRIPT
start
wait_step 30 90
tab live
expect_ranks live 2
wait_end 90
tab runs
focus latest
wait_rows 2 60
expect_ranks focused 2
SCRIPT
app "$work/ranks.toml" "$work/ranks.txt" "$work/ranks.out"
[ "$(grep -c "^gui script: .* per-rank view: 2 ranks" "$work/ranks.out")" = 2 ] || fail "the per-rank view lacks a rank"
# ---- 3. a run another database's job went on with (checkpoints under a shared run.checkpoint_dir):
# the app's resume of this database's older copy is refused, naming the record and the command
# line's resume, which brings the record in; nothing is written.
config chain cpu 20 > "$work/chain.toml"
expect 0 "$work/chain1.out" "$bin" train --no-gui --config "$work/chain.toml" --runs-dir "$work/runs3" \
  --set "run.checkpoint_dir=\"$work/ckpt\""
expect 0 "$work/chain2.out" "$bin" train --no-gui --resume chain --runs-dir "$work/other" \
  --set "run.checkpoint_dir=\"$work/ckpt\"" --set train.steps=40
cat > "$work/chain.txt" <<SCRIPT
tab runs
focus latest
wait_rows 1 60
resume -1 expect_refused
SCRIPT
db3="$work/runs3/deltadeck.db"
before=$(sqlite3 "$db3" "SELECT status || ' ' || count(*) FROM runs r JOIN metrics m ON m.run_id = r.id")
run_gui "$work/runs3" "$work/chain.toml" "$work/chain.txt" "$work/chain.out" > /dev/null
grep -qF "gui script: resume refused: Not resumed: $work/ckpt/chain/run_record.json is further along than this database's copy of run 'chain' (step 40 against 20): a job of another database went on with it. Resume it once from the command line, which brings the record in: deltadeck train --no-gui --resume chain --runs-dir $work/runs3" \
  "$work/chain.out" || { cat "$work/chain.out"; fail "the app's resume of the older copy was not refused"; }
[ "$(sqlite3 "$db3" "SELECT status || ' ' || count(*) FROM runs r JOIN metrics m ON m.run_id = r.id")" = "$before" ] \
  || fail "the refused resume wrote to the database"
echo "PASS"
