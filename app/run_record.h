// A run's whole record as one JSON document: the run's row, its config (as TOML and as JSON), its
// current metrics, checkpoints and events. `runs export --format json` writes it; node 0 of a
// training run keeps a copy in the run's folder (storage::RUN_RECORD_FILE, rewritten at each checkpoint and
// at the end), so the record travels with the checkpoints; `runs import` and a resume on a machine
// whose database does not know the run read it back.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "storage/run_store.h"
#include "storage/types.h"

namespace app {

// The document for run `r` of `store`. Non-finite metric values are written as null.
nlohmann::ordered_json run_record_json(const storage::RunStore& store, const storage::RunSummary& r);

// Writes the document to `path` whole or not at all (a temporary file of this process, flushed to
// disk, renamed over it). Throws std::runtime_error naming the path on failure.
void write_run_record(const storage::RunStore& store, const storage::RunSummary& r, const std::string& path);

// The run a document describes, for RunStore::import_run. `source` names the document in errors.
// A record written while its run was running says 'running': it comes in as 'interrupted', since no
// process of the importing machine runs it. The record's last_step is its highest metric step. A null metric value comes in as NaN. Throws
// std::runtime_error naming the source and the key (e.g. "metrics.loss.step") that is missing or of
// the wrong type, or a metric whose columns differ in length.
storage::ImportedRun parse_run_record(const nlohmann::ordered_json& doc, const std::string& source);

// Rewrites the record in run r's folder `run_dir` where one is there already and is this run's and
// no further along (after an edit of the run: a new name, tags, a note); a record another database
// has since taken further, or another run's, is left alone. Returns "" or why it was not rewritten
// (the edit stands either way). Never throws.
std::string refresh_run_record(const storage::RunStore& store, const storage::RunSummary& r, const std::string& run_dir);

// Reads and parses the record at `path`: a run_record.json, or a run folder holding one. Sets
// *file to the file read, which also becomes the run's imported_from. Throws std::runtime_error naming the path when it is missing, unreadable
// or not JSON, and as parse_run_record.
storage::ImportedRun read_run_record(const std::string& path, std::string* file = nullptr);

}  // namespace app
