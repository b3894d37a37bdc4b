#!/usr/bin/env bash
# `deltadeck runs ...` and the plain log formats against a database this test fills with three tiny
# training runs: list (filters), show, compare, export (csv, json), tag, note, rename, delete; run
# names that match nothing or several runs; JSON log lines that carry every metric of the step;
# text lines in the documented format.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
bin=$(realpath "$bin")
cd "$work"
db="$work/runs/deltadeck.db"
q() { sqlite3 "$db" "$1"; }

mkdir -p corpus
for i in $(seq 1 120); do printf 'pack my box with five dozen liquor jugs %d\n%%\n' "$i" >> corpus/a.txt; done
cat > run.toml <<TOML
name = "base"
[model]
d = 32
L = 1
attn_heads = 2
attn_kv_heads = 1
attn_head_dim = 16
ffn_hidden = 64
[data]
train = ["text:$work/corpus/*.txt"]
val = 0.05
[train]
steps = 6
batch_size = 2
seq_len = 16
warmup_steps = 2
eval_batches = 1
[run]
log_interval = 2
eval_interval = 3
save_interval = 3
threads = 1
TOML

# ---- fill: base, base-2 (another lr), other (JSON log lines)
"$bin" train --no-gui --config run.toml --runs-dir runs > base.out 2>&1 || { cat base.out; fail "run base"; }
"$bin" train --no-gui --config run.toml --runs-dir runs --set train.lr=1e-3 > base2.out 2>&1 || { cat base2.out; fail "run base-2"; }
"$bin" train --no-gui --config run.toml --runs-dir runs --set name=other --set train.steps=4 --log-format json \
  > other.jsonl 2> other.err || { cat other.jsonl other.err; fail "run other"; }

# Text lines: the documented format (ui/log/log_line.h, README "Output").
step_re='^step [0-9]+/6 \| loss [0-9]+\.[0-9]{4} \| grad_norm [0-9.]+ \| lr [0-9.]+e[-+][0-9]{2} \| [0-9.]+k? tok/s \| [0-9]+s( \| eta [0-9hms]+)?$'
[ "$(grep -c '^step ' base.out)" = 3 ] || { cat base.out; fail "expected 3 step lines (log_interval 2 of 6 steps)"; }
grep '^step ' base.out | grep -qvE "$step_re" && { grep '^step ' base.out; fail "a step line breaks the documented format"; }
grep -qE '^step 4/6 .* \| eta [0-9]+s$' base.out || { cat base.out; fail "no eta on the second logged step"; }
grep -qE '^eval step 3 \| val_loss [0-9.]+ \| val_ppl [0-9.]+$' base.out || fail "no eval line"
grep -qE '^checkpoint step 3 \| /.*/runs/base/checkpoints/step_00000003 \| [0-9.]+[kM]B$' base.out || fail "no checkpoint line"

# JSON lines: each parses; each step line carries every metric the database has for that step.
python3 - "$db" other.jsonl <<'PY' || fail "JSON log lines"
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
run_id, = db.execute("SELECT id FROM runs WHERE name='other'").fetchone()
lines = [json.loads(l) for l in open(sys.argv[2])]
kinds = [l["event"] for l in lines]
assert kinds[0] == "run" and kinds[-1] == "ended", kinds
assert lines[0]["config"]["train"]["steps"] == 4
fixed = ["event", "time", "run", "step"]
for l in lines:
    assert list(l)[:4] == fixed, l
steps = [l for l in lines if l["event"] == "step"]
assert [l["step"] for l in steps] == [2, 4], steps
for l in steps:
    want = dict(db.execute("SELECT key, value FROM metrics WHERE run_id=? AND step=? AND key NOT LIKE 'val_%'",
                           (run_id, l["step"])).fetchall())
    got = {k: v for k, v in l.items() if k not in fixed + ["total_steps", "tokens", "wall_s", "eta_s"]}
    assert set(got) == set(want), (sorted(got), sorted(want))
    for k in want:
        assert abs(got[k] - want[k]) <= 1e-12 * max(1, abs(want[k])), (k, got[k], want[k])
    assert l["total_steps"] == 4
assert any(l["event"] == "eval" and "val_loss" in l for l in lines)
assert any(l["event"] == "checkpoint" and l["bytes"] > 0 for l in lines)
assert lines[-1]["status"] == "finished"
print("json lines ok: %d lines, %d steps" % (len(lines), len(steps)))
PY

# ---- list, filters
expect 0 list.out "$bin" runs list --runs-dir runs
for n in base base-2 other; do has list.out " $n "; done
q "UPDATE runs SET status='failed', message='test' WHERE name='other'"
expect 0 finished.out "$bin" runs list --status finished --runs-dir runs
has finished.out "base-2"
grep -q " other " finished.out && fail "--status finished lists a failed run"
expect 2 badstatus.out "$bin" runs list --status done --runs-dir runs
has badstatus.out "--status: must be one of running, finished, stopped, failed, interrupted, preempted, diverged (got \"done\")"
expect 1 nodb.out "$bin" runs list --runs-dir "$work/nowhere"
has nodb.out "no run database at $work/nowhere/deltadeck.db"

# ---- a run whose process died without closing it (a SIGKILL) lists as interrupted, with the reason
sh -c 'exit 0' &
gone=$!
wait "$gone"
q "UPDATE runs SET status='running', pid=$gone, ended_at=NULL, message='' WHERE name='other'"
expect 0 dead.out "$bin" runs list --runs-dir runs
grep " other " dead.out | grep -q "interrupted" || { cat dead.out; fail "a dead process's run is not listed as interrupted"; }
expect 0 deadshow.out "$bin" runs show other --runs-dir runs
has deadshow.out "status     interrupted"
has deadshow.out "process $gone on "
q "UPDATE runs SET status='failed', message='test' WHERE name='other'"

# ---- run names: unknown and ambiguous list the candidates
expect 1 amb.out "$bin" runs show bas --runs-dir runs
has amb.out "run 'bas' is ambiguous: base, base-2"
expect 1 unknown.out "$bin" runs show nope --runs-dir runs
has unknown.out "no run named 'nope'; runs: base, base-2, other"
expect 0 byid.out "$bin" runs show 3 --runs-dir runs
has byid.out "run 3 'other'"

# ---- show
expect 0 show.out "$bin" runs show base --runs-dir runs
has show.out "status     finished"
has show.out "progress   step 6"
has show.out "val_loss   final "
has show.out "step 6  "
has show.out "checkpoint saved"
has show.out "seq_len = 16"

# ---- compare
expect 0 cmp.out "$bin" runs compare base base-2 other --runs-dir runs
has cmp.out "base (1)"
has cmp.out "best val_loss"
grep -qE '^  train\.lr +0\.003 +0\.001 +0\.003 *$' cmp.out || { cat cmp.out; fail "no train.lr difference row"; }
grep -qE '^  train\.steps +6 +6 +4 *$' cmp.out || { cat cmp.out; fail "no train.steps difference row"; }
grep -q "config differences (2 keys)" cmp.out || { cat cmp.out; fail "expected exactly lr and steps to differ"; }
expect 2 cmp1.out "$bin" runs compare base --runs-dir runs
has cmp1.out "name at least two runs"
expect 1 cmp2.out "$bin" runs compare base 1 --runs-dir runs
has cmp2.out "is named twice"

# ---- export
expect 0 csv.err "$bin" runs export base --format csv --out base.csv --runs-dir runs
rows=$(q "SELECT count(*) FROM metrics WHERE run_id=1")
[ "$(head -1 base.csv)" = "step,tokens,wall_s,key,value" ] || fail "csv header"
[ "$(($(wc -l < base.csv) - 1))" = "$rows" ] || fail "csv has $(($(wc -l < base.csv) - 1)) rows, the database $rows"
"$bin" runs export base --runs-dir runs | cmp -s - base.csv || fail "csv to stdout differs from --out"
expect 0 json.err "$bin" runs export base-2 --format json --out base2.json --runs-dir runs
python3 - "$db" base2.json <<'PY' || fail "json export"
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
doc = json.load(open(sys.argv[2]))
assert doc["run"]["name"] == "base-2" and doc["run"]["status"] == "finished"
assert doc["config"]["train"]["lr"] == 0.001
for key, cols in doc["metrics"].items():
    n, = db.execute("SELECT count(*) FROM metrics WHERE run_id=2 AND key=?", (key,)).fetchone()
    assert len(cols["value"]) == len(cols["step"]) == n, key
assert len(doc["checkpoints"]) == db.execute("SELECT count(*) FROM checkpoints WHERE run_id=2").fetchone()[0]
assert doc["events"], "no events"
PY
expect 2 fmt.out "$bin" runs export base --format xml --runs-dir runs
has fmt.out "--format: must be csv or json (got \"xml\")"

# ---- tag, note
expect 0 tag.out "$bin" runs tag base sweep best --runs-dir runs
has tag.out "tags: best, sweep"
expect 0 tag2.out "$bin" runs tag base-2 sweep --runs-dir runs
expect 0 untag.out "$bin" runs tag base best --remove --runs-dir runs
has untag.out "tags: sweep"
expect 2 badtag.out "$bin" runs tag base "two words" --runs-dir runs
has badtag.out "must not contain whitespace"
expect 0 bytag.out "$bin" runs list --tag sweep --runs-dir runs
has bytag.out " base-2 "
grep -q " other " bytag.out && fail "--tag lists an untagged run"
expect 0 note.out "$bin" runs note base "warmup too short" --runs-dir runs
[ "$(q "SELECT note FROM runs WHERE name='base'")" = "warmup too short" ] || fail "note not stored"
expect 0 shown.out "$bin" runs show base --runs-dir runs
has shown.out "note       warmup too short"
has shown.out "tags       sweep"

# ---- rename: the folder and checkpoint paths follow, so export still finds the checkpoints
expect 2 taken.out "$bin" runs rename base-2 base --runs-dir runs
has taken.out "name 'base' is taken by run 1"
expect 0 rename.out "$bin" runs rename base-2 lr-low --runs-dir runs
[ -d runs/lr-low/checkpoints ] && [ ! -e runs/base-2 ] || fail "the run folder did not move"
[ "$(q "SELECT count(*) FROM checkpoints WHERE run_id=2 AND path LIKE '%/lr-low/checkpoints/%'")" = 2 ] \
  || fail "checkpoint paths not rewritten: $(q "SELECT path FROM checkpoints WHERE run_id=2")"
expect 0 export.out "$bin" export lr-low --out "$work/exported" --runs-dir runs
[ -s "$work/exported/model.safetensors" ] || fail "export after rename"

# ---- delete: refuses a live run, asks, --yes
q "UPDATE runs SET status='running', pid=$$ WHERE name='other'"
expect 1 live.out "$bin" runs delete other --yes --runs-dir runs
has live.out "is running"
q "UPDATE runs SET status='failed' WHERE name='other'"
expect 2 noanswer.out "$bin" runs delete other --runs-dir runs < /dev/null
has noanswer.out "pass --yes"
[ "$(q "SELECT count(*) FROM runs WHERE name='other'")" = 1 ] || fail "deleted without an answer"
echo n > no.txt
expect 2 declined.out "$bin" runs delete other --runs-dir runs < no.txt
has declined.out "not deleted"
echo y > yes.txt
expect 0 deleted.out "$bin" runs delete other --runs-dir runs < yes.txt
has deleted.out "deleted run 3 'other'"
[ ! -e runs/other ] || fail "the run folder of 'other' is still there"
expect 0 deleted2.out "$bin" runs delete lr-low --yes --runs-dir runs
[ "$(q "SELECT count(*) FROM runs")" = 1 ] || fail "expected one run left"
[ "$(q "SELECT count(*) FROM metrics WHERE run_id IN (2, 3)")" = 0 ] || fail "metrics of deleted runs left"
[ ! -e runs/lr-low ] || fail "the run folder of 'lr-low' is still there"
[ -d runs/base/checkpoints ] || fail "deleting other runs touched base's checkpoints"
expect 1 gone.out "$bin" runs show other --runs-dir runs
has gone.out "no run named 'other'; runs: base"
# ---- a NaN metric (a skipped step's loss; SQLite keeps NaN as NULL) reads as NaN, not 0: the
# summaries pass over it and the JSON export writes null
q "INSERT INTO metrics(run_id, step, tokens, wall_s, key, value) VALUES(1, 999, 0, 0, 'loss', NULL)"
expect 0 nan.out "$bin" runs show base --runs-dir runs
grep -q "loss       final nan, best 0.0000" nan.out && { cat nan.out; fail "a NaN loss was read as 0"; }
grep -qE "loss       final nan, best [1-9]" nan.out || { cat nan.out; fail "runs show with a NaN loss"; }
expect 0 nan-json.err "$bin" runs export base --format json --out nan.json --runs-dir runs
python3 -c "import json,sys; d=json.load(open('nan.json')); v=d['metrics']['loss']['value']; sys.exit(0 if v[-1] is None and v[0] is not None else 1)" \
  || fail "the JSON export does not hold the NaN loss as null"
# ---- runs export never overwrites the database, and another existing file only with --force;
# export refuses a checkpoint folder and an existing export (without --force) and an empty --out
before=$(q "SELECT count(*) FROM metrics")
expect 2 clobber.out "$bin" runs export base --format csv --out runs/deltadeck.db --force --runs-dir runs
has clobber.out "is the run database"
[ "$(q "SELECT count(*) FROM metrics")" = "$before" ] || fail "the database changed"
expect 2 exists.out "$bin" runs export base --format csv --out nan.json --runs-dir runs
has exists.out "nan.json exists; pass --force to replace it"
expect 0 forced.err "$bin" runs export base --format csv --out nan.json --force --runs-dir runs
head -1 nan.json | grep -qx "step,tokens,wall_s,key,value" || fail "--force did not replace the file"
ck=$(ls -d runs/base/checkpoints/step_* | tail -1)
expect 1 into-ckpt.out "$bin" export base --out "$ck" --runs-dir runs
has into-ckpt.out "a checkpoint folder (it holds manifest.json)"
expect 0 first-export.out "$bin" export base --out "$work/exp2" --runs-dir runs
expect 1 again.out "$bin" export base --out "$work/exp2" --runs-dir runs
has again.out "model.safetensors exists; export to another folder, or replace it (--force)"
expect 0 again-forced.out "$bin" export base --out "$work/exp2" --force --runs-dir runs
expect 1 empty-out.out "$bin" export base --out "" --runs-dir runs
has empty-out.out "no output folder given (--out)"
echo "runs e2e: ok"
