#!/usr/bin/env bash
# Guarantees 1 and 7 (docs/reliability.md) on the real program: a run is killed with SIGKILL right
# after the k-th file operation of a checkpoint save (DELTADECK_IO_FAULT=kill@op=K), for every
# operation of the second save and its prune, and for points of the first; the seed varies with k.
# Then, before anything else touches it: the database passes integrity_check and holds every metric
# row up to the newest committed checkpoint. `train --resume latest` then continues from exactly
# that checkpoint (a partial one is skipped and reported), and the finished run has exactly one
# current row per (step, metric), the crashed attempt's later rows marked superseded.
source "$(dirname "$0")/e2e_common.sh"
run=(train "${tiny[@]}" --set train.steps=6 --set run.save_interval=2 --set run.keep_checkpoints=1)

# Number every I/O operation of the saves once.
DELTADECK_IO_FAULT=trace "$bin" "${run[@]}" --runs-dir "$work/trace" > "$work/trace.out" 2> "$work/trace.err" \
  || { cat "$work/trace.out" "$work/trace.err"; fail "trace run failed"; }
op_of() { grep -E "$1" "$work/trace.err" | head -1 | sed -E 's/^io op ([0-9]+):.*/\1/'; }
first2=$(op_of 'step_00000002')
commit2=$(op_of 'rename .*/step_00000002$')
first4=$(op_of 'step_00000004')
commit4=$(op_of 'rename .*/step_00000004$')
first6=$(op_of 'step_00000006')
[ -n "$first2" ] && [ -n "$commit2" ] && [ -n "$commit4" ] && [ -n "$first6" ] \
  || { cat "$work/trace.err"; fail "could not find the saves' operations in the trace"; }
points="$first2 $((commit2 - 1)) $commit2 $(seq -s " " "$first4" $((first6 - 1)))"
echo "second save: ops $first4..$((first6 - 1)), committed by op $commit4; sweeping: $points"

for k in $points; do
  d="$work/k$k"
  set +e
  # The group's stderr is dropped: bash reports the SIGKILL there ("Killed").
  { DELTADECK_IO_FAULT="kill@op=$k" "$bin" "${run[@]}" --runs-dir "$d" --set seed=$((k % 3 + 1)) > "$d.out" 2>&1; } \
    2> /dev/null
  rc=$?
  set -e
  [ "$rc" = 137 ] || { cat "$d.out"; fail "op $k: exited $rc, expected death by SIGKILL (137)"; }
  db="$d/deltadeck.db"
  [ "$(q "$db" 'PRAGMA integrity_check')" = ok ] || fail "op $k: integrity_check after the kill"
  if [ "$k" -ge "$commit4" ]; then target=4; elif [ "$k" -ge "$commit2" ]; then target=2; else target=0; fi
  # No metric row up to the committed checkpoint's step is lost: the engine waited for them.
  [ "$(q "$db" "SELECT count(DISTINCT step) FROM metrics WHERE key='loss' AND step <= $target")" = "$target" ] \
    || fail "op $k: loss rows up to the committed step $target are missing"
  later=$(q "$db" "SELECT count(*) FROM metrics WHERE key='loss' AND step > $target")
  partial=no
  for t in "$d"/demo/checkpoints/step_*.tmp; do [ -e "$t" ] && partial=$(basename "$t"); done
  set +e
  "$bin" train --no-gui --log-format text --runs-dir "$d" --resume latest > "$d.resume.out" 2>&1
  rc=$?
  set -e
  if [ "$target" = 0 ]; then
    [ "$rc" = 2 ] || { cat "$d.resume.out"; fail "op $k: resume without a committed checkpoint exited $rc"; }
    grep -q "holds no usable checkpoint" "$d.resume.out" || { cat "$d.resume.out"; fail "op $k: no clear error"; }
    continue
  fi
  [ "$rc" = 0 ] || { cat "$d.resume.out"; fail "op $k: resume failed ($rc)"; }
  grep -q "resuming from .*/step_0000000$target\$" "$d.resume.out" \
    || { grep resuming "$d.resume.out"; fail "op $k: did not resume from step $target"; }
  if [ "$partial" != no ]; then
    grep -q "skipped .*$partial: an unfinished save" "$d.resume.out" \
      || { cat "$d.resume.out"; fail "op $k: the partial $partial was not reported"; }
  fi
  [ "$(q "$db" 'PRAGMA integrity_check')" = ok ] || fail "op $k: integrity_check after the resume"
  [ "$(q "$db" "SELECT status FROM runs")" = finished ] || fail "op $k: resumed run not finished"
  one_current_row_each "$db" || fail "op $k: a (step, metric) has more than one current row"
  [ "$(q "$db" "SELECT count(*) FROM metrics WHERE key='loss' AND superseded = 0")" = 6 ] \
    || fail "op $k: expected 6 current loss rows"
  [ "$(q "$db" "SELECT count(*) FROM metrics WHERE key='loss' AND superseded = 1")" = "$later" ] \
    || fail "op $k: the crashed attempt's $later loss rows after step $target are not (all) superseded"
  valid_checkpoint "$d" demo 6 || fail "op $k: the final checkpoint does not load"
done
echo "crash sweep e2e: ok ($(echo $points | wc -w) kill points)"
