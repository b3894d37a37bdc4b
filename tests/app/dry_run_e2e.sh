#!/usr/bin/env bash
# `deltadeck train --dry-run`: the demo config is reported (parameters checked against the built
# model, world size, memory, schedule) and nothing is created; token shards are counted from their
# headers; a bad config exits 2 naming the key; a dry run of --resume names the checkpoint and
# changes nothing in the database.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
bin=$(realpath "$bin")
cd "$work"

# 1. The demo config.
"$bin" train --dry-run --runs-dir "$work/runs" > demo.out 2>&1 || { cat demo.out; fail "dry run of the demo config"; }
has demo.out "dry run of the demo config; nothing is trained, recorded or written"
has demo.out "parameters 1,214,208; built on the CPU: the same count"
has demo.out "training FLOPs per token"
has demo.out "world size 1, precision fp32"
has demo.out "optimizer state       9.3 MiB  (AdamW moments)"
has demo.out "600 steps × 2,048 tokens (16 rows × 128 × 1 accumulation × 1 rank) = 1.23M tokens"
has demo.out "evaluation every 100 steps and at the end (6 in all)"
has demo.out "dry run ok"
grep -qE '^ +[0-9]+ files, [0-9.]+ MiB, [0-9.]+M tokens \(about one per byte' demo.out || { cat demo.out; fail "no data figures"; }
[ ! -e "$work/runs" ] || fail "a dry run created $work/runs"
# The schedule's tokens by phases (10 steps of 64 × 16 reach 10,000 tokens, then 590 of 128 × 16),
# and a trillion steps counted at once rather than walked (that took hours).
"$bin" train --dry-run --runs-dir "$work/runs" --set 'train.phases=["0:64x16", "10000:128x16"]' > phases.out 2>&1 \
  || { cat phases.out; fail "dry run with phases"; }
has phases.out "= 1.22M tokens"
timeout 60 "$bin" train --dry-run --runs-dir "$work/runs" --set train.steps=1000000000000 > huge.out 2>&1 \
  || { cat huge.out; fail "dry run of 10^12 steps (exit $?)"; }
has huge.out "1,000,000,000,000 steps"
has huge.out "dry run ok"

# 2. An llm.c token shard: 256 int32 header (magic, version, token count), then uint16 tokens.
python3 - <<'PY'
import struct
tokens = ([50256] + list(range(1, 400))) * 25          # 25 documents of 400 tokens
with open("shard_000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(tokens), *tokens))
PY
"$bin" train --dry-run --runs-dir "$work/runs" --set "data.train=[\"llmc:$work/shard_*.bin\"]" \
  --set model.vocab_size=50304 > shard.out 2>&1 || { cat shard.out; fail "dry run on a token shard"; }
has shard.out "1 file, 20.5 KiB, 10k tokens (from the shard headers)"
has shard.out "vocabulary 50304"
has shard.out "split  24 training documents, 1 held out: 1 validation batch (384 tokens)"
# A split the loader cannot make (3 documents, none held out at data.val = 0.02) is refused here,
# not after the run was recorded.
python3 - <<'PY'
import struct
tokens = ([50256] + list(range(1, 400))) * 3
with open("small_000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(tokens), *tokens))
PY
set +e
"$bin" train --dry-run --runs-dir "$work/runs" --set "data.train=[\"llmc:$work/small_*.bin\"]" \
  --set model.vocab_size=50304 > small.out 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { cat small.out; fail "a dry run with an empty validation split exited $rc"; }
has small.out "data.val: the validation split came out empty"

# 3. A bad config: exit 2, the key named, nothing created.
set +e
"$bin" train --dry-run --runs-dir "$work/runs" --set train.batch_size=0 --set run.devices=gpu7 > bad.out 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { cat bad.out; fail "bad config exited $rc, expected 2"; }
has bad.out "train.batch_size"
has bad.out "run.devices"
[ ! -e "$work/runs" ] || fail "a failed dry run created $work/runs"

# 4. --resume: the run and its checkpoint are named; the database is left as it was.
"$bin" train --no-gui --runs-dir "$work/runs" --set train.steps=2 --set train.warmup_steps=1 --set run.threads=1 \
  > short.out 2>&1 || { cat short.out; fail "the run to resume"; }
before=$(sqlite3 "$work/runs/deltadeck.db" "SELECT status, ended_at, (SELECT count(*) FROM events) FROM runs")
"$bin" train --dry-run --resume demo --runs-dir "$work/runs" --set train.steps=10 > resume.out 2>&1 \
  || { cat resume.out; fail "dry run of --resume"; }
has resume.out "dry run of run 'demo' (id 1)"
has resume.out "would resume from $work/runs/demo/checkpoints/step_00000002"
has resume.out "10 steps"
after=$(sqlite3 "$work/runs/deltadeck.db" "SELECT status, ended_at, (SELECT count(*) FROM events) FROM runs")
[ "$before" = "$after" ] || fail "the dry run changed the run record: $before -> $after"
echo "dry run e2e: ok"
