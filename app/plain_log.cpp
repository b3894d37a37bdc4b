// The plain log front end: the host's records as text or JSON lines, polled every 100 ms. The
// host queues them on its own thread, so a slow stdout (a full pipe, a network file system under
// a batch job) delays only these lines, never a training step.
#include <chrono>
#include <ctime>
#include <iostream>
#include <thread>

#include "app/front_ends.h"
#include "app/signals.h"
#include "trainer/config.h"
#include "ui/log/log_line.h"

namespace app {

namespace {

// The resolved config as the `| key | value |` table printed when a run starts.
void print_config_table(const std::string& toml_text) {
  std::cout << "| key | value |\n|---|---|\n";
  std::string section;
  size_t pos = 0;
  while (pos < toml_text.size()) {
    size_t nl = toml_text.find('\n', pos);
    std::string line = toml_text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? toml_text.size() : nl + 1;
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1) + ".";
      continue;
    }
    const auto eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    std::cout << "| " << section << line.substr(0, eq) << " | " << line.substr(eq + 3) << " |\n";
  }
}

}  // namespace

std::string utc_now_ms() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03lldZ", static_cast<long long>(ms));
  return buf;
}

void print_run_header(const RunHost& host, LogFormat format, const std::string& version_line) {
  ui::RunView v;
  host.snapshot(v);
  const PreparedRun& run = host.run();
  if (format == LogFormat::Json) {
    std::cout << ui::format_run_json(v, run.resume_from, trainer::to_json(run.cfg), utc_now_ms()) << "\n"
              << std::flush;
    return;
  }
  std::cout << version_line << ": run '" << v.run_name << "' (id " << v.run_id << "), " << v.model << ", "
            << ui::format_count(static_cast<double>(v.params)) << " parameters\n"
            << "database " << v.db_path << ", checkpoints " << v.run_dir << "/checkpoints\n";
  if (!run.resume_from.empty()) std::cout << "resuming from " << run.resume_from << "\n";
  print_config_table(trainer::to_toml(run.cfg));
  std::cout << std::flush;
}

trainer::EndedEvent run_plain_log(RunHost& host, LogFormat format) {
  ui::RunView v;
  host.snapshot(v);
  int signals_seen = 0;
  std::vector<ui::LogRecord> recs;
  auto print = [&](const ui::LogRecord& r) {
    if (format == LogFormat::Json) {
      std::cout << ui::format_record_json(r, v.total_steps, v.run_name, utc_now_ms()) << "\n";
      return;
    }
    const std::string line = ui::format_record_text(r, v.total_steps);
    if (line.empty()) return;
    if (r.kind == "log" && r.level == "error") std::cerr << line << "\n" << std::flush;
    else std::cout << line << "\n";
  };
  for (bool last = false; !last;) {
    if (stop_signals_received() > signals_seen) {
      signals_seen = stop_signals_received();
      if (signals_seen == 1) {
        ui::LogRecord r;
        r.kind = "log";
        r.text = "stop requested: saving a checkpoint and stopping at the next step boundary";
        print(r);
        host.send(stop_command());  // Preempt for a SIGTERM under Slurm (signals.h)
      }
    }
    // ended() before draining, so the last records are printed after the run is recorded.
    last = host.ended();
    recs.clear();
    host.take_records(recs);
    for (const auto& r : recs) print(r);
    std::cout << std::flush;
    if (!last) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (const int64_t dropped = host.dropped_records(); dropped > 0) {
    std::cerr << "warning: " << dropped << " log lines were dropped (stdout too slow); the database has every metric\n";
  }
  return host.wait();
}

}  // namespace app
