#!/usr/bin/env bash
# The desktop app end to end under Xvfb, as a user would drive it: a headless baseline run first,
# then the app starts a second run from its launcher, shows it live, lists both runs, and lays
# their curves over each other in Compare. Each screenshot's plot areas must hold pixels of their
# series' colours (gui_png_check); the database must hold the finished run, every logged step and
# its checkpoints.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
check=$2   # the gui_png_check program
need_xvfb
make_corpus "$work/corpus/fox.txt" 200 'the quick brown fox jumps over the lazy dog'
cat > "$work/run.toml" <<TOML
name = "gui-e2e"
[model]
$TINY_MODEL_KEYS
[data]
train = ["text:$work/corpus/*.txt"]
val = 0.05
[train]
steps = 200
batch_size = 4
seq_len = 32
warmup_steps = 5
eval_batches = 2
[run]
devices = "cpu"
log_interval = 2
eval_interval = 50
save_interval = 100
threads = 1
TOML

# 1. A baseline with another learning rate, headless, for Compare.
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/runs" \
  --set name=baseline --set train.lr=1e-3 > "$work/baseline.out" 2>&1 \
  || { cat "$work/baseline.out"; fail "baseline run failed"; }

# 2. The app: start from the launcher, watch, browse, compare.
cat > "$work/script.txt" <<SCRIPT
start
wait_step 120 90
tab live
frames 3
screenshot $work/live.png
wait_end 120
tab runs
focus latest
wait_rows 2 60
frames 3
screenshot $work/runs.png
compare all
tab compare
wait_rows 2 60
frames 3
screenshot $work/compare.png
tab runs
focus latest
tag e2e-tag
note written by the gui test
export_csv $work/gui-e2e.csv
checkpoint verify 100
checkpoint export 200 $work/export
wait_tasks 60
checkpoint expect 100 ok
rename gui-renamed
wait_tasks 30
resume 100
wait_step 130 60
command stop
wait_end 120
tab runs
wait_rows 2 60
# The Runs view read this run to step 200 before the resume; after it, only the current rows: the
# evaluations at 50 and 100 (those at 150 and 200 were superseded), one loss per step.
expect_series focused val_loss 2 30
expect_series focused loss
expect_series live loss
resume -1
wait_end 120
tab live
smoothing 0
frames 3
screenshot $work/resumed.png
tab runs
wait_rows 2 60
expect_series live loss 100 30
expect_series focused loss 100 30
expect_series focused val_loss 4 30
stats
quit
SCRIPT
start=$(date +%s)
run_gui "$work/runs" "$work/run.toml" "$work/script.txt" "$work/gui.out"
echo "app ran $(( $(date +%s) - start )) s"
for shot in live runs compare resumed; do
  grep -q "^screenshot $work/$shot.png 1440x900" "$work/gui.out" || fail "no $shot screenshot"
done

# 3. The screenshots: the dashboard's plots (loss, grad norm, loss scale, lr, tokens/s at least) and
# the compare plots (two runs, two colours each) hold drawn series, not just background.
"$check" "$work/live.png" 4 || fail "dashboard screenshot"
"$check" "$work/compare.png" 2 || fail "compare screenshot"
grep -c . "$work/compare.png.plots" > /dev/null
awk '{ if (NF < 7) bad = 1 } END { exit bad }' "$work/compare.png.plots" || fail "a compare plot shows fewer than 2 runs"
# After resuming from step 100, stopping, and resuming again to the end, the dashboard plots one
# value per logged step: 100 loss points (2..200), 4 evaluations.
grep -q '^loss .* [0-9A-F]*:100 [0-9A-F]*:4$' "$work/resumed.png.plots" \
  || { cat "$work/resumed.png.plots"; fail "the resumed run's loss plot does not hold one point per step"; }

# 4. The database: the app's run (tagged, annotated, renamed, resumed from its step-100 checkpoint,
# stopped, resumed again) finished with every logged step once, its evaluations and checkpoints.
db="$work/runs/deltadeck.db"
[ "$(sqlite3 "$db" 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(sqlite3 "$db" "SELECT status FROM runs WHERE name='gui-renamed'")" = finished ] || fail "gui-renamed not finished"
id=$(sqlite3 "$db" "SELECT id FROM runs WHERE name='gui-renamed'")
[ "$(sqlite3 "$db" "SELECT tag FROM tags WHERE run_id=$id")" = e2e-tag ] || fail "tag not recorded"
[ "$(sqlite3 "$db" "SELECT note FROM runs WHERE id=$id")" = "written by the gui test" ] || fail "note not recorded"
sqlite3 "$db" "SELECT text FROM events WHERE run_id=$id" | grep -q "resumed from .*step_00000100" || fail "no resume event"
# The abandoned attempt's checkpoint of step 200 was set aside (kept, never chosen) when the run
# resumed from step 100, so the second resume continued from the stop's checkpoint, not from it.
ls -d "$work/runs/gui-renamed/checkpoints/step_00000200.superseded" > /dev/null || fail "step 200 not set aside"
sqlite3 "$db" "SELECT text FROM events WHERE run_id=$id" | grep -q "set aside the abandoned attempt's .*step_00000200.superseded" \
  || fail "no event for the checkpoint set aside"
# Rows an abandoned attempt logged after the checkpoint are deleted, or (newer schemas) kept and
# marked superseded; either way the run's current history has each logged step once.
live_rows="1"
[ "$(sqlite3 "$db" "SELECT count(*) FROM pragma_table_info('metrics') WHERE name='superseded'")" = 1 ] \
  && live_rows="superseded = 0"
[ "$(sqlite3 "$db" "SELECT count(*) FROM metrics WHERE run_id=$id AND key='loss' AND $live_rows")" = 100 ] \
  || fail "the resumed run repeats or lacks logged steps"
# The CSV export holds every metric row of the run as it was then (before the resume), at full precision.
[ "$(( $(wc -l < "$work/gui-e2e.csv") - 1 ))" -gt 1000 ] || fail "CSV export too short"
head -1 "$work/gui-e2e.csv" | grep -qx "step,tokens,wall_s,key,value" || fail "CSV header"
# The checkpoint of step 200, exported from its row in the Runs view.
[ -s "$work/export/model.safetensors" ] && [ -s "$work/export/config.json" ] || fail "checkpoint export missing"
[ "$(sqlite3 "$db" "SELECT count(DISTINCT step) FROM metrics WHERE run_id=$id AND key='loss'")" = 100 ] \
  || fail "expected 100 logged loss steps (2..200)"
[ "$(sqlite3 "$db" "SELECT count(*) FROM metrics WHERE run_id=$id AND key='val_loss' AND $live_rows")" = 4 ] \
  || fail "expected 4 val_loss rows"
# 100, the stop's, 200 (the abandoned attempt's 200 was set aside; the resumed run saved its own).
[ "$(sqlite3 "$db" "SELECT count(*) FROM checkpoints WHERE run_id=$id")" = 3 ] || fail "expected 3 checkpoints"
# The app records the cores it leaves to ATen (one kept for the frame loop) in the run's config.
sqlite3 "$db" "SELECT config_toml FROM runs WHERE id=$id" | grep -q "threads = 1" || fail "config not recorded"

# 5. Run names in other scripts: the app's font takes their characters (Cyrillic from DejaVu, CJK
# from the system's fallback font, which scripts/setup installs), so no name is drawn as '?'.
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/names" --set 'name="проба-実験"' \
  --set train.steps=2 --set train.warmup_steps=1 --set run.eval_interval=0 > "$work/names.out" 2>&1 || { cat "$work/names.out"; fail "named run failed"; }
cat > "$work/names.txt" <<SCRIPT
tab runs
wait_rows 1 30
frames 3
expect_glyphs 10
screenshot $work/names.png
quit
SCRIPT
run_gui "$work/names" "$work/run.toml" "$work/names.txt" "$work/names_gui.out"
grep -q "glyphs: all 1 run names drawn (fallback font: /" "$work/names_gui.out" \
  || { cat "$work/names_gui.out"; fail "the run named проба-実験 is not drawn whole"; }
echo "PASS"
