#!/usr/bin/env bash
# The terminal dashboard end to end, driven under tmux as a user would: the real program trains the
# embedded demo config in a 120x40 pane; the test reads the screen with capture-pane and the run
# database with sqlite3.
#   1. charts appear; p pauses (the step stops moving), p resumes; a resize redraws at the new size;
#      s records a checkpoint; q asks, n cancels, q + y saves a checkpoint and exits 0 with the
#      terminal restored (normal screen, the same stty settings as before).
#   2. SIGTERM stops with a checkpoint and restores the terminal.
#   3. SIGSEGV (a crash) restores the terminal, then dies of the signal.
# Each pane runs under a private tmux server (-S), so the user's tmux is never touched.
source "$(dirname "${BASH_SOURCE[0]}")/../support/e2e_base.sh" "$(realpath "$1")"
sock="$work/tmux.sock"
t() { tmux -S "$sock" "$@"; }
trap 't kill-server 2> /dev/null || true; rm -rf "$work"' EXIT
screen() { t capture-pane -p -t "$1"; }
fail() {
  echo "FAIL: $*" >&2
  for s in $(t list-sessions -F '#{session_name}' 2> /dev/null); do
    echo "--- pane $s:" >&2
    screen "$s" >&2 || true
  done
  exit 1
}
shows() { screen "$1" | grep -qF -- "$2"; }
# The step of the header row ("step 12/100000 ...").
header_step() { screen "$1" | sed -n '2s/^step \([0-9]*\)\/.*/\1/p'; }
db_value() { sqlite3 "$work/$1/runs/deltadeck.db" "$2" 2> /dev/null || true; }

# start NAME: the demo config in a fresh runs folder; the pane's shell records the terminal settings
# before and after, and the exit status.
start() {
  local name=$1
  mkdir -p "$work/$name"
  t new-session -d -s "$name" -x 120 -y 40 -c "$work/$name" \
    "stty -g > before; '$bin' train --no-gui --runs-dir runs --set train.steps=100000 --set train.warmup_steps=10 \
       --set run.log_interval=1 --set run.eval_interval=0 --set run.save_interval=0 --set run.threads=1 2> stderr; \
     echo \$? > exit_code; stty -g > after; sleep 600"
  wait_for 90 "the dashboard of $name" shows "$name" "save & quit"
  wait_for 90 "steps in $name" bash -c "[ \"\$(tmux -S '$sock' capture-pane -p -t '$name' | sed -n '2s/^step \([0-9]*\)\/.*/\1/p')\" -ge 3 ]"
}
exited() { [ -s "$work/$1/exit_code" ]; }
restored() {
  local name=$1
  [ "$(t display -p -t "$name" '#{alternate_on}')" = 0 ] || fail "$name: the pane is still on the alternate screen"
  cmp -s "$work/$name/before" "$work/$name/after" \
    || fail "$name: terminal settings differ after exit: $(cat "$work/$name/before") vs $(cat "$work/$name/after")"
}
braille() { screen "$1" | LC_ALL=C grep -c $'\xe2[\xa0-\xa3]' || true; }

# ---- 1. keys
start keys
shows keys "loss  train" || fail "no loss chart"
shows keys "grad norm" || fail "no grad norm chart"
shows keys "tokens/s" || fail "no tokens/s chart"
shows keys "GPUs  no telemetry" || fail "no GPU table line"
[ "$(braille keys)" -ge 10 ] || fail "the charts hold no braille lines"

t send-keys -t keys p
wait_for 30 "PAUSED" shows keys "PAUSED"
wait_for 30 "the paused event" shows keys "paused at step"
sleep 1
s1=$(header_step keys)
rows1=$(db_value keys "SELECT count(*) FROM metrics WHERE key='loss'")
sleep 2
s2=$(header_step keys)
rows2=$(db_value keys "SELECT count(*) FROM metrics WHERE key='loss'")
[ "$s1" = "$s2" ] || fail "the step moved while paused: $s1 -> $s2"
[ "$rows1" = "$rows2" ] || fail "loss rows grew while paused: $rows1 -> $rows2"
[ "$(db_value keys "SELECT count(*) FROM events WHERE text LIKE 'paused at step%'")" = 1 ] || fail "no pause event in the database"

t send-keys -t keys p
wait_for 30 "RUNNING again" shows keys "RUNNING"
wait_for 30 "steps after resume" bash -c "[ \"\$(tmux -S '$sock' capture-pane -p -t keys | sed -n '2s/^step \([0-9]*\)\/.*/\1/p')\" -gt $((s2 + 2)) ]"

t resize-window -t keys -x 80 -y 24
wait_for 10 "a redraw at 80x24" bash -c "tmux -S '$sock' capture-pane -p -t keys | sed -n '24p' | grep -qF 'save & quit'"
screen keys | sed -n 1p | grep -q "RUNNING" || fail "no header after the resize"
[ "$(screen keys | wc -l)" = 24 ] || fail "the pane is not 24 rows after the resize"
t resize-window -t keys -x 120 -y 40

t send-keys -t keys s
wait_for 60 "the save-now checkpoint in the database" \
  bash -c "[ \"\$(sqlite3 '$work/keys/runs/deltadeck.db' 'SELECT count(*) FROM checkpoints' 2> /dev/null)\" = 1 ]"
saved=$(db_value keys "SELECT path FROM checkpoints")
# Recorded paths are absolute, though the run's folder was given relative to its working folder.
case "$saved" in /*) ;; *) fail "checkpoint path $saved is not absolute" ;; esac
[ -f "$saved/model.safetensors" ] || fail "save-now checkpoint $saved is not on disk"
wait_for 30 "the checkpoint in the event log" shows keys "checkpoint saved at step"

t send-keys -t keys q
wait_for 10 "the quit question" shows keys "Save a checkpoint and quit? [y/N]"
t send-keys -t keys n
wait_for 10 "quit cancelled" shows keys "quit cancelled"
sleep 1
exited keys && fail "n did not cancel the quit"
t send-keys -t keys q
wait_for 10 "the quit question again" shows keys "Save a checkpoint and quit? [y/N]"
t send-keys -t keys y
wait_for 60 "the program to exit after q y" exited keys
[ "$(cat "$work/keys/exit_code")" = 0 ] || fail "exit code $(cat "$work/keys/exit_code") after q y: $(cat "$work/keys/stderr")"
restored keys
wait_for 10 "the final line on the normal screen" shows keys "run 'demo' stopped at step"
[ "$(db_value keys "SELECT status FROM runs")" = stopped ] || fail "run not recorded as stopped"
[ "$(db_value keys "SELECT count(*) FROM checkpoints")" = 2 ] || fail "expected the save-now and the quit checkpoints"
last=$(db_value keys "SELECT max(step) FROM metrics WHERE key='loss'")
final=$(db_value keys "SELECT max(step) FROM checkpoints")
[ "$final" -ge "$last" ] || fail "the quit checkpoint (step $final) is older than the last step ($last)"
[ -f "$(db_value keys "SELECT path FROM checkpoints WHERE step=$final")/model.safetensors" ] \
  || fail "quit checkpoint not on disk"

# ---- 2. SIGTERM: a clean stop with a checkpoint, terminal restored.
start term
pid=$(pgrep -P "$(t display -p -t term '#{pane_pid}')" -x deltadeck) || fail "no deltadeck process in the pane"
kill -TERM "$pid"
wait_for 60 "the program to exit after SIGTERM" exited term
[ "$(cat "$work/term/exit_code")" = 0 ] || fail "exit code $(cat "$work/term/exit_code") after SIGTERM"
restored term
[ "$(db_value term "SELECT status FROM runs")" = stopped ] || fail "SIGTERM: run not stopped"
[ "$(db_value term "SELECT count(*) FROM checkpoints")" = 1 ] || fail "SIGTERM: no checkpoint"

# ---- 3. A crash: the terminal is restored, then the process dies of the signal.
start crash
pid=$(pgrep -P "$(t display -p -t crash '#{pane_pid}')" -x deltadeck) || fail "no deltadeck process in the pane"
kill -SEGV "$pid"
wait_for 30 "the program to die of SIGSEGV" exited crash
[ "$(cat "$work/crash/exit_code")" = 139 ] || fail "exit code $(cat "$work/crash/exit_code") after SIGSEGV, expected 139"
restored crash

echo "tui e2e: ok (paused at step $s1, save-now checkpoint, quit checkpoint at step $final; SIGTERM and SIGSEGV restore the terminal)"
