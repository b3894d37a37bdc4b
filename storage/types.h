// Plain value types of the run database, shared by the writer, the readers and the UI. No torch,
// no sqlite: ui/ includes this.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace storage {

struct MetricPoint {
  int64_t step = 0;
  int64_t tokens = 0;
  double wall_s = 0;
  std::string key;
  double value = 0;
};

// One metric row bound to its run, as the writer thread queues it.
struct MetricRow {
  int64_t run_id = 0;
  MetricPoint point;
};

struct NewRun {
  std::string name;          // requested name; a suffix "-2", "-3", ... is added if taken
  std::string model;         // e.g. "gpt/tiny"
  std::string config_toml;   // the resolved config
  std::string config_json;
  int64_t params = 0;
  int64_t world_size = 1;
  std::string revision;      // program revision (git)
  // run.checkpoint_dir, where set: the run's folder goes to <checkpoint_dir>/<name> instead of
  // beside the database, and a folder of that name already there takes the name too.
  std::string checkpoint_dir;
};

struct RunSummary {
  int64_t id = 0;
  std::string name;
  std::string status;        // running | finished | stopped | failed | interrupted
  std::string model;
  std::string host;
  int64_t pid = 0;
  // The machine boot and pid namespace of that process (schema 5; empty for older rows): a pid
  // is checked only where it means the same process (see process_liveness).
  std::string proc_ns;
  int64_t params = 0;
  int64_t world_size = 1;
  std::string revision;
  std::string started_at;    // UTC, ISO 8601
  std::string heartbeat_at;  // UTC, ISO 8601: the run process's last sign of life (started_at if none)
  std::string ended_at;      // empty while running
  std::string message;       // why it ended, when it failed
  int64_t last_step = 0;     // highest step with a metric
  std::string note;          // the user's free text (schema 3); empty when none
  std::vector<std::string> tags;  // the user's labels, sorted (schema 3)
};

// Which runs list_runs returns; an empty field matches every run.
struct RunFilter {
  std::string status;        // running | finished | stopped | failed | interrupted
  std::string tag;           // runs carrying this tag
};

// What RunStore::delete_run removed from disk besides the rows, and what it had to leave.
struct DeletedRun {
  std::string name;
  std::vector<std::string> removed;  // checkpoint directories and the run folder, as removed
  std::vector<std::string> kept;     // "PATH (why)" for each path that could not or should not go
};

struct CheckpointRecord {
  int64_t run_id = 0;
  int64_t step = 0;
  std::string path;
  int64_t bytes = 0;
  std::string sha256;
  std::string created_at;
};

struct EventRecord {
  int64_t run_id = 0;
  int64_t step = 0;
  std::string level;         // info | warn | error
  std::string text;
  std::string created_at;
};

// A run recorded by another database (another machine's, or one since lost), brought in whole:
// `runs import`, and a resume on a node whose database does not know the run (app/run_record.h).
struct ImportedRun {
  // name, status (not running), model, host, params, world_size, revision, started_at,
  // heartbeat_at, ended_at, message, note and tags are taken; id, pid, proc_ns and last_step are not.
  RunSummary record;
  std::string config_toml, config_json;
  std::vector<MetricPoint> metrics;
  std::vector<CheckpointRecord> checkpoints;  // run_id ignored
  std::vector<EventRecord> events;            // run_id ignored
  std::string imported_from;                  // where the record was read (a file), kept with the run
};

}  // namespace storage
