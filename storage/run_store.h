// RunStore: the SQLite run database (runs, configs, metrics, checkpoints, events). WAL mode,
// schema version in PRAGMA user_version, numbered migrations applied in order (docs/schema.md).
// One RunStore owns one connection; the writer thread owns its own, readers open their own.
// Every connection waits up to 5 s for a lock (busy timeout) and every write takes the write lock
// up front (BEGIN IMMEDIATE), so a reader never makes a writer fail and vice versa. A database on
// a network file system is refused: WAL needs shared memory that NFS/SMB/9P/FUSE do not give.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "storage/types.h"

struct sqlite3;

namespace storage {

// Why a database at `path` (a file that may not exist yet) cannot be used safely: "" when its
// folder is on a local file system, else the refusal naming the path and the file system. WAL needs
// a shared-memory index that network file systems do not provide, so a reader could see a torn
// database. DELTADECK_ALLOW_NETWORK_DB=1 skips the check (at the user's risk). Any thread.
std::string network_filesystem_problem(const std::string& path);
// The name of a network (or FUSE) file system for a statfs f_type, or nullptr for a local one.
const char* network_filesystem_name(long f_type);

// A failed SQLite call: the message names the database and the statement; code() is SQLite's
// primary result code (SQLITE_BUSY, SQLITE_FULL, SQLITE_CONSTRAINT, ...), so a caller can tell a
// failure that may pass (another process holding the write lock) from one that will not.
class SqliteError : public std::runtime_error {
 public:
  SqliteError(const std::string& what, int code) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }
  // Whether the failure may pass if tried again: another connection held a lock past the busy
  // timeout (SQLITE_BUSY, SQLITE_LOCKED).
  bool may_pass() const;

 private:
  int code_;
};

// A run's record as one JSON document in its folder, beside checkpoints/ (app/run_record.h): the
// train command rewrites it at every checkpoint and at the end, so the run can be brought into
// another database (`runs import`, or a resume on a node whose database does not know the run).
inline constexpr const char* RUN_RECORD_FILE = "run_record.json";
// The record's metric rows, beside it, in a file whose name starts with this and that the record
// names ("run_record.metrics.<pid>-<time>.jsonl"): one JSON array per line, appended at each
// rewrite of the record with the rows logged since, so that a save costs the new rows, not all of
// them. The record says how many of its lines are the run's (a line past them is a write cut short).
inline constexpr const char* RUN_METRICS_PREFIX = "run_record.metrics.";
// Which process trains the run now, while it trains (app/run_owner.h).
inline constexpr const char* RUN_OWNER_FILE = "run_owner.json";

// The schema version this program writes.
constexpr int SCHEMA_VERSION = 6;

// A time as the database records it: UTC, ISO 8601 to the second ("2026-12-01T18:30:00Z"); such
// stamps compare as text. now_utc() is the time now.
std::string utc_iso8601(std::time_t t);
std::string now_utc();
// This machine's hostname ("unknown" where it cannot be read), as runs.host records it.
std::string this_host();

// This process's machine boot and pid namespace: "BOOT_ID pid:[INODE]" from /proc, empty where
// /proc does not tell. Two containers on one host (even with one hostname) differ in the second
// part, two machines in the first.
std::string this_process_namespace();

// What this process can tell about the process of a run record: Alive or Dead only when it ran on
// this host (hostname) in this pid namespace (or the record predates namespaces: empty proc_ns),
// where kill(pid, 0) means that process; Unknown elsewhere (another machine, or another container
// sharing the hostname, where the same pid is another process or none).
enum class Liveness { Alive, Dead, Unknown };
Liveness process_liveness(const std::string& host, int64_t pid, const std::string& proc_ns);

// A live run's process stamps runs.heartbeat_at at least this often (MetricsWriter::keep_alive),
// and one whose stamp is older than RUN_QUIET_S is taken as gone by a resume.
constexpr int64_t HEARTBEAT_EVERY_S = 30;
constexpr int64_t RUN_QUIET_S = 120;

// Why `run` must not be resumed or changed now because its process may still be running it: alive
// here (same host and pid namespace), or elsewhere with a heartbeat in the last RUN_QUIET_S
// seconds. Empty when it is not 'running', its process is gone, or it has been quiet longer.
std::string still_running(const RunSummary& run);

// Applies migrations 1..target_version to an open database (exposed so tests can build an
// older schema and check that opening it with the full store migrates it). Throws on failure.
void migrate(sqlite3* db, int target_version);

class RunStore {
 public:
  // Opens (creating directories and the file if needed) and migrates. read_only opens an existing
  // file without migrating or writing. Runs left 'running' by a process that is gone are marked
  // 'interrupted' (not in read-only mode). Throws std::runtime_error naming the path on failure.
  // ":memory:" is allowed for tests.
  static std::unique_ptr<RunStore> open(const std::string& path, bool read_only = false);
  // Opens an existing file read-only for a reader that shows runs (`deltadeck runs`, the app's
  // Runs view). Where this user may write the file, one read-write open comes first: it migrates
  // an older schema and marks runs whose process is gone 'interrupted', so a listing after a crash
  // or a SIGKILL does not show them as running. A file this user cannot write (or that the
  // read-write open cannot take, e.g. locked) is read as it is. Throws as open does.
  static std::unique_ptr<RunStore> open_for_display(const std::string& path);
  ~RunStore();
  RunStore(const RunStore&) = delete;
  RunStore& operator=(const RunStore&) = delete;

  // What open does for runs left 'running' whose process is gone, again (for a reader that stays
  // open while other processes' runs may die): marks them 'interrupted'; returns how many. Throws
  // in read-only mode.
  int mark_dead_runs();

  // Records a new run with status 'running', this host and pid; returns its id. The stored name
  // is unique (suffix added if the requested one is taken); read it back with run().
  int64_t create_run(const NewRun& r);
  // Records a run brought from another database with everything it had (ImportedRun), in one
  // transaction, under its own name; returns its id. With replace_id, that run's rows (an older
  // copy of the same run, under the same name) go in the same transaction. Refuses (throws, naming
  // it, writing nothing) a name this database already has (other than replace_id's) or that is not
  // one path component, a status of 'running' or none of the known ones, and a tag create_run's
  // rules refuse. The run is marked imported (r.imported_from) until reopen_run: delete_run leaves
  // the checkpoints it names where they are.
  int64_t import_run(const ImportedRun& r, int64_t replace_id = 0);
  // status: finished | stopped | failed | interrupted | preempted | diverged. Sets ended_at.
  void finish_run(int64_t run_id, const std::string& status, const std::string& message);
  // Marks a run 'running' again (resume), clearing ended_at and message, and the mark of an
  // imported run: resumed here, its checkpoints are this database's.
  void reopen_run(int64_t run_id);
  // Stamps a running run's heartbeat_at with the time now (the writer's keep-alive).
  void heartbeat(int64_t run_id);
  // Replaces a run's recorded config (a resume's --set changes): the next resume starts from it.
  void update_run_config(int64_t run_id, const std::string& config_toml, const std::string& config_json);

  // Inserts many metric rows in one transaction (the writer thread's call).
  void insert_metrics(const std::vector<MetricRow>& rows);
  void add_checkpoint(const CheckpointRecord& c);
  void remove_checkpoint(int64_t run_id, int64_t step);
  // Marks the current metric rows after `step` superseded (a resume from the checkpoint of that
  // step recomputes them; the abandoned attempt's rows stay, out of every reader's way); returns
  // how many were marked.
  int64_t supersede_metrics_after(int64_t run_id, int64_t step);
  // The name this had before schema 4; it supersedes too (nothing is deleted any more).
  int64_t remove_metrics_after(int64_t run_id, int64_t step) { return supersede_metrics_after(run_id, step); }
  void add_event(const EventRecord& e);

  // ---- the user's edits (the `runs` commands and the GUI's run browser). Each throws
  // std::runtime_error naming the run and what was wrong; any thread that owns this store.

  // Gives a run a new unique name. Its folder <db folder>/<name> (checkpoints) and node logs
  // <name>.node<K>.log move along and the recorded checkpoint paths follow, so --resume and export
  // keep working. Refuses a running run, a name that is taken, and names that are not one path
  // component (empty, ".", "..", containing '/'), and a run whose recorded config keeps its folder
  // outside the runs folder (run.checkpoint_dir). A rename cut short (a crash between moving the
  // folder and committing the row) is undone at the next writable open.
  void rename_run(int64_t run_id, const std::string& new_name);
  // Replaces the run's note; "" clears it.
  void set_note(int64_t run_id, const std::string& note);
  // Adds / removes one tag; false when the run already had it / did not have it. A tag is 1..64
  // characters without whitespace or ','.
  bool add_tag(int64_t run_id, const std::string& tag);
  bool remove_tag(int64_t run_id, const std::string& tag);
  std::vector<std::string> tags(int64_t run_id) const;
  // Deletes the run's rows (metrics, checkpoints, events, tags) in one transaction, then its
  // checkpoint directories and record, and, when nothing else is left in it, its folder <db
  // folder>/<name> (and <run.checkpoint_dir>/<name>, where its recorded config sets that key). An
  // imported run (import_run, not resumed here since) loses its rows only: its files are another
  // database's, and are listed in `kept`.
  // Refuses a running run. Files that cannot be removed are listed in the result's `kept`.
  DeletedRun delete_run(int64_t run_id);

  // Every run matching the filter (all by default), by id. A status outside running | finished |
  // stopped | failed | interrupted | preempted | diverged throws, listing them.
  std::vector<RunSummary> list_runs(const RunFilter& filter = {}) const;
  std::optional<RunSummary> run(int64_t run_id) const;
  // Finds a run by numeric id, exact name, or unique name prefix. Throws std::runtime_error
  // with the candidates when nothing or more than one run matches.
  RunSummary find_run(const std::string& id_or_name) const;
  // Where an imported run came from (import_run), "" for this database's own runs.
  std::string imported_from(int64_t run_id) const;
  std::string run_config_toml(int64_t run_id) const;
  std::string run_config_json(int64_t run_id) const;
  // All current (not superseded) points of one metric, ordered by step. Empty key = every metric.
  std::vector<MetricPoint> metrics(int64_t run_id, const std::string& key = "") const;
  // The current points of a run logged after row `after_row` of the metrics table (0: all of
  // them), in the order they were logged; *last_row becomes the last one's row (after_row when
  // there are none). A run's rows are logged in increasing row order, so asking again from
  // *last_row gives exactly the rows logged since (the record's appended metrics file).
  std::vector<MetricPoint> metrics_logged_after(int64_t run_id, int64_t after_row, int64_t* last_row) const;
  // Distinct metric keys of a run.
  std::vector<std::string> metric_keys(int64_t run_id) const;
  std::vector<CheckpointRecord> checkpoints(int64_t run_id) const;
  std::vector<EventRecord> events(int64_t run_id) const;
  // PRAGMA integrity_check's first line ("ok" when healthy).
  std::string integrity_check() const;
  int schema_version() const;
  // Whether a commit returns only after it is on disk (PRAGMA synchronous FULL or EXTRA on this
  // connection): true for read-write stores.
  bool commits_are_synced() const;
  const std::string& path() const { return path_; }

 private:
  RunStore(sqlite3* db, std::string path, bool read_only);
  sqlite3* db_;
  std::string path_;
  bool read_only_;
  // The folder checkpoints of run `name` go to: the database's folder + "/" + name (the train
  // command puts both in run.runs_dir).
  std::string run_dir(const std::string& name) const;
  // The database's folder, "." for a database named without one: where run folders are listed.
  std::string runs_folder() const;
  RunSummary summary_or_throw(int64_t run_id, const char* what) const;
  // "<db folder>/.rename-<run id>": a rename_run in progress (its run folder's old and new path),
  // written before the folder moves and removed once the row has committed.
  std::string rename_journal(int64_t run_id) const;
  // At a writable open: finishes what a rename_run cut short between moving the folder and
  // committing left behind, moving the folder back to where the row says it is.
  void recover_renames();
};

}  // namespace storage
