#!/usr/bin/env bash
# The command line end to end: a headless run records its config, one loss row per logged step,
# its checkpoint and status in SQLite; `runs list/show` read it back; a bad config exits 2 and
# writes nothing.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
python=${2:-}   # a Python with the safetensors library (the project's .venv); checks skipped without it
make_corpus "$work/corpus/fox.txt" 200 'the quick brown fox jumps over the lazy dog'
cat > "$work/run.toml" <<TOML
name = "e2e"
[model]
$TINY_MODEL_KEYS
[data]
train = ["text:$work/corpus/*.txt"]
val = 0.05
[train]
steps = 40
batch_size = 4
seq_len = 32
warmup_steps = 5
eval_batches = 2
[run]
log_interval = 5
eval_interval = 20
save_interval = 20
threads = 1
TOML

# 1. A bad config: every problem reported by key, exit 2, nothing written.
set +e
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/runs" \
  --set train.lr=-1 --set train.stepz=3 --set run.devices=gpu7 > "$work/bad.out" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { cat "$work/bad.out"; fail "bad config exited $rc, expected 2"; }
grep -q "train.lr" "$work/bad.out" || fail "no train.lr error: $(cat "$work/bad.out")"
grep -q "train.stepz" "$work/bad.out" || fail "no unknown-key error"
grep -q "did you mean 'train.steps'" "$work/bad.out" || fail "no suggestion for train.stepz"
[ ! -e "$work/runs" ] || fail "a bad config created $work/runs"

# 2. A real run.
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/runs" > "$work/run.out" 2>&1 \
  || { cat "$work/run.out"; fail "training failed"; }
grep -q "^step 40/40 | loss" "$work/run.out" || { cat "$work/run.out"; fail "no final log line"; }
db="$work/runs/deltadeck.db"
[ "$(sqlite3 "$db" 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(sqlite3 "$db" "SELECT status FROM runs WHERE name='e2e'")" = finished ] || fail "status not finished"
loss_rows=$(sqlite3 "$db" "SELECT count(*) FROM metrics WHERE key='loss'")
[ "$loss_rows" = 8 ] || fail "expected 8 loss rows (steps 5..40), got $loss_rows"
distinct=$(sqlite3 "$db" "SELECT count(DISTINCT step) FROM metrics WHERE key='loss'")
[ "$distinct" = 8 ] || fail "loss rows not one per logged step"
[ "$(sqlite3 "$db" "SELECT count(*) FROM metrics WHERE key='val_loss'")" = 2 ] || fail "expected 2 val_loss rows"
ck=$(sqlite3 "$db" "SELECT path FROM checkpoints WHERE step=40")
[ -f "$ck/model.safetensors" ] || fail "checkpoint of step 40 missing on disk ($ck)"
sha=$(sqlite3 "$db" "SELECT sha256 FROM checkpoints WHERE step=40")
[ "$(sha256sum "$ck/model.safetensors" | cut -d' ' -f1)" = "$sha" ] || fail "recorded sha256 differs from the file"
sqlite3 "$db" "SELECT config_toml FROM runs WHERE name='e2e'" | grep -q "seq_len = 32" || fail "config not recorded"

# 3. The same name again gets a suffix; runs list/show read both.
"$bin" train --no-gui --config "$work/run.toml" --runs-dir "$work/runs" --set train.steps=5 > /dev/null 2>&1
"$bin" runs list --runs-dir "$work/runs" > "$work/list.out"
grep -q "e2e-2" "$work/list.out" || { cat "$work/list.out"; fail "second run not listed as e2e-2"; }
"$bin" runs show e2e --runs-dir "$work/runs" > "$work/show.out" 2>&1 || fail "runs show e2e"
grep -q "status     finished" "$work/show.out" || { cat "$work/show.out"; fail "runs show lacks status"; }
grep -q "step 40" "$work/show.out" || fail "runs show lacks the checkpoint"
set +e
"$bin" runs show nosuchrun --runs-dir "$work/runs" > "$work/none.out" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "unknown run exited $rc"
grep -q "e2e" "$work/none.out" || fail "unknown run error does not list the runs"

# 4. Resume: the finished 40-step run continues to 60 in the same record. A stale row after the
#    checkpoint (as a crash leaves behind) is marked superseded, so every logged step has exactly one
#    current row (schema 4).
#    A damaged checkpoint after the one chosen (a copy of step 40 as step 50 with a flipped byte) is
#    skipped and set aside, so pruning never counts it as the newest.
run_id=$(sqlite3 "$db" "SELECT id FROM runs WHERE name='e2e'")
sqlite3 "$db" "INSERT INTO metrics(run_id, step, tokens, wall_s, key, value) VALUES($run_id, 45, 0, 0, 'loss', 99)"
ckpts="$work/runs/e2e/checkpoints"
cp -r "$ckpts/step_00000040" "$ckpts/step_00000050"
printf '\377' | dd of="$ckpts/step_00000050/model.safetensors" bs=1 seek=200 conv=notrunc status=none
"$bin" train --no-gui --resume e2e --runs-dir "$work/runs" --set train.steps=60 > "$work/resume.out" 2>&1 \
  || { cat "$work/resume.out"; fail "resume failed"; }
grep -q "resuming from .*step_00000040" "$work/resume.out" || { cat "$work/resume.out"; fail "did not resume from step 40"; }
grep -q "^step 60/60 | loss" "$work/resume.out" || { cat "$work/resume.out"; fail "resumed run did not reach step 60"; }
grep -q "set aside .*step_00000050.superseded" "$work/resume.out" || { cat "$work/resume.out"; fail "step 50 not set aside"; }
[ -d "$ckpts/step_00000050.superseded" ] && [ ! -e "$ckpts/step_00000050" ] && [ -d "$ckpts/step_00000060" ] \
  || { ls "$ckpts"; fail "checkpoints after the resume"; }
[ "$(sqlite3 "$db" "SELECT count(*) FROM runs")" = 2 ] || fail "resume created a new run record"
[ "$(sqlite3 "$db" "SELECT status FROM runs WHERE name='e2e'")" = finished ] || fail "resumed run not finished"
rows=$(sqlite3 "$db" "SELECT count(*) || '/' || count(DISTINCT step) FROM metrics WHERE run_id=$run_id AND key='loss' AND superseded=0")
[ "$rows" = "12/12" ] || fail "expected 12 current loss rows for 12 steps (5..60) after resume, got $rows"
[ "$(sqlite3 "$db" "SELECT superseded FROM metrics WHERE run_id=$run_id AND value=99")" = 1 ] || fail "stale row not superseded"
sqlite3 "$db" "SELECT text FROM events WHERE run_id=$run_id" | grep -q "resumed from" || fail "no resume event"
sqlite3 "$db" "SELECT text FROM events WHERE run_id=$run_id" | grep -q "set aside .*step_00000050.superseded" \
  || fail "no set-aside event"
# The resume's --set is now the run's config: the next resume (no --set) keeps steps = 60 rather
# than going back to the recorded 40, and the change is in the run's events.
sqlite3 "$db" "SELECT json_extract(config_json, '$.train.steps') FROM runs WHERE id=$run_id" | grep -qx 60 \
  || fail "the resume's train.steps is not in the run's config"
sqlite3 "$db" "SELECT text FROM events WHERE run_id=$run_id" | grep -q "resume changed the run's config: train.steps 40 -> 60" \
  || { sqlite3 "$db" "SELECT text FROM events WHERE run_id=$run_id"; fail "no config-change event"; }
"$bin" train --no-gui --dry-run --resume e2e --runs-dir "$work/runs" > "$work/resume2.out" 2>&1 \
  || { cat "$work/resume2.out"; fail "dry run of a second resume"; }
grep -q "^schedule 60 steps" "$work/resume2.out" || { cat "$work/resume2.out"; fail "a second resume lost train.steps = 60"; }
set +e
"$bin" train --no-gui --resume nosuchrun --runs-dir "$work/runs" > "$work/resume_bad.out" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] || fail "resuming an unknown run succeeded"
# Resumes refused before anything starts (exit 2, the run left as it was): an empty --resume (an
# unset shell variable), train.steps below the checkpoint's step, and another number of training
# sources than the loader's saved position holds.
src=$(sqlite3 "$db" "SELECT json_extract(config_json, '$.data.train[0]') FROM runs WHERE id=$run_id")
for bad in "--resume=" "--resume e2e --set train.steps=10" "--resume e2e --set data.train=[\"$src\",\"$src\"]"; do
  set +e
  # shellcheck disable=SC2086  # the words of $bad are the arguments
  "$bin" train --no-gui $bad --runs-dir "$work/runs" > "$work/resume_refused.out" 2>&1
  rc=$?
  set -e
  [ "$rc" = 2 ] || { cat "$work/resume_refused.out"; fail "train $bad exited $rc, expected 2"; }
done
grep -q "data.train_sources: the checkpoint has 1, this run has 2" "$work/resume_refused.out" \
  || { cat "$work/resume_refused.out"; fail "a resume with another source count does not name data.train_sources"; }
"$bin" train --no-gui --resume e2e --runs-dir "$work/runs" --set train.steps=10 > "$work/resume_low.out" 2>&1 || true
grep -q "train.steps = 10 is below the step 60" "$work/resume_low.out" \
  || { cat "$work/resume_low.out"; fail "a resume below the checkpoint's step does not say so"; }
sqlite3 "$db" "SELECT json_extract(config_json, '$.train.steps') FROM runs WHERE id=$run_id" | grep -qx 60 \
  || fail "a refused resume changed the run's recorded config"
[ "$(sqlite3 "$db" "SELECT status FROM runs WHERE id=$run_id")" = finished ] || fail "a refused resume changed the run's status"
# Values no command can use are refused naming the flag.
for bad in "model info --seq-len -5" "model info --vocab 0" "sample --checkpoint $work/runs/e2e -t inf" \
           "sample --checkpoint $work/runs/e2e -t nan" "sample --checkpoint $work/runs/e2e --threads -2"; do
  set +e
  # shellcheck disable=SC2086
  "$bin" $bad > "$work/flag.out" 2>&1
  rc=$?
  set -e
  flag=$(echo "$bad" | grep -o -- '-[-a-z]* [-a-z0-9]*$' | cut -d' ' -f1)
  [ "$rc" = 2 ] && grep -q -- "$flag" "$work/flag.out" || { cat "$work/flag.out"; fail "$bad exited $rc"; }
done

# 5. Export: the newest checkpoint or a chosen step as model.safetensors + config.json.
"$bin" export e2e --runs-dir "$work/runs" --out "$work/export" > "$work/export.out" 2>&1 \
  || { cat "$work/export.out"; fail "export failed"; }
grep -q "step 60" "$work/export.out" || { cat "$work/export.out"; fail "export did not take the newest step"; }
[ -s "$work/export/model.safetensors" ] || fail "no exported weights"
grep -q '"d": 64' "$work/export/config.json" || { cat "$work/export/config.json"; fail "config.json lacks model.d"; }
"$bin" export e2e --runs-dir "$work/runs" --step 40 --out "$work/export40" > /dev/null 2>&1 || fail "export --step 40"
# Integers are decimal: a step copied from a step_00000040 folder name is step 40 (not octal 32),
# and a hexadecimal one is refused naming the flag.
"$bin" export e2e --runs-dir "$work/runs" --step 00000040 --out "$work/export40z" > "$work/export40z.out" 2>&1 \
  || { cat "$work/export40z.out"; fail "export --step 00000040"; }
grep -q "step 40" "$work/export40z.out" || { cat "$work/export40z.out"; fail "--step 00000040 is not step 40"; }
set +e
"$bin" export e2e --runs-dir "$work/runs" --step 0x28 --out "$work/export28" > "$work/export28.out" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--step.*expects a decimal integer (got 0x28)" "$work/export28.out" \
  || { cat "$work/export28.out"; fail "--step 0x28 exited $rc"; }
# The options whose defaults mean "not given" (-1) refuse a negative value instead of ignoring it.
for bad in "export e2e --out $work/export-5 --step -5" "train --dry-run --node-rank -1" "train --dry-run --nnodes -2" \
           "train --dry-run --master-port 0"; do
  set +e
  # shellcheck disable=SC2086  # the words of $bad are the arguments
  "$bin" $bad --runs-dir "$work/runs" > "$work/neg.out" 2>&1
  rc=$?
  set -e
  flag=$(echo "$bad" | grep -o -- '--[a-z-]* -\?[0-9]*$' | cut -d' ' -f1)
  [ "$rc" = 2 ] && grep -q -- "$flag" "$work/neg.out" || { cat "$work/neg.out"; fail "$bad exited $rc"; }
done
set +e
"$bin" export e2e --runs-dir "$work/runs" --step 7 --out "$work/export7" > "$work/export7.out" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "export of a missing step exited $rc"
grep -q "checkpoints at steps 20, 40, 60" "$work/export7.out" || { cat "$work/export7.out"; fail "missing-step error"; }

# 6. The safetensors Python library reads the exported weights and a checkpoint, and their tensors
#    match config.json's list and each other.
if [ -n "$python" ] && "$python" -c "import safetensors" 2> /dev/null; then
  "$python" - "$work/export" "$ck" <<'PY' 2> "$work/py.err" || { cat "$work/py.err"; fail "safetensors (Python) check"; }
import json, sys
from safetensors.torch import load_file
export, ckpt = sys.argv[1], sys.argv[2]
cfg = json.load(open(export + "/config.json"))
w = load_file(export + "/model.safetensors")
assert set(w) == set(cfg["tensors"]), "tensor names differ from config.json"
for name, t in w.items():
    assert list(t.shape) == cfg["tensors"][name], name
    assert str(t.dtype) == "torch.float32", name
c = load_file(ckpt + "/model.safetensors")
assert set(c) == set(w), "checkpoint and export hold different tensors"
print("python safetensors: %d tensors ok" % len(w))
PY
else
  echo "cli e2e: no Python safetensors library given; skipped the Python reader check"
fi
# `bench train` on the CPU: the table, and the JSON with its figures and no CUDA graph step.
"$bin" bench train --preset tiny --family gpt --batch 2 --seq-len 32 --steps 2 --warmup 1 \
  --json "$work/bench.json" > "$work/bench.out" 2>&1 || { cat "$work/bench.out"; fail "bench train failed"; }
grep -q "CUDA graph step: off$" "$work/bench.out" || fail "bench: $(cat "$work/bench.out")"
grep -q '"cuda_graph": "off"' "$work/bench.json" || fail "bench json: $(cat "$work/bench.json")"
grep -qE '"tokens_per_s": [0-9.]*[1-9]' "$work/bench.json" || fail "bench json without tokens/s: $(cat "$work/bench.json")"
# --profile-top takes a positive count; a bad one is refused by name before anything runs.
set +e
"$bin" bench train --preset tiny --family gpt --steps 1 --warmup 0 --profile --profile-top 0 > "$work/top.out" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { cat "$work/top.out"; fail "--profile-top 0 exited $rc, expected 2"; }
grep -q -- "--profile-top" "$work/top.out" || fail "the --profile-top error does not name the flag: $(cat "$work/top.out")"
# `sample`: text from a text run; token ids from a run on llm.c token shards, whose tokenizer
# (GPT-2's) the run never had, and a prompt that is not ids refused naming --prompt.
"$bin" sample --checkpoint "$work/runs/e2e" -n 12 --seed 3 > "$work/sample.out" 2> "$work/sample.err" \
  || { cat "$work/sample.err"; fail "sample of the text run"; }
[ -s "$work/sample.out" ] || fail "sample printed no text"
grep -q "generated in" "$work/sample.err" || { cat "$work/sample.err"; fail "sample: no summary"; }
python3 - "$work/shard_000.bin" <<'PY'
import random, struct, sys
random.seed(1)
tokens = []
for _ in range(60):
    tokens += [50256] + [random.randrange(50000) for _ in range(80)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(tokens), *tokens))
PY
"$bin" train --no-gui --runs-dir "$work/runs" --set name=shards --set "data.train=[\"llmc:$work/shard_*.bin\"]" \
  --set model.vocab_size=50304 --set model.d=32 --set model.L=1 --set train.steps=3 --set train.batch_size=2 \
  --set train.seq_len=32 --set train.warmup_steps=1 --set run.threads=1 > "$work/shards.out" 2>&1 \
  || { cat "$work/shards.out"; fail "training on a token shard"; }
"$bin" sample --checkpoint "$work/runs/shards" --prompt "50256 464" -n 6 -t 0 > "$work/ids.out" 2> "$work/ids.err" \
  || { cat "$work/ids.err"; fail "sample of the token-shard run"; }
grep -qE '^50256 464( [0-9]+)+$' "$work/ids.out" || { cat "$work/ids.out"; fail "sample of a token run: not ids"; }
grep -q "token ids, as the run trained on token files" "$work/ids.err" || { cat "$work/ids.err"; fail "no ids note"; }
set +e
"$bin" sample --checkpoint "$work/runs/shards" --prompt "hello" -n 6 > /dev/null 2> "$work/ids-bad.err"
rc=$?
set -e
[ "$rc" = 1 ] && grep -q -- "--prompt: this run trained on token files" "$work/ids-bad.err" \
  || { cat "$work/ids-bad.err"; fail "a text prompt for a token run exited $rc"; }
# A sample that cannot start (no such checkpoint) writes nothing to stdout, not even the prompt.
set +e
"$bin" sample --checkpoint "$work/runs/no-such-run" --prompt "hello" -n 6 > "$work/none.out" 2> "$work/none.err"
rc=$?
set -e
[ "$rc" = 1 ] && [ ! -s "$work/none.out" ] && grep -q "no such checkpoint or run directory" "$work/none.err" \
  || { cat "$work/none.out" "$work/none.err"; fail "a sample of no checkpoint exited $rc or wrote to stdout"; }
# A SentencePiece run's export carries its tokenizer model, named by config.json, so the folder
# stands alone.
"$bin" tokenizer train --input "/usr/share/games/fortunes/fortunes" --vocab-size 512 --out "$work/sp.model" \
  > "$work/sp.out" 2>&1 || { cat "$work/sp.out"; fail "tokenizer train"; }
# Training again onto an existing model is refused (runs that read it would get other ids), unless
# --force; the model is replaced whole, and no temporary files are left.
cp "$work/sp.model" "$work/sp.model.first"
set +e
"$bin" tokenizer train --input "/usr/share/games/fortunes/fortunes" --vocab-size 300 --out "$work/sp.model" \
  > "$work/sp2.out" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--out: .*sp.model exists" "$work/sp2.out" && cmp -s "$work/sp.model" "$work/sp.model.first" \
  || { cat "$work/sp2.out"; fail "tokenizer train over an existing model exited $rc"; }
"$bin" tokenizer train --input "/usr/share/games/fortunes/fortunes" --vocab-size 512 --out "$work/sp.model" --force \
  > "$work/sp3.out" 2>&1 || { cat "$work/sp3.out"; fail "tokenizer train --force"; }
[ -f "$work/sp.vocab" ] && [ ! -e "$work/sp.tmp.model" ] && [ ! -e "$work/sp.tmp.vocab" ] \
  || { ls "$work"; fail "tokenizer train --force left temporary files or no .vocab"; }
"$bin" train --no-gui --runs-dir "$work/runs" --set name=sp --set "data.tokenizer=\"sentencepiece:$work/sp.model\"" \
  --set model.vocab_size=512 --set train.steps=2 --set train.warmup_steps=1 --set run.threads=1 > "$work/sp-run.out" 2>&1 \
  || { cat "$work/sp-run.out"; fail "training with the SentencePiece tokenizer"; }
"$bin" export sp --runs-dir "$work/runs" --out "$work/sp-export" > "$work/sp-export.out" 2>&1 \
  || { cat "$work/sp-export.out"; fail "export of the SentencePiece run"; }
cmp -s "$work/sp.model" "$work/sp-export/tokenizer.model" || fail "the export's tokenizer.model is not the run's"
grep -q '"tokenizer": "sentencepiece:tokenizer.model"' "$work/sp-export/config.json" \
  || { cat "$work/sp-export/config.json"; fail "config.json does not name the exported tokenizer"; }
echo "cli e2e: ok"
