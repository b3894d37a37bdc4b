// Tests of RunStore and the schema: creation, migration from version 1, runs, metrics,
// checkpoints, events and interrupted-run detection. File-backed tests use a fresh mkdtemp dir
// each, because WAL mode and the migration path only exist on a real file.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "storage/file_util.h"
#include "storage/run_store.h"
#include "tests/support/error_of.h"

namespace {

using storage::RunStore;
using testing_support::error_of;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/deltadeck-storage-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

storage::NewRun new_run(const std::string& name) {
  storage::NewRun r;
  r.name = name;
  r.model = "gpt/tiny";
  r.config_toml = "[model]\npreset = \"tiny\"\n";
  r.config_json = "{\"model\":{\"preset\":\"tiny\"}}";
  r.params = 1234;
  r.world_size = 2;
  r.revision = "abc123";
  return r;
}

storage::MetricRow row(int64_t run_id, int64_t step, const std::string& key, double value) {
  storage::MetricRow r;
  r.run_id = run_id;
  r.point.step = step;
  r.point.tokens = step * 1024;
  r.point.wall_s = step * 0.5;
  r.point.key = key;
  r.point.value = value;
  return r;
}

void exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
}

TEST(Schema, CreatesInMemory) {
  auto store = RunStore::open(":memory:");
  EXPECT_EQ(store->schema_version(), storage::SCHEMA_VERSION);
  EXPECT_EQ(store->integrity_check(), "ok");
  EXPECT_TRUE(store->list_runs().empty());
}

TEST(Schema, CreatesFileInWalMode) {
  TempDir dir;
  const std::string path = dir.file("sub/dir/deltadeck.db");
  {
    auto store = RunStore::open(path);
    EXPECT_EQ(store->schema_version(), storage::SCHEMA_VERSION);
    EXPECT_EQ(store->integrity_check(), "ok");
    EXPECT_EQ(store->path(), path);
    // Metric rows flushed before a checkpoint must outlive a power loss as the checkpoint does.
    EXPECT_TRUE(store->commits_are_synced());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);

  // Opening again is a no-op migration.
  auto again = RunStore::open(path);
  EXPECT_EQ(again->schema_version(), storage::SCHEMA_VERSION);
}

TEST(Schema, ReadOnlyNeedsAnExistingFile) {
  TempDir dir;
  const std::string path = dir.file("missing.db");
  const std::string err = error_of([&] { RunStore::open(path, /*read_only=*/true); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Schema, RefusesANewerVersion) {
  TempDir dir;
  const std::string path = dir.file("new.db");
  RunStore::open(path);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  exec(db, "PRAGMA user_version = 99");
  sqlite3_close(db);
  const std::string err = error_of([&] { RunStore::open(path); });
  EXPECT_NE(err.find("newer"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
}

TEST(Schema, MigratesFromVersion1) {
  TempDir dir;
  const std::string path = dir.file("v1.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  storage::migrate(db, 1);
  exec(db, "INSERT INTO runs(id, name, status, model, host, params, started_at, ended_at) "
           "VALUES(7, 'old', 'finished', 'gpt/tiny', 'box', 99, '2026-01-02T03:04:05Z', "
           "'2026-01-02T04:00:00Z')");
  exec(db, "INSERT INTO metrics(run_id, step, tokens, wall_s, key, value) VALUES "
           "(7, 1, 100, 0.5, 'loss', 4.5), (7, 2, 200, 1.0, 'loss', 4.0), "
           "(7, 2, 200, 1.0, 'lr', 0.001)");
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 1);
  sqlite3_finalize(st);
  // Version 1 has no checkpoints table: the migration below really adds it.
  EXPECT_NE(sqlite3_exec(db, "SELECT * FROM checkpoints", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  auto store = RunStore::open(path);
  EXPECT_EQ(store->schema_version(), storage::SCHEMA_VERSION);
  EXPECT_EQ(store->integrity_check(), "ok");
  auto r = store->run(7);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->name, "old");
  EXPECT_EQ(r->status, "finished");
  EXPECT_EQ(r->params, 99);
  EXPECT_EQ(r->started_at, "2026-01-02T03:04:05Z");
  EXPECT_EQ(r->world_size, 1);  // the column's default
  EXPECT_EQ(r->pid, 0);         // NULL: version 1 did not record it
  EXPECT_EQ(r->message, "");
  EXPECT_EQ(r->last_step, 2);
  auto loss = store->metrics(7, "loss");
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_DOUBLE_EQ(loss[1].value, 4.0);
  // The new tables work on the migrated file.
  store->add_checkpoint({7, 2, "/ckpt/old-2", 10, "", ""});
  EXPECT_EQ(store->checkpoints(7).size(), 1u);
}

TEST(RunStore, CreateRunPicksUniqueNames) {
  auto store = RunStore::open(":memory:");
  const int64_t a = store->create_run(new_run("demo"));
  const int64_t b = store->create_run(new_run("demo"));
  const int64_t c = store->create_run(new_run("demo"));
  EXPECT_EQ(store->run(a)->name, "demo");
  EXPECT_EQ(store->run(b)->name, "demo-2");
  EXPECT_EQ(store->run(c)->name, "demo-3");

  auto r = *store->run(a);
  EXPECT_EQ(r.status, "running");
  EXPECT_EQ(r.model, "gpt/tiny");
  EXPECT_EQ(r.pid, static_cast<int64_t>(getpid()));
  EXPECT_FALSE(r.host.empty());
  EXPECT_EQ(r.params, 1234);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.revision, "abc123");
  EXPECT_EQ(r.started_at.size(), 20u) << r.started_at;  // 2026-11-23T09:30:00Z
  EXPECT_EQ(r.started_at.back(), 'Z');
  EXPECT_EQ(r.ended_at, "");
  EXPECT_EQ(store->run_config_toml(a), new_run("").config_toml);
  EXPECT_EQ(store->run_config_json(a), new_run("").config_json);

  auto runs = store->list_runs();
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].id, a);
  EXPECT_EQ(runs[2].id, c);
  EXPECT_FALSE(store->run(12345).has_value());
}

// A folder left where a deleted run lived (a delete cut short) is not given to a new run of that
// name: its checkpoints would be pruned and resumed from as the new run's.
TEST(RunStore, CreateRunSkipsNamesWhoseFolderIsLeftOnDisk) {
  TempDir dir;
  storage::files::make_dirs(dir.file("demo/checkpoints/step_00002000"));
  auto store = RunStore::open(dir.file("deltadeck.db"));
  const int64_t a = store->create_run(new_run("demo"));
  EXPECT_EQ(store->run(a)->name, "demo-2");
  const int64_t b = store->create_run(new_run("fresh"));
  EXPECT_EQ(store->run(b)->name, "fresh");
}

TEST(RunStore, FinishAndReopen) {
  auto store = RunStore::open(":memory:");
  const int64_t id = store->create_run(new_run("demo"));
  store->finish_run(id, "failed", "loss is NaN at step 12");
  auto r = *store->run(id);
  EXPECT_EQ(r.status, "failed");
  EXPECT_EQ(r.message, "loss is NaN at step 12");
  EXPECT_FALSE(r.ended_at.empty());

  store->reopen_run(id);
  r = *store->run(id);
  EXPECT_EQ(r.status, "running");
  EXPECT_EQ(r.ended_at, "");
  EXPECT_EQ(r.message, "");
  EXPECT_EQ(r.pid, static_cast<int64_t>(getpid()));

  EXPECT_NE(error_of([&] { store->finish_run(id, "done", ""); }).find("not one of"),
            std::string::npos);
  EXPECT_NE(error_of([&] { store->finish_run(999, "finished", ""); }).find("999"),
            std::string::npos);
  EXPECT_NE(error_of([&] { store->reopen_run(999); }).find("999"), std::string::npos);
}

TEST(RunStore, FindRun) {
  auto store = RunStore::open(":memory:");
  const int64_t demo = store->create_run(new_run("demo"));
  const int64_t demo2 = store->create_run(new_run("demo"));
  const int64_t other = store->create_run(new_run("baseline"));

  EXPECT_EQ(store->find_run(std::to_string(other)).id, other);
  EXPECT_EQ(store->find_run("demo").id, demo);  // exact name wins over being a prefix of demo-2
  EXPECT_EQ(store->find_run("demo-2").id, demo2);
  EXPECT_EQ(store->find_run("base").id, other);

  const std::string ambiguous = error_of([&] { store->find_run("de"); });
  EXPECT_NE(ambiguous.find("run 'de' is ambiguous: demo, demo-2"), std::string::npos) << ambiguous;

  const std::string unknown = error_of([&] { store->find_run("x"); });
  EXPECT_NE(unknown.find("no run named 'x'; runs: demo, demo-2, baseline"), std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find(":memory:"), std::string::npos) << unknown;
  // A number that is no id falls back to names.
  EXPECT_NE(error_of([&] { store->find_run("42"); }).find("no run named '42'"), std::string::npos);
  // A run named like another run's id is not silently the other run (`runs delete 1` must not
  // delete run 1 when the user meant the run named "1").
  const int64_t named_one = store->create_run(new_run(std::to_string(demo)));
  const std::string both = error_of([&] { store->find_run(std::to_string(demo)); });
  EXPECT_NE(both.find("is ambiguous: the id of run 'demo' and the name of run " + std::to_string(named_one)),
            std::string::npos)
      << both;
  EXPECT_EQ(store->find_run(std::to_string(named_one)).id, named_one);
}

TEST(RunStore, FindRunListsAtMostTenNames) {
  auto store = RunStore::open(":memory:");
  for (int i = 0; i < 15; ++i) store->create_run(new_run("r" + std::to_string(i)));
  const std::string unknown = error_of([&] { store->find_run("zzz"); });
  EXPECT_NE(unknown.find("runs: ..., r5, r6"), std::string::npos) << unknown;
  EXPECT_EQ(unknown.find("r4,"), std::string::npos) << unknown;
  const std::string ambiguous = error_of([&] { store->find_run("r"); });
  EXPECT_NE(ambiguous.find("(5 more)"), std::string::npos) << ambiguous;
}

TEST(RunStore, MetricsRoundTrip) {
  auto store = RunStore::open(":memory:");
  const int64_t id = store->create_run(new_run("demo"));
  const int64_t other = store->create_run(new_run("other"));
  // Written out of step order, to check that reads sort.
  store->insert_metrics({row(id, 3, "loss", 3.0), row(id, 1, "loss", 5.0), row(id, 2, "loss", 4.0),
                         row(id, 2, "lr", 1e-3), row(id, 3, "grad_norm", 0.25),
                         row(other, 9, "loss", 1.0)});
  auto loss = store->metrics(id, "loss");
  ASSERT_EQ(loss.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(loss[i].step, i + 1);
    EXPECT_EQ(loss[i].tokens, (i + 1) * 1024);
    EXPECT_DOUBLE_EQ(loss[i].wall_s, (i + 1) * 0.5);
    EXPECT_EQ(loss[i].key, "loss");
    EXPECT_DOUBLE_EQ(loss[i].value, 5.0 - i);
  }
  auto all = store->metrics(id);
  ASSERT_EQ(all.size(), 5u);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LE(all[i - 1].step, all[i].step);
  EXPECT_EQ(store->metric_keys(id), (std::vector<std::string>{"grad_norm", "loss", "lr"}));
  EXPECT_EQ(store->metric_keys(other), std::vector<std::string>{"loss"});
  EXPECT_TRUE(store->metric_keys(12345).empty());
  EXPECT_EQ(store->run(id)->last_step, 3);
  EXPECT_EQ(store->list_runs()[1].last_step, 9);
  EXPECT_TRUE(store->metrics(id, "missing").empty());
}

// SQLite keeps a NaN as NULL: it reads back as NaN (a skipped step's loss), not as 0; infinities
// stay infinities.
TEST(RunStore, NonFiniteMetricValuesReadBackAsTheyWere) {
  auto store = RunStore::open(":memory:");
  const int64_t id = store->create_run(new_run("nan"));
  const double inf = std::numeric_limits<double>::infinity();
  store->insert_metrics({row(id, 1, "loss", 4.0), row(id, 2, "loss", std::nan("")), row(id, 3, "loss", inf),
                         row(id, 4, "loss", -inf)});
  auto loss = store->metrics(id, "loss");
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_EQ(loss[0].value, 4.0);
  EXPECT_TRUE(std::isnan(loss[1].value)) << loss[1].value;
  EXPECT_EQ(loss[2].value, inf);
  EXPECT_EQ(loss[3].value, -inf);
}

TEST(RunStore, InsertMetricsIsAllOrNothing) {
  auto store = RunStore::open(":memory:");
  const int64_t id = store->create_run(new_run("demo"));
  // The last row names a run that does not exist: the foreign key fails the whole batch.
  const std::string err =
      error_of([&] { store->insert_metrics({row(id, 1, "loss", 1.0), row(999, 1, "loss", 1.0)}); });
  EXPECT_NE(err.find("FOREIGN KEY"), std::string::npos) << err;
  EXPECT_TRUE(store->metrics(id).empty());
  // The connection is usable afterwards (the transaction was rolled back).
  store->insert_metrics({row(id, 1, "loss", 1.0)});
  EXPECT_EQ(store->metrics(id).size(), 1u);
}

TEST(RunStore, Checkpoints) {
  auto store = RunStore::open(":memory:");
  const int64_t id = store->create_run(new_run("demo"));
  store->add_checkpoint({id, 200, "/ckpt/200", 2000, "beef", ""});
  store->add_checkpoint({id, 100, "/ckpt/100", 1000, "cafe", "2026-11-23T09:30:00Z"});
  auto cks = store->checkpoints(id);
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_EQ(cks[0].step, 100);
  EXPECT_EQ(cks[0].path, "/ckpt/100");
  EXPECT_EQ(cks[0].bytes, 1000);
  EXPECT_EQ(cks[0].sha256, "cafe");
  EXPECT_EQ(cks[0].created_at, "2026-11-23T09:30:00Z");
  EXPECT_EQ(cks[1].step, 200);
  EXPECT_FALSE(cks[1].created_at.empty());

  // Saving the same step again replaces the row.
  store->add_checkpoint({id, 200, "/ckpt/200b", 2001, "f00d", ""});
  cks = store->checkpoints(id);
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_EQ(cks[1].path, "/ckpt/200b");

  store->remove_checkpoint(id, 100);
  cks = store->checkpoints(id);
  ASSERT_EQ(cks.size(), 1u);
  EXPECT_EQ(cks[0].step, 200);
}

TEST(RunStore, Events) {
  auto store = RunStore::open(":memory:");
  const int64_t id = store->create_run(new_run("demo"));
  store->add_event({id, 0, "info", "started", ""});
  store->add_event({id, 50, "warn", "loss spike", "2026-11-23T09:30:00Z"});
  auto ev = store->events(id);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].text, "started");
  EXPECT_EQ(ev[1].step, 50);
  EXPECT_EQ(ev[1].level, "warn");
  EXPECT_EQ(ev[1].created_at, "2026-11-23T09:30:00Z");
  EXPECT_FALSE(ev[0].created_at.empty());
}

TEST(RunStore, DeletingARunCascades) {
  TempDir dir;
  const std::string path = dir.file("c.db");
  auto store = RunStore::open(path);
  const int64_t id = store->create_run(new_run("demo"));
  store->insert_metrics({row(id, 1, "loss", 1.0)});
  store->add_checkpoint({id, 1, "/c", 1, "", ""});
  store->add_event({id, 1, "info", "x", ""});
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  exec(db, "PRAGMA foreign_keys = ON");
  exec(db, "DELETE FROM runs");
  sqlite3_close(db);
  EXPECT_TRUE(store->metrics(id).empty());
  EXPECT_TRUE(store->checkpoints(id).empty());
  EXPECT_TRUE(store->events(id).empty());
}

// A pid that existed a moment ago and is gone now.
int64_t dead_pid() {
  pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

TEST(RunStore, MarksRunsOfDeadProcessesInterrupted) {
  TempDir dir;
  const std::string path = dir.file("i.db");
  int64_t dead = 0, alive = 0, remote_stale = 0, remote_fresh = 0, finished = 0;
  int64_t other_ns = 0, other_ns_stale = 0, legacy = 0;
  int64_t pid = 0;
  std::string host;
  {
    auto store = RunStore::open(path);
    dead = store->create_run(new_run("dead"));
    alive = store->create_run(new_run("alive"));
    remote_stale = store->create_run(new_run("remote-stale"));
    remote_fresh = store->create_run(new_run("remote-fresh"));
    finished = store->create_run(new_run("finished"));
    other_ns = store->create_run(new_run("other-ns"));
    other_ns_stale = store->create_run(new_run("other-ns-stale"));
    legacy = store->create_run(new_run("legacy"));
    store->finish_run(finished, "finished", "");
    host = store->run(dead)->host;
  }
  pid = dead_pid();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string sql =
      "UPDATE runs SET pid = " + std::to_string(pid) + " WHERE name IN ('dead', 'finished');"
      "UPDATE runs SET host = 'elsewhere', heartbeat_at = '2020-01-01T00:00:00Z' "
      "  WHERE name = 'remote-stale';"
      "UPDATE runs SET host = 'elsewhere', pid = " + std::to_string(pid) +
      " WHERE name = 'remote-fresh';"
      // Another container with this host name: its pid is not this namespace's, dead or alive.
      "UPDATE runs SET pid = " + std::to_string(pid) + ", proc_ns = 'another-boot pid:[4026531836]' "
      "  WHERE name IN ('other-ns', 'other-ns-stale');"
      "UPDATE runs SET heartbeat_at = '2020-01-01T00:00:00Z' WHERE name = 'other-ns-stale';"
      // A row from before schema 5: host and pid alone, as then.
      "UPDATE runs SET pid = " + std::to_string(pid) + ", proc_ns = NULL WHERE name = 'legacy';";
  exec(db, sql.c_str());
  sqlite3_close(db);

  // A read-only open changes nothing.
  EXPECT_EQ(RunStore::open(path, /*read_only=*/true)->run(dead)->status, "running");

  auto store = RunStore::open(path);
  auto r = *store->run(dead);
  EXPECT_EQ(r.status, "interrupted");
  EXPECT_EQ(r.message, "process " + std::to_string(pid) + " on " + host +
                           " ended without closing the run");
  EXPECT_FALSE(r.ended_at.empty());
  EXPECT_EQ(store->run(alive)->status, "running");  // this very process
  EXPECT_EQ(store->run(remote_stale)->status, "interrupted");
  EXPECT_NE(store->run(remote_stale)->message.find("no heartbeat"), std::string::npos);
  EXPECT_EQ(store->run(remote_fresh)->status, "running");  // its pid means nothing here
  EXPECT_EQ(store->run(other_ns)->status, "running");      // nor here, under this host name
  EXPECT_EQ(store->run(other_ns_stale)->status, "interrupted");
  EXPECT_NE(store->run(other_ns_stale)->message.find("no heartbeat"), std::string::npos);
  EXPECT_EQ(store->run(legacy)->status, "interrupted");
  EXPECT_EQ(store->run(alive)->proc_ns, storage::this_process_namespace());
  EXPECT_EQ(store->run(finished)->status, "finished");
  EXPECT_EQ(store->run(finished)->message, "");
}

// A pid is judged only on this host and in this pid namespace: "BOOT_ID pid:[INODE]" from /proc.
TEST(RunStore, ProcessLivenessNeedsThisHostAndNamespace) {
  const std::string ns = storage::this_process_namespace();
  ASSERT_NE(ns.find(" pid:["), std::string::npos) << ns;  // a Linux /proc
  const int64_t me = getpid(), gone = dead_pid();
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  using storage::Liveness;
  EXPECT_EQ(storage::process_liveness(host, me, ns), Liveness::Alive);
  EXPECT_EQ(storage::process_liveness(host, me, ""), Liveness::Alive);  // before schema 5
  EXPECT_EQ(storage::process_liveness(host, gone, ns), Liveness::Dead);
  EXPECT_EQ(storage::process_liveness(host, gone, "another-boot pid:[1]"), Liveness::Unknown);
  EXPECT_EQ(storage::process_liveness(host, me, "another-boot pid:[1]"), Liveness::Unknown);
  EXPECT_EQ(storage::process_liveness("another-host", gone, ns), Liveness::Unknown);
  EXPECT_EQ(storage::process_liveness(host, 0, ns), Liveness::Unknown);
}

// Whether a resume must leave a run alone: alive here, or elsewhere with a recent heartbeat.
TEST(RunStore, StillRunningByPidHereAndByHeartbeatElsewhere) {
  TempDir dir;
  const std::string path = dir.file("alive.db");
  auto store = RunStore::open(path);
  const int64_t id = store->create_run(new_run("r"));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  auto sql = [&](const std::string& s) {
    ASSERT_EQ(sqlite3_exec(db, s.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  };
  EXPECT_NE(storage::still_running(*store->run(id)).find("is still running"), std::string::npos);  // this process
  sql("UPDATE runs SET pid = " + std::to_string(dead_pid()));
  EXPECT_EQ(storage::still_running(*store->run(id)), "");  // its process is gone
  // Another machine: alive while its heartbeat is recent, taken as gone after RUN_QUIET_S.
  sql("UPDATE runs SET host = 'another-host'");
  store->heartbeat(id);
  const std::string busy = storage::still_running(*store->run(id));
  EXPECT_NE(busy.find("may still be running"), std::string::npos) << busy;
  EXPECT_NE(busy.find("another-host"), std::string::npos) << busy;
  sql("UPDATE runs SET heartbeat_at = '2000-01-01T00:00:00Z'");
  EXPECT_EQ(storage::still_running(*store->run(id)), "");
  store->heartbeat(id);
  store->finish_run(id, "stopped", "");
  EXPECT_EQ(storage::still_running(*store->run(id)), "");  // not running
  sqlite3_close(db);
}

// What `deltadeck runs list` and the app's Runs view open: a run whose process died without
// closing it (SIGKILL, OOM) shows as interrupted, with the reason, not as running; a file this
// user cannot write is read as it is (not checked as root, who may write any file).
TEST(RunStore, OpenForDisplayMarksRunsOfDeadProcesses) {
  TempDir dir;
  const std::string path = dir.file("d.db");
  int64_t dead = 0, alive = 0;
  {
    auto store = RunStore::open(path);
    dead = store->create_run(new_run("dead"));
    alive = store->create_run(new_run("alive"));
  }
  const int64_t pid = dead_pid();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  exec(db, ("UPDATE runs SET pid = " + std::to_string(pid) + " WHERE name = 'dead'").c_str());
  sqlite3_close(db);

  if (geteuid() != 0) {
    ASSERT_EQ(chmod(path.c_str(), 0444), 0);
    EXPECT_EQ(RunStore::open_for_display(path)->run(dead)->status, "running");
    ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  }
  auto shown = RunStore::open_for_display(path);
  const auto r = *shown->run(dead);
  EXPECT_EQ(r.status, "interrupted");
  EXPECT_NE(r.message.find("ended without closing the run"), std::string::npos) << r.message;
  EXPECT_EQ(shown->run(alive)->status, "running");  // this very process
  const std::string err = error_of([&] { shown->create_run(new_run("x")); });
  EXPECT_NE(err.find("readonly"), std::string::npos) << err;  // what it returns is read-only
  EXPECT_NE(error_of([&] { shown->mark_dead_runs(); }).find("read-only"), std::string::npos);

  // A reader that stays open (the app's Runs view) sweeps again: a run that dies later is marked
  // by mark_dead_runs on a read-write store, once.
  auto writer = RunStore::open(path);
  EXPECT_EQ(writer->mark_dead_runs(), 0);
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  exec(db, ("UPDATE runs SET pid = " + std::to_string(dead_pid()) + " WHERE name = 'alive'").c_str());
  sqlite3_close(db);
  EXPECT_EQ(shown->run(alive)->status, "running");
  EXPECT_EQ(writer->mark_dead_runs(), 1);
  EXPECT_EQ(shown->run(alive)->status, "interrupted");
  EXPECT_EQ(writer->mark_dead_runs(), 0);
}

TEST(RunStore, ReadOnlyRefusesWrites) {
  TempDir dir;
  const std::string path = dir.file("ro.db");
  RunStore::open(path)->create_run(new_run("demo"));
  auto ro = RunStore::open(path, /*read_only=*/true);
  EXPECT_EQ(ro->find_run("demo").name, "demo");
  const std::string err = error_of([&] { ro->create_run(new_run("x")); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("readonly"), std::string::npos) << err;
}

}  // namespace
