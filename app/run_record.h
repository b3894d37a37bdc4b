// A run's whole record as one JSON document: the run's row, its config (as TOML and as JSON), its
// current metrics, checkpoints and events. `runs export --format json` writes it, metrics inline;
// node 0 of a training run keeps it in the run's folder (storage::RUN_RECORD_FILE, rewritten at
// each checkpoint and at the end) with the metric rows in a file beside it
// (storage::RUN_METRICS_PREFIX..., appended to), so the record travels with the checkpoints and a save
// costs the rows logged since the last one; `runs import` and a resume on a machine whose database
// does not know the run read either form back.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "storage/run_store.h"
#include "storage/types.h"

namespace app {

// The document for run `r` of `store`, its metrics inline ("metrics": columns step, tokens, wall_s
// and value for each key). Non-finite metric values are written as null.
nlohmann::ordered_json run_record_json(const storage::RunStore& store, const storage::RunSummary& r);

// Keeps one run's record in its folder, for the one process that trains it (RunHost's record
// thread). The document names its metrics file instead of holding them ("metrics_file", and
// "metric_rows": how many of that file's lines are the run's); a line past them is an append cut
// short, or one whose record was not rewritten yet, and readers leave it.
class RunRecordWriter {
 public:
  explicit RunRecordWriter(std::string run_dir);
  // Brings the folder's record up to the database's copy of run r. The metric rows logged since
  // this writer's last write are appended to the metrics file and flushed to disk; at the first
  // write (a resume may have superseded rows), after a failed one, or when the file is not as this
  // writer left it, the rows are written whole to a new file instead. Then the record is written
  // whole or not at all (a temporary file of this process, flushed, renamed over it), naming that
  // file and its row count, and after a new file the ones it named before are removed. Throws
  // std::runtime_error naming the file on failure; the record on disk then still names a file
  // holding every row it counts.
  void write(const storage::RunStore& store, const storage::RunSummary& r);
  // Metric rows the record names after the last successful write.
  int64_t metric_rows() const { return rows_; }

 private:
  void rewrite_metrics(const storage::RunStore& store, int64_t run_id);
  void append_metrics(const storage::RunStore& store, int64_t run_id);
  std::string dir_;
  std::string file_;      // the metrics file's name in dir_ ("" before the first write)
  bool in_step_ = false;  // the metrics file is as the last write left it
  int64_t last_row_ = 0;  // the database's row of the last metric row written
  int64_t rows_ = 0;      // lines in the metrics file
  int64_t bytes_ = 0;     // its size
};

// The run a document describes, for RunStore::import_run. `source` names the document in errors.
// Its metrics are inline, or in the file its "metrics_file" names in the folder `metrics_dir` (the
// record's own; of that file, the first "metric_rows" lines). A record written while its run was
// running says 'running': it comes in as 'interrupted', since no process of the importing machine
// runs it. The record's last_step is its highest metric step. A null metric value comes in as NaN.
// Throws std::runtime_error naming the source and the key (e.g. "metrics.loss.step") that is
// missing or of the wrong type, a metric whose columns differ in length, or the metrics file and
// the line that is missing or malformed.
storage::ImportedRun parse_run_record(const nlohmann::ordered_json& doc, const std::string& source,
                                      const std::string& metrics_dir = "");

// Rewrites the record in run r's folder `run_dir` where one is there already and is this run's and
// no further along (after an edit of the run: a new name, tags, a note); a record another database
// has since taken further, or another run's, is left alone. Its metrics (inline, or the file it
// names and how many lines) stay as they are. Returns "" or why it was not rewritten (the edit
// stands either way). Never throws.
std::string refresh_run_record(const storage::RunStore& store, const storage::RunSummary& r, const std::string& run_dir);

// Whether two summaries are of one run: the same name and start (its id differs between databases).
inline bool same_run(const storage::RunSummary& a, const storage::RunSummary& b) {
  return a.name == b.name && a.started_at == b.started_at;
}

// Reads and parses the record at `path`: a run_record.json, or a run folder holding one. Sets
// *file to the file read, which also becomes the run's imported_from. Throws std::runtime_error naming the path when it is missing, unreadable
// or not JSON, and as parse_run_record.
storage::ImportedRun read_run_record(const std::string& path, std::string* file = nullptr);

}  // namespace app
