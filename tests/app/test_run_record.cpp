// The run's record in its folder (app/run_record.h): RunRecordWriter appends each write's new metric
// rows to the metrics file and rewrites it whole where it cannot trust it (the first write, a file
// someone else changed, a resume that superseded rows); readers take exactly the rows the record
// names, leave a torn last line, and name the file and line of what is missing or malformed; an
// edit's refresh leaves the metrics where they are.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/run_owner.h"
#include "app/run_record.h"
#include "storage/file_util.h"
#include "storage/run_store.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

namespace {

using storage::RunStore;
using testing_support::TempDir;
using testing_support::error_of;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_ino) : -1;
}

int64_t lines_of(const std::string& text) {
  int64_t n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

nlohmann::json record_of(const std::string& run_dir) {
  return nlohmann::json::parse(read_file(run_dir + "/" + storage::RUN_RECORD_FILE));
}

// Steps [from, to] of two metrics, one of them NaN at every third step.
void log_steps(RunStore& store, int64_t id, int64_t from, int64_t to) {
  std::vector<storage::MetricRow> rows;
  for (int64_t s = from; s <= to; ++s) {
    rows.push_back({id, {s, 64 * s, 0.25 * static_cast<double>(s), "loss", s % 3 == 0 ? std::nan("") : 5.0 / s}});
    rows.push_back({id, {s, 64 * s, 0.25 * static_cast<double>(s), "gpu0.util", 90.0 + static_cast<double>(s)}});
  }
  store.insert_metrics(rows);
}

// The run's current rows as the database has them, in the order they were logged, against those
// read back from the record (NaN equal to NaN).
void expect_same_rows(const RunStore& store, int64_t id, const std::vector<storage::MetricPoint>& got) {
  int64_t last = 0;
  const auto want = store.metrics_logged_after(id, 0, &last);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    EXPECT_EQ(got[i].key, want[i].key);
    EXPECT_EQ(got[i].step, want[i].step);
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_EQ(got[i].wall_s, want[i].wall_s);
    if (std::isnan(want[i].value)) EXPECT_TRUE(std::isnan(got[i].value));
    else EXPECT_EQ(got[i].value, want[i].value);
  }
}

struct RecordedRun {
  TempDir dir;
  std::unique_ptr<RunStore> store = RunStore::open(dir.file("runs.db"));
  int64_t id = 0;
  std::string run_dir = dir.file("r");

  RecordedRun() {
    storage::NewRun nr;
    nr.name = "r";
    nr.model = "gpt/tiny";
    nr.config_toml = "name = \"r\"\n";
    nr.config_json = "{\"name\": \"r\"}";
    id = store->create_run(nr);
    storage::files::make_dirs(run_dir);
  }
  storage::RunSummary summary() const { return *store->run(id); }
  // The metrics file the record names.
  std::string metrics_file() const { return run_dir + "/" + record_of(run_dir)["metrics_file"].get<std::string>(); }
  // How many metrics files the folder holds.
  int metrics_files() const {
    int n = 0;
    for (const std::string& f : storage::files::list_dir(run_dir)) n += f.rfind(storage::RUN_METRICS_PREFIX, 0) == 0;
    return n;
  }
};

TEST(RunRecord, WriterAppendsEachWritesNewRows) {
  RecordedRun run;
  app::RunRecordWriter writer(run.run_dir);
  log_steps(*run.store, run.id, 1, 5);
  writer.write(*run.store, run.summary());
  EXPECT_EQ(writer.metric_rows(), 10);
  const std::string first = read_file(run.metrics_file());
  EXPECT_EQ(lines_of(first), 10);
  const int64_t inode = inode_of(run.metrics_file());
  auto doc = record_of(run.run_dir);
  EXPECT_EQ(doc["metrics_file"].get<std::string>().rfind(storage::RUN_METRICS_PREFIX, 0), 0u);
  EXPECT_EQ(doc["metric_rows"], 10);
  EXPECT_FALSE(doc.contains("metrics"));

  const std::string name = run.metrics_file();
  // Another run of the database logs in between: none of its rows come along.
  storage::NewRun other;
  other.name = "other";
  const int64_t other_id = run.store->create_run(other);
  log_steps(*run.store, other_id, 1, 3);
  log_steps(*run.store, run.id, 6, 8);
  log_steps(*run.store, other_id, 4, 5);
  writer.write(*run.store, run.summary());
  const std::string second = read_file(run.metrics_file());
  EXPECT_EQ(run.metrics_file(), name);
  EXPECT_EQ(inode_of(run.metrics_file()), inode) << "the file was replaced, not appended to";
  EXPECT_EQ(run.metrics_files(), 1);
  EXPECT_EQ(second.substr(0, first.size()), first) << "the rows already written changed";
  EXPECT_EQ(lines_of(second), 16);
  EXPECT_EQ(record_of(run.run_dir)["metric_rows"], 16);
  // A write with nothing new logged leaves the file alone.
  writer.write(*run.store, run.summary());
  EXPECT_EQ(read_file(run.metrics_file()), second);

  const storage::ImportedRun back = app::read_run_record(run.run_dir);
  EXPECT_EQ(back.record.last_step, 8);
  expect_same_rows(*run.store, run.id, back.metrics);
  // No temporary file is left behind.
  for (const std::string& f : storage::files::list_dir(run.run_dir))
    EXPECT_EQ(f.find(".tmp"), std::string::npos) << f;
}

TEST(RunRecord, ReadersLeaveATornLastLineAndTheWriterRewritesAFileItDidNotLeave) {
  RecordedRun run;
  app::RunRecordWriter writer(run.run_dir);
  log_steps(*run.store, run.id, 1, 4);
  writer.write(*run.store, run.summary());
  // An append cut short: a last line without its newline, past the rows the record names.
  std::ofstream(run.metrics_file(), std::ios::app) << "[\"loss\",5,320,1.2";
  expect_same_rows(*run.store, run.id, app::read_run_record(run.run_dir).metrics);

  // The file is not as the writer left it: the next write replaces it whole, without the torn bytes.
  const std::string torn = run.metrics_file();
  log_steps(*run.store, run.id, 5, 6);
  writer.write(*run.store, run.summary());
  EXPECT_NE(run.metrics_file(), torn);
  EXPECT_FALSE(storage::files::exists(torn)) << "the file the record named before is still there";
  EXPECT_EQ(run.metrics_files(), 1);
  EXPECT_EQ(lines_of(read_file(run.metrics_file())), 12);
  EXPECT_EQ(read_file(run.metrics_file()).back(), '\n');
  expect_same_rows(*run.store, run.id, app::read_run_record(run.run_dir).metrics);
}

TEST(RunRecord, AResumesFewerRowsGoToANewFileTheRecordThenNames) {
  RecordedRun run;
  {
    app::RunRecordWriter first_job(run.run_dir);
    log_steps(*run.store, run.id, 1, 9);
    first_job.write(*run.store, run.summary());
  }
  const std::string first_file = run.metrics_file();
  // Resumed from step 6, the next job has logged only step 7 again when it first saves: 14 rows
  // where the record named 18. Its rows go to a file of their own, so that the record on disk
  // names the 18-row file until it names the new one.
  run.store->supersede_metrics_after(run.id, 6);
  log_steps(*run.store, run.id, 7, 7);
  app::RunRecordWriter second_job(run.run_dir);
  second_job.write(*run.store, run.summary());
  EXPECT_NE(run.metrics_file(), first_file);
  EXPECT_FALSE(storage::files::exists(first_file));
  EXPECT_EQ(record_of(run.run_dir)["metric_rows"], 14);
  EXPECT_EQ(lines_of(read_file(run.metrics_file())), 14);
  expect_same_rows(*run.store, run.id, app::read_run_record(run.run_dir).metrics);
}

TEST(RunRecord, AResumesFirstWriteLeavesSupersededRowsOut) {
  RecordedRun run;
  {
    app::RunRecordWriter first_job(run.run_dir);
    log_steps(*run.store, run.id, 1, 9);
    first_job.write(*run.store, run.summary());
  }
  // The next job resumes from step 6's checkpoint: steps 7 to 9 are logged again.
  run.store->supersede_metrics_after(run.id, 6);
  log_steps(*run.store, run.id, 7, 10);
  app::RunRecordWriter second_job(run.run_dir);
  second_job.write(*run.store, run.summary());
  EXPECT_EQ(second_job.metric_rows(), 20);
  EXPECT_EQ(lines_of(read_file(run.metrics_file())), 20);
  const storage::ImportedRun back = app::read_run_record(run.run_dir);
  EXPECT_EQ(back.record.last_step, 10);
  expect_same_rows(*run.store, run.id, back.metrics);
}

TEST(RunRecord, MissingOrMalformedMetricLinesAreNamed) {
  RecordedRun run;
  app::RunRecordWriter writer(run.run_dir);
  log_steps(*run.store, run.id, 1, 3);
  writer.write(*run.store, run.summary());
  const std::string whole = read_file(run.metrics_file());

  // Fewer whole lines than the record names.
  std::ofstream(run.metrics_file(), std::ios::binary | std::ios::trunc) << whole.substr(0, whole.rfind('\n', whole.size() - 2) + 1);
  EXPECT_NE(error_of([&] { app::read_run_record(run.run_dir); })
                .find(run.metrics_file() + " holds 5 whole lines; its record (run_record.json) names 6 metric rows"),
            std::string::npos);
  // The last line the record counts without its newline (an append cut short inside it).
  std::ofstream(run.metrics_file(), std::ios::binary | std::ios::trunc) << whole.substr(0, whole.size() - 1);
  EXPECT_NE(error_of([&] { app::read_run_record(run.run_dir); }).find(" holds 5 whole lines"), std::string::npos);
  // A line that is not a row.
  std::string bad = whole;
  bad.replace(bad.find('\n') + 1, bad.find('\n', bad.find('\n') + 1) - bad.find('\n') - 1, "{\"loss\": 1}");
  std::ofstream(run.metrics_file(), std::ios::binary | std::ios::trunc) << bad;
  EXPECT_NE(error_of([&] { app::read_run_record(run.run_dir); })
                .find(run.metrics_file() + ": line 2 must be [key, step, tokens, wall_s, value]"),
            std::string::npos);
  std::ofstream(run.metrics_file(), std::ios::binary | std::ios::trunc) << "[\"loss\", 1,\n" << whole;
  EXPECT_NE(error_of([&] { app::read_run_record(run.run_dir); }).find(run.metrics_file() + ": line 1 is not valid JSON"),
            std::string::npos);
  // No metrics file at all.
  std::remove(run.metrics_file().c_str());
  EXPECT_NE(error_of([&] { app::read_run_record(run.run_dir); }).find("cannot read the run's metrics"),
            std::string::npos);
}

TEST(RunRecord, AnEditsRefreshKeepsTheMetricsWhereTheyAre) {
  RecordedRun run;
  app::RunRecordWriter writer(run.run_dir);
  log_steps(*run.store, run.id, 1, 4);
  writer.write(*run.store, run.summary());
  const std::string metrics = read_file(run.metrics_file());
  run.store->set_note(run.id, "lr too high");
  EXPECT_EQ(app::refresh_run_record(*run.store, run.summary(), run.run_dir), "");
  const auto doc = record_of(run.run_dir);
  EXPECT_EQ(doc["run"]["note"], "lr too high");
  EXPECT_EQ(doc["metric_rows"], 8);
  EXPECT_EQ(read_file(run.metrics_file()), metrics);
  // While another process trains the run (its owner file names a live process), that process
  // rewrites the record: the edit leaves it alone.
  app::RunOwner trainer = app::this_process_owner("/elsewhere/deltadeck.db");
  trainer.pid = static_cast<int64_t>(::getppid());
  app::write_run_owner(run.run_dir, trainer);
  run.store->set_note(run.id, "second thoughts");
  EXPECT_NE(app::refresh_run_record(*run.store, run.summary(), run.run_dir).find("rewrites it at its next save"),
            std::string::npos);
  EXPECT_EQ(record_of(run.run_dir)["run"]["note"], "lr too high");
  // The export keeps its metrics inline, and reads back the same rows.
  const auto inline_doc = app::run_record_json(*run.store, run.summary());
  ASSERT_TRUE(inline_doc.contains("metrics"));
  const auto back = app::parse_run_record(inline_doc, "export.json");
  EXPECT_EQ(back.metrics.size(), 8u);
}

}  // namespace
