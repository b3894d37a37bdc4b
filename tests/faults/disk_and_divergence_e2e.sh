#!/usr/bin/env bash
# Guarantees 4 and 6 (docs/reliability.md) on the real program. A disk that fills in the middle of
# a checkpoint (DELTADECK_IO_FAULT=enospc): with run.save_retries = 0 the run stops cleanly (failed,
# exit 1, the error naming the file and the resume target), the previous checkpoint stays the
# resume target and the same step is saved again after the resume without "already exists"; with
# retries configured the run waits, retries and finishes. A loss that stays NaN ends the run as
# `diverged` with exit code 3 after train.max_nonfinite_steps skipped steps.
source "$(dirname "$0")/e2e_common.sh"
run=(train "${tiny[@]}" --set train.steps=6 --set run.save_interval=2)

DELTADECK_IO_FAULT=trace "$bin" "${run[@]}" --runs-dir "$work/trace" > /dev/null 2> "$work/trace.err" || fail "trace run"
op_of() { grep -E "$1" "$work/trace.err" | head -1 | sed -E 's/^io op ([0-9]+):.*/\1/'; }
# The write of the second save's state file.
state4=$(op_of 'write .*/step_00000004.tmp/state.safetensors')
[ -n "$state4" ] || { cat "$work/trace.err"; fail "no state write of step 4 in the trace"; }

# 1. No retries: the disk stays full from the middle of step 4's save.
d="$work/full"
set +e
DELTADECK_IO_FAULT="enospc@op=$state4,persist" "$bin" "${run[@]}" --runs-dir "$d" > "$d.out" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || { cat "$d.out"; fail "disk full: exited $rc, expected 1"; }
grep -q "checkpoint at step 4 not written: .*step_00000004.tmp/state.safetensors: write failed at byte offset [0-9]* (No space left on device); the resume target stays .*step_00000002" "$d.out" \
  || { cat "$d.out"; fail "disk full: the error does not name the file, the reason and the resume target"; }
[ "$(q "$d/deltadeck.db" "SELECT status FROM runs")" = failed ] || fail "disk full: status not failed"
[ "$(q "$d/deltadeck.db" 'PRAGMA integrity_check')" = ok ] || fail "disk full: integrity_check"
[ ! -e "$d/demo/checkpoints/step_00000004.tmp" ] || fail "disk full: partial checkpoint left behind"
# Space is back: the resume starts from step 2 and saves step 4 again.
"$bin" train --no-gui --log-format text --runs-dir "$d" --resume latest > "$d.resume.out" 2>&1 \
  || { cat "$d.resume.out"; fail "disk full: resume failed"; }
grep -q "resuming from .*step_00000002$" "$d.resume.out" || fail "disk full: not resumed from step 2"
grep -q "^checkpoint step 4 " "$d.resume.out" || { cat "$d.resume.out"; fail "disk full: step 4 not saved again"; }
valid_checkpoint "$d" demo 4 || fail "disk full: the step 4 saved again does not load"
one_current_row_each "$d/deltadeck.db" || fail "disk full: duplicate current rows"

# 2. Retries: the disk is full once, the retry a moment later succeeds.
d="$work/retry"
DELTADECK_IO_FAULT="enospc@op=$state4" "$bin" "${run[@]}" --runs-dir "$d" --set run.save_retries=2 \
  --set run.save_retry_delay_s=0.2 > "$d.out" 2>&1 || { cat "$d.out"; fail "retry: the run failed"; }
grep -q "^warn: checkpoint at step 4 not written: .*No space left on device.*; retry 1 of 2 in 0.2 s" "$d.out" \
  || { cat "$d.out"; fail "retry: no warning naming the retry"; }
[ "$(q "$d/deltadeck.db" "SELECT status FROM runs")" = finished ] || fail "retry: not finished"
valid_checkpoint "$d" demo 4 || fail "retry: step 4 not saved"

# 3. A loss that stays NaN: skipped until train.max_nonfinite_steps in a row, then `diverged`, exit 3.
d="$work/nan"
set +e
DELTADECK_FAULT="nan@loss" "$bin" train "${tiny[@]}" --runs-dir "$d" --set train.steps=50 \
  --set train.max_nonfinite_steps=4 > "$d.out" 2>&1
rc=$?
set -e
[ "$rc" = 3 ] || { cat "$d.out"; fail "diverged: exited $rc, expected 3"; }
[ "$(q "$d/deltadeck.db" "SELECT status FROM runs")" = diverged ] || fail "diverged: status"
q "$d/deltadeck.db" "SELECT message FROM runs" | grep -q "4 skipped steps in a row" || fail "diverged: message"
[ "$(q "$d/deltadeck.db" "SELECT count(*) FROM events WHERE level='warn' AND text LIKE 'step % skipped: non-finite%'")" = 4 ] \
  || fail "diverged: expected 4 skip events with their steps"
echo "disk and divergence e2e: ok"
