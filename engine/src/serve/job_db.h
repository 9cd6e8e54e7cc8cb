// The durable job queue: one SQLite database (WAL) per data dir, holding every
// job with its request, state, timestamps, seed, model version, result and
// error. A job that was acknowledged by insert() survives a crash, kill -9 or
// a restart; every state change is a single guarded UPDATE (WHERE state = ...)
// so that a job starts and finishes exactly once, even when threads or
// processes race on it.
//
// States and the transitions this class allows (anything else returns false):
//
//   queued  --mark_running-->  running  --complete-->  completed
//   queued  --fail-->          failed      running  --fail-->    failed
//   queued  --cancel / request_cancel / clear_queued-->  cancelled
//   running --cancel-->        cancelled
//   running --request_cancel-> running with cancel_requested = 1 (the runner
//                              sees it in cancel_requests() and calls cancel())
//   running --requeue / recover--> queued   (or cancelled when a cancel was
//                              requested while it ran)
//   running --recover-->       failed   (the second time its process died while it ran alone)
//
// One JobDb may be shared by many threads (calls are serialized by a mutex);
// several JobDb objects, in one process or many, may use the same file.
// Never carry an open JobDb across fork(): open a new one in the child.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

struct sqlite3;

namespace atelier::runtime {

struct JobRow {
  int64_t id = 0;
  std::string state;            // "queued", "running", "completed", "failed", "cancelled"
  int priority = 0;             // higher runs first
  bool interactive = false;
  std::string request_json;     // the request as submitted (JSON text)
  int64_t created_ms = 0, started_ms = 0, finished_ms = 0;   // unix epoch ms; 0 = not yet
  uint64_t seed = 0;
  std::string model_version;    // what produced the result: "sha256:<hex>" of the model file
  std::string model_name;       // the same for people: "stories260k@1", or the file's path
  std::string result_json;      // on completion
  std::string error_code, error_message;
  int attempts = 0;             // times it was started
  bool cancel_requested = false;
  int interrupted = 0;          // times it was running when its process died (recover())
  std::string submit_key;       // NewJob::key; "" = none
  bool suspect = false;         // it was running when its process died: the scheduler runs it alone (recover())
  int died_alone = 0;           // process deaths while it was the only running job (recover())
  // Where and how it ran (complete()); "" for older rows.
  std::string device, precision, engine_build;
};

// What complete() records beside the model version.
struct RunRecord {
  std::string device;        // "cpu", "cuda:0"
  std::string precision;     // text/precision.h's label
  std::string engine_build;  // engine_build()
};

// One job for insert_many().
struct NewJob {
  std::string request_json;
  int priority = 0;
  bool interactive = false;
  uint64_t seed = 0;
  // "" = always a new job. Else idempotent: when a job with this key is
  // queued, running or completed, insert_many returns its id instead of
  // queuing another (one that failed or was cancelled is queued again).
  std::string key;
};

// The error of a job that recover() found running alone for the second time.
inline constexpr const char kInterruptedTwice[] =
    "interrupted twice; retry to run it again (its process died two times while this job ran alone: it may be what "
    "kills it)";

class JobDb {
 public:
  // The schema version this build creates and understands.
  static constexpr int kSchemaVersion = 8;

  // Opens or creates PATH (SQLite, WAL, synchronous=FULL, busy timeout 5 s,
  // foreign keys on) and applies pending migrations, each in its own
  // transaction. Throws atelier::Error naming the path and SQLite's message;
  // a database from a newer Atelier is refused ("made by a newer Atelier").
  // The parent folder must exist.
  static std::unique_ptr<JobDb> open(const std::string& path);

  // `atelier queue repair`: when PATH is damaged (open throws DamagedError),
  // moves it aside (PATH.damaged-<ms>, kept), creates a fresh database and
  // copies every job row still readable from the old one (a job that was
  // running is recovered at the next runner start as usual).
  struct RepairReport {
    bool damaged = false;  // false: the database was fine; nothing was done
    std::string backup;
    int64_t rows = 0;      // rows salvaged (jobs and meta)
  };
  static RepairReport repair(const std::string& path);
  ~JobDb();
  JobDb(const JobDb&) = delete;
  JobDb& operator=(const JobDb&) = delete;

  const std::string& path() const { return path_; }
  int schema_version() const;

  // Queues a job (state "queued"); returns its id once the row is committed
  // and synced, so an acknowledged job survives kill -9 and power loss.
  int64_t insert(const std::string& request_json, int priority, bool interactive, uint64_t seed, int64_t now_ms);
  // Queues many jobs in one transaction (one sync); ids in input order.
  // FRESH (optional): per job, true when it was inserted now (false: an earlier keyed job).
  std::vector<int64_t> insert_many(const std::vector<NewJob>& jobs, int64_t now_ms, std::vector<bool>* fresh = nullptr);

  // queued -> running, attempts + 1, started_ms = now, cancel_requested = 0;
  // false if it was not queued (cancelled meanwhile, or another runner won).
  bool mark_running(int64_t id, int64_t now_ms);
  // running -> completed with result and model version; false if not running.
  bool complete(int64_t id, const std::string& result_json, const std::string& model_version, int64_t now_ms,
                const std::string& model_name = "", const RunRecord& run = {});
  // queued or running -> failed (a queued job may fail admission without
  // ever running); false if already finished or unknown. CODE: the engine's
  // status name ("not_found", "invalid_model", ... see status_code_name).
  bool fail(int64_t id, const std::string& code, const std::string& message, int64_t now_ms);
  // queued or running -> cancelled; false if already finished or unknown.
  bool cancel(int64_t id, int64_t now_ms);
  // For a process that does not run the queue: queued -> cancelled at once;
  // running -> cancel_requested = 1 (the runner cancels it). False if already
  // finished or unknown. The one-argument form stamps the system clock.
  bool request_cancel(int64_t id);
  bool request_cancel(int64_t id, int64_t now_ms);
  // Ids of running jobs with cancel_requested, ascending.
  std::vector<int64_t> cancel_requests();
  // Changes the priority of a queued or running job; false if finished or unknown.
  bool set_priority(int64_t id, int priority);
  // running -> queued (preemption, clean shutdown): started_ms = 0, result
  // and error cleared, partial output is not stored. A job whose cancel was
  // requested while it ran goes to cancelled instead. True when the job left
  // "running"; false if it was not running.
  bool requeue(int64_t id);
  // At engine start, after a process death: every running job -> queued (or
  // cancelled when a cancel was requested) and marked `suspect`. Crash-loop
  // protection that finds the job that kills the process, not its
  // neighbours: when exactly one job was running, its `died_alone` count + 1,
  // and at 2 it is failed with kInterruptedTwice; jobs that died together
  // are only suspects, which the scheduler runs one at a time until each
  // ends (so a job that kills the process dies alone next time). `interrupted`
  // counts every death. Writes nothing when nothing was running. Returns how
  // many running jobs were found (cancelled ones not counted).
  int recover();

  std::optional<JobRow> get(int64_t id) const;
  // The newest queued, running or completed job inserted with KEY (NewJob::key).
  std::optional<int64_t> find_key(const std::string& key) const;
  // STATE "" = all; LIMIT <= 0 = no limit; ordered by id.
  std::vector<JobRow> list(const std::string& state, int limit, bool newest_first) const;
  // Queued jobs by priority desc then id asc; LIMIT <= 0 = no limit.
  std::vector<JobRow> next_queued(int limit) const;
  // Rows in STATE ("" = all).
  int64_t count(const std::string& state) const;
  // Deletes completed/failed/cancelled jobs; returns how many.
  int clear_finished();
  // Cancels every queued job (finished_ms = system clock); returns how many.
  int clear_queued();

  // Several transitions (complete / fail / cancel) as one transaction, so
  // the jobs a step ends cost one disk sync instead of one each (group
  // commit). While a Batch lives it holds the connection: other threads'
  // calls wait for it. Its transitions are durable only once commit()
  // returns; commit() throws as a transition would (and then none of them
  // happened); a Batch destroyed uncommitted rolls back.
  class Batch {
   public:
    explicit Batch(JobDb& db);
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;
    void commit();

   private:
    friend class JobDb;
    static void check_open(const JobDb& db);
    JobDb& db_;
    std::unique_lock<std::recursive_mutex> lock_;
    bool open_ = false;
  };

  // True when another connection (another process) has committed a change
  // since the last call (true on the first). SQLite's data_version: a cheap
  // read, so a runner can poll for other processes' jobs without re-reading
  // the queue every time.
  bool changed_elsewhere();

  // Persistent queue pause flag (meta table); false on a new database.
  void set_paused(bool paused);
  bool paused() const;

 private:
  explicit JobDb(std::string path);
  void migrate();
  std::string meta_get(const std::string& key) const;  // "" when absent; caller holds mu_
  void meta_set(const std::string& key, const std::string& value);

  std::string path_;
  sqlite3* db_ = nullptr;
  int64_t data_version_ = -1;  // last PRAGMA data_version seen by changed_elsewhere()
  mutable std::recursive_mutex mu_;
  bool in_batch_ = false;  // a Batch is open (under mu_)  // recursive: a Batch holds it while its transitions take it
};

// Only one process executes the queue of a data dir at a time; others only
// read and write the database. flock(LOCK_EX | LOCK_NB) on DIR/runner.lock,
// held for the object's lifetime and released by the kernel when the holder
// dies, even by SIGKILL. The file holds the holder's pid, for messages.
class RunnerLock {
 public:
  // nullptr if another process (or another RunnerLock in this one) holds it;
  // throws atelier::Error if the file cannot be opened (missing dir, rights).
  static std::unique_ptr<RunnerLock> try_acquire(const std::string& data_dir);
  // The pid written by the current or last holder, 0 if none or unreadable.
  static int64_t holder_pid(const std::string& data_dir);
  ~RunnerLock();
  RunnerLock(const RunnerLock&) = delete;
  RunnerLock& operator=(const RunnerLock&) = delete;

 private:
  explicit RunnerLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace atelier::runtime
