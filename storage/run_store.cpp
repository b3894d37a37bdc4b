// RunStore: the run database through the sqlite3 C API (schema and migrations in schema.cpp).
// A run left 'running' is judged dead only from evidence this machine can check: a pid on this
// host and in this pid namespace that no longer exists, or (other hosts, other containers) no
// heartbeat for an hour. Marking a live run
// 'interrupted' would be worse than showing a dead one as running, so anything else is left alone.
#include "storage/run_store.h"

#include "storage/file_io.h"
#include "storage/file_util.h"
#include "storage/run_name.h"

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sqlite3.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

namespace storage {
namespace {

// A run on another host with no heartbeat for this long is taken as dead.
constexpr int64_t HEARTBEAT_TIMEOUT_S = 3600;
// find_run's error lists at most this many names.
constexpr size_t MAX_CANDIDATES = 10;

[[noreturn]] void fail(sqlite3* db, const std::string& path, const std::string& what) {
  throw SqliteError(path + ": " + what + ": " + sqlite3_errmsg(db), sqlite3_errcode(db) & 0xff);
}

// One prepared statement; finalized on scope exit. Errors name the database path.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& path, const char* sql) : db_(db), path_(path) {
    if (sqlite3_prepare_v2(db, sql, -1, &st_, nullptr) != SQLITE_OK) {
      fail(db_, path_, std::string("preparing \"") + sql + "\"");
    }
  }
  ~Stmt() { sqlite3_finalize(st_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v) { return check(sqlite3_bind_int64(st_, i, v)); }
  Stmt& bind(int i, double v) { return check(sqlite3_bind_double(st_, i, v)); }
  Stmt& bind(int i, const std::string& v) {
    return check(sqlite3_bind_text(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  // NULL for an empty string, so optional text columns stay NULL rather than ''.
  Stmt& bind_or_null(int i, const std::string& v) {
    return v.empty() ? check(sqlite3_bind_null(st_, i)) : bind(i, v);
  }

  // True while there is a row; false when done. Throws on error.
  bool step() {
    int rc = sqlite3_step(st_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail(db_, path_, std::string("running \"") + sqlite3_sql(st_) + "\"");
  }
  void run() {
    step();
    reset();
  }
  void reset() {
    sqlite3_reset(st_);
    sqlite3_clear_bindings(st_);
  }

  int64_t i64(int col) const { return sqlite3_column_int64(st_, col); }
  double f64(int col) const { return sqlite3_column_double(st_, col); }
  bool is_null(int col) const { return sqlite3_column_type(st_, col) == SQLITE_NULL; }
  std::string text(int col) const {
    auto p = reinterpret_cast<const char*>(sqlite3_column_text(st_, col));
    return p ? std::string(p, sqlite3_column_bytes(st_, col)) : std::string();
  }

 private:
  Stmt& check(int rc) {
    if (rc != SQLITE_OK) fail(db_, path_, std::string("binding \"") + sqlite3_sql(st_) + "\"");
    return *this;
  }
  sqlite3* db_;
  const std::string& path_;
  sqlite3_stmt* st_ = nullptr;
};

// BEGIN IMMEDIATE on construction (the write lock up front, so a busy database waits in the busy
// handler here rather than failing mid-transaction); rolls back unless commit() was reached.
class Transaction {
 public:
  Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {
    if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
      fail(db_, path_, "begin transaction");
    }
  }
  ~Transaction() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
      fail(db_, path_, "commit");
    }
    done_ = true;
  }

 private:
  sqlite3* db_;
  const std::string& path_;
  bool done_ = false;
};

void exec(sqlite3* db, const std::string& path, const char* sql) {
  if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
    fail(db, path, std::string("running \"") + sql + "\"");
  }
}

constexpr const char* SUMMARY_COLUMNS =
    "SELECT id, name, status, model, host, pid, params, world_size, revision, started_at, "
    "ended_at, message, note, proc_ns, COALESCE(heartbeat_at, started_at) FROM runs";

constexpr const char* STATUSES[] = {"running", "finished", "stopped", "failed", "interrupted", "preempted", "diverged"};

RunSummary read_summary(const Stmt& s) {
  RunSummary r;
  r.id = s.i64(0);
  r.name = s.text(1);
  r.status = s.text(2);
  r.model = s.text(3);
  r.host = s.text(4);
  r.pid = s.i64(5);
  r.params = s.i64(6);
  r.world_size = s.i64(7);
  r.revision = s.text(8);
  r.started_at = s.text(9);
  r.ended_at = s.text(10);
  r.message = s.text(11);
  r.note = s.text(12);
  r.proc_ns = s.text(13);
  r.heartbeat_at = s.text(14);
  return r;
}

std::vector<std::string> tags_of(sqlite3* db, const std::string& path, int64_t run_id) {
  std::vector<std::string> out;
  Stmt s(db, path, "SELECT tag FROM tags WHERE run_id = ?1 ORDER BY tag");
  s.bind(1, run_id);
  while (s.step()) out.push_back(s.text(0));
  return out;
}

std::string tag_problem(const std::string& tag) {
  if (tag.empty()) return "must not be empty";
  if (tag.size() > 64) return "must be at most 64 characters";
  for (char c : tag) {
    if (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r') return "must not contain whitespace or ','";
  }
  return "";
}

// A checkpoint path ".../<old>/checkpoints/step_X" with the run folder component renamed; other
// paths come back unchanged. Works on relative and absolute paths alike, whatever folder the
// recording process ran from.
std::string with_run_folder(const std::string& path, const std::string& old_name,
                            const std::string& new_name) {
  const std::string marker = "/checkpoints/";
  const size_t at = path.rfind(marker);
  if (at == std::string::npos || at == 0) return path;
  const size_t slash = path.rfind('/', at - 1);
  const size_t begin = slash == std::string::npos ? 0 : slash + 1;
  if (path.compare(begin, at - begin, old_name) != 0 || at - begin != old_name.size()) return path;
  return path.substr(0, begin) + new_name + path.substr(at);
}

std::string errno_text() { return std::strerror(errno); }

// The run.checkpoint_dir a run's recorded config names (absolute, as the trainer resolves it), ""
// where it has none (its folder is beside the database) or the JSON does not parse.
std::string recorded_checkpoint_dir(const std::string& config_json) {
  try {
    const auto j = nlohmann::json::parse(config_json);
    const auto run = j.find("run");
    if (run == j.end() || !run->is_object()) return "";
    const auto dir = run->find("checkpoint_dir");
    return dir != run->end() && dir->is_string() ? dir->get<std::string>() : "";
  } catch (const std::exception&) {
    return "";
  }
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < MAX_CANDIDATES; ++i) {
    if (i) out += ", ";
    out += names[i];
  }
  if (names.size() > MAX_CANDIDATES) {
    out += ", ... (" + std::to_string(names.size() - MAX_CANDIDATES) + " more)";
  }
  return out;
}

bool parse_id(const std::string& s, int64_t* id) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  *id = std::strtoll(s.c_str(), nullptr, 10);
  return true;
}

// Distinct keys as a loose index scan: each key is one seek into (run_id, key, step), where
// SELECT DISTINCT would read every row of the run (millions for a long run).
// Only current rows count (superseded ones are an abandoned attempt's): ORDER BY ... LIMIT 1 walks
// the index and skips the few superseded rows, where min() would have to consider them all.
std::vector<std::string> metric_keys_of(sqlite3* db, const std::string& path, int64_t run_id) {
  std::vector<std::string> out;
  Stmt first(db, path, "SELECT key FROM metrics WHERE run_id = ?1 AND superseded = 0 ORDER BY key LIMIT 1");
  first.bind(1, run_id);
  if (!first.step() || first.is_null(0)) return out;
  out.push_back(first.text(0));
  Stmt next(db, path,
            "SELECT key FROM metrics WHERE run_id = ?1 AND key > ?2 AND superseded = 0 ORDER BY key LIMIT 1");
  for (;;) {
    next.bind(1, run_id).bind(2, out.back());
    if (!next.step() || next.is_null(0)) break;
    std::string key = next.text(0);
    next.reset();
    out.push_back(std::move(key));
  }
  return out;
}

// max(step) per key is one index seek each; max(step) over the whole run would read every one of
// its rows, and list_runs runs every time the UI refreshes its run list.
int64_t last_step_of(sqlite3* db, const std::string& path, int64_t run_id) {
  int64_t last = 0;
  Stmt s(db, path,
         "SELECT step FROM metrics WHERE run_id = ?1 AND key = ?2 AND superseded = 0 ORDER BY step DESC LIMIT 1");
  for (const std::string& key : metric_keys_of(db, path, run_id)) {
    s.bind(1, run_id).bind(2, key);
    if (s.step()) last = std::max(last, s.i64(0));
    s.reset();
  }
  return last;
}

// Marks runs whose process is gone as 'interrupted' (see the file comment for the rules); returns
// how many.
int mark_interrupted(sqlite3* db, const std::string& path) {
  const std::string host = this_host();
  const std::string cutoff = utc_iso8601(std::time(nullptr) - HEARTBEAT_TIMEOUT_S);
  struct Dead {
    int64_t id;
    std::string message;
  };
  std::vector<Dead> dead;
  {
    Stmt s(db, path,
           "SELECT id, host, pid, COALESCE(heartbeat_at, started_at), proc_ns FROM runs "
           "WHERE status = 'running'");
    while (s.step()) {
      const int64_t id = s.i64(0), pid = s.i64(2);
      const std::string run_host = s.text(1), seen = s.text(3);
      const std::string who = "process " + std::to_string(pid) + " on " + run_host;
      const Liveness live = process_liveness(run_host, pid, s.text(4));
      if (live == Liveness::Dead) {
        dead.push_back({id, who + " ended without closing the run"});
      } else if (live == Liveness::Unknown && !seen.empty() && seen < cutoff) {
        dead.push_back({id, "no heartbeat from " + who + " since " + seen});
      }
    }
  }
  if (dead.empty()) return 0;
  Transaction tx(db, path);
  Stmt u(db, path,
         "UPDATE runs SET status = 'interrupted', ended_at = ?1, message = ?2 "
         "WHERE id = ?3 AND status = 'running'");
  const std::string now = now_utc();
  for (const Dead& d : dead) u.bind(1, now).bind(2, d.message).bind(3, d.id).run();
  tx.commit();
  return static_cast<int>(dead.size());
}

}  // namespace

std::string utc_iso8601(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string now_utc() { return utc_iso8601(std::time(nullptr)); }

std::string this_host() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

bool SqliteError::may_pass() const { return code_ == SQLITE_BUSY || code_ == SQLITE_LOCKED; }

std::string this_process_namespace() {
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) boot = buf;
    std::fclose(f);
  }
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  char ns[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (boot.empty() || n <= 0) return "";
  return boot + " " + std::string(ns, static_cast<size_t>(n));
}

Liveness process_liveness(const std::string& host, int64_t pid, const std::string& proc_ns) {
  if (pid <= 0 || host != this_host()) return Liveness::Unknown;
  if (!proc_ns.empty() && proc_ns != this_process_namespace()) return Liveness::Unknown;
  // EPERM means the pid exists but is someone else's: alive, as far as we can tell.
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return Liveness::Dead;
  return Liveness::Alive;
}

std::string still_running(const RunSummary& run) {
  if (run.status != "running") return "";
  const std::string who = "pid " + std::to_string(run.pid) + " on " + run.host;
  switch (process_liveness(run.host, run.pid, run.proc_ns)) {
    case Liveness::Alive: return "is still running (" + who + ")";
    case Liveness::Dead: return "";
    case Liveness::Unknown: break;
  }
  // Another machine or container: only its heartbeat tells. ISO 8601 UTC stamps compare as text.
  if (run.heartbeat_at.empty() || run.heartbeat_at < utc_iso8601(std::time(nullptr) - RUN_QUIET_S)) return "";
  return "may still be running (" + who + ", last heartbeat " + run.heartbeat_at + "); a run whose process is gone "
         "is taken as ended " + std::to_string(RUN_QUIET_S) + " s after its last heartbeat";
}

const char* network_filesystem_name(long f_type) {
  // statfs(2) magic numbers (linux/magic.h and the file systems' own headers).
  switch (static_cast<unsigned long>(f_type) & 0xffffffffUL) {
    case 0x6969UL: return "NFS";
    case 0x517BUL: return "SMB";
    case 0xFF534D42UL: return "CIFS";
    case 0xFE534D42UL: return "SMB2";
    case 0x01021997UL: return "9P";
    case 0x65735546UL: return "FUSE";
    case 0x5346414FUL: return "AFS";
    case 0x00C36400UL: return "Ceph";
    case 0x0BD00BD0UL: return "Lustre";
    case 0x47504653UL: return "GPFS";
    case 0x013111A8UL: return "IBRIX";
    case 0x564C0000UL: return "NCP";
    case 0x73717368UL: return "CODA";
    default: return nullptr;
  }
}

std::string network_filesystem_problem(const std::string& path) {
  if (path.empty() || path == ":memory:") return "";
  if (const char* allow = std::getenv("DELTADECK_ALLOW_NETWORK_DB"); allow && std::string(allow) == "1") return "";
  // The database's folder (the file may not exist yet); the nearest existing ancestor.
  std::string dir = files::parent_dir(path);
  if (dir.empty()) dir = ".";
  while (!files::is_dir(dir) && dir != "/" && dir != ".") {
    const std::string up = files::parent_dir(dir);
    dir = up.empty() ? "." : up;
  }
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return "";
  const char* fs = network_filesystem_name(static_cast<long>(st.f_type));
  if (!fs) return "";
  return path + ": the folder " + dir + " is on a " + fs +
         " file system; the run database uses SQLite's WAL mode, which needs shared memory between the "
         "processes that open it, and network file systems do not provide it (readers could see a torn "
         "database). Put --runs-dir (run.runs_dir) on a local disk; a multi-node run puts its checkpoints "
         "where every node sees them with run.checkpoint_dir (e.g. --set run.checkpoint_dir=/shared/ckpt), and "
         "the run's record kept there lets a later job with a new runs folder --resume it. "
         "DELTADECK_ALLOW_NETWORK_DB=1 skips this check, at your own risk (only node 0 opens the database, but "
         "a reader on another machine while the run writes could see it torn)";
}

std::unique_ptr<RunStore> RunStore::open(const std::string& path, bool read_only) {
  const bool in_memory = path == ":memory:";
  if (const std::string problem = network_filesystem_problem(path); !problem.empty())
    throw std::runtime_error(problem);
  if (!in_memory && !read_only) {
    const std::string parent = files::parent_dir(path);
    if (!parent.empty()) files::make_dirs(parent);
  }
  sqlite3* db = nullptr;
  const int flags = read_only ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    throw std::runtime_error(path + ": open: " + msg +
                             (read_only ? " (read-only open needs an existing database)" : ""));
  }
  // From here the RunStore owns db, so a throw below closes it.
  std::unique_ptr<RunStore> store(new RunStore(db, path, read_only));
  sqlite3_busy_timeout(db, 5000);
  exec(db, path, "PRAGMA foreign_keys = ON");
  if (!read_only) {
    // WAL lets the UI's readers read while the writer thread commits. FULL syncs the WAL at every
    // commit: a checkpoint is fsynced before it counts, and the metric rows committed before it
    // (MetricsWriter::flush) must survive a power loss with it, or a resume from it leaves a gap
    // it never fills (NORMAL syncs only at WAL checkpoints). The cost, one fsync a commit, falls
    // on the storage thread, which commits at most every 50 ms.
    exec(db, path, "PRAGMA journal_mode = WAL");
    exec(db, path, "PRAGMA synchronous = FULL");
    // Automatic checkpoints stay on (every 1000 pages); after one, the WAL file is cut back to
    // 64 MiB, so a burst of writes while a reader held an old snapshot does not leave it large.
    exec(db, path, "PRAGMA journal_size_limit = 67108864");
    migrate(db, SCHEMA_VERSION);
    if (!in_memory) {
      try {
        store->recover_renames();
      } catch (const std::exception&) {
        // Another writer held the lock past the busy timeout: the next open tries again.
      }
    }
  }
  const int version = store->schema_version();
  if (version != SCHEMA_VERSION) {
    throw std::runtime_error(
        path + ": schema version " + std::to_string(version) + ", this program reads version " +
        std::to_string(SCHEMA_VERSION) +
        (version > SCHEMA_VERSION ? " (written by a newer deltadeck)"
                                  : " (open it once read-write to migrate it)"));
  }
  if (!read_only) mark_interrupted(db, path);
  return store;
}

std::unique_ptr<RunStore> RunStore::open_for_display(const std::string& path) {
  if (access(path.c_str(), W_OK) == 0) {
    try {
      open(path);
    } catch (const std::exception&) {
      // Read it as it is: the read-only open below reports what stops it, if anything does.
    }
  }
  return open(path, /*read_only=*/true);
}

int RunStore::mark_dead_runs() {
  if (read_only_) throw std::runtime_error(path_ + ": opened read-only, cannot mark runs interrupted");
  return mark_interrupted(db_, path_);
}

RunStore::RunStore(sqlite3* db, std::string path, bool read_only)
    : db_(db), path_(std::move(path)), read_only_(read_only) {}

RunStore::~RunStore() { sqlite3_close_v2(db_); }

int64_t RunStore::create_run(const NewRun& r) {
  const std::string base = r.name.empty() ? "run" : r.name;
  // IMMEDIATE makes the name check and the insert atomic against another process doing the same.
  Transaction tx(db_, path_);
  std::string name = base;
  // A run's folder is <runs dir>/<name>, beside the database. A folder of that name left behind
  // (a delete cut short, files it could not remove) takes the name too: pruning and --resume trust
  // the checkpoints on disk, and would take the old run's for the new one's.
  const std::string runs_dir = path_ == ":memory:" ? "" : runs_folder();
  {
    Stmt taken(db_, path_, "SELECT 1 FROM runs WHERE name = ?1");
    for (int64_t n = 2;; ++n) {
      taken.bind(1, name);
      const bool exists = taken.step() || (!runs_dir.empty() && files::exists(runs_dir + "/" + name)) ||
                          (!r.checkpoint_dir.empty() && files::exists(r.checkpoint_dir + "/" + name));
      taken.reset();
      if (!exists) break;
      name = base + "-" + std::to_string(n);
    }
  }
  const std::string now = now_utc();
  Stmt s(db_, path_,
         "INSERT INTO runs(name, status, model, config_toml, config_json, host, pid, params, "
         "world_size, revision, started_at, heartbeat_at, proc_ns) "
         "VALUES(?1, 'running', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11)");
  s.bind(1, name)
      .bind_or_null(2, r.model)
      .bind(3, r.config_toml)
      .bind(4, r.config_json)
      .bind(5, this_host())
      .bind(6, static_cast<int64_t>(getpid()))
      .bind(7, r.params)
      .bind(8, r.world_size)
      .bind_or_null(9, r.revision)
      .bind(10, now)
      .bind_or_null(11, this_process_namespace())
      .run();
  const int64_t id = sqlite3_last_insert_rowid(db_);
  tx.commit();
  return id;
}

namespace {

// REPLACE: saving the same step again (after a resume) overwrites the file, so the row follows.
constexpr const char* kInsertCheckpoint =
    "INSERT OR REPLACE INTO checkpoints(run_id, step, path, bytes, sha256, created_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6)";
constexpr const char* kInsertEvent = "INSERT INTO events(run_id, step, level, text, created_at) VALUES(?1, ?2, ?3, ?4, ?5)";

// One row of run_id through a statement of kInsertCheckpoint / kInsertEvent; an empty created_at is now.
void insert_checkpoint(Stmt& s, int64_t run_id, const CheckpointRecord& c) {
  s.bind(1, run_id)
      .bind(2, c.step)
      .bind(3, c.path)
      .bind(4, c.bytes)
      .bind_or_null(5, c.sha256)
      .bind(6, c.created_at.empty() ? now_utc() : c.created_at)
      .run();
}
void insert_event(Stmt& s, int64_t run_id, const EventRecord& e) {
  s.bind(1, run_id)
      .bind(2, e.step)
      .bind(3, e.level.empty() ? std::string("info") : e.level)
      .bind(4, e.text)
      .bind(5, e.created_at.empty() ? now_utc() : e.created_at)
      .run();
}

}  // namespace

int64_t RunStore::import_run(const ImportedRun& r, int64_t replace_id) {
  const RunSummary& rec = r.record;
  const std::string what = path_ + ": import of run '" + rec.name + "': ";
  if (const std::string why = run_name_problem(rec.name); !why.empty()) throw std::runtime_error(what + "the name " + why);
  if (rec.status == "running" ||
      std::find(std::begin(STATUSES), std::end(STATUSES), rec.status) == std::end(STATUSES)) {
    throw std::runtime_error(what + "status '" + rec.status +
                             "' is not one of finished, stopped, failed, interrupted, preempted, diverged");
  }
  for (const std::string& tag : rec.tags) {
    if (const std::string why = tag_problem(tag); !why.empty()) throw std::runtime_error(what + "tag '" + tag + "' " + why);
  }
  Transaction tx(db_, path_);
  {
    Stmt taken(db_, path_, "SELECT id FROM runs WHERE name = ?1");
    taken.bind(1, rec.name);
    if (taken.step() && taken.i64(0) != replace_id) {
      throw std::runtime_error(what + "this database already has a run of that name (id " +
                               std::to_string(taken.i64(0)) + ")");
    }
  }
  if (replace_id != 0) {
    // The older copy's rows (metrics, checkpoints, events, tags follow by ON DELETE CASCADE).
    Stmt(db_, path_, "DELETE FROM runs WHERE id = ?1 AND status != 'running'").bind(1, replace_id).run();
    if (sqlite3_changes(db_) == 0)
      throw std::runtime_error(what + "the run it replaces (id " + std::to_string(replace_id) + ") is gone or running");
  }
  Stmt run(db_, path_,
           "INSERT INTO runs(name, status, model, config_toml, config_json, host, pid, params, world_size, revision, "
           "started_at, heartbeat_at, ended_at, message, note, imported_from) "
           "VALUES(?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)");
  run.bind(1, rec.name)
      .bind(2, rec.status)
      .bind_or_null(3, rec.model)
      .bind(4, r.config_toml)
      .bind(5, r.config_json)
      .bind_or_null(6, rec.host)
      .bind(7, rec.params)
      .bind(8, rec.world_size)
      .bind_or_null(9, rec.revision)
      .bind_or_null(10, rec.started_at)
      .bind_or_null(11, rec.heartbeat_at.empty() ? rec.started_at : rec.heartbeat_at)
      .bind_or_null(12, rec.ended_at)
      .bind_or_null(13, rec.message)
      .bind_or_null(14, rec.note)
      .bind(15, r.imported_from.empty() ? std::string("(unnamed record)") : r.imported_from)
      .run();
  const int64_t id = sqlite3_last_insert_rowid(db_);
  {
    Stmt m(db_, path_, "INSERT INTO metrics(run_id, step, tokens, wall_s, key, value) VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
    for (const MetricPoint& p : r.metrics)
      m.bind(1, id).bind(2, p.step).bind(3, p.tokens).bind(4, p.wall_s).bind(5, p.key).bind(6, p.value).run();
  }
  {
    Stmt c(db_, path_, kInsertCheckpoint);
    for (const CheckpointRecord& k : r.checkpoints) insert_checkpoint(c, id, k);
  }
  {
    Stmt e(db_, path_, kInsertEvent);
    for (const EventRecord& ev : r.events) insert_event(e, id, ev);
  }
  {
    Stmt t(db_, path_, "INSERT OR IGNORE INTO tags(run_id, tag) VALUES(?1, ?2)");
    for (const std::string& tag : rec.tags) t.bind(1, id).bind(2, tag).run();
  }
  tx.commit();
  return id;
}

void RunStore::finish_run(int64_t run_id, const std::string& status, const std::string& message) {
  if (status == "running" ||
      std::find(std::begin(STATUSES), std::end(STATUSES), status) == std::end(STATUSES)) {
    throw std::runtime_error(path_ + ": finish_run: status '" + status +
                             "' is not one of finished, stopped, failed, interrupted, preempted, diverged");
  }
  Transaction tx(db_, path_);
  Stmt s(db_, path_, "UPDATE runs SET status = ?1, ended_at = ?2, message = ?3 WHERE id = ?4");
  s.bind(1, status).bind(2, now_utc()).bind_or_null(3, message).bind(4, run_id).run();
  if (sqlite3_changes(db_) == 0) {
    throw std::runtime_error(path_ + ": finish_run: no run with id " + std::to_string(run_id));
  }
  tx.commit();
}

void RunStore::reopen_run(int64_t run_id) {
  const std::string now = now_utc();
  Transaction tx(db_, path_);
  Stmt s(db_, path_,
         "UPDATE runs SET status = 'running', ended_at = NULL, message = NULL, host = ?1, "
         "pid = ?2, heartbeat_at = ?3, proc_ns = ?5, imported_from = NULL WHERE id = ?4");
  s.bind(1, this_host()).bind(2, static_cast<int64_t>(getpid())).bind(3, now).bind(4, run_id);
  s.bind_or_null(5, this_process_namespace()).run();
  if (sqlite3_changes(db_) == 0) {
    throw std::runtime_error(path_ + ": reopen_run: no run with id " + std::to_string(run_id));
  }
  tx.commit();
}

void RunStore::heartbeat(int64_t run_id) {
  Stmt s(db_, path_, "UPDATE runs SET heartbeat_at = ?1 WHERE id = ?2 AND status = 'running'");
  s.bind(1, now_utc()).bind(2, run_id).run();
}

void RunStore::insert_metrics(const std::vector<MetricRow>& rows) {
  if (rows.empty()) return;
  Transaction tx(db_, path_);
  std::set<int64_t> runs;
  {
    Stmt s(db_, path_,
           "INSERT INTO metrics(run_id, step, tokens, wall_s, key, value) "
           "VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
    for (const MetricRow& r : rows) {
      s.bind(1, r.run_id)
          .bind(2, r.point.step)
          .bind(3, r.point.tokens)
          .bind(4, r.point.wall_s)
          .bind(5, r.point.key)
          .bind(6, r.point.value)
          .run();
      runs.insert(r.run_id);
    }
  }
  // The heartbeat that tells other hosts this run is alive (see mark_interrupted).
  Stmt hb(db_, path_, "UPDATE runs SET heartbeat_at = ?1 WHERE id = ?2");
  const std::string now = now_utc();
  for (int64_t id : runs) hb.bind(1, now).bind(2, id).run();
  tx.commit();
}

void RunStore::add_checkpoint(const CheckpointRecord& c) {
  Transaction tx(db_, path_);
  Stmt s(db_, path_, kInsertCheckpoint);
  insert_checkpoint(s, c.run_id, c);
  tx.commit();
}

void RunStore::remove_checkpoint(int64_t run_id, int64_t step) {
  Transaction tx(db_, path_);
  Stmt s(db_, path_, "DELETE FROM checkpoints WHERE run_id = ?1 AND step = ?2");
  s.bind(1, run_id).bind(2, step).run();
  tx.commit();
}

int64_t RunStore::supersede_metrics_after(int64_t run_id, int64_t step) {
  Transaction tx(db_, path_);
  Stmt s(db_, path_, "UPDATE metrics SET superseded = 1 WHERE run_id = ?1 AND step > ?2 AND superseded = 0");
  s.bind(1, run_id).bind(2, step).run();
  const int64_t n = sqlite3_changes(db_);
  tx.commit();
  return n;
}

void RunStore::add_event(const EventRecord& e) {
  Transaction tx(db_, path_);
  Stmt s(db_, path_, kInsertEvent);
  insert_event(s, e.run_id, e);
  tx.commit();
}

std::vector<RunSummary> RunStore::list_runs(const RunFilter& filter) const {
  if (!filter.status.empty() &&
      std::find(std::begin(STATUSES), std::end(STATUSES), filter.status) == std::end(STATUSES)) {
    throw std::runtime_error("status '" + filter.status +
                             "' is not one of running, finished, stopped, failed, interrupted, preempted, diverged");
  }
  std::vector<RunSummary> out;
  {
    Stmt s(db_, path_,
           (std::string(SUMMARY_COLUMNS) +
            " WHERE (?1 = '' OR status = ?1)"
            " AND (?2 = '' OR id IN (SELECT run_id FROM tags WHERE tag = ?2)) ORDER BY id")
               .c_str());
    s.bind(1, filter.status).bind(2, filter.tag);
    while (s.step()) out.push_back(read_summary(s));
  }
  for (RunSummary& r : out) {
    r.last_step = last_step_of(db_, path_, r.id);
    r.tags = tags_of(db_, path_, r.id);
  }
  return out;
}

std::optional<RunSummary> RunStore::run(int64_t run_id) const {
  Stmt s(db_, path_, (std::string(SUMMARY_COLUMNS) + " WHERE id = ?1").c_str());
  s.bind(1, run_id);
  if (!s.step()) return std::nullopt;
  RunSummary r = read_summary(s);
  r.last_step = last_step_of(db_, path_, run_id);
  r.tags = tags_of(db_, path_, run_id);
  return r;
}

std::string RunStore::run_dir(const std::string& name) const {
  const std::string parent = files::parent_dir(path_);
  return parent.empty() ? name : parent + "/" + name;
}

std::string RunStore::runs_folder() const {
  const std::string parent = files::parent_dir(path_);
  return parent.empty() ? "." : parent;
}

RunSummary RunStore::summary_or_throw(int64_t run_id, const char* what) const {
  auto r = run(run_id);
  if (!r) throw std::runtime_error(path_ + ": " + what + ": no run with id " + std::to_string(run_id));
  return *r;
}

void RunStore::rename_run(int64_t run_id, const std::string& new_name) {
  const RunSummary r = summary_or_throw(run_id, "rename");
  if (const std::string why = run_name_problem(new_name); !why.empty()) {
    throw std::runtime_error("new name '" + new_name + "' " + why);
  }
  if (r.name == new_name) return;
  if (r.status == "running") {
    throw std::runtime_error("run '" + r.name + "' is running (pid " + std::to_string(r.pid) + " on " + r.host +
                             "); rename it after it ends");
  }
  // A folder under run.checkpoint_dir would have to move on another file system, where another
  // database's run may hold the new name: the rename refuses rather than strand its checkpoints.
  if (const std::string cd = recorded_checkpoint_dir(run_config_json(run_id)); !cd.empty())
    throw std::runtime_error("run '" + r.name + "' keeps its checkpoints in " + cd + "/" + r.name +
                             " (run.checkpoint_dir), outside the runs folder; such a run keeps its name");
  Transaction tx(db_, path_);
  {
    Stmt taken(db_, path_, "SELECT id FROM runs WHERE name = ?1");
    taken.bind(1, new_name);
    if (taken.step()) {
      throw std::runtime_error("name '" + new_name + "' is taken by run " + std::to_string(taken.i64(0)));
    }
  }
  // The status again inside the transaction: a resume may have reopened the run since.
  Stmt(db_, path_, "UPDATE runs SET name = ?1 WHERE id = ?2 AND status != 'running'")
      .bind(1, new_name)
      .bind(2, run_id)
      .run();
  if (sqlite3_changes(db_) == 0)
    throw std::runtime_error("run '" + r.name + "' started running again (a resume); rename it after it ends");
  {
    Stmt u(db_, path_, "UPDATE checkpoints SET path = ?1 WHERE run_id = ?2 AND step = ?3");
    for (const CheckpointRecord& c : checkpoints(run_id)) {
      const std::string moved = with_run_folder(c.path, r.name, new_name);
      if (moved != c.path) u.bind(1, moved).bind(2, run_id).bind(3, c.step).run();
    }
  }
  // The folder moves before the commit, so a failed move leaves the rows as they were; a failed
  // commit moves it back.
  const bool on_disk = path_ != ":memory:";
  const std::string old_dir = run_dir(r.name), new_dir = run_dir(new_name);
  bool moved = false;
  if (on_disk && files::is_dir(old_dir)) {
    if (files::exists(new_dir)) {
      throw std::runtime_error("cannot rename run '" + r.name + "': " + new_dir + " already exists");
    }
    // The journal first: a crash after the move and before the commit leaves the folder where the
    // row does not say, and the journal tells the next open where to move it back from.
    const std::string journal = rename_journal(run_id);
    try {
      write_text_file(posix_io(), journal, old_dir + "\n" + new_dir + "\n");
      posix_io().fsync_dir(runs_folder());
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot rename run '" + r.name + "': " + e.what());
    }
    if (::rename(old_dir.c_str(), new_dir.c_str()) != 0) {
      const std::string why = errno_text();
      std::remove(journal.c_str());
      throw std::runtime_error("cannot move " + old_dir + " to " + new_dir + " (" + why + ")");
    }
    moved = true;
  }
  try {
    tx.commit();
  } catch (...) {
    if (moved) ::rename(new_dir.c_str(), old_dir.c_str());
    if (moved) std::remove(rename_journal(run_id).c_str());
    throw;
  }
  if (moved) std::remove(rename_journal(run_id).c_str());
  if (!on_disk) return;
  // Node logs of a multi-node run (<name>.node<K>.log) are only logs: moved if possible.
  const std::string folder = runs_folder();
  const std::string prefix = r.name + ".node";
  for (const std::string& f : files::list_dir(folder)) {
    if (f.rfind(prefix, 0) != 0 || f.size() <= prefix.size() + 4 || f.substr(f.size() - 4) != ".log") continue;
    const std::string digits = f.substr(prefix.size(), f.size() - prefix.size() - 4);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    ::rename((folder + "/" + f).c_str(), (folder + "/" + new_name + ".node" + digits + ".log").c_str());
  }
}

std::string RunStore::rename_journal(int64_t run_id) const { return run_dir(".rename-" + std::to_string(run_id)); }

void RunStore::recover_renames() {
  const std::string prefix = ".rename-";
  for (const std::string& f : files::list_dir(runs_folder())) {
    if (f.rfind(prefix, 0) != 0 || f.size() == prefix.size() ||
        f.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
      continue;
    const int64_t run_id = std::stoll(f.substr(prefix.size()));
    const std::string journal = rename_journal(run_id);
    std::string old_dir, new_dir;
    {
      std::ifstream j(journal);
      std::getline(j, old_dir);
      std::getline(j, new_dir);
    }
    // Under the write lock: a rename in progress in another process holds it until its commit.
    Transaction tx(db_, path_);
    const auto r = run(run_id);
    if (r && !old_dir.empty() && run_dir(r->name) == old_dir && !files::exists(old_dir) && files::is_dir(new_dir))
      ::rename(new_dir.c_str(), old_dir.c_str());
    tx.commit();
    std::remove(journal.c_str());
  }
}

void RunStore::set_note(int64_t run_id, const std::string& note) {
  summary_or_throw(run_id, "note");
  Transaction tx(db_, path_);
  Stmt(db_, path_, "UPDATE runs SET note = ?1 WHERE id = ?2").bind_or_null(1, note).bind(2, run_id).run();
  tx.commit();
}

bool RunStore::add_tag(int64_t run_id, const std::string& tag) {
  if (const std::string why = tag_problem(tag); !why.empty()) {
    throw std::runtime_error("tag '" + tag + "' " + why);
  }
  summary_or_throw(run_id, "tag");
  Transaction tx(db_, path_);
  Stmt(db_, path_, "INSERT OR IGNORE INTO tags(run_id, tag) VALUES(?1, ?2)").bind(1, run_id).bind(2, tag).run();
  const bool added = sqlite3_changes(db_) > 0;
  tx.commit();
  return added;
}

bool RunStore::remove_tag(int64_t run_id, const std::string& tag) {
  summary_or_throw(run_id, "untag");
  Transaction tx(db_, path_);
  Stmt(db_, path_, "DELETE FROM tags WHERE run_id = ?1 AND tag = ?2").bind(1, run_id).bind(2, tag).run();
  const bool removed = sqlite3_changes(db_) > 0;
  tx.commit();
  return removed;
}

std::vector<std::string> RunStore::tags(int64_t run_id) const { return tags_of(db_, path_, run_id); }

std::string RunStore::imported_from(int64_t run_id) const {
  Stmt s(db_, path_, "SELECT imported_from FROM runs WHERE id = ?1");
  s.bind(1, run_id);
  return s.step() ? s.text(0) : std::string();
}

DeletedRun RunStore::delete_run(int64_t run_id) {
  const RunSummary r = summary_or_throw(run_id, "delete");
  if (r.status == "running") {
    throw std::runtime_error("run '" + r.name + "' is running (pid " + std::to_string(r.pid) + " on " + r.host +
                             "); stop it before deleting it");
  }
  const std::vector<CheckpointRecord> cks = checkpoints(run_id);
  const std::string checkpoint_dir = recorded_checkpoint_dir(run_config_json(run_id));
  const std::string from = imported_from(run_id);
  {
    // Rows first: the database is the index of what exists, so a crash below leaves stray files
    // (listed nowhere, harmless) rather than rows pointing at deleted checkpoints.
    Transaction tx(db_, path_);
    // The status again inside the transaction: a resume may have reopened the run since.
    Stmt(db_, path_, "DELETE FROM runs WHERE id = ?1 AND status != 'running'").bind(1, run_id).run();
    if (sqlite3_changes(db_) == 0)
      throw std::runtime_error("run '" + r.name + "' started running again (a resume); stop it before deleting it");
    tx.commit();
  }
  DeletedRun out;
  out.name = r.name;
  if (!from.empty()) {
    // Brought from another database and not resumed here: its checkpoints are the other's.
    out.kept.push_back("its checkpoints and folder (the run was imported from " + from +
                       "; they belong to the database it came from)");
    return out;
  }
  if (path_ == ":memory:") return out;
  auto remove = [&](const std::string& p) {
    if (files::remove_tree(p)) out.removed.push_back(p);
    else out.kept.push_back(p + " (could not be removed: " + errno_text() + ")");
  };
  // Recorded checkpoints, wherever the recording process put them; only step_* directories, so a
  // hand-edited row can never point the deletion at anything else.
  for (const CheckpointRecord& c : cks) {
    const size_t slash = c.path.find_last_of('/');
    const std::string base = slash == std::string::npos ? c.path : c.path.substr(slash + 1);
    if (base.rfind("step_", 0) == 0 && files::is_dir(c.path)) remove(c.path);
  }
  // The run's own folder: its checkpoints folder (older, pruned and half-written step_* dirs
  // included), its record (RUN_RECORD_FILE, its RUN_METRICS_PREFIX files) and a stale owner file (RUN_OWNER_FILE; the caller
  // checked no process holds the run), then the folders themselves when nothing else is in them. Likewise the run's folder
  // under the run.checkpoint_dir its recorded config names.
  std::vector<std::string> dirs{run_dir(r.name)};
  if (!checkpoint_dir.empty()) dirs.push_back(checkpoint_dir + "/" + r.name);
  for (const std::string& dir : dirs) {
    const std::string ckdir = dir + "/checkpoints";
    for (const std::string& f : files::list_dir(ckdir)) {
      if (f.rfind("step_", 0) == 0) remove(ckdir + "/" + f);
    }
    for (const std::string& f : files::list_dir(dir)) {
      for (const std::string record : {RUN_RECORD_FILE, RUN_OWNER_FILE}) {
        if (f == record || f.rfind(record + ".tmp", 0) == 0) remove(dir + "/" + f);
      }
      if (f.rfind(RUN_METRICS_PREFIX, 0) == 0) remove(dir + "/" + f);
    }
    for (const std::string& d : {ckdir, dir}) {
      if (!files::is_dir(d)) continue;
      if (::rmdir(d.c_str()) == 0) out.removed.push_back(d);
      else out.kept.push_back(d + " (holds other files)");
    }
  }
  return out;
}

RunSummary RunStore::find_run(const std::string& id_or_name) const {
  int64_t id = 0;
  if (parse_id(id_or_name, &id)) {
    if (auto r = run(id)) {
      // A run may be named "7" while another has the id 7: say so rather than pick one.
      Stmt named(db_, path_, "SELECT id FROM runs WHERE name = ?1 AND id != ?2");
      named.bind(1, id_or_name).bind(2, id);
      if (named.step()) {
        throw std::runtime_error(path_ + ": run '" + id_or_name + "' is ambiguous: the id of run '" + r->name +
                                 "' and the name of run " + std::to_string(named.i64(0)) +
                                 " (name either by its id)");
      }
      return *r;
    }
  }
  std::vector<std::pair<int64_t, std::string>> matches;
  {
    Stmt s(db_, path_,
           "SELECT id, name FROM runs WHERE substr(name, 1, length(?1)) = ?1 ORDER BY id");
    s.bind(1, id_or_name);
    while (s.step()) matches.emplace_back(s.i64(0), s.text(1));
  }
  for (const auto& m : matches) {
    if (m.second == id_or_name) return *run(m.first);
  }
  if (matches.size() == 1) return *run(matches[0].first);
  std::vector<std::string> names;
  if (!matches.empty()) {
    for (const auto& m : matches) names.push_back(m.second);
    throw std::runtime_error(path_ + ": run '" + id_or_name + "' is ambiguous: " +
                             join_names(names));
  }
  // The newest runs are the likeliest targets of a typo, so those are the ones listed.
  Stmt s(db_, path_, "SELECT name FROM runs ORDER BY id DESC LIMIT ?1");
  s.bind(1, static_cast<int64_t>(MAX_CANDIDATES + 1));
  while (s.step()) names.push_back(s.text(0));
  if (names.empty()) {
    throw std::runtime_error(path_ + ": no run named '" + id_or_name +
                             "'; the database has no runs");
  }
  const bool more = names.size() > MAX_CANDIDATES;
  if (more) names.pop_back();
  std::reverse(names.begin(), names.end());
  throw std::runtime_error(path_ + ": no run named '" + id_or_name + "'; runs: " +
                           (more ? "..., " : "") + join_names(names));
}

void RunStore::update_run_config(int64_t run_id, const std::string& config_toml, const std::string& config_json) {
  Transaction tx(db_, path_);
  Stmt s(db_, path_, "UPDATE runs SET config_toml = ?1, config_json = ?2 WHERE id = ?3");
  s.bind(1, config_toml).bind(2, config_json).bind(3, run_id).run();
  if (sqlite3_changes(db_) == 0) {
    throw std::runtime_error(path_ + ": update_run_config: no run with id " + std::to_string(run_id));
  }
  tx.commit();
}

std::string RunStore::run_config_toml(int64_t run_id) const {
  Stmt s(db_, path_, "SELECT config_toml FROM runs WHERE id = ?1");
  s.bind(1, run_id);
  if (!s.step()) throw std::runtime_error(path_ + ": no run with id " + std::to_string(run_id));
  return s.text(0);
}

std::string RunStore::run_config_json(int64_t run_id) const {
  Stmt s(db_, path_, "SELECT config_json FROM runs WHERE id = ?1");
  s.bind(1, run_id);
  if (!s.step()) throw std::runtime_error(path_ + ": no run with id " + std::to_string(run_id));
  return s.text(0);
}

namespace {

// The metric point in columns first.. of a row: step, tokens, wall_s, key, value.
MetricPoint metric_point(const Stmt& s, int first) {
  MetricPoint p;
  p.step = s.i64(first);
  p.tokens = s.i64(first + 1);
  p.wall_s = s.f64(first + 2);
  p.key = s.text(first + 3);
  // SQLite stores a NaN as NULL: a non-finite loss comes back as NaN, not as 0.
  p.value = s.is_null(first + 4) ? std::numeric_limits<double>::quiet_NaN() : s.f64(first + 4);
  return p;
}

}  // namespace

std::vector<MetricPoint> RunStore::metrics(int64_t run_id, const std::string& key) const {
  std::vector<MetricPoint> out;
  // rowid breaks ties so repeated steps (a resumed run) come back in the order they were written.
  Stmt s(db_, path_,
         key.empty() ? "SELECT step, tokens, wall_s, key, value FROM metrics WHERE run_id = ?1 AND superseded = 0 "
                       "ORDER BY step, key, rowid"
                     : "SELECT step, tokens, wall_s, key, value FROM metrics "
                       "WHERE run_id = ?1 AND key = ?2 AND superseded = 0 ORDER BY step, rowid");
  s.bind(1, run_id);
  if (!key.empty()) s.bind(2, key);
  while (s.step()) out.push_back(metric_point(s, 0));
  return out;
}

std::vector<MetricPoint> RunStore::metrics_logged_after(int64_t run_id, int64_t after_row, int64_t* last_row) const {
  std::vector<MetricPoint> out;
  *last_row = after_row;
  // From a row on, the rows after it are the newest of the table: walked by rowid ("+run_id" keeps
  // SQLite from choosing the (run_id, key, step) index, which would read and sort every row of the
  // run: 0.1 s a save at a million rows). From the start, that index finds the run's rows.
  Stmt s(db_, path_,
         after_row > 0 ? "SELECT rowid, step, tokens, wall_s, key, value FROM metrics "
                         "WHERE rowid > ?2 AND +run_id = ?1 AND superseded = 0 ORDER BY rowid"
                       : "SELECT rowid, step, tokens, wall_s, key, value FROM metrics "
                         "WHERE run_id = ?1 AND superseded = 0 AND rowid > ?2 ORDER BY rowid");
  s.bind(1, run_id);
  s.bind(2, after_row);
  while (s.step()) {
    *last_row = s.i64(0);
    out.push_back(metric_point(s, 1));
  }
  return out;
}

std::vector<std::string> RunStore::metric_keys(int64_t run_id) const {
  return metric_keys_of(db_, path_, run_id);
}

std::vector<CheckpointRecord> RunStore::checkpoints(int64_t run_id) const {
  std::vector<CheckpointRecord> out;
  Stmt s(db_, path_,
         "SELECT run_id, step, path, bytes, sha256, created_at FROM checkpoints "
         "WHERE run_id = ?1 ORDER BY step");
  s.bind(1, run_id);
  while (s.step()) {
    CheckpointRecord c;
    c.run_id = s.i64(0);
    c.step = s.i64(1);
    c.path = s.text(2);
    c.bytes = s.i64(3);
    c.sha256 = s.text(4);
    c.created_at = s.text(5);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<EventRecord> RunStore::events(int64_t run_id) const {
  std::vector<EventRecord> out;
  Stmt s(db_, path_,
         "SELECT run_id, step, level, text, created_at FROM events WHERE run_id = ?1 ORDER BY id");
  s.bind(1, run_id);
  while (s.step()) {
    EventRecord e;
    e.run_id = s.i64(0);
    e.step = s.i64(1);
    e.level = s.text(2);
    e.text = s.text(3);
    e.created_at = s.text(4);
    out.push_back(std::move(e));
  }
  return out;
}

std::string RunStore::integrity_check() const {
  Stmt s(db_, path_, "PRAGMA integrity_check");
  return s.step() ? s.text(0) : std::string();
}

bool RunStore::commits_are_synced() const {
  Stmt s(db_, path_, "PRAGMA synchronous");
  return s.step() && s.i64(0) >= 2;  // 2 = FULL, 3 = EXTRA
}

int RunStore::schema_version() const {
  Stmt s(db_, path_, "PRAGMA user_version");
  return s.step() ? static_cast<int>(s.i64(0)) : 0;
}

}  // namespace storage
