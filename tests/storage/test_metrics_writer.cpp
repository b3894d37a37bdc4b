// Tests of MetricsWriter: rows from several threads land exactly once, flush() means committed,
// a bad batch is reported and does not stop the thread, rows wait out another process's write
// lock, and a read-only reader on the same file keeps reading while the writer commits (the reason
// for WAL mode).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "storage/metrics_writer.h"
#include "storage/run_store.h"

namespace {

using storage::MetricRow;
using storage::MetricsWriter;
using storage::RunStore;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/deltadeck-writer-XXXXXX";
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

MetricRow row(int64_t run_id, int64_t step, const std::string& key, double value) {
  MetricRow r;
  r.run_id = run_id;
  r.point.step = step;
  r.point.key = key;
  r.point.value = value;
  return r;
}

int64_t make_run(const std::string& path) {
  storage::NewRun r;
  r.name = "writer";
  return RunStore::open(path)->create_run(r);
}

TEST(MetricsWriter, TwoThreadsEveryRowExactlyOnce) {
  TempDir dir;
  const std::string path = dir.file("w.db");
  const int64_t id = make_run(path);
  constexpr int ROWS_PER_THREAD = 25000;
  {
    MetricsWriter writer(path);
    // One thread pushes row by row, the other in small vectors: both entry points.
    std::thread a([&] {
      for (int i = 0; i < ROWS_PER_THREAD; ++i) writer.push(row(id, i, "a", i));
    });
    std::thread b([&] {
      std::vector<MetricRow> chunk;
      for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        chunk.push_back(row(id, i, "b", -i));
        if (chunk.size() == 37 || i == ROWS_PER_THREAD - 1) {
          writer.push(chunk);
          chunk.clear();
        }
      }
    });
    a.join();
    b.join();
    writer.flush();
    EXPECT_EQ(writer.rows_written(), 2 * ROWS_PER_THREAD);
    EXPECT_EQ(writer.last_error(), "");

    // flush() returned, so another connection sees every row now, not eventually.
    auto store = RunStore::open(path, /*read_only=*/true);
    auto all = store->metrics(id);
    ASSERT_EQ(all.size(), 2u * ROWS_PER_THREAD);
    std::set<std::pair<std::string, int64_t>> seen;
    for (const auto& p : all) {
      EXPECT_DOUBLE_EQ(p.value, p.key == "a" ? p.step : -p.step);
      seen.insert({p.key, p.step});
    }
    EXPECT_EQ(seen.size(), 2u * ROWS_PER_THREAD);
    EXPECT_EQ(store->run(id)->last_step, ROWS_PER_THREAD - 1);
  }
}

TEST(MetricsWriter, DestructorFlushes) {
  TempDir dir;
  const std::string path = dir.file("d.db");
  const int64_t id = make_run(path);
  {
    MetricsWriter writer(path);
    for (int i = 0; i < 1000; ++i) writer.push(row(id, i, "loss", 1.0));
  }
  EXPECT_EQ(RunStore::open(path)->metrics(id, "loss").size(), 1000u);
}

// With no rows coming (a paused run, a long evaluation), the writer still stamps the run's
// heartbeat, which is how other machines tell the run is alive.
TEST(MetricsWriter, KeepAliveStampsTheHeartbeatWithoutRows) {
  TempDir dir;
  const std::string path = dir.file("k.db");
  const int64_t id = make_run(path);
  auto store = RunStore::open(path);
  auto heartbeat = [&] { return store->run(id)->heartbeat_at; };
  const std::string old = "2000-01-01T00:00:00Z";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  auto set_old = [&] {
    ASSERT_EQ(sqlite3_exec(db, ("UPDATE runs SET heartbeat_at = '" + old + "'").c_str(), nullptr, nullptr, nullptr),
              SQLITE_OK);
  };
  set_old();
  {
    MetricsWriter writer(path);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(heartbeat(), old);  // not kept alive: nothing written
    writer.keep_alive(id, std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    EXPECT_GT(heartbeat(), old);
    set_old();
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    EXPECT_GT(heartbeat(), old);  // and again, each beat
  }
  // An ended run's heartbeat is left as it was.
  store->finish_run(id, "finished", "");
  set_old();
  {
    MetricsWriter writer(path);
    writer.keep_alive(id, std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_EQ(heartbeat(), old);
  sqlite3_close(db);
}

TEST(MetricsWriter, FlushWithNothingPendingReturns) {
  TempDir dir;
  MetricsWriter writer(dir.file("e.db"));
  writer.flush();
  EXPECT_EQ(writer.rows_written(), 0);
}

TEST(MetricsWriter, BadBatchIsReportedAndWritingGoesOn) {
  TempDir dir;
  const std::string path = dir.file("bad.db");
  const int64_t id = make_run(path);
  MetricsWriter writer(path);
  // No run 999: the foreign key fails this batch, its retry too, and its rows are dropped.
  writer.push(std::vector<MetricRow>{row(999, 1, "loss", 1.0), row(999, 2, "loss", 1.0)});
  writer.flush();
  const std::string err = writer.last_error();
  EXPECT_NE(err.find("dropped 2 metric rows"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_EQ(writer.rows_written(), 0);

  writer.push(row(id, 1, "loss", 1.0));
  writer.flush();
  EXPECT_EQ(writer.rows_written(), 1);
  EXPECT_EQ(RunStore::open(path, true)->metrics(id).size(), 1u);
}

// Another process holding the write lock past two busy timeouts (a `runs delete` of a long run
// removes its rows in one transaction) must not cost metric rows: the batch waits, and flush() --
// which a checkpoint waits on before it commits -- returns only once the rows are written.
TEST(MetricsWriter, RowsWaitOutAWriteLockHeldPastTheBusyTimeout) {
  TempDir dir;
  const std::string path = dir.file("locked.db");
  const int64_t id = make_run(path);
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  MetricsWriter writer(path);
  writer.push(std::vector<MetricRow>{row(id, 1, "loss", 3.0), row(id, 2, "loss", 2.0), row(id, 3, "loss", 1.0)});
  std::thread holder([other] {
    std::this_thread::sleep_for(std::chrono::seconds(11));  // the writer's busy timeout is 5 s a try
    sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr);
  });
  writer.flush();
  EXPECT_EQ(writer.rows_written(), 3);
  EXPECT_EQ(writer.last_error(), "");
  holder.join();
  sqlite3_close(other);
  EXPECT_EQ(RunStore::open(path, true)->metrics(id).size(), 3u);
}

TEST(MetricsWriter, ReaderReadsWhileWriterWrites) {
  TempDir dir;
  const std::string path = dir.file("rw.db");
  const int64_t id = make_run(path);
  MetricsWriter writer(path);
  auto reader = RunStore::open(path, /*read_only=*/true);

  std::atomic<bool> done{false};
  std::thread producer([&] {
    for (int i = 0; i < 20000; ++i) {
      writer.push(row(id, i, "loss", 1.0 / (i + 1)));
      if (i % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    done = true;
  });
  // Every read succeeds (no SQLITE_BUSY) and sees a prefix that only grows.
  size_t last = 0;
  int reads = 0;
  while (!done) {
    auto pts = reader->metrics(id, "loss");
    EXPECT_GE(pts.size(), last);
    for (size_t i = 0; i < pts.size(); ++i) {
      if (pts[i].step != static_cast<int64_t>(i)) {
        ADD_FAILURE() << "gap at " << i;
        break;
      }
    }
    last = pts.size();
    ++reads;
  }
  producer.join();
  writer.flush();
  EXPECT_GT(reads, 1);
  EXPECT_EQ(reader->metrics(id, "loss").size(), 20000u);
  EXPECT_EQ(writer.last_error(), "");
}

}  // namespace
