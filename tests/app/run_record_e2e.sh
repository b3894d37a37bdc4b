#!/usr/bin/env bash
# A run's record travels with its checkpoints (storage::RUN_RECORD_FILE in the run folder, rewritten
# at every checkpoint and at the end): `runs import` brings it into another database, and a resume
# on a database that does not know the run (a cluster job's fresh node-local runs folder) takes it
# from there, by name or as "latest", from the runs folder or from run.checkpoint_dir, and so does a
# database whose copy of the run is behind the record (a job of a chain back on an earlier node).
# Broken records are refused naming the file and the key; delete removes the record with the
# folder, but an imported copy's delete leaves the files.
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
bin=$(realpath "$bin")
cd "$work"
# rows DB RUN: the run's current metric rows.
rows() { sqlite3 "$1" "SELECT count(*) FROM metrics m JOIN runs r ON r.id = m.run_id WHERE r.name='$2' AND superseded=0"; }

make_corpus corpus/a.txt 120 'pack my box with five dozen liquor jugs'
cat > run.toml <<TOML
name = "rec"
[model]
$TINY_MODEL_KEYS
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
log_interval = 1
eval_interval = 3
save_interval = 3
threads = 1
TOML

# ---- the record beside the checkpoints says what the database says
expect 0 rec.out "$bin" train --no-gui --config run.toml --runs-dir runs
[ -f runs/rec/run_record.json ] || fail "no run record in runs/rec"
[ -z "$(ls runs/rec | grep '\.tmp')" ] || fail "a temporary file was left: $(ls runs/rec)"
python3 - runs/deltadeck.db runs/rec/run_record.json <<'PY' || fail "the record differs from the database"
import json, math, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
doc = json.load(open(sys.argv[2]))
assert doc["run"]["name"] == "rec" and doc["run"]["status"] == "finished", doc["run"]
assert doc["config_toml"] == db.execute("SELECT config_toml FROM runs WHERE name='rec'").fetchone()[0]
# The metric rows are in the file the record names, one [key, step, tokens, wall_s, value] a line,
# in the order they were logged.
assert doc["metrics_file"].startswith("run_record.metrics.") and "metrics" not in doc, list(doc)
lines = [json.loads(l) for l in open("runs/rec/" + doc["metrics_file"])]
assert [f for f in __import__("os").listdir("runs/rec") if f.startswith("run_record.metrics.")] == [doc["metrics_file"]]
want = db.execute("SELECT key, step, tokens, wall_s, value FROM metrics WHERE superseded=0 ORDER BY rowid").fetchall()
assert doc["metric_rows"] == len(lines) == len(want), (doc["metric_rows"], len(lines), len(want))
same = lambda a, b: a == b or (a is None and (b is None or math.isnan(b)))
assert all(all(same(x, y) for x, y in zip(l, w)) for l, w in zip(lines, want)), "rows differ"
assert [c["step"] for c in doc["checkpoints"]] == [3, 6], doc["checkpoints"]
PY
before=$(rows runs/deltadeck.db rec)

# ---- runs import: another database gets the whole run; a second import of the name is refused
expect 0 import.out "$bin" runs import runs/rec --runs-dir elsewhere
has import.out "imported run 'rec' (id 1, finished) from runs/rec/run_record.json: $before metric rows, 2 checkpoints"
[ "$(rows elsewhere/deltadeck.db rec)" = "$before" ] || fail "imported $(rows elsewhere/deltadeck.db rec) rows, not $before"
expect 0 show.out "$bin" runs show rec --runs-dir elsewhere
has show.out "finished"
expect 1 again.out "$bin" runs import runs/rec/run_record.json --runs-dir elsewhere
has again.out "already has a run of that name (id 1)"
# Broken records: not JSON (with the byte), a key missing, columns of different lengths, a folder
# without one; the trainer's record with a metrics file shorter than it says, or a line not a row.
head -c 200 runs/rec/run_record.json > cut.json
expect 1 cut.out "$bin" runs import cut.json --runs-dir elsewhere
has cut.out "cut.json: not valid JSON at byte"
expect 0 export.out "$bin" runs export rec --format json --out export.json --runs-dir runs
mkdir -p shortfile badline
mfile=$(python3 -c "import json; print(json.load(open('runs/rec/run_record.json'))['metrics_file'])")
cp runs/rec/run_record.json shortfile/ && head -n 3 "runs/rec/$mfile" > "shortfile/$mfile"
expect 1 shortfile.out "$bin" runs import shortfile --runs-dir elsewhere
has shortfile.out "shortfile/$mfile holds 3 whole lines; its record (run_record.json) names $before metric rows"
cp runs/rec/run_record.json badline/ && sed '2s/.*/{"loss": 1}/' "runs/rec/$mfile" > "badline/$mfile"
expect 1 badline.out "$bin" runs import badline --runs-dir elsewhere
has badline.out "badline/$mfile: line 2 must be [key, step, tokens, wall_s, value]"
python3 - export.json <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = json.loads(json.dumps(doc)); bad["run"]["name"] = "nocfg"; del bad["config_toml"]; json.dump(bad, open("nocfg.json", "w"))
bad = json.loads(json.dumps(doc)); bad["run"]["name"] = "short"; bad["metrics"]["loss"]["step"].pop(); json.dump(bad, open("short.json", "w"))
live = json.loads(json.dumps(doc)); live["run"]["name"] = "live"; live["run"]["status"] = "running"; json.dump(live, open("live.json", "w"))
PY
expect 1 nocfg.out "$bin" runs import nocfg.json --runs-dir elsewhere
has nocfg.out "nocfg.json: \"config_toml\" is missing"
expect 1 short.out "$bin" runs import short.json --runs-dir elsewhere
has short.out "\"metrics.loss\" has columns of different lengths"
mkdir -p empty-folder
expect 1 nofile.out "$bin" runs import empty-folder --runs-dir elsewhere
has nofile.out "the folder holds no run record"
# A record written while its run was running comes in as interrupted.
expect 0 live.out "$bin" runs import live.json --runs-dir elsewhere
has live.out "imported run 'live' (id 2, interrupted)"
[ "$(sqlite3 elsewhere/deltadeck.db "SELECT count(*) FROM runs")" = 2 ] || fail "a refused import wrote a run"
# Deleting an imported run drops its rows only: the checkpoints are the other database's.
expect 0 delimp.out "$bin" runs delete rec --yes --runs-dir elsewhere
has delimp.out "the run was imported from $work/runs/rec/run_record.json"
[ -d runs/rec/checkpoints/step_00000006 ] && [ -f runs/rec/run_record.json ] || fail "deleting the imported copy removed files"

# ---- a resume whose database is gone takes the run from its record and goes on
rm -f runs/deltadeck.db runs/deltadeck.db-wal runs/deltadeck.db-shm
expect 0 dry.out "$bin" train --no-gui --resume rec --runs-dir runs --dry-run
has dry.out "run 'rec' (from its record $work/runs/rec/run_record.json, which a resume brings into runs/deltadeck.db)"
[ ! -e runs/deltadeck.db ] || fail "the dry run created a database"
expect 0 adopt.out "$bin" train --no-gui --resume rec --runs-dir runs --set train.steps=9
has adopt.out "took run 'rec' from its record $work/runs/rec/run_record.json ($before metric rows, 2 checkpoints) into runs/deltadeck.db"
has adopt.out "resume changed the run's config: train.steps 6 -> 9"
[ -z "$(sqlite3 runs/deltadeck.db "SELECT imported_from FROM runs WHERE name='rec'")" ] || fail "a resumed run stays marked imported"
[ "$(sqlite3 runs/deltadeck.db "SELECT status || ' ' || max(m.step) FROM runs r JOIN metrics m ON m.run_id = r.id WHERE m.key='loss' AND superseded=0")" = "finished 9" ] \
  || fail "the adopted run did not finish at step 9"
[ "$(sqlite3 runs/deltadeck.db "SELECT min(step) FROM metrics WHERE key='loss' AND superseded=0")" = 1 ] \
  || fail "the steps before the resume were not brought in"

# ---- a cluster chain: checkpoints under run.checkpoint_dir, each job a fresh runs folder
expect 0 job1.out "$bin" train --no-gui --config run.toml --runs-dir job1 --set name=chain --set "run.checkpoint_dir=\"$work/ckpt\""
[ -f ckpt/chain/run_record.json ] || fail "no record under run.checkpoint_dir"
expect 1 noset.out "$bin" train --no-gui --resume latest --runs-dir job2
has noset.out "no run database at job2/deltadeck.db; and no run record (run_record.json) of any run is in job2"
expect 0 job2.out "$bin" train --no-gui --resume latest --runs-dir job2 --set "run.checkpoint_dir=\"$work/ckpt\"" \
  --set train.steps=9
has job2.out "took run 'chain' from its record $work/ckpt/chain/run_record.json"
[ "$(sqlite3 job2/deltadeck.db "SELECT max(step) FROM metrics WHERE key='loss' AND superseded=0")" = 9 ] \
  || fail "job 2 did not reach step 9"
python3 -c "import json,sys; d=json.load(open('ckpt/chain/run_record.json')); rows=[json.loads(l) for l in open('ckpt/chain/' + d['metrics_file'])][:d['metric_rows']]; sys.exit(0 if max(r[1] for r in rows if r[0] == 'loss') == 9 else 1)" \
  || fail "the record was not rewritten by job 2"
# Job 3 lands on job 1's node: its database knows the run only to step 6, the record to step 9.
expect 0 job3.out "$bin" train --no-gui --resume chain --runs-dir job1 --set "run.checkpoint_dir=\"$work/ckpt\"" \
  --set train.steps=12
has job3.out "ckpt/chain/run_record.json is further along than job1/deltadeck.db (step 9 against 6): the run is taken from it"
[ "$(sqlite3 job1/deltadeck.db "SELECT count(DISTINCT step) || ' ' || min(step) || ' ' || max(step) FROM metrics WHERE key='loss' AND superseded=0")" = "12 1 12" ] \
  || fail "job 3's database does not hold steps 1 to 12: $(sqlite3 job1/deltadeck.db "SELECT step FROM metrics WHERE key='loss'")"
[ "$(sqlite3 job1/deltadeck.db "SELECT count(*) FROM runs")" = 1 ] || fail "the older copy was not replaced"
# Only what changed is reported changed (the record's config reads back as written): here the
# runs folder, which the config records.
expect 0 job4.out "$bin" train --no-gui --resume chain --runs-dir job4 --set "run.checkpoint_dir=\"$work/ckpt\""
has job4.out "took run 'chain' from its record"
has job4.out "resume changed the run's config: run.runs_dir \"job1\" -> \"job4\" (later resumes keep it)"

# Job 5 lands on a node whose database holds a run of its own, older than the chain: "latest" is
# the chain, whose record under run.checkpoint_dir was written after that run was last active, not
# the database's newest run; with the record older than that run, the database's newest run.
expect 0 old.out "$bin" train --no-gui --config run.toml --runs-dir job5 --set name=old
# ... trained in January, as its database and its record's file say.
sqlite3 job5/deltadeck.db "UPDATE runs SET started_at='2026-01-01T00:00:00Z', heartbeat_at='2026-01-01T00:10:00Z', ended_at='2026-01-01T00:10:00Z' WHERE name='old'"
touch -d '2026-01-01 00:10:00 UTC' job5/old/run_record.json
expect 0 job5.out "$bin" train --no-gui --resume latest --runs-dir job5 --set "run.checkpoint_dir=\"$work/ckpt\"" --dry-run
has job5.out "--resume latest: $work/ckpt/chain/run_record.json (run 'chain', written "
has job5.out "is newer than job5/deltadeck.db's newest run 'old' (last active 2026-01-01T00:10:00Z): run 'chain' is resumed"
has job5.out "dry run of run 'chain' (from its record $work/ckpt/chain/run_record.json"
touch -d '2025-12-31 00:00:00 UTC' ckpt/chain/run_record.json
# (The run's checkpoints are then looked for under the run.checkpoint_dir given, where it has none.)
expect 2 job5b.out "$bin" train --no-gui --resume latest --runs-dir job5 --set "run.checkpoint_dir=\"$work/ckpt\"" --dry-run
has job5b.out "--resume latest: run 'old': $work/ckpt/old: no such checkpoint or run directory"
! grep -q "is newer than" job5b.out || fail "an older record was taken over the database's newest run"
touch ckpt/chain/run_record.json

# ---- delete removes the record and the run folder with it
expect 0 del.out "$bin" runs delete chain --yes --runs-dir job4
[ ! -e ckpt/chain ] || { ls -la ckpt/chain; fail "the run folder under run.checkpoint_dir is still there"; }
# ---- two databases, one run folder: the process training it holds it (its owner file)
expect 0 own1.out "$bin" train --no-gui --config run.toml --runs-dir own1 --set name=shared \
  --set "run.checkpoint_dir=\"$work/ckpt2\""
[ ! -e ckpt2/shared/run_owner.json ] || fail "the owner file outlived the run"
# A job on "another node" (database own2) resumes it and trains on, long enough to be looked at.
"$bin" train --no-gui --resume shared --runs-dir own2 --set "run.checkpoint_dir=\"$work/ckpt2\"" \
  --set train.steps=1000000 > own2.out 2>&1 &
pids+=($!)
owner=$!
wait_for 120 "the resumed run's owner file" test -f ckpt2/shared/run_owner.json
# ... and its record past the first database's step 6 (a checkpoint of its own).
past6() { python3 -c "import json,sys; sys.exit(0 if json.load(open('ckpt2/shared/run_record.json'))['run']['last_step'] > 6 else 1)" 2> /dev/null; }
wait_for 120 "the resumed run's record past step 6" past6
has ckpt2/shared/run_owner.json "\"pid\": $owner"
# The first database's copy is finished: neither its resume nor its delete may touch the folder now.
expect 2 own1b.out "$bin" train --no-gui --resume shared --runs-dir own1 --set "run.checkpoint_dir=\"$work/ckpt2\""
has own1b.out "run 'shared' is being trained by pid $owner on $(hostname), recording it in $work/own2/deltadeck.db"
has own1b.out "nothing was started"
expect 2 own1d.out "$bin" train --no-gui --resume shared --runs-dir own1 --set "run.checkpoint_dir=\"$work/ckpt2\"" --dry-run
has own1d.out "is being trained by pid $owner"
expect 1 own1del.out "$bin" runs delete shared --yes --runs-dir own1
has own1del.out "run 'shared' is being trained by pid $owner"
[ -d ckpt2/shared/checkpoints ] || fail "a refused delete removed the checkpoints"
# Killed outright, it leaves the file behind; its process gone, the folder is free again.
kill -9 "$owner"
wait "$owner" 2> /dev/null || true
[ -f ckpt2/shared/run_owner.json ] || fail "the killed run's owner file is gone"
expect 0 own1c.out "$bin" train --no-gui --resume shared --runs-dir own1 --set "run.checkpoint_dir=\"$work/ckpt2\"" \
  --set train.steps=2000000 --dry-run
has own1c.out "is further along than"
echo "run record e2e: ok"
