#include "storage/run_queries.h"

#include <sqlite3.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace storage {

namespace {

[[noreturn]] void fail(sqlite3* db, const std::string& what) {
  const char* file = sqlite3_db_filename(db, "main");
  throw std::runtime_error(std::string(file ? file : "?") + ": " + what + ": " + sqlite3_errmsg(db));
}

// A prepared statement finalized on scope exit.
struct Query {
  Query(sqlite3* db, const char* sql) : db(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) fail(db, std::string("preparing ") + sql);
  }
  ~Query() { sqlite3_finalize(st); }
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;
  bool step() {
    const int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail(db, std::string("running ") + sqlite3_sql(st));
  }
  void bind(int i, int64_t v) { sqlite3_bind_int64(st, i, v); }
  void bind(int i, const char* v) { sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC); }
  int64_t i64(int c) const { return sqlite3_column_int64(st, c); }
  double f64(int c) const { return sqlite3_column_double(st, c); }
  bool null(int c) const { return sqlite3_column_type(st, c) == SQLITE_NULL; }
  std::string text(int c) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st, c));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(st, c))) : std::string();
  }
  sqlite3* db;
  sqlite3_stmt* st = nullptr;
};

}  // namespace

void ReadConnectionCloser::operator()(sqlite3* db) const { sqlite3_close_v2(db); }

ReadConnection open_read_connection(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    const std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    throw std::runtime_error(path + ": open read-only: " + msg);
  }
  // A writer checkpointing the WAL can hold a lock for a moment; wait rather than fail.
  sqlite3_busy_timeout(db, 2000);
  return ReadConnection(db);
}

int64_t data_version(sqlite3* db) {
  Query q(db, "PRAGMA data_version");
  return q.step() ? q.i64(0) : 0;
}

std::vector<MetricRowRead> metrics_after(sqlite3* db, int64_t run_id, int64_t after_rowid, int64_t limit) {
  // Rows are read along the table's own rowid b-tree (NOT INDEXED), from just after the last row
  // read: a poll of a live run touches only the rows written since, not every row of the run (the
  // (run_id, key, step) index would make SQLite visit all of them and sort by rowid, each poll).
  // A first read starts at the run's first row, found once through the index.
  int64_t from = after_rowid;
  if (from <= 0) {
    Query first(db, "SELECT min(rowid) FROM metrics WHERE run_id = ?1");
    first.bind(1, run_id);
    if (!first.step() || first.null(0)) return {};
    from = first.i64(0) - 1;
  }
  Query q(db,
          "SELECT rowid, step, tokens, wall_s, key, value FROM metrics NOT INDEXED "
          "WHERE rowid > ?2 AND run_id = ?1 AND superseded = 0 ORDER BY rowid LIMIT ?3");
  q.bind(1, run_id);
  q.bind(2, from);
  q.bind(3, limit);
  std::vector<MetricRowRead> out;
  while (q.step()) {
    MetricRowRead r;
    r.rowid = q.i64(0);
    r.point.step = q.i64(1);
    r.point.tokens = q.i64(2);
    r.point.wall_s = q.f64(3);
    r.point.key = q.text(4);
    r.point.value = q.null(5) ? std::numeric_limits<double>::quiet_NaN() : q.f64(5);
    out.push_back(std::move(r));
  }
  return out;
}

RunFigures run_figures(sqlite3* db, int64_t run_id) {
  RunFigures f;
  {
    Query q(db, "SELECT step, tokens, wall_s, value FROM metrics WHERE run_id = ?1 AND key = 'loss' "
                "AND superseded = 0 ORDER BY step DESC LIMIT 1");
    q.bind(1, run_id);
    if (q.step()) {
      f.has_loss = true;
      f.last_step = q.i64(0);
      f.tokens = q.i64(1);
      f.wall_s = q.f64(2);
      f.final_loss = q.null(3) ? std::numeric_limits<double>::quiet_NaN() : q.f64(3);  // NaN is stored as NULL
    }
  }
  {
    Query q(db, "SELECT min(value) FROM metrics WHERE run_id = ?1 AND key = 'val_loss' AND superseded = 0");
    q.bind(1, run_id);
    if (q.step() && !q.null(0)) {
      f.has_val = true;
      f.best_val_loss = q.f64(0);
    }
  }
  return f;
}

std::vector<std::pair<int64_t, std::string>> run_configs(sqlite3* db) {
  Query q(db, "SELECT id, config_json FROM runs ORDER BY id");
  std::vector<std::pair<int64_t, std::string>> out;
  while (q.step()) out.emplace_back(q.i64(0), q.text(1));
  return out;
}

int64_t export_metrics_csv(sqlite3* db, int64_t run_id, const std::string& path) {
  // The query first: one that cannot be prepared (a damaged file) leaves no empty file behind.
  Query q(db, "SELECT step, tokens, wall_s, key, value FROM metrics WHERE run_id = ?1 AND superseded = 0 "
              "ORDER BY key, step, rowid");
  q.bind(1, run_id);
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
  std::fputs("step,tokens,wall_s,key,value\n", f);
  int64_t rows = 0;
  try {
    while (q.step()) {
      // Keys are metric names (letters, digits, '.', '_'): no quoting needed. SQLite stores NaN
      // as NULL: written back as nan (a skipped step's loss is not 0).
      const double value = q.null(4) ? std::numeric_limits<double>::quiet_NaN() : q.f64(4);
      std::fprintf(f, "%lld,%lld,%.17g,%s,%.17g\n", static_cast<long long>(q.i64(0)),
                   static_cast<long long>(q.i64(1)), q.f64(2), q.text(3).c_str(), value);
      ++rows;
    }
  } catch (...) {
    std::fclose(f);
    throw;
  }
  if (std::fclose(f) != 0) throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
  return rows;
}

}  // namespace storage
