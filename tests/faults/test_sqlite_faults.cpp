// The run database under load and crashes (docs/reliability.md, guarantees 4, 5 and 8):
//   KillNine*         a child process streams metrics, one committed batch per step, and is killed
//                     with SIGKILL at 100 random points: the database passes integrity_check and
//                     holds exactly the committed batches, whole.
//   PollingReader*    a GUI-like reader polls every 16 ms while the writer commits every step and a
//                     second connection writes events: no reader or writer ever sees SQLITE_BUSY or
//                     any error, the WAL stays bounded (checkpoints are not starved), and there is
//                     at most one commit per step. DD_FAULTS_SQLITE_SECONDS sets the duration
//                     (default 20; the long form in docs/reliability.md is 600).
//   OneCommitPerStep  slow steps with rows arriving twice per step still commit once per step.
//   DiskFull*         SQLITE_FULL at random points of the database's writes (a VFS that fills up):
//                     the error is reported, the database stays intact, the failed batch is absent
//                     or whole, and writing works again once space is back.
//   SignalsDuring*    signals landing on the writer thread in the middle of commits (handlers with
//                     SA_RESTART, as app/signals.cpp installs them) fail nothing.
//   NetworkFs*        network file systems are recognised and named.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "storage/file_util.h"
#include "storage/metrics_writer.h"
#include "storage/run_queries.h"
#include "storage/run_store.h"
#include "tests/faults/sqlite_full_vfs.h"
#include "tests/support/temp_dir.h"

namespace {

using storage::MetricRow;
using storage::MetricsWriter;
using storage::RunStore;
using testing_support::TempDir;
using Clock = std::chrono::steady_clock;

MetricRow row(int64_t run_id, int64_t step, const std::string& key, double value) {
  MetricRow r;
  r.run_id = run_id;
  r.point.step = step;
  r.point.tokens = step * 100;
  r.point.key = key;
  r.point.value = value;
  return r;
}

// The rows a trainer would log at `step`: `keys` metrics with values that encode (step, key).
std::vector<MetricRow> step_rows(int64_t run_id, int64_t step, int keys) {
  std::vector<MetricRow> rows;
  for (int k = 0; k < keys; ++k) rows.push_back(row(run_id, step, "m" + std::to_string(k), step * 1000.0 + k));
  return rows;
}

int64_t new_run(const std::string& path, const std::string& name) {
  storage::NewRun r;
  r.name = name;
  return RunStore::open(path)->create_run(r);
}

// Steps 1..n each have exactly `keys` rows with the values step_rows wrote; returns n.
int64_t whole_batches(RunStore& store, int64_t run_id, int keys) {
  std::map<int64_t, std::vector<storage::MetricPoint>> by_step;
  for (const auto& p : store.metrics(run_id)) by_step[p.step].push_back(p);
  int64_t n = 0;
  for (const auto& [step, pts] : by_step) {
    EXPECT_EQ(step, n + 1) << "a step is missing before step " << step;
    EXPECT_EQ(pts.size(), static_cast<size_t>(keys)) << "step " << step << " is not a whole batch";
    for (const auto& p : pts) EXPECT_EQ(p.value, step * 1000.0 + std::stoi(p.key.substr(1))) << p.key;
    n = step;
  }
  return n;
}

TEST(SqliteFaults, KillNineAtHundredRandomPointsWhileMetricsStream) {
  TempDir dir;
  const std::string path = dir.path() + "/runs.db";
  constexpr int KEYS = 9;
  std::mt19937 rng(2026);
  int64_t batches = 0;
  for (int i = 0; i < 100; ++i) {
    SCOPED_TRACE("kill " + std::to_string(i));
    const int64_t run_id = new_run(path, "kill");
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      try {
        MetricsWriter w(path);
        for (int64_t step = 1;; ++step) {
          w.push(step_rows(run_id, step, KEYS));
          w.flush();  // committed: only now is the step announced
          if (::write(fds[1], &step, sizeof step) != sizeof step) ::_exit(4);
        }
      } catch (...) {
        ::_exit(3);
      }
    }
    ::close(fds[1]);
    int64_t announced = 0, step = 0;
    ASSERT_EQ(::read(fds[0], &step, sizeof step), static_cast<ssize_t>(sizeof step)) << "the writer never committed";
    announced = step;
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer ended on its own: " << status;
    while (::read(fds[0], &step, sizeof step) == static_cast<ssize_t>(sizeof step)) announced = step;
    ::close(fds[0]);
    auto store = RunStore::open(path);
    ASSERT_EQ(store->integrity_check(), "ok");
    const int64_t n = whole_batches(*store, run_id, KEYS);
    // Every announced batch is there; at most one more committed just before the kill.
    EXPECT_GE(n, announced);
    EXPECT_LE(n, announced + 1);
    batches += n;
  }
  std::printf("100 kills: %lld committed batches checked\n", static_cast<long long>(batches));
}

int64_t file_size_or_zero(const std::string& p) { return std::max<int64_t>(0, storage::files::file_size(p)); }

TEST(SqliteFaults, PollingReaderNeverBusyWalBoundedOneCommitPerStep) {
  const char* env = std::getenv("DD_FAULTS_SQLITE_SECONDS");
  const double seconds = env ? std::atof(env) : 20.0;
  TempDir dir;
  const std::string path = dir.path() + "/runs.db";
  const int64_t run_id = new_run(path, "load");
  constexpr int KEYS = 40;  // a wide row: ~1 MB/s of WAL, so a starved checkpoint shows within seconds
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reader_errors{0}, event_errors{0}, polls{0}, rows_seen{0}, max_wal{0};
  std::string first_reader_error, first_event_error;
  std::thread reader([&] {
    auto db = storage::open_read_connection(path);
    int64_t version = -1, last_rowid = 0;
    while (!stop) {
      try {
        const int64_t v = storage::data_version(db.get());
        if (v != version) {
          version = v;
          for (const auto& r : storage::metrics_after(db.get(), run_id, last_rowid, 1000000)) {
            last_rowid = r.rowid;
            ++rows_seen;
          }
          storage::run_figures(db.get(), run_id);
        }
      } catch (const std::exception& e) {
        if (reader_errors++ == 0) first_reader_error = e.what();
      }
      max_wal = std::max<int64_t>(max_wal, file_size_or_zero(path + "-wal"));
      ++polls;
      std::this_thread::sleep_for(std::chrono::milliseconds(16));
    }
  });
  // A second writing connection, as the run host's store writes events and checkpoints.
  std::thread events([&] {
    auto store = RunStore::open(path);
    for (int64_t i = 0; !stop; ++i) {
      try {
        store->add_event({run_id, i, "info", "event " + std::to_string(i), ""});
      } catch (const std::exception& e) {
        if (event_errors++ == 0) first_event_error = e.what();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  });
  int64_t steps = 0;
  {
    MetricsWriter w(path);
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      ++steps;
      w.push(step_rows(run_id, steps, KEYS));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    w.flush();
    EXPECT_EQ(w.last_error(), "");
    EXPECT_LE(w.commits(), steps) << "more commits than training steps";
    std::printf("%.0f s: %lld steps, %lld commits, %lld reader polls, %lld rows seen live, largest WAL %.2f MiB\n",
                seconds, static_cast<long long>(steps), static_cast<long long>(w.commits()),
                static_cast<long long>(polls.load()), static_cast<long long>(rows_seen.load()),
                static_cast<double>(max_wal.load()) / (1 << 20));
  }
  stop = true;
  reader.join();
  events.join();
  EXPECT_EQ(reader_errors.load(), 0) << first_reader_error;
  EXPECT_EQ(event_errors.load(), 0) << first_event_error;
  EXPECT_GT(polls.load(), static_cast<int64_t>(seconds * 20)) << "the reader was starved";
  // wal_autocheckpoint resets the WAL every ~1000 pages (4 MiB); starved checkpoints would let it
  // grow with everything written (well past this in 20 s).
  EXPECT_LT(max_wal.load(), 12 << 20);
  auto store = RunStore::open(path);
  EXPECT_EQ(whole_batches(*store, run_id, KEYS), steps);
  EXPECT_EQ(store->integrity_check(), "ok");
}

TEST(SqliteFaults, SlowStepsCommitOncePerStep) {
  TempDir dir;
  const std::string path = dir.path() + "/runs.db";
  const int64_t run_id = new_run(path, "slow");
  MetricsWriter w(path);
  const int64_t steps = 12;
  for (int64_t s = 1; s <= steps; ++s) {
    w.push(step_rows(run_id, s, 5));  // the step's training row
    std::this_thread::sleep_for(std::chrono::milliseconds(90));
    w.push(row(run_id, s, "val_loss", 2.0));  // its evaluation, later in the same step
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
  }
  w.flush();
  // One commit per step, plus the final flush.
  EXPECT_LE(w.commits(), steps + 1);
  EXPECT_GE(w.commits(), steps / 2) << "rows were held back too long";
  EXPECT_EQ(w.rows_written(), steps * 6);
}

TEST(SqliteFaults, DiskFullAtRandomPointsLeavesTheDatabaseIntact) {
  faults::install_full_vfs();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    TempDir dir;
    const std::string path = dir.path() + "/runs.db";
    const int64_t run_id = new_run(path, "full");
    {
      auto store = RunStore::open(path);
      for (int64_t s = 1; s <= 10; ++s) store->insert_metrics(step_rows(run_id, s, 6));
    }
    const int64_t budget = static_cast<int64_t>(rng() % 40000);
    const int64_t failures_before = faults::full_vfs_failures();
    std::string writer_error, event_error;
    {
      MetricsWriter w(path);
      auto events = RunStore::open(path);
      faults::set_full_vfs_budget(budget);
      int64_t s = 11;
      for (; s <= 60 && w.last_error().empty(); ++s) {
        w.push(step_rows(run_id, s, 6));
        w.flush();
      }
      try {
        events->add_event({run_id, s, "info", std::string(5000, 'x'), ""});
      } catch (const std::exception& e) {
        event_error = e.what();
      }
      writer_error = w.last_error();
      faults::set_full_vfs_budget(-1);  // space is back
      w.push(step_rows(run_id, 1000, 6));
      w.flush();
    }
    EXPECT_GT(faults::full_vfs_failures(), failures_before) << "the disk never filled (budget " << budget << ")";
    EXPECT_NE(writer_error.find("database or disk is full"), std::string::npos) << writer_error;
    if (!event_error.empty()) {
      EXPECT_NE(event_error.find("database or disk is full"), std::string::npos) << event_error;
    }
    auto store = RunStore::open(path);
    EXPECT_EQ(store->integrity_check(), "ok");
    // The rows before the disk filled are intact and every stored batch is whole; the batch after
    // space came back is there.
    std::map<int64_t, int> per_step;
    for (const auto& p : store->metrics(run_id)) ++per_step[p.step];
    for (int64_t s = 1; s <= 10; ++s) EXPECT_EQ(per_step[s], 6) << "step " << s;
    for (const auto& [step, n] : per_step) EXPECT_EQ(n, 6) << "step " << step << " was written in part";
    EXPECT_EQ(per_step[1000], 6);
  }
}

std::atomic<int64_t> g_usr1{0};
void on_usr1(int) { ++g_usr1; }

TEST(SqliteFaults, SignalsDuringCommitsFailNothing) {
  TempDir dir;
  const std::string path = dir.path() + "/runs.db";
  const int64_t run_id = new_run(path, "signals");
  struct sigaction sa {}, old {};
  sa.sa_handler = on_usr1;
  sa.sa_flags = SA_RESTART;  // as app/signals.cpp installs SIGINT/SIGTERM
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  int64_t steps = 0;
  {
    MetricsWriter w(path);  // its thread has SIGUSR1 unblocked...
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, nullptr);  // ... and is the only one from here on
    std::atomic<bool> stop{false};
    std::thread sender([&] {
      while (!stop) {
        ::kill(::getpid(), SIGUSR1);
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
    });
    const auto end = Clock::now() + std::chrono::seconds(3);
    while (Clock::now() < end) {
      w.push(step_rows(run_id, ++steps, 8));
      w.flush();
    }
    stop = true;
    sender.join();
    EXPECT_EQ(w.last_error(), "");
    pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
  }
  sigaction(SIGUSR1, &old, nullptr);
  EXPECT_GT(g_usr1.load(), 100) << "the signals did not reach the writer";
  auto store = RunStore::open(path);
  EXPECT_EQ(store->integrity_check(), "ok");
  EXPECT_EQ(whole_batches(*store, run_id, 8), steps);
}

TEST(SqliteFaults, NetworkFileSystemsAreRecognised) {
  EXPECT_STREQ(storage::network_filesystem_name(0x6969), "NFS");
  EXPECT_STREQ(storage::network_filesystem_name(0xFF534D42L), "CIFS");
  EXPECT_STREQ(storage::network_filesystem_name(0xFE534D42L), "SMB2");
  EXPECT_STREQ(storage::network_filesystem_name(0x01021997), "9P");
  EXPECT_STREQ(storage::network_filesystem_name(0x65735546), "FUSE");
  EXPECT_EQ(storage::network_filesystem_name(0xEF53), nullptr);        // ext4
  EXPECT_EQ(storage::network_filesystem_name(0x01021994), nullptr);    // tmpfs
  EXPECT_EQ(storage::network_filesystem_name(0x58465342), nullptr);    // xfs
  TempDir dir;
  EXPECT_EQ(storage::network_filesystem_problem(dir.path() + "/not/yet/runs.db"), "");
  EXPECT_EQ(storage::network_filesystem_problem(":memory:"), "");
}

}  // namespace
