// Benchmark (not a test): rows/s of metric inserts into a WAL file, through
// RunStore::insert_metrics in batches and through MetricsWriter row by row, plus the reads the UI
// repeats (list_runs, one metric's curve). Usage: bench_metrics_insert [rows] (default 1,000,000).
// It prints and never asserts: machines differ, and CI must not fail on a slow runner.
// Ten keys per step, like a trainer logging loss, lr, grad norm and friends.
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "storage/metrics_writer.h"
#include "storage/run_store.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t BATCH = 10000;
constexpr int KEYS = 10;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

storage::MetricRow make_row(int64_t run_id, int64_t i) {
  static const char* const NAMES[KEYS] = {"loss", "lr", "grad_norm", "tokens_per_s", "mfu",
                                          "val_loss", "loss_scale", "step_ms", "mem_gb", "ppl"};
  storage::MetricRow r;
  r.run_id = run_id;
  r.point.step = i / KEYS;
  r.point.tokens = r.point.step * 524288;
  r.point.wall_s = r.point.step * 0.1;
  r.point.key = NAMES[i % KEYS];
  r.point.value = 1.0 / static_cast<double>(i + 1);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1000000;
  char tmpl[] = "/tmp/deltadeck-bench-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  const std::string path = dir + "/bench.db";
  int rc = 0;
  try {
    auto store = storage::RunStore::open(path);
    storage::NewRun nr;
    nr.name = "bench";
    const int64_t batched = store->create_run(nr);
    const int64_t queued = store->create_run(nr);

    std::vector<storage::MetricRow> batch;
    batch.reserve(BATCH);
    auto t0 = Clock::now();
    for (int64_t i = 0; i < rows; ++i) {
      batch.push_back(make_row(batched, i));
      if (batch.size() == BATCH || i == rows - 1) {
        store->insert_metrics(batch);
        batch.clear();
      }
    }
    double s = seconds_since(t0);
    std::printf("insert_metrics, batches of %zu: %lld rows in %.2f s = %.0f rows/s\n", BATCH,
                static_cast<long long>(rows), s, rows / s);

    {
      storage::MetricsWriter writer(path);
      t0 = Clock::now();
      for (int64_t i = 0; i < rows; ++i) writer.push(make_row(queued, i));
      const double push_s = seconds_since(t0);
      writer.flush();
      s = seconds_since(t0);
      std::printf("MetricsWriter, push row by row + flush: %lld rows in %.2f s = %.0f rows/s "
                  "(pushing alone %.2f s)%s%s\n",
                  static_cast<long long>(rows), s, rows / s, push_s,
                  writer.last_error().empty() ? "" : "; error: ", writer.last_error().c_str());
    }

    auto reader = storage::RunStore::open(path, /*read_only=*/true);
    t0 = Clock::now();
    auto runs = reader->list_runs();
    std::printf("list_runs (%zu runs, last_step %lld): %.2f ms\n", runs.size(),
                static_cast<long long>(runs[0].last_step), seconds_since(t0) * 1e3);
    t0 = Clock::now();
    auto curve = reader->metrics(batched, "loss");
    std::printf("metrics(run, \"loss\") (%zu points): %.2f ms\n", curve.size(),
                seconds_since(t0) * 1e3);
    std::printf("database: %.1f MB\n",
                std::filesystem::file_size(path) / 1e6 +
                    (std::filesystem::exists(path + "-wal")
                         ? std::filesystem::file_size(path + "-wal") / 1e6
                         : 0.0));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_metrics_insert: %s\n", e.what());
    rc = 1;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
