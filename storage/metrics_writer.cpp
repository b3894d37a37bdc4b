// MetricsWriter: the storage thread that drains queued metric rows into SQLite in batches.
// It waits up to GATHER after a commit before the next one, even when rows are already waiting:
// committing every row as it arrives would cost a WAL write per step and wake readers for
// nothing, while a batch every ~50 ms keeps the plots live with a handful of commits a second.
// It also commits at most once per training step: rows of a step already committed (an
// evaluation, telemetry) wait for the next step's rows, or HOLD at most, unless a flush or a full
// batch asks. So a fast run commits at most every GATHER and a slow one once per step.
#include "storage/metrics_writer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <iterator>


#include "storage/run_store.h"

namespace storage {
namespace {

constexpr auto GATHER = std::chrono::milliseconds(50);
// One transaction never holds more than this many rows, so a backlog is written in bounded
// steps and a flush() or a reader never waits on one huge commit.
constexpr size_t MAX_BATCH = 10000;
// Rows of an already committed step wait at most this long for the next step's.
constexpr auto HOLD = std::chrono::seconds(5);
// A batch whose failure may pass is tried again after a pause that doubles up to MAX_PAUSE, for
// RETRY_FOR in all (each try itself waits out the 5 s busy timeout).
constexpr auto FIRST_PAUSE = std::chrono::milliseconds(100);
constexpr auto MAX_PAUSE = std::chrono::seconds(5);
constexpr auto RETRY_FOR = std::chrono::minutes(3);

// The failure that passes: another process holding the write lock past the busy timeout (a
// `runs delete` of a long run removes its rows in one transaction). Others are not waited out: a
// run_id with no run fails every time, and a full disk stops the run's checkpoints too, so a
// checkpoint's flush() held for minutes behind it would only stall the step.

}  // namespace

MetricsWriter::MetricsWriter(const std::string& db_path) : store_(RunStore::open(db_path)) {
  thread_ = std::thread(&MetricsWriter::run, this);
}

MetricsWriter::~MetricsWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  // run() drains the queue before it returns, so joining is the flush.
  thread_.join();
}

void MetricsWriter::push(MetricRow row) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = note_arrival(row.point.step);
    pending_.push_back(std::move(row));
    ++pushed_;
    wake = wake || pending_.size() >= MAX_BATCH;
  }
  // Only the transitions the thread waits for: a per-row wake-up would cost a context switch per
  // row, each ending in the thread going back to sleep to gather more.
  if (wake) cv_.notify_one();
}

void MetricsWriter::push(const std::vector<MetricRow>& rows) {
  if (rows.empty()) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const MetricRow& r : rows) wake = note_arrival(r.point.step) || wake;
    pending_.insert(pending_.end(), rows.begin(), rows.end());
    pushed_ += static_cast<int64_t>(rows.size());
    wake = wake || pending_.size() >= MAX_BATCH;
  }
  if (wake) cv_.notify_one();
}

void MetricsWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = pushed_;
  if (committed_ >= target) return;
  flush_to_ = std::max(flush_to_, target);
  cv_.notify_one();
  flushed_cv_.wait(lock, [&] { return committed_ >= target; });
}

std::string MetricsWriter::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

bool MetricsWriter::note_arrival(int64_t step) {
  // Called with mu_ held. Wakes the thread when the queue fills from empty, or when a step newer
  // than any queued arrives (rows held for a committed step may go now).
  bool wake = false;
  if (pending_.empty()) {
    first_pending_at_ = std::chrono::steady_clock::now();
    wake = true;
  }
  if (step > max_pending_step_) {
    wake = wake || max_pending_step_ <= max_committed_step_;
    max_pending_step_ = step;
  }
  return wake;
}

void MetricsWriter::keep_alive(int64_t run_id, std::chrono::milliseconds every) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    alive_run_ = run_id;
    alive_every_ = every;
    next_beat_ = std::chrono::steady_clock::now() + every;
  }
  cv_.notify_one();
}

void MetricsWriter::run() {
  auto last_commit = std::chrono::steady_clock::now() - GATHER;
  std::vector<MetricRow> batch;
  std::unique_lock<std::mutex> lock(mu_);
  auto urgent = [&] { return stop_ || flush_to_ > committed_ || pending_.size() >= MAX_BATCH; };
  auto new_step = [&] { return max_pending_step_ > max_committed_step_; };
  auto has_work = [&] { return stop_ || !pending_.empty(); };
  for (;;) {
    // Idle: wait for rows, stamping the kept-alive run's heartbeat when it falls due (a commit of
    // rows stamps it too, insert_metrics).
    while (!has_work()) {
      if (alive_run_ == 0) {
        cv_.wait(lock, [&] { return has_work() || alive_run_ != 0; });
        continue;
      }
      if (cv_.wait_until(lock, next_beat_, has_work)) break;
      const int64_t run = alive_run_;
      next_beat_ = std::chrono::steady_clock::now() + alive_every_;
      lock.unlock();
      try {
        store_->heartbeat(run);
      } catch (const std::exception&) {
        // Busy or gone for a moment: the next beat (or commit) stamps it.
      }
      lock.lock();
    }
    if (pending_.empty()) break;
    cv_.wait_until(lock, last_commit + GATHER, urgent);
    if (!urgent() && !new_step())
      cv_.wait_until(lock, first_pending_at_ + HOLD, [&] { return urgent() || new_step(); });
    const size_t n = std::min(pending_.size(), MAX_BATCH);
    const auto end = pending_.begin() + static_cast<std::ptrdiff_t>(n);
    batch.assign(std::make_move_iterator(pending_.begin()), std::make_move_iterator(end));
    pending_.erase(pending_.begin(), end);
    for (const MetricRow& r : batch) max_committed_step_ = std::max(max_committed_step_, r.point.step);
    if (pending_.empty()) {
      max_pending_step_ = max_committed_step_;
    } else {
      first_pending_at_ = std::chrono::steady_clock::now();
    }
    lock.unlock();

    const std::string error = write(batch);
    last_commit = std::chrono::steady_clock::now();

    lock.lock();
    committed_ += static_cast<int64_t>(n);
    if (!error.empty()) last_error_ = error;
    flushed_cv_.notify_all();
  }
}

std::string MetricsWriter::write(const std::vector<MetricRow>& batch) {
  // A batch that fails for a reason that may pass stays here, retried, and flush() waits for it,
  // so a checkpoint is never committed over metric rows that are not in the database. A failure
  // that will not pass, or one that outlasts RETRY_FOR, drops the batch (rows kept any longer
  // would pile up while the trainer keeps pushing) and says so.
  const auto give_up_at = std::chrono::steady_clock::now() + RETRY_FOR;
  std::chrono::milliseconds pause = FIRST_PAUSE;
  for (int tries = 1;; ++tries) {
    try {
      store_->insert_metrics(batch);
      rows_written_ += static_cast<int64_t>(batch.size());
      ++commits_;
      return "";
    } catch (const SqliteError& e) {
      if (!e.may_pass() || std::chrono::steady_clock::now() + pause > give_up_at) {
        return "dropped " + std::to_string(batch.size()) + " metric rows after " + std::to_string(tries) +
               (tries == 1 ? " try: " : " tries: ") + e.what();
      }
    } catch (const std::exception& e) {
      return "dropped " + std::to_string(batch.size()) + " metric rows: " + e.what();
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, MAX_PAUSE);
  }
}

}  // namespace storage
