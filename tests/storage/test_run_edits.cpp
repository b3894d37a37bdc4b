// Tests of the user's edits to recorded runs (schema 3): migration from version 2, tags, notes,
// filters, rename (the run folder and checkpoint paths follow) and delete (rows and files).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "storage/file_util.h"
#include "storage/run_store.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

namespace {

using storage::RunStore;
using testing_support::TempDir;
using testing_support::error_of;

storage::NewRun new_run(const std::string& name) {
  storage::NewRun r;
  r.name = name;
  r.model = "gpt/tiny";
  r.config_toml = "name = \"" + name + "\"\n";
  r.config_json = "{}";
  r.params = 10;
  return r;
}

// A checkpoint folder as the trainer leaves it, recorded in the store.
std::string add_checkpoint_dir(RunStore& store, int64_t id, const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  const std::string dir = run_dir + "/checkpoints/" + name;
  storage::files::make_dirs(dir);
  std::ofstream(dir + "/model.safetensors") << "weights";
  store.add_checkpoint({id, step, dir, 7, "", ""});
  return dir;
}

TEST(RunEdits, MigratesFromVersion2KeepingRuns) {
  TempDir dir;
  const std::string path = dir.file("v2.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  storage::migrate(db, 2);
  ASSERT_EQ(sqlite3_exec(db,
                         "INSERT INTO runs(id, name, status, started_at) VALUES(3, 'old', 'finished', "
                         "'2026-01-01T00:00:00Z')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  // Version 2 has no tags table: the migration below really adds it.
  EXPECT_NE(sqlite3_exec(db, "SELECT * FROM tags", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  auto store = RunStore::open(path);
  EXPECT_EQ(store->schema_version(), storage::SCHEMA_VERSION);
  EXPECT_EQ(store->integrity_check(), "ok");
  auto r = store->find_run("old");
  EXPECT_EQ(r.note, "");
  EXPECT_TRUE(r.tags.empty());
  EXPECT_TRUE(store->add_tag(3, "baseline"));
  store->set_note(3, "kept from v2");
  EXPECT_EQ(store->run(3)->note, "kept from v2");
}

TEST(RunEdits, TagsNotesAndFilters) {
  auto store = RunStore::open(":memory:");
  const int64_t a = store->create_run(new_run("a"));
  const int64_t b = store->create_run(new_run("b"));
  const int64_t c = store->create_run(new_run("c"));
  store->finish_run(a, "finished", "");
  store->finish_run(b, "failed", "NaN");

  EXPECT_TRUE(store->add_tag(a, "sweep"));
  EXPECT_FALSE(store->add_tag(a, "sweep"));  // already there
  EXPECT_TRUE(store->add_tag(a, "best"));
  EXPECT_TRUE(store->add_tag(b, "sweep"));
  EXPECT_EQ(store->tags(a), (std::vector<std::string>{"best", "sweep"}));
  EXPECT_EQ(store->run(a)->tags, (std::vector<std::string>{"best", "sweep"}));
  EXPECT_TRUE(store->remove_tag(a, "best"));
  EXPECT_FALSE(store->remove_tag(a, "best"));
  EXPECT_NE(error_of([&] { store->add_tag(a, "two words"); }).find("whitespace"), std::string::npos);
  EXPECT_NE(error_of([&] { store->add_tag(a, ""); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] { store->add_tag(999, "x"); }).find("no run with id 999"), std::string::npos);

  store->set_note(c, "lr 3e-3, warmup 100");
  EXPECT_EQ(store->run(c)->note, "lr 3e-3, warmup 100");
  store->set_note(c, "");
  EXPECT_EQ(store->run(c)->note, "");

  auto ids = [](const std::vector<storage::RunSummary>& runs) {
    std::vector<int64_t> out;
    for (const auto& r : runs) out.push_back(r.id);
    return out;
  };
  EXPECT_EQ(ids(store->list_runs()), (std::vector<int64_t>{a, b, c}));
  EXPECT_EQ(ids(store->list_runs({"finished", ""})), std::vector<int64_t>{a});
  EXPECT_EQ(ids(store->list_runs({"", "sweep"})), (std::vector<int64_t>{a, b}));
  EXPECT_EQ(ids(store->list_runs({"failed", "sweep"})), std::vector<int64_t>{b});
  EXPECT_TRUE(store->list_runs({"", "nosuchtag"}).empty());
  EXPECT_NE(error_of([&] { store->list_runs({"done", ""}); }).find("not one of running, finished"),
            std::string::npos);
}

TEST(RunEdits, RenameMovesTheFolderAndCheckpointPaths) {
  TempDir dir;
  auto store = RunStore::open(dir.file("runs/deltadeck.db"));
  const int64_t id = store->create_run(new_run("demo"));
  const int64_t other = store->create_run(new_run("other"));
  const std::string ck = add_checkpoint_dir(*store, id, dir.file("runs/demo"), 20);
  std::ofstream(dir.file("runs/demo.node1.log")) << "node 1\n";

  EXPECT_NE(error_of([&] { store->rename_run(id, "better"); }).find("is running"), std::string::npos);
  store->finish_run(id, "finished", "");
  store->finish_run(other, "finished", "");
  EXPECT_NE(error_of([&] { store->rename_run(id, "other"); }).find("taken by run " + std::to_string(other)),
            std::string::npos);
  EXPECT_NE(error_of([&] { store->rename_run(id, "a/b"); }).find("must not contain '/'"), std::string::npos);
  EXPECT_NE(error_of([&] { store->rename_run(id, ".."); }).find("'..'"), std::string::npos);
  EXPECT_NE(error_of([&] { store->rename_run(id, ""); }).find("empty"), std::string::npos);
  EXPECT_TRUE(storage::files::is_dir(ck));  // nothing moved by the refusals

  store->rename_run(id, "better");
  EXPECT_EQ(store->run(id)->name, "better");
  EXPECT_EQ(store->find_run("better").id, id);
  EXPECT_FALSE(storage::files::exists(dir.file("runs/demo")));
  const std::string moved = dir.file("runs/better/checkpoints/step_00000020");
  EXPECT_TRUE(storage::files::exists(moved + "/model.safetensors"));
  ASSERT_EQ(store->checkpoints(id).size(), 1u);
  EXPECT_EQ(store->checkpoints(id)[0].path, moved);
  EXPECT_TRUE(storage::files::exists(dir.file("runs/better.node1.log")));

  // A folder already holding the new name is not overwritten, and the rows stay as they were.
  storage::files::make_dirs(dir.file("runs/taken"));
  EXPECT_NE(error_of([&] { store->rename_run(id, "taken"); }).find("already exists"), std::string::npos);
  EXPECT_EQ(store->run(id)->name, "better");
  EXPECT_EQ(store->checkpoints(id)[0].path, moved);
}

// A rename cut short after its folder moved and before its row committed (a crash) leaves a
// journal; the next writable open moves the folder back to where the row says the run is. A
// journal left after a commit that did happen changes nothing. A successful rename leaves none.
TEST(RunEdits, ARenameCutShortIsUndoneAtTheNextOpen) {
  TempDir dir;
  const std::string db = dir.file("runs/deltadeck.db");
  int64_t id = 0;
  std::string ck;
  {
    auto store = RunStore::open(db);
    id = store->create_run(new_run("demo"));
    ck = add_checkpoint_dir(*store, id, dir.file("runs/demo"), 20);
    store->finish_run(id, "finished", "");
  }
  const std::string journal = dir.file("runs/.rename-" + std::to_string(id));
  // The state a crash between the move and the commit leaves: journal written, folder moved.
  std::ofstream(journal) << dir.file("runs/demo") << "\n" << dir.file("runs/better") << "\n";
  ASSERT_EQ(std::rename(dir.file("runs/demo").c_str(), dir.file("runs/better").c_str()), 0);
  {
    auto store = RunStore::open(db);
    EXPECT_EQ(store->run(id)->name, "demo");
    EXPECT_TRUE(storage::files::exists(ck + "/model.safetensors"));  // back where the row says
    EXPECT_FALSE(storage::files::exists(dir.file("runs/better")));
    EXPECT_FALSE(storage::files::exists(journal));

    store->rename_run(id, "better");
    EXPECT_TRUE(storage::files::is_dir(dir.file("runs/better/checkpoints")));
    EXPECT_FALSE(storage::files::exists(journal));  // removed after the commit
  }
  // A crash after the commit, before the journal went: the folder is where the row says already.
  std::ofstream(journal) << dir.file("runs/demo") << "\n" << dir.file("runs/better") << "\n";
  auto store = RunStore::open(db);
  EXPECT_EQ(store->run(id)->name, "better");
  EXPECT_TRUE(storage::files::is_dir(dir.file("runs/better/checkpoints")));
  EXPECT_FALSE(storage::files::exists(dir.file("runs/demo")));
  EXPECT_FALSE(storage::files::exists(journal));
}

TEST(RunEdits, DeleteRemovesRowsAndCheckpointFiles) {
  TempDir dir;
  auto store = RunStore::open(dir.file("runs/deltadeck.db"));
  const int64_t id = store->create_run(new_run("gone"));
  const int64_t keep = store->create_run(new_run("kept"));
  const std::string ck1 = add_checkpoint_dir(*store, id, dir.file("runs/gone"), 10);
  const std::string ck2 = add_checkpoint_dir(*store, id, dir.file("runs/gone"), 20);
  storage::files::make_dirs(dir.file("runs/gone/checkpoints/step_00000030.tmp"));  // a crashed save
  const std::string kept_ck = add_checkpoint_dir(*store, keep, dir.file("runs/kept"), 10);
  store->insert_metrics({{id, {1, 10, 0.1, "loss", 2.0}}, {keep, {1, 10, 0.1, "loss", 3.0}}});
  store->add_event({id, 1, "info", "x", ""});
  store->add_tag(id, "t");

  EXPECT_NE(error_of([&] { store->delete_run(id); }).find("is running"), std::string::npos);
  store->finish_run(id, "stopped", "");
  const storage::DeletedRun d = store->delete_run(id);
  EXPECT_EQ(d.name, "gone");
  EXPECT_TRUE(d.kept.empty()) << d.kept[0];
  EXPECT_FALSE(storage::files::exists(ck1));
  EXPECT_FALSE(storage::files::exists(ck2));
  EXPECT_FALSE(storage::files::exists(dir.file("runs/gone")));
  EXPECT_FALSE(store->run(id).has_value());
  EXPECT_TRUE(store->metrics(id).empty());
  EXPECT_TRUE(store->events(id).empty());
  EXPECT_TRUE(store->checkpoints(id).empty());
  EXPECT_TRUE(store->tags(id).empty());
  // The other run is untouched.
  EXPECT_TRUE(storage::files::exists(kept_ck + "/model.safetensors"));
  EXPECT_EQ(store->metrics(keep).size(), 1u);
  EXPECT_NE(error_of([&] { store->delete_run(id); }).find("no run with id"), std::string::npos);
}

TEST(RunEdits, DeleteLeavesForeignFilesInTheRunFolder) {
  TempDir dir;
  auto store = RunStore::open(dir.file("runs/deltadeck.db"));
  const int64_t id = store->create_run(new_run("mine"));
  add_checkpoint_dir(*store, id, dir.file("runs/mine"), 5);
  std::ofstream(dir.file("runs/mine/notes.txt")) << "the user's own file";
  store->finish_run(id, "finished", "");
  const storage::DeletedRun d = store->delete_run(id);
  ASSERT_EQ(d.kept.size(), 1u);
  EXPECT_NE(d.kept[0].find("holds other files"), std::string::npos) << d.kept[0];
  EXPECT_TRUE(storage::files::exists(dir.file("runs/mine/notes.txt")));
  EXPECT_FALSE(storage::files::exists(dir.file("runs/mine/checkpoints")));
}

// A run whose folder lies under run.checkpoint_dir: a folder of its name there takes the name, a
// rename is refused (its checkpoints would stay under the old name), and delete removes that folder
// (named by the run's recorded config) as well as the one beside the database.
TEST(RunEdits, RunsWithACheckpointDirKeepTheirNameAndDeleteTheirFolderThere) {
  TempDir dir;
  auto store = RunStore::open(dir.file("runs/deltadeck.db"));
  const std::string shared = dir.file("shared");
  storage::files::make_dirs(shared + "/busy");  // another database's run, under the same folder
  storage::NewRun r = new_run("busy");
  r.checkpoint_dir = shared;
  r.config_json = "{\"run\": {\"checkpoint_dir\": \"" + shared + "\"}}";
  const int64_t id = store->create_run(r);
  EXPECT_EQ(store->run(id)->name, "busy-2");
  const std::string ck = add_checkpoint_dir(*store, id, shared + "/busy-2", 10);
  storage::files::make_dirs(shared + "/busy-2/checkpoints/step_00000020.tmp");  // a crashed save
  store->finish_run(id, "finished", "");

  const std::string refused = error_of([&] { store->rename_run(id, "other"); });
  EXPECT_NE(refused.find("run.checkpoint_dir"), std::string::npos) << refused;
  EXPECT_EQ(store->run(id)->name, "busy-2");
  EXPECT_EQ(store->checkpoints(id)[0].path, ck);
  EXPECT_TRUE(storage::files::exists(ck + "/model.safetensors"));

  const storage::DeletedRun d = store->delete_run(id);
  EXPECT_TRUE(d.kept.empty()) << d.kept[0];
  EXPECT_FALSE(storage::files::exists(shared + "/busy-2"));
  EXPECT_TRUE(storage::files::is_dir(shared + "/busy"));  // not this run's

  // Beside the database, a run keeps its rename (the recorded folder is its own).
  const int64_t local = store->create_run(new_run("local"));
  add_checkpoint_dir(*store, local, dir.file("runs/local"), 5);
  store->finish_run(local, "finished", "");
  store->rename_run(local, "renamed");
  EXPECT_TRUE(storage::files::is_dir(dir.file("runs/renamed/checkpoints/step_00000005")));
}

}  // namespace

// A run brought from another database (import_run) keeps everything it had: its row (status,
// times, message, note, tags), config, metrics (a NaN too), checkpoints and events, in one
// transaction. A taken name, a 'running' status or a bad tag is refused and writes nothing.
TEST(RunEdits, ImportRunKeepsEverythingOrWritesNothing) {
  auto store = RunStore::open(":memory:");
  storage::ImportedRun in;
  in.record.name = "far";
  in.record.status = "preempted";
  in.record.message = "SIGTERM from the scheduler";
  in.record.model = "hybrid/base";
  in.record.host = "node17";
  in.record.params = 1234;
  in.record.world_size = 16;
  in.record.revision = "abc123";
  in.record.started_at = "2026-11-30T10:00:00Z";
  in.record.heartbeat_at = "2026-11-30T12:00:00Z";
  in.record.ended_at = "2026-11-30T12:00:05Z";
  in.record.note = "first job of the chain";
  in.record.tags = {"cluster", "sweep"};
  in.config_toml = "name = \"far\"\n";
  in.config_json = "{\"name\":\"far\"}";
  for (int64_t s = 1; s <= 5; ++s) in.metrics.push_back({s, 100 * s, 0.5 * s, "loss", 4.0 - 0.1 * s});
  in.metrics.push_back({6, 600, 3.0, "loss", std::nan("")});
  in.checkpoints.push_back({0, 3, "/shared/ckpt/far/checkpoints/step_00000003", 99, "ff", "2026-11-30T11:00:00Z"});
  in.events.push_back({0, 3, "info", "checkpoint saved", "2026-11-30T11:00:00Z"});
  const int64_t id = store->import_run(in);

  const auto r = store->run(id);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->name, "far");
  EXPECT_EQ(r->status, "preempted");
  EXPECT_EQ(r->message, "SIGTERM from the scheduler");
  EXPECT_EQ(r->model, "hybrid/base");
  EXPECT_EQ(r->host, "node17");
  EXPECT_EQ(r->params, 1234);
  EXPECT_EQ(r->world_size, 16);
  EXPECT_EQ(r->revision, "abc123");
  EXPECT_EQ(r->started_at, "2026-11-30T10:00:00Z");
  EXPECT_EQ(r->ended_at, "2026-11-30T12:00:05Z");
  EXPECT_EQ(r->note, "first job of the chain");
  EXPECT_EQ(r->tags, (std::vector<std::string>{"cluster", "sweep"}));
  EXPECT_EQ(r->last_step, 6);
  EXPECT_EQ(store->run_config_toml(id), in.config_toml);
  EXPECT_EQ(store->run_config_json(id), in.config_json);
  const auto loss = store->metrics(id, "loss");
  ASSERT_EQ(loss.size(), 6u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(loss[i].step, in.metrics[i].step);
    EXPECT_EQ(loss[i].tokens, in.metrics[i].tokens);
    EXPECT_EQ(loss[i].wall_s, in.metrics[i].wall_s);
    EXPECT_EQ(loss[i].value, in.metrics[i].value);
  }
  EXPECT_TRUE(std::isnan(loss[5].value));
  const auto cks = store->checkpoints(id);
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].path, in.checkpoints[0].path);
  EXPECT_EQ(cks[0].sha256, "ff");
  ASSERT_EQ(store->events(id).size(), 1u);
  EXPECT_EQ(store->events(id)[0].text, "checkpoint saved");

  // Refusals name what is wrong and leave the database as it was.
  EXPECT_NE(error_of([&] { store->import_run(in); }).find("already has a run of that name (id " + std::to_string(id)),
            std::string::npos);
  auto running = in;
  running.record.name = "live";
  running.record.status = "running";
  EXPECT_NE(error_of([&] { store->import_run(running); }).find("status 'running'"), std::string::npos);
  auto bad_tag = in;
  bad_tag.record.name = "tagged";
  bad_tag.record.tags = {"two words"};
  EXPECT_NE(error_of([&] { store->import_run(bad_tag); }).find("tag 'two words'"), std::string::npos);
  auto bad_name = in;
  bad_name.record.name = "a/b";
  EXPECT_FALSE(error_of([&] { store->import_run(bad_name); }).empty());
  EXPECT_EQ(store->list_runs().size(), 1u);
  EXPECT_EQ(store->metrics(id).size(), 6u);
}
