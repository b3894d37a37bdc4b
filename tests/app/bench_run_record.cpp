// Benchmark (not a test): what keeping a run's record in its folder costs per save, for a run with
// many metric rows (a long run with GPU telemetry logs about 5 rows a second a GPU). It times the
// writer's first write (the metrics file written whole), a later write after 1,000 new rows (appended),
// and, for comparison, the whole document with the metrics inline (what each save wrote before the
// metrics file). Usage: bench_run_record [rows] (default 1,000,000). Prints, never asserts.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/run_record.h"
#include "storage/file_util.h"
#include "storage/run_store.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Ten keys a step, as a trainer logs them.
void log_rows(storage::RunStore& store, int64_t id, int64_t first, int64_t n) {
  static const char* const KEYS[10] = {"loss", "lr", "grad_norm", "tokens_per_s", "mfu",
                                       "gpu0.util", "gpu0.power_w", "gpu0.temp_c", "gpu0.mem_used_gib", "gpu0.sm_clock_mhz"};
  std::vector<storage::MetricRow> rows;
  for (int64_t i = first; i < first + n; ++i) {
    const int64_t step = i / 10;
    rows.push_back({id, {step, 16384 * step, 0.03 * static_cast<double>(step), KEYS[i % 10], 1.0 / (1.0 + static_cast<double>(i))}});
    if (rows.size() == 10000) {
      store.insert_metrics(rows);
      rows.clear();
    }
  }
  if (!rows.empty()) store.insert_metrics(rows);
}

long peak_rss_mib() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1000000;
  const std::string dir = storage::files::make_temp_dir("deltadeck-bench-record-");
  {
    auto store = storage::RunStore::open(dir + "/runs.db");
    storage::NewRun nr;
    nr.name = "long";
    nr.model = "hybrid/base";
    nr.config_toml = "name = \"long\"\n";
    nr.config_json = "{}";
    const int64_t id = store->create_run(nr);
    const std::string run_dir = dir + "/long";
    storage::files::make_dirs(run_dir);
    log_rows(*store, id, 0, rows);

    app::RunRecordWriter writer(run_dir);
    auto t0 = Clock::now();
    writer.write(*store, *store->run(id));
    const double first = seconds_since(t0);
    const long rss_after_first = peak_rss_mib();
    log_rows(*store, id, rows, 1000);
    t0 = Clock::now();
    writer.write(*store, *store->run(id));
    const double append = seconds_since(t0);
    int64_t file_bytes = 0;
    for (const std::string& f : storage::files::list_dir(run_dir))
      if (f.rfind(storage::RUN_METRICS_PREFIX, 0) == 0) file_bytes += storage::files::file_size(run_dir + "/" + f);

    t0 = Clock::now();
    const std::string inline_doc =
        app::run_record_json(*store, *store->run(id)).dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    const double whole = seconds_since(t0);
    std::printf("rows %lld: first write (metrics file whole) %.3f s, %.1f MB; a save 1,000 rows later (appended) "
                "%.4f s; the record with its metrics inline (before) %.3f s, %.1f MB; peak RSS %ld MiB after the "
                "first write, %ld MiB after the inline record\n",
                static_cast<long long>(rows + 1000), first, static_cast<double>(file_bytes) / 1e6, append, whole,
                static_cast<double>(inline_doc.size()) / 1e6, rss_after_first, peak_rss_mib());
  }
  storage::files::remove_tree(dir);
  return 0;
}
