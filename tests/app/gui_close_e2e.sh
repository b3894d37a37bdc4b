#!/usr/bin/env bash
# Closing the desktop app's window while it trains (docs/reliability.md, guarantee 10), under Xvfb.
# 1. The close lands while a checkpoint save is being written (its step_X.tmp exists): the dialog
#    asks, Enter takes "Stop with checkpoint and close", and the window keeps drawing while the run
#    stops. The run must end `stopped` with its newest checkpoint verified, every metric row up to
#    it in the database, and the app gone within 30 s of the close.
# 2. A second close while the run stops quits at once: what was committed stays usable (the save it
#    cut short is skipped by a resume, the earlier checkpoint is chosen, the database is intact).
# The model is big enough (13M parameters, 170 MB a checkpoint) for a save to take about a second.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
need_xvfb
make_corpus "$work/corpus/box.txt" 300 'pack my box with five dozen liquor jugs'
cat > "$work/run.toml" <<TOML
name = "closing"
[model]
d = 384
L = 6
attn_heads = 6
attn_kv_heads = 2
attn_head_dim = 64
ffn_hidden = 1536
vocab_size = 512
[data]
train = ["text:$work/corpus/*.txt"]
val = 0.05
[train]
steps = 40
batch_size = 2
seq_len = 32
warmup_steps = 2
eval_batches = 1
[run]
devices = "cpu"
log_interval = 1
eval_interval = 0
save_interval = 5
TOML
app() {  # app RUNS_DIR SCRIPT OUT
  run_gui "$1" "$work/run.toml" "$2" "$3"
}

# ---- 1. close during a save, stop and save
cat > "$work/close.txt" <<SCRIPT
start
wait_saving 90
close
key enter
expect_saving
screenshot $work/closing.png
SCRIPT
runs="$work/runs"
app "$runs" "$work/close.txt" "$work/close.out"
grep -q "^gui script: a save in flight at step" "$work/close.out" || fail "no save was seen in flight"
grep -q "^screenshot $work/closing.png" "$work/close.out" || fail "no frame drawn while the run stopped"
line=$(grep "^gui close:" "$work/close.out") || fail "the app did not report the close"
read -r waited frames gap < <(sed -E 's/.*waited ([0-9.]+) s.* ([0-9]+) frames drawn.*gap between frames ([0-9.]+) s.*/\1 \2 \3/' <<< "$line")
echo "close: waited $waited s, $frames frames, longest gap $gap s"
awk -v w="$waited" 'BEGIN { exit !(w < 30) }' || fail "the app took $waited s to close"
# The window kept drawing while it waited (the closing dialog's clock redraws every 0.25 s).
awk -v f="$frames" -v w="$waited" -v g="$gap" 'BEGIN { exit !(f >= 2 && g < 1.0 && f >= int(w / 0.5)) }' \
  || fail "frames while waiting: $frames in $waited s, longest gap $gap s"

db="$runs/deltadeck.db"
[ "$(sqlite3 "$db" 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(sqlite3 "$db" "SELECT status FROM runs WHERE name='closing'")" = stopped ] || fail "the run is not 'stopped'"
read -r last_ckpt sha < <(sqlite3 -separator ' ' "$db" "SELECT step, sha256 FROM checkpoints ORDER BY step DESC LIMIT 1")
last_step=$(sqlite3 "$db" "SELECT max(step) FROM metrics WHERE key='loss' AND superseded=0")
echo "stopped at step $last_step, newest checkpoint $last_ckpt"
[ "$last_ckpt" = "$last_step" ] || fail "the newest checkpoint ($last_ckpt) is not of the last step ($last_step)"
# Every step up to the checkpoint has its metrics (log_interval 1), once.
[ "$(sqlite3 "$db" "SELECT count(DISTINCT step) || ' ' || count(*) FROM metrics WHERE key='loss' AND superseded=0")" = "$last_step $last_step" ] \
  || fail "loss rows up to step $last_step are missing or repeated"
# The newest checkpoint verifies: its weights hash as recorded, and a resume would choose it,
# skipping nothing (every file checked against its manifest's size and sha256).
dir=$(printf '%s/closing/checkpoints/step_%08d' "$runs" "$last_ckpt")
[ "$(sha256sum "$dir/model.safetensors" | cut -d' ' -f1)" = "$sha" ] || fail "model.safetensors does not match its record"
"$bin" train --dry-run --resume closing --runs-dir "$runs" > "$work/dry.out" 2>&1 || { cat "$work/dry.out"; fail "dry run"; }
grep -q "would resume from $dir\$" "$work/dry.out" || { cat "$work/dry.out"; fail "the newest checkpoint is not the resume target"; }
! grep -q "skipped" "$work/dry.out" || { cat "$work/dry.out"; fail "a checkpoint was skipped"; }

# ---- 2. a second close while the run stops quits at once
cat > "$work/quit.txt" <<SCRIPT
start
wait_step 6 90
wait_saving 90
close
key enter
close
frames 5
SCRIPT
runs2="$work/runs2"
app "$runs2" "$work/quit.txt" "$work/quit.out"
grep -q "^gui close: .*; quit at once" "$work/quit.out" || fail "the second close did not quit at once"
grep -q "closed before run 'closing' had stopped; its last committed checkpoint is kept" "$work/quit.out" \
  || fail "no word on the run left behind"
db2="$runs2/deltadeck.db"
[ "$(sqlite3 "$db2" 'PRAGMA integrity_check')" = ok ] || fail "integrity_check after quitting at once"
"$bin" train --dry-run --resume closing --runs-dir "$runs2" > "$work/dry2.out" 2>&1 || { cat "$work/dry2.out"; fail "dry run 2"; }
cat "$work/dry2.out" | grep -E "skipped|would resume"
grep -q "would resume from $runs2/closing/checkpoints/step_00000005\$" "$work/dry2.out" \
  || fail "the committed checkpoint of step 5 is not the resume target"
echo "PASS"
