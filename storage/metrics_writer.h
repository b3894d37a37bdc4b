// MetricsWriter: the storage thread. The trainer's side only queues rows (never waits on SQLite);
// this thread owns its own connection and writes each batch in one transaction.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/run_store.h"
#include "storage/types.h"

namespace storage {

class MetricsWriter {
 public:
  // Opens its own connection to the database at path and starts the thread. Throws if it cannot open.
  explicit MetricsWriter(const std::string& db_path);
  // Flushes everything queued, then joins.
  ~MetricsWriter();

  // Any thread; never blocks on SQLite (only on a short mutex).
  void push(MetricRow row);
  void push(const std::vector<MetricRow>& rows);
  // Blocks until every row pushed before the call is committed. Any thread except the writer.
  void flush();
  // From now on the thread also stamps run_id's heartbeat every `every` when no rows come (paused,
  // a long evaluation or save, a slow step), so other machines can tell the run is alive
  // (storage::still_running). Any thread.
  void keep_alive(int64_t run_id, std::chrono::milliseconds every = std::chrono::seconds(HEARTBEAT_EVERY_S));
  // Rows committed so far, and the last error (empty when none).
  int64_t rows_written() const { return rows_written_.load(); }
  // Transactions committed so far (at most one per training step, see metrics_writer.cpp).
  int64_t commits() const { return commits_.load(); }
  std::string last_error() const;

 private:
  void run();
  // Inserts one batch (writer thread, mu_ not held): "" when written, else why it was dropped.
  std::string write(const std::vector<MetricRow>& batch);
  bool note_arrival(int64_t step);  // mu_ held
  std::unique_ptr<RunStore> store_;
  mutable std::mutex mu_;
  std::condition_variable cv_, flushed_cv_;
  std::deque<MetricRow> pending_;
  // committed_ counts rows settled: written, or dropped (see write(); last_error says so).
  int64_t pushed_ = 0, committed_ = 0;
  // flush() raises this so the thread writes at once instead of waiting to gather a fuller batch.
  int64_t flush_to_ = 0;
  bool stop_ = false;
  int64_t alive_run_ = 0;  // keep_alive's run (0: none)
  std::chrono::milliseconds alive_every_{0};
  std::chrono::steady_clock::time_point next_beat_{};
  std::atomic<int64_t> rows_written_{0}, commits_{0};
  // The commit-once-per-step policy: the newest step queued and committed, and when the oldest
  // queued row arrived.
  int64_t max_pending_step_ = INT64_MIN, max_committed_step_ = INT64_MIN;
  std::chrono::steady_clock::time_point first_pending_at_{};
  std::string last_error_;
  std::thread thread_;
};

}  // namespace storage
