# Sourced by the faults e2e scripts (argument 1: the deltadeck binary): a work folder removed on exit
# (KEEP=1 keeps it), a tiny corpus, the settings of a tiny CPU run, and helpers.
source "$(dirname "${BASH_SOURCE[0]}")/../support/e2e_base.sh" "$1"
mkdir -p "$work/corpus"
for i in $(seq 1 300); do printf 'sphinx of black quartz, judge my vow %d\n%%\n' "$i" >> "$work/corpus/q.txt"; done
# A tiny GPT on the CPU: a step takes ~10 ms on 2 cores, a whole run about a second.
tiny=(--no-gui --log-format text
  --set "data.train=[\"text:$work/corpus/*.txt\"]" --set data.val=0.05
  --set model.d=64 --set model.L=2 --set train.batch_size=4 --set train.seq_len=64
  --set train.warmup_steps=1 --set train.eval_batches=2 --set run.log_interval=1 --set run.eval_interval=0
  --set run.threads=1)
q() { sqlite3 "$1" "$2"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# The run's checkpoint of step $3 under runs folder $1 (run name $2) loads with its checksums verified.
valid_checkpoint() {
  "$bin" export "$2" --runs-dir "$1" --step "$3" --out "$work/export.$$" --force > /dev/null 2>&1
}
# Exactly one current metric row per (step, key): the resume bookkeeping (schema 4).
one_current_row_each() {
  [ "$(q "$1" "SELECT count(*) FROM (SELECT step, key FROM metrics WHERE superseded = 0 GROUP BY run_id, step, key HAVING count(*) > 1)")" = 0 ]
}
