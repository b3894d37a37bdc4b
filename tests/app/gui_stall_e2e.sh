#!/usr/bin/env bash
# The training loop never waits on the UI: while the app trains a run, its frame loop sleeps 2 s
# inside a frame, three times (the `stall` hook). Training must keep its pace through each stall,
# every logged step and evaluation must still reach the database with no pause in the run's own
# clock, and the only loss is UI snapshots the stalled frame loop never looked at.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
need_xvfb
make_corpus "$work/corpus/box.txt" 300 'pack my box with five dozen liquor jugs'
steps=300
cat > "$work/run.toml" <<TOML
name = "stall"
[data]
train = ["text:$work/corpus/*.txt"]
val = 0.05
[train]
steps = $steps
batch_size = 4
seq_len = 64
warmup_steps = 10
eval_batches = 2
[run]
devices = "cpu"
log_interval = 2
eval_interval = 100
save_interval = 150
TOML
cat > "$work/script.txt" <<SCRIPT
start
wait_step 20 90
stall 2000
frames 2
stall 2000
frames 2
stall 2000
frames 2
stats
wait_end 240
stats
quit
SCRIPT
run_gui "$work/runs" "$work/run.toml" "$work/script.txt" "$work/gui.out"

db="$work/runs/deltadeck.db"
[ "$(sqlite3 "$db" "SELECT status FROM runs WHERE name='stall'")" = finished ] || fail "run not finished"
# Every metric reached the database: one loss row per logged step, every evaluation, both checkpoints.
[ "$(sqlite3 "$db" "SELECT count(DISTINCT step) FROM metrics WHERE key='loss'")" = $((steps / 2)) ] \
  || fail "expected $((steps / 2)) logged steps"
[ "$(sqlite3 "$db" "SELECT count(*) FROM metrics WHERE key='val_loss'")" = 3 ] || fail "expected 3 evaluations"
[ "$(sqlite3 "$db" "SELECT count(*) FROM checkpoints")" = 2 ] || fail "expected 2 checkpoints (150, 300)"

# The run's own clock never paused: no gap between consecutive logged steps near a stall's 2 s
# (they come every ~0.1 s; 1.5 s leaves room for a loaded machine).
read -r median maxgap < <(sqlite3 "$db" "SELECT wall_s FROM metrics WHERE key='loss' ORDER BY step" |
  awk 'NR > 1 { printf "%.4f\n", $1 - prev } { prev = $1 }' | sort -n |
  awk '{ d[NR] = $1 } END { printf "%s %s\n", d[int(NR / 2) + 1], d[NR] }')
echo "logged-step interval: median ${median} s, max ${maxgap} s"
awk -v g="$maxgap" 'BEGIN { exit !(g < 1.5) }' || fail "a ${maxgap} s gap between logged steps: training waited"

# Training kept its pace through each stall: at least half the steps its average pace gives in 2 s.
first_last=$(sqlite3 "$db" "SELECT min(wall_s), max(wall_s) FROM metrics WHERE key='loss'")
rate=$(awk -F'|' -v s=$steps '{ printf "%.3f", s / ($2 - $1) }' <<< "$first_last")
echo "average pace: $rate steps/s"
stalls=$(grep -c "^gui stall:" "$work/gui.out" || true)
[ "$stalls" = 3 ] || fail "expected 3 stall reports, got $stalls"
grep "^gui stall:" "$work/gui.out" | while read -r line; do
  read -r slept from to < <(sed -E 's/.*slept ([0-9.]+) s.*step ([0-9]+) to ([0-9]+).*/\1 \2 \3/' <<< "$line")
  awk -v sl="$slept" -v a="$from" -v b="$to" -v r="$rate" \
    'BEGIN { if (sl < 1.9) exit 2; if (b - a < 0.5 * r * sl) exit 1 }' \
    || fail "during a ${slept} s stall training went only from step $from to $to (pace $rate steps/s)"
done
# Only UI snapshots were skipped (the view jumped ahead after each stall).
skipped=$(grep "^gui stats:" "$work/gui.out" | head -1 | sed -E 's/.*skipped ([0-9]+).*/\1/')
[ "$skipped" -gt 0 ] || fail "no snapshots were skipped during the stalls"
echo "PASS"
