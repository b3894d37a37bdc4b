// The run database schema: one numbered function per version, applied in order by migrate().
// A migration is never edited once released; a change to the schema is a new migration_N, so a
// database written by any earlier release opens with its data intact (docs/schema.md lists them).
#include <sqlite3.h>

#include <stdexcept>
#include <string>

#include "storage/run_store.h"

namespace storage {
namespace {

[[noreturn]] void fail(sqlite3* db, const std::string& what) {
  const char* file = sqlite3_db_filename(db, "main");
  std::string path = (file && *file) ? file : ":memory:";
  throw std::runtime_error(path + ": " + what + ": " + sqlite3_errmsg(db));
}

void exec(sqlite3* db, const char* sql, const std::string& what) {
  if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) fail(db, what);
}

int user_version(sqlite3* db) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr) != SQLITE_OK) {
    fail(db, "reading the schema version");
  }
  int version = 0;
  if (sqlite3_step(st) == SQLITE_ROW) version = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  return version;
}

// Version 1: runs and their metrics, the first thing the program stored.
void migration_1(sqlite3* db) {
  exec(db, R"sql(
    CREATE TABLE runs(
      id          INTEGER PRIMARY KEY,
      name        TEXT UNIQUE NOT NULL,
      status      TEXT NOT NULL,
      model       TEXT,
      config_toml TEXT,
      config_json TEXT,
      host        TEXT,
      params      INTEGER,
      revision    TEXT,
      started_at  TEXT,
      ended_at    TEXT
    );
    CREATE TABLE metrics(
      run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
      step   INTEGER NOT NULL,
      tokens INTEGER,
      wall_s REAL,
      key    TEXT NOT NULL,
      value  REAL
    );
    -- Every read is "one metric of one run, by step"; no unique constraint, so a resumed run
    -- that repeats steps after its checkpoint never loses a batch to a conflict.
    CREATE INDEX metrics_run_key_step ON metrics(run_id, key, step);
  )sql", "migration 1");
}

// Version 2: checkpoints and events, and what runs needs to tell a live run from a dead one.
void migration_2(sqlite3* db) {
  exec(db, R"sql(
    ALTER TABLE runs ADD COLUMN pid INTEGER;
    ALTER TABLE runs ADD COLUMN world_size INTEGER DEFAULT 1;
    ALTER TABLE runs ADD COLUMN message TEXT;
    ALTER TABLE runs ADD COLUMN heartbeat_at TEXT;
    CREATE TABLE checkpoints(
      run_id     INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
      step       INTEGER NOT NULL,
      path       TEXT NOT NULL,
      bytes      INTEGER,
      sha256     TEXT,
      created_at TEXT NOT NULL,
      PRIMARY KEY(run_id, step)
    );
    CREATE TABLE events(
      id         INTEGER PRIMARY KEY,
      run_id     INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
      step       INTEGER,
      level      TEXT NOT NULL,
      text       TEXT NOT NULL,
      created_at TEXT NOT NULL
    );
    CREATE INDEX events_run ON events(run_id, id);
  )sql", "migration 2");
}

// Version 3: what users add to runs afterwards: a note per run and any number of tags.
void migration_3(sqlite3* db) {
  exec(db, R"sql(
    ALTER TABLE runs ADD COLUMN note TEXT;
    CREATE TABLE tags(
      run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
      tag    TEXT NOT NULL,
      PRIMARY KEY(run_id, tag)
    );
    -- `runs list --tag T` looks runs up by tag.
    CREATE INDEX tags_tag ON tags(tag, run_id);
  )sql", "migration 3");
}

// Version 4: a resumed run keeps the rows an abandoned attempt logged after the checkpoint it
// resumed from, marked superseded instead of deleted, so exactly one current row per (run, step,
// key) is read while the history stays. Readers filter on superseded = 0.
void migration_4(sqlite3* db) {
  exec(db, R"sql(
    ALTER TABLE metrics ADD COLUMN superseded INTEGER NOT NULL DEFAULT 0;
  )sql", "migration 4");
}

// Version 5: the pid namespace of a run's process beside its host and pid, so that a run started
// in another container with the same hostname is not judged by a pid that means nothing here.
void migration_5(sqlite3* db) {
  exec(db, R"sql(
    ALTER TABLE runs ADD COLUMN proc_ns TEXT;
  )sql", "migration 5");
}

// Version 6: where a run brought from another database came from (RunStore::import_run): such a run
// names another machine's checkpoints, which deleting it here must leave alone, until a resume here
// makes it this database's own again.
void migration_6(sqlite3* db) {
  exec(db, R"sql(
    ALTER TABLE runs ADD COLUMN imported_from TEXT;
  )sql", "migration 6");
}

using Migration = void (*)(sqlite3*);
// MIGRATIONS[i] takes the database from version i to version i + 1.
constexpr Migration MIGRATIONS[] = {migration_1, migration_2, migration_3, migration_4, migration_5, migration_6};
static_assert(sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]) == SCHEMA_VERSION,
              "one migration per schema version");

}  // namespace

void migrate(sqlite3* db, int target_version) {
  if (target_version < 0 || target_version > SCHEMA_VERSION) {
    throw std::runtime_error("migrate: target version " + std::to_string(target_version) +
                             " is outside 0.." + std::to_string(SCHEMA_VERSION));
  }
  for (int v = user_version(db); v < target_version; ++v) {
    // IMMEDIATE takes the write lock before reading the version again, so two processes opening
    // the same new file cannot both run migration_1.
    exec(db, "BEGIN IMMEDIATE", "migration " + std::to_string(v + 1) + ": begin");
    try {
      if (user_version(db) != v) {
        exec(db, "ROLLBACK", "migration: rollback");
        v = user_version(db) - 1;
        continue;
      }
      MIGRATIONS[v](db);
      exec(db, ("PRAGMA user_version = " + std::to_string(v + 1)).c_str(),
           "migration " + std::to_string(v + 1) + ": setting the version");
      exec(db, "COMMIT", "migration " + std::to_string(v + 1) + ": commit");
    } catch (...) {
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }
}

}  // namespace storage
