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

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <iterator>
#include <vector>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

#include "core/error.h"

namespace atelier::sql {

// True when SQLite's last error on DB is a full disk: SQLITE_FULL, or the
// "disk I/O error" SQLite reports when growing its -shm or -wal file met ENOSPC.
inline bool disk_full(sqlite3* db) {
  if (!db) return false;
  return (sqlite3_extended_errcode(db) & 0xff) == SQLITE_FULL || sqlite3_system_errno(db) == ENOSPC;
}

// What SQLite's last error on DB means for the user and what to do, or "".
inline std::string advice(sqlite3* db) {
  if (!db) return "";
  const int rc = sqlite3_extended_errcode(db) & 0xff;
  // SQLite says "disk I/O error" for a full disk too; say what it means.
  if (disk_full(db))
    return " (the disk is full: free some space and try again; nothing already saved was lost)";
  // "database is locked" alone does not say whose lock or what to do.
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED)
    return " (the file is locked by another process that is writing to it, for longer than Atelier waits: let that "
           "process finish or close it, then try again; nothing was changed)";
  return "";
}

template <const char* Noun>
[[noreturn]] inline void fail(sqlite3* db, const std::string& path, const std::string& what) {
  // A full disk is said plainly: which statement met it says nothing to the user.
  if (disk_full(db))
    throw DiskFullError(std::string(Noun) + " " + path + ": cannot write: the disk is full (" + sqlite3_errmsg(db) +
                        "): free some space and try again; nothing already saved was lost");
  std::string msg = std::string(Noun) + " " + path + ": " + what;
  if (db) msg += ": " + std::string(sqlite3_errmsg(db)) + advice(db);
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
  // Ready to run again with new bindings (a statement prepared once for many rows).
  Stmt& reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
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
    if (disk_full(db))
      throw DiskFullError(std::string(Noun) + " " + path + ": cannot write: the disk is full (" + msg +
                          "): free some space and try again; nothing already saved was lost");
    throw IoError(std::string(Noun) + " " + path + ": \"" + std::string(sql).substr(0, 60) + "\" failed: " + msg + advice(db));
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
// True when SQLite's last error on DB says the file itself is damaged (not a
// lock, not the disk): a truncated or overwritten database.
inline bool damaged_code(sqlite3* db) {
  const int rc = db ? (sqlite3_extended_errcode(db) & 0xff) : SQLITE_OK;
  return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

// A full disk: opening a WAL database needs its -shm file (the shared
// wal-index, 32 KiB), which a full disk cannot give; SQLite then fails even
// a read ("disk I/O error"). open_without_shm() reopens PATH into *DB in
// EXCLUSIVE locking mode, where the wal-index lives in this process's heap
// and no -shm is made (sqlite.org/wal.html#noshm): reads work, writes fail
// with SQLITE_FULL (DiskFullError) until there is room. The price: while
// such a connection is open, other connections wait for the file (another
// process: the busy timeout; this process: shmless_slots() below, in turn,
// since SQLite's polling let one thread starve behind two others for 5 s).
// It is only taken when nobody has the database open normally (one who had
// would have sized the -shm already).
struct ShmlessSlots {
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::string> busy;              // paths with such a connection open in this process
  std::map<sqlite3*, std::string> owners;  // that connection -> its path
};
inline ShmlessSlots& shmless_slots() {
  static ShmlessSlots slots;
  return slots;
}

// Closes a connection made by open_wal (use it instead of sqlite3_close_v2):
// one opened without its -shm gives its turn to the next.
inline void close(sqlite3* db) {
  if (!db) return;
  ShmlessSlots& s = shmless_slots();
  std::string path;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.owners.find(db); it != s.owners.end()) {
      path = it->second;
      s.owners.erase(it);
    }
  }
  sqlite3_close_v2(db);
  if (path.empty()) return;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.busy.erase(path);
  }
  s.cv.notify_all();
}

// Returns 1 when *DB is open without its -shm, 0 when SQLite refused (*DB then
// holds its error), -1 when this process's turn did not come by DEADLINE.
inline int open_without_shm(const std::string& path, int busy_timeout_ms, std::chrono::steady_clock::time_point deadline,
                            sqlite3** db, std::string* mode) {
  ShmlessSlots& slots = shmless_slots();
  {
    std::unique_lock<std::mutex> lock(slots.mu);
    if (!slots.cv.wait_until(lock, deadline, [&] { return !slots.busy.count(path); })) return -1;
    slots.busy.insert(path);
  }
  // The failed connection goes first: its locks would keep this one out.
  sqlite3_close_v2(*db);
  *db = nullptr;
  // The file must be there already: a new database cannot be made on a full disk.
  bool ok = sqlite3_open_v2(path.c_str(), db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr) == SQLITE_OK;
  if (ok) {
    sqlite3_extended_result_codes(*db, 1);
    sqlite3_busy_timeout(*db, busy_timeout_ms);
    sqlite3_stmt* s = nullptr;
    ok = sqlite3_exec(*db, "PRAGMA locking_mode = EXCLUSIVE", nullptr, nullptr, nullptr) == SQLITE_OK &&
         sqlite3_prepare_v2(*db, "PRAGMA journal_mode", -1, &s, nullptr) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW;
    if (ok) {
      const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
      *mode = p ? p : "";
    }
    sqlite3_finalize(s);
  }
  std::lock_guard<std::mutex> lock(slots.mu);
  if (ok) {
    slots.owners[*db] = path;
    return 1;
  }
  slots.busy.erase(path);
  slots.cv.notify_all();
  return 0;
}

template <const char* Noun>
inline void open_wal_unchecked(const std::string& path, int busy_timeout_ms, const std::string& wal_advice, sqlite3** db) {
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
  if (sqlite3_open_v2(path.c_str(), db, flags, nullptr) != SQLITE_OK) fail<Noun>(*db, path, "cannot open");
  sqlite3_extended_result_codes(*db, 1);
  sqlite3_busy_timeout(*db, busy_timeout_ms);
  // Switching a new file to WAL needs an exclusive lock and, when several
  // processes create the database at once, can report SQLITE_BUSY without
  // calling the busy handler; retry it for as long as the busy timeout.
  std::string mode;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(busy_timeout_ms);
  bool without_shm = false;  // the disk is full: open_without_shm() from now on
  for (;;) {
    int rc = SQLITE_OK;
    if (!without_shm) {
      sqlite3_stmt* s = nullptr;
      rc = sqlite3_prepare_v2(*db, "PRAGMA journal_mode = WAL", -1, &s, nullptr);
      if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
          const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
          mode = p ? p : "";
        }
      }
      sqlite3_finalize(s);
      if (rc == SQLITE_ROW) break;
      without_shm = disk_full(*db);
    }
    if (without_shm) {
      // Another connection in exclusive mode (another process's, on the same
      // full disk) holds the file for a moment: waited for like a lock.
      const int opened = open_without_shm(path, busy_timeout_ms, deadline, db, &mode);
      if (opened == 1) break;
      if (opened < 0)
        throw DiskFullError(std::string(Noun) + " " + path +
                            ": cannot open: the disk is full, and another part of this process holds the file (without "
                            "room for its shared index, one at a time) for longer than Atelier waits: free some space and try again");
      rc = *db ? sqlite3_extended_errcode(*db) : SQLITE_CANTOPEN;
    }
    if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() > deadline)
      fail<Noun>(*db, path, "cannot open (switching to WAL journaling)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (mode != "wal")
    throw IoError(std::string(Noun) + " " + path + ": cannot switch to WAL journaling (got \"" + mode + "\"); " + wal_advice);
  exec<Noun>(*db, path, "PRAGMA synchronous = FULL");
  exec<Noun>(*db, path, "PRAGMA foreign_keys = ON");
  // A truncated file can open fine and fail later, on some page; look at every page now.
  sqlite3_stmt* q = nullptr;
  int rc = sqlite3_prepare_v2(*db, "PRAGMA quick_check(1)", -1, &q, nullptr);
  std::string verdict;
  if (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(q, 0));
    verdict = p ? p : "";
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_ROW && damaged_code(*db)) fail<Noun>(*db, path, "quick_check failed");
  if (rc == SQLITE_ROW && verdict != "ok") throw IoError(std::string(Noun) + " " + path + ": quick_check: " + verdict);
  if (rc != SQLITE_ROW) fail<Noun>(*db, path, "cannot check the file");
}

// Opens (or creates) PATH into *db: full mutex, extended result codes, the
// busy timeout, WAL journaling, synchronous = FULL (every commit synced, so an
// acknowledged write survives power loss, not only kill -9) and foreign keys,
// then checks every page (PRAGMA quick_check). A damaged file (truncated,
// overwritten) is reported as DamagedError with REPAIR_ADVICE (the command
// that rebuilds it), not as SQLite's bare "database disk image is malformed".
// *db is set before anything can throw, so the caller's destructor closes it.
template <const char* Noun>
inline void open_wal(const std::string& path, int busy_timeout_ms, const std::string& wal_advice, sqlite3** db,
                     const std::string& repair_advice = "") {
  try {
    open_wal_unchecked<Noun>(path, busy_timeout_ms, wal_advice, db);
  } catch (const IoError& e) {
    const std::string what = e.what();
    if (!damaged_code(*db) && what.find("quick_check") == std::string::npos) throw;
    throw DamagedError(std::string(Noun) + " " + path + " is damaged (" + (damaged_code(*db) ? sqlite3_errmsg(*db) : what) + "); " +
                       (repair_advice.empty() ? "restore it from a backup" : repair_advice));
  }
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
  // Up to date already (the usual case): a read, so opening never waits for
  // another process's write lock (a reader must not block behind a writer).
  {
    sqlite3_stmt* s = nullptr;
    bool current = false;
    if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &s, nullptr) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW) {
      const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
      current = p && std::to_string(count) == p;
    }
    sqlite3_finalize(s);
    if (current) return;
  }
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

// Repair: moves PATH (and its -wal, -shm) aside as PATH.damaged-<ms> and
// returns that name; the caller then creates a fresh database at PATH and
// salvages from the backup. Throws IoError when the rename fails.
inline std::string set_aside(const std::string& path) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string backup = path + ".damaged-" + std::to_string(ms);
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string from = path + suffix, to = backup + suffix;
    if (std::rename(from.c_str(), to.c_str()) != 0 && errno != ENOENT)
      throw IoError("cannot move " + from + " aside to " + to + ": " + std::strerror(errno));
  }
  return backup;
}

// Copies every row still readable from BACKUP's TABLES into the same tables
// of DB (columns by name, so an older schema's rows fit; rows whose key is
// already there are skipped). A damaged page ends a scan, so each table is
// read forwards and then backwards by rowid to reach the rows after it.
// Returns the rows copied. Never throws for damage in BACKUP.
// SEQUENCES (optional) receives BACKUP's AUTOINCREMENT counters (sqlite_sequence).
inline int64_t salvage_rows(sqlite3* db, const std::string& backup, const std::vector<std::string>& tables,
                            std::map<std::string, int64_t>* sequences = nullptr) {
  // A working copy (the backup stays as it was found). A truncated file's
  // header still counts the lost pages, which makes SQLite refuse even the
  // schema; the copy's page count is set to what is really there.
  const std::string work = backup + ".salvage";
  {
    std::ifstream in(backup, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.size() >= 100) {
      const auto u8 = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])); };
      uint32_t page = (u8(16) << 8) | u8(17);
      if (page == 1) page = 65536;
      if (page >= 512) {
        const uint32_t have = static_cast<uint32_t>(bytes.size() / page);
        const uint32_t said = (u8(28) << 24) | (u8(29) << 16) | (u8(30) << 8) | u8(31);
        if (have < said)
          for (int i = 0; i < 4; ++i) bytes[28 + i] = static_cast<char>((have >> (24 - 8 * i)) & 0xff);
      }
    }
    std::ofstream(work, std::ios::binary | std::ios::trunc) << bytes;
    std::ifstream wal(backup + "-wal", std::ios::binary);
    if (wal) std::ofstream(work + "-wal", std::ios::binary | std::ios::trunc) << wal.rdbuf();
  }
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
    }
  } cleanup{work};
  sqlite3* old = nullptr;
  if (sqlite3_open_v2(work.c_str(), &old, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close_v2(old);
    return 0;
  }
  if (sequences) {
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(old, "SELECT name, seq FROM sqlite_sequence", -1, &q, nullptr) == SQLITE_OK)
      while (sqlite3_step(q) == SQLITE_ROW) {
        const auto* name = reinterpret_cast<const char*>(sqlite3_column_text(q, 0));
        if (name) (*sequences)[name] = sqlite3_column_int64(q, 1);
      }
    sqlite3_finalize(q);
  }
  int64_t copied = 0;
  sqlite3_exec(db, "PRAGMA foreign_keys = OFF", nullptr, nullptr, nullptr);
  sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
  for (const std::string& table : tables) {
    for (const char* order : {"ASC", "DESC"}) {
      sqlite3_stmt* read = nullptr;
      const std::string q = "SELECT * FROM \"" + table + "\" ORDER BY rowid " + order;
      if (sqlite3_prepare_v2(old, q.c_str(), -1, &read, nullptr) != SQLITE_OK) {
        sqlite3_finalize(read);
        break;  // no such table in the backup (or its schema page is gone)
      }
      const int n = sqlite3_column_count(read);
      std::string cols, marks;
      for (int c = 0; c < n; ++c) {
        cols += std::string(c ? ", " : "") + "\"" + sqlite3_column_name(read, c) + "\"";
        marks += c ? ", ?" : "?";
      }
      sqlite3_stmt* write = nullptr;
      const std::string ins = "INSERT OR IGNORE INTO \"" + table + "\" (" + cols + ") VALUES (" + marks + ")";
      if (sqlite3_prepare_v2(db, ins.c_str(), -1, &write, nullptr) != SQLITE_OK) {
        sqlite3_finalize(write);
        sqlite3_finalize(read);
        break;
      }
      while (sqlite3_step(read) == SQLITE_ROW) {
        for (int c = 0; c < n; ++c) sqlite3_bind_value(write, c + 1, sqlite3_column_value(read, c));
        if (sqlite3_step(write) == SQLITE_DONE && sqlite3_changes(db) > 0) ++copied;
        sqlite3_reset(write);
      }
      sqlite3_finalize(write);
      sqlite3_finalize(read);
    }
  }
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  sqlite3_exec(db, "PRAGMA foreign_keys = ON", nullptr, nullptr, nullptr);
  sqlite3_close_v2(old);
  return copied;
}

}  // namespace atelier::sql
