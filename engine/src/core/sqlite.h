// The SQLite pieces the engine's databases share (the job queue, the model
// store): a prepared-statement wrapper, exec, an IMMEDIATE write
// transaction, and opening a file in WAL mode with full syncs. Header-only:
// the rooms that include it link SQLite themselves.
//
// Errors are atelier::Error reading "NOUN PATH: what: sqlite's message";
// NOUN ("job database", "model store database") is a template argument so
// call sites stay short.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

#include "core/error.h"

namespace atelier::sql {

template <const char* Noun>
[[noreturn]] inline void fail(sqlite3* db, const std::string& path, const std::string& what) {
  std::string msg = std::string(Noun) + " " + path + ": " + what;
  if (db) msg += ": " + std::string(sqlite3_errmsg(db));
  throw IoError(msg);
}

// A prepared statement, finalized on scope exit. Indexes are 1-based for
// bind (as in SQLite) and 0-based for columns.
template <const char* Noun>
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& path, std::string_view sql) : db_(db), path_(path) {
    if (sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &s_, nullptr) != SQLITE_OK)
      fail<Noun>(db, path, "cannot prepare \"" + std::string(sql) + "\"");
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& i64(int index, int64_t v) {
    check(sqlite3_bind_int64(s_, index, v));
    return *this;
  }
  Stmt& text(int index, const std::string& v) {
    check(sqlite3_bind_text(s_, index, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  // True when a row is ready, false when done.
  bool step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail_step();
  }
  // Runs a write to completion; returns the rows it changed.
  int run() {
    while (step()) {
    }
    return sqlite3_changes(db_);
  }
  int64_t col_i64(int c) const { return sqlite3_column_int64(s_, c); }
  std::string col_text(int c) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, c));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_, c))) : std::string();
  }

 private:
  // Out of line: GCC 12 warns falsely (-Wrestrict) on inlined string concatenation.
  [[noreturn]] __attribute__((noinline)) void fail_step() {
    std::string what = "statement failed: ";
    what.append(sqlite3_sql(s_));
    fail<Noun>(db_, path_, what);
  }
  void check(int rc) {
    if (rc != SQLITE_OK) fail<Noun>(db_, path_, "cannot bind a parameter");
  }
  sqlite3* db_;
  const std::string& path_;
  sqlite3_stmt* s_ = nullptr;
};

template <const char* Noun>
inline void exec(sqlite3* db, const std::string& path, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    throw IoError(std::string(Noun) + " " + path + ": \"" + std::string(sql).substr(0, 60) + "\" failed: " + msg);
  }
}

// BEGIN IMMEDIATE takes the write lock up front (waiting up to the busy
// timeout), so a read-then-write transaction never fails on lock upgrade.
template <const char* Noun>
class Txn {
 public:
  Txn(sqlite3* db, const std::string& path) : db_(db), path_(path) { exec<Noun>(db, path, "BEGIN IMMEDIATE"); }
  ~Txn() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Txn(const Txn&) = delete;
  Txn& operator=(const Txn&) = delete;
  void commit() {
    exec<Noun>(db_, path_, "COMMIT");
    open_ = false;
  }

 private:
  sqlite3* db_;
  const std::string& path_;
  bool open_ = true;
};

// Opens (or creates) PATH into *db: full mutex, extended result codes, the
// busy timeout, WAL journaling, synchronous = FULL (every commit synced, so an
// acknowledged write survives power loss, not only kill -9) and foreign keys.
// *db is set before anything can throw, so the caller's destructor closes it.
template <const char* Noun>
inline void open_wal(const std::string& path, int busy_timeout_ms, const std::string& wal_advice, sqlite3** db) {
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
  if (sqlite3_open_v2(path.c_str(), db, flags, nullptr) != SQLITE_OK) fail<Noun>(*db, path, "cannot open");
  sqlite3_extended_result_codes(*db, 1);
  sqlite3_busy_timeout(*db, busy_timeout_ms);
  // Switching a new file to WAL needs an exclusive lock and, when several
  // processes create the database at once, can report SQLITE_BUSY without
  // calling the busy handler; retry it for as long as the busy timeout.
  std::string mode;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(busy_timeout_ms);
  for (;;) {
    sqlite3_stmt* s = nullptr;
    int rc = sqlite3_prepare_v2(*db, "PRAGMA journal_mode = WAL", -1, &s, nullptr);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(s);
      if (rc == SQLITE_ROW) {
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
        mode = p ? p : "";
      }
    }
    sqlite3_finalize(s);
    if (rc == SQLITE_ROW) break;
    if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() > deadline)
      fail<Noun>(*db, path, "cannot open (switching to WAL journaling)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (mode != "wal")
    throw IoError(std::string(Noun) + " " + path + ": cannot switch to WAL journaling (got \"" + mode + "\"); " + wal_advice);
  exec<Noun>(*db, path, "PRAGMA synchronous = FULL");
  exec<Noun>(*db, path, "PRAGMA foreign_keys = ON");
}

// Brings the schema to version `count` by applying migrations[v] for each
// v from the stored meta.schema_version up. One transaction per step,
// re-reading the version inside it, so two processes opening the same new
// database at once apply each step once. A version this build does not know
// is refused: `what` names the kind of file ("an Atelier job database") and
// `elsewhere` the way out ("another data dir").
template <const char* Noun>
inline void migrate(sqlite3* db, const std::string& path, const char* const* migrations, int count,
                    const std::string& what, const std::string& elsewhere) {
  for (;;) {
    Txn<Noun> txn(db, path);
    exec<Noun>(db, path, "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
    std::string text;
    {
      Stmt<Noun> s(db, path, "SELECT value FROM meta WHERE key = 'schema_version'");
      if (s.step()) text = s.col_text(0);
    }
    int version = 0;
    if (!text.empty()) {
      size_t used = 0;
      try {
        version = std::stoi(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != text.size() || version < 0)
        throw IoError(std::string(Noun) + " " + path + ": unreadable schema version \"" + text +
                    "\"; the file is damaged or not " + what);
    }
    if (version > count)
      throw UnsupportedError(std::string(Noun) + " " + path + " was made by a newer Atelier (schema version " +
                  std::to_string(version) + ", this build knows up to " + std::to_string(count) +
                  "); update Atelier or use " + elsewhere);
    if (version == count) {
      txn.commit();
      return;
    }
    exec<Noun>(db, path, migrations[version]);
    Stmt<Noun>(db, path,
               "INSERT INTO meta (key, value) VALUES ('schema_version', ?1) "
               "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
        .text(1, std::to_string(version + 1))
        .run();
    txn.commit();
  }
}

}  // namespace atelier::sql
