// Reads the desktop app needs beyond RunStore's: a run's metric rows in write order after a given
// row (so a reader thread fetches only what is new), the summary figures of the runs browser, and
// a run's metrics as CSV. Free functions over a read-only connection of their own; the database
// runs in WAL mode, so these never block the writer thread and the writer never blocks them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "storage/types.h"

struct sqlite3;

namespace storage {

// A read-only connection; closes on destruction. One per reader thread.
struct ReadConnectionCloser {
  void operator()(sqlite3* db) const;
};
using ReadConnection = std::unique_ptr<sqlite3, ReadConnectionCloser>;
// Opens an existing database read-only. Throws std::runtime_error naming the path when the file
// does not exist or cannot be opened.
ReadConnection open_read_connection(const std::string& path);

// PRAGMA data_version: changes whenever another connection commits. A reader polls this (a few
// microseconds) and queries only when it moved.
int64_t data_version(sqlite3* db);

// One metric row with its rowid (write order).
struct MetricRowRead {
  int64_t rowid = 0;
  MetricPoint point;
};
// Rows of run_id with rowid > after_rowid, in rowid order, at most `limit`. Throws on SQL errors.
std::vector<MetricRowRead> metrics_after(sqlite3* db, int64_t run_id, int64_t after_rowid, int64_t limit);

// The figures of one run the runs browser shows, read through the (run_id, key, step) index.
struct RunFigures {
  int64_t last_step = 0;        // of the training loss
  int64_t tokens = 0;           // tokens at that step
  double wall_s = 0;            // wall time at that step
  bool has_val = false;
  double best_val_loss = 0;
  double final_loss = 0;
  bool has_loss = false;
};
RunFigures run_figures(sqlite3* db, int64_t run_id);

// id → config_json of every run (the browser's config columns and the compare view's diff).
std::vector<std::pair<int64_t, std::string>> run_configs(sqlite3* db);

// Writes every metric row of the run to `path` as CSV (step,tokens,wall_s,key,value; values with
// 17 significant digits, so they read back bit for bit), ordered by key then step. Returns the
// rows written. Throws std::runtime_error naming the path on I/O errors.
int64_t export_metrics_csv(sqlite3* db, int64_t run_id, const std::string& path);

}  // namespace storage
