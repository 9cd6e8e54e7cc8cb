#include "serve/job_db.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <filesystem>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "core/sqlite.h"

namespace atelier::runtime {

namespace {

// Ordered migrations: entry i takes the schema from version i to i + 1. Never
// edit a shipped entry; append a new one and bump JobDb::kSchemaVersion.
constexpr const char* kMigrations[] = {
    // 1: the jobs table and the queue-order index.
    R"sql(
CREATE TABLE jobs (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  state         TEXT    NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
  priority      INTEGER NOT NULL DEFAULT 0,
  interactive   INTEGER NOT NULL DEFAULT 0,
  request_json  TEXT    NOT NULL,
  created_ms    INTEGER NOT NULL,
  started_ms    INTEGER NOT NULL DEFAULT 0,
  finished_ms   INTEGER NOT NULL DEFAULT 0,
  seed          INTEGER NOT NULL DEFAULT 0,
  model_version TEXT    NOT NULL DEFAULT '',
  result_json   TEXT    NOT NULL DEFAULT '',
  error_code    TEXT    NOT NULL DEFAULT '',
  error_message TEXT    NOT NULL DEFAULT '',
  attempts      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX jobs_queue ON jobs (state, priority DESC, id);
)sql",
    // 2: cancel requests from processes that do not run the queue.
    R"sql(
ALTER TABLE jobs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
)sql",
    // 3: the model version a job used, for people ("stories260k@1"); model_version holds its sha256.
    R"sql(
ALTER TABLE jobs ADD COLUMN model_name TEXT NOT NULL DEFAULT '';
)sql",
    // 4: failed jobs' error_code is the status name ("not_found"), no longer
    // StatusCode's number; older rows are renamed (other codes stay as they are).
    R"sql(
UPDATE jobs SET error_code = CASE error_code
    WHEN '1' THEN 'invalid_argument' WHEN '2' THEN 'not_found' WHEN '3' THEN 'invalid_model'
    WHEN '4' THEN 'unsupported' WHEN '5' THEN 'io' WHEN '6' THEN 'internal' WHEN '7' THEN 'cancelled'
    WHEN 'invalid_request' THEN 'invalid_argument' ELSE error_code END
  WHERE state = 'failed';
)sql",
    // 5: crash-loop protection: how many times the job was running when its
    // process died (recover() fails it the second time instead of re-running it forever).
    R"sql(
ALTER TABLE jobs ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0;
)sql",
    // 6: idempotent submission: a caller-chosen key (`atelier batch`: its line's
    // digest, number and output folder) so a rerun finds the job it queued before.
    R"sql(
ALTER TABLE jobs ADD COLUMN submit_key TEXT NOT NULL DEFAULT '';
CREATE INDEX jobs_submit_key ON jobs (submit_key) WHERE submit_key != '';
)sql",
    // 7: crash recovery that finds the job that kills the process (recover()):
    // suspect = running when its process died, run alone until it ends;
    // died_alone = process deaths while it was the only running job.
    R"sql(
ALTER TABLE jobs ADD COLUMN suspect INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN died_alone INTEGER NOT NULL DEFAULT 0;
)sql",
    // 8: where and how a job ran (issue 33): the device, the precision policy's
    // label and the engine build, beside the model digest.
    R"sql(
ALTER TABLE jobs ADD COLUMN device TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN precision TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN engine_build TEXT NOT NULL DEFAULT '';
)sql",
};
static_assert(std::size(kMigrations) == JobDb::kSchemaVersion, "one migration per schema version");

constexpr const char* kColumns =
    "id, state, priority, interactive, request_json, created_ms, started_ms, finished_ms, seed, "
    "model_version, result_json, error_code, error_message, attempts, cancel_requested, model_name, interrupted, submit_key, suspect, died_alone, "
    "device, precision, engine_build";

constexpr int kBusyTimeoutMs = 5000;

constexpr char kNoun[] = "job database";
using Stmt = sql::Stmt<kNoun>;
using Txn = sql::Txn<kNoun>;

int64_t system_now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}





JobRow read_row(const Stmt& s) {
  JobRow r;
  r.id = s.col_i64(0);
  r.state = s.col_text(1);
  r.priority = static_cast<int>(s.col_i64(2));
  r.interactive = s.col_i64(3) != 0;
  r.request_json = s.col_text(4);
  r.created_ms = s.col_i64(5);
  r.started_ms = s.col_i64(6);
  r.finished_ms = s.col_i64(7);
  r.seed = static_cast<uint64_t>(s.col_i64(8));
  r.model_version = s.col_text(9);
  r.result_json = s.col_text(10);
  r.error_code = s.col_text(11);
  r.error_message = s.col_text(12);
  r.attempts = static_cast<int>(s.col_i64(13));
  r.cancel_requested = s.col_i64(14) != 0;
  r.model_name = s.col_text(15);
  r.interrupted = static_cast<int>(s.col_i64(16));
  r.submit_key = s.col_text(17);
  r.suspect = s.col_i64(18) != 0;
  r.died_alone = static_cast<int>(s.col_i64(19));
  r.device = s.col_text(20);
  r.precision = s.col_text(21);
  r.engine_build = s.col_text(22);
  return r;
}

}  // namespace

JobDb::JobDb(std::string path) : path_(std::move(path)) {}

JobDb::~JobDb() {
  sql::close(db_);  // not sqlite3_close_v2: see sql::open_without_shm
}

std::unique_ptr<JobDb> JobDb::open(const std::string& path) {
  std::unique_ptr<JobDb> j(new JobDb(path));
  sql::open_wal<kNoun>(path, kBusyTimeoutMs, "put the data dir on a local file system", &j->db_,
                       "run `atelier queue repair --data-dir " + std::filesystem::path(path).parent_path().string() +
                           "` to rebuild it from what is readable (the damaged file is kept beside it)");
  j->migrate();
  return j;
}

JobDb::RepairReport JobDb::repair(const std::string& path) {
  RepairReport r;
  try {
    open(path);
    return r;
  } catch (const DamagedError&) {
  }
  r.damaged = true;
  r.backup = sql::set_aside(path);
  auto db = open(path);
  std::lock_guard lock(db->mu_);
  // Ids are never reused, even those of rows that could not be read back.
  std::map<std::string, int64_t> sequences;
  r.rows = sql::salvage_rows(db->db_, r.backup, {"jobs", "meta"}, &sequences);
  const int64_t seq = sequences.count("jobs") ? sequences["jobs"] : 0;
  if (seq > 0) {
    Stmt u(db->db_, path, "INSERT INTO sqlite_sequence (name, seq) SELECT 'jobs', ?1 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'jobs')");
    u.i64(1, seq).run();
    Stmt m(db->db_, path, "UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'jobs'");
    m.i64(1, seq).run();
  }
  return r;
}

std::string JobDb::meta_get(const std::string& key) const {
  Stmt s(db_, path_, "SELECT value FROM meta WHERE key = ?1");
  s.text(1, key);
  return s.step() ? s.col_text(0) : std::string();
}

void JobDb::meta_set(const std::string& key, const std::string& value) {
  Stmt s(db_, path_, "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value");
  s.text(1, key).text(2, value).run();
}

void JobDb::migrate() {
  std::lock_guard lock(mu_);
  sql::migrate<kNoun>(db_, path_, kMigrations, kSchemaVersion, "an Atelier job database", "another data dir");
}

int JobDb::schema_version() const {
  std::lock_guard lock(mu_);
  const std::string v = meta_get("schema_version");
  return v.empty() ? 0 : std::stoi(v);
}

int64_t JobDb::insert(const std::string& request_json, int priority, bool interactive, uint64_t seed,
                      int64_t now_ms) {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_,
         "INSERT INTO jobs (state, priority, interactive, request_json, created_ms, seed) "
         "VALUES ('queued', ?1, ?2, ?3, ?4, ?5)");
  s.i64(1, priority).i64(2, interactive ? 1 : 0).text(3, request_json).i64(4, now_ms).i64(5, static_cast<int64_t>(seed));
  s.run();
  return sqlite3_last_insert_rowid(db_);
}

std::vector<int64_t> JobDb::insert_many(const std::vector<NewJob>& jobs, int64_t now_ms, std::vector<bool>* fresh) {
  std::lock_guard lock(mu_);
  std::vector<int64_t> ids;
  ids.reserve(jobs.size());
  Txn txn(db_, path_);
  // Each statement prepared once for the whole batch (SQLite's parser was a
  // tenth of a 100k-line batch's time).
  // `submit_key != ''` lets SQLite use the partial index jobs_submit_key (a
  // query must name its WHERE term). Without it the lookup walked every queued
  // row by jobs_queue, so a batch's insert was quadratic: 100k lines never
  // finished queueing.
  Stmt find(db_, path_,
            "SELECT id FROM jobs WHERE submit_key = ?1 AND submit_key != '' AND state IN ('queued', 'running', 'completed') "
            "ORDER BY id DESC LIMIT 1");
  Stmt insert(db_, path_,
              "INSERT INTO jobs (state, priority, interactive, request_json, created_ms, seed, submit_key) "
              "VALUES ('queued', ?1, ?2, ?3, ?4, ?5, ?6)");
  for (const NewJob& j : jobs) {
    // A keyed job already queued, running or completed is that job; one that
    // failed or was cancelled is queued afresh (a rerun is how it is retried).
    if (!j.key.empty()) {
      find.reset().text(1, j.key);
      const int64_t earlier = find.step() ? find.col_i64(0) : 0;
      find.reset();  // no read left open across the inserts and the commit
      if (earlier != 0) {
        ids.push_back(earlier);
        if (fresh) fresh->push_back(false);
        continue;
      }
    }
    insert.reset().i64(1, j.priority).i64(2, j.interactive ? 1 : 0).text(3, j.request_json).i64(4, now_ms);
    insert.i64(5, static_cast<int64_t>(j.seed)).text(6, j.key);
    insert.run();
    ids.push_back(sqlite3_last_insert_rowid(db_));
    if (fresh) fresh->push_back(true);
  }
  txn.commit();
  return ids;
}

// Each transition below is one UPDATE guarded by the source state, run as its
// own (autocommit) transaction, or inside a Batch's: of any number of racing
// callers, threads or processes, exactly one sees a changed row.

JobDb::Batch::Batch(JobDb& db) : db_(db), lock_(db.mu_) {
  sql::exec<kNoun>(db_.db_, db_.path_, "BEGIN IMMEDIATE");
  open_ = true;
  db_.in_batch_ = true;
}

JobDb::Batch::~Batch() {
  db_.in_batch_ = false;
  if (open_) sqlite3_exec(db_.db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

void JobDb::Batch::commit() {
  db_.in_batch_ = false;
  open_ = false;  // committed, or (on an error) rolled back below: never again
  check_open(db_);
  try {
    sql::exec<kNoun>(db_.db_, db_.path_, "COMMIT");
  } catch (...) {
    sqlite3_exec(db_.db_, "ROLLBACK", nullptr, nullptr, nullptr);  // a failed COMMIT may leave it open
    throw;
  }
}

// SQLite rolls a transaction back by itself on some errors (a full disk, an
// I/O error): from then on a batch's transitions would each commit alone and
// the batch's earlier ones are gone. So a transition in a batch whose
// transaction ended, and that batch's commit, fail instead.
void JobDb::Batch::check_open(const JobDb& db) {
  if (sqlite3_get_autocommit(db.db_))
    throw Error(StatusCode::Io, db.path_ + ": the job database rolled a batch of writes back (an earlier write in it failed)");
}

bool JobDb::mark_running(int64_t id, int64_t now_ms) {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_,
         "UPDATE jobs SET state = 'running', started_ms = ?2, attempts = attempts + 1, cancel_requested = 0 "
         "WHERE id = ?1 AND state = 'queued'");
  return s.i64(1, id).i64(2, now_ms).run() == 1;
}

bool JobDb::complete(int64_t id, const std::string& result_json, const std::string& model_version, int64_t now_ms,
                     const std::string& model_name, const RunRecord& run) {
  std::lock_guard lock(mu_);
  if (in_batch_) Batch::check_open(*this);
  Stmt s(db_, path_,
         "UPDATE jobs SET state = 'completed', result_json = ?2, model_version = ?3, finished_ms = ?4, model_name = ?5, "
         "device = ?6, precision = ?7, engine_build = ?8 "
         "WHERE id = ?1 AND state = 'running'");
  return s.i64(1, id).text(2, result_json).text(3, model_version).i64(4, now_ms).text(5, model_name).text(6, run.device)
             .text(7, run.precision).text(8, run.engine_build).run() == 1;
}

bool JobDb::fail(int64_t id, const std::string& code, const std::string& message, int64_t now_ms) {
  std::lock_guard lock(mu_);
  if (in_batch_) Batch::check_open(*this);
  Stmt s(db_, path_,
         "UPDATE jobs SET state = 'failed', error_code = ?2, error_message = ?3, finished_ms = ?4 "
         "WHERE id = ?1 AND state IN ('queued', 'running')");
  return s.i64(1, id).text(2, code).text(3, message).i64(4, now_ms).run() == 1;
}

bool JobDb::cancel(int64_t id, int64_t now_ms) {
  std::lock_guard lock(mu_);
  if (in_batch_) Batch::check_open(*this);
  Stmt s(db_, path_,
         "UPDATE jobs SET state = 'cancelled', finished_ms = ?2 WHERE id = ?1 AND state IN ('queued', 'running')");
  return s.i64(1, id).i64(2, now_ms).run() == 1;
}

bool JobDb::request_cancel(int64_t id) { return request_cancel(id, system_now_ms()); }

bool JobDb::request_cancel(int64_t id, int64_t now_ms) {
  std::lock_guard lock(mu_);
  // One statement: a queued job is cancelled at once, a running one flagged.
  Stmt s(db_, path_,
         "UPDATE jobs SET cancel_requested = 1, "
         "  finished_ms = CASE WHEN state = 'queued' THEN ?2 ELSE finished_ms END, "
         "  state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END "
         "WHERE id = ?1 AND state IN ('queued', 'running')");
  return s.i64(1, id).i64(2, now_ms).run() == 1;
}

std::vector<int64_t> JobDb::cancel_requests() {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_, "SELECT id FROM jobs WHERE state = 'running' AND cancel_requested = 1 ORDER BY id");
  std::vector<int64_t> ids;
  while (s.step()) ids.push_back(s.col_i64(0));
  return ids;
}

bool JobDb::set_priority(int64_t id, int priority) {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_, "UPDATE jobs SET priority = ?2 WHERE id = ?1 AND state IN ('queued', 'running')");
  return s.i64(1, id).i64(2, priority).run() == 1;
}

namespace {
// running -> queued, or cancelled when a cancel was requested meanwhile.
constexpr const char* kRequeueSet =
    "UPDATE jobs SET "
    "  state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "
    "  finished_ms = CASE WHEN cancel_requested THEN ?1 ELSE 0 END, "
    "  started_ms = CASE WHEN cancel_requested THEN started_ms ELSE 0 END, "
    "  result_json = '', model_version = '', model_name = '', error_code = '', error_message = '', "
    "  device = '', precision = '', engine_build = '' "
    "WHERE state = 'running'";
}  // namespace

bool JobDb::requeue(int64_t id) {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_, std::string(kRequeueSet) + " AND id = ?2");
  return s.i64(1, system_now_ms()).i64(2, id).run() == 1;
}

int JobDb::recover() {
  std::lock_guard lock(mu_);
  const int64_t now = system_now_ms();
  // Read first: with nothing running there is nothing to write, so a runner
  // starts on a full disk (or a database opened without its -shm) too.
  int64_t running = 0, counted = 0;
  {
    Stmt c(db_, path_, "SELECT count(*), coalesce(sum(cancel_requested = 0), 0) FROM jobs WHERE state = 'running'");
    if (c.step()) {
      running = c.col_i64(0);
      counted = c.col_i64(1);
    }
  }
  if (running == 0) return 0;
  Txn txn(db_, path_);
  // The process died with these jobs running. When one ran alone, it is the
  // only one that can have killed it: a second such death fails it, instead
  // of re-running it forever. Jobs that ran together are only suspects: they
  // run one at a time (the scheduler's quarantine) until each ends, so a job
  // that kills the process soon dies alone, and its neighbours finish.
  if (running == 1) {
    Stmt alone(db_, path_,
               "UPDATE jobs SET died_alone = died_alone + 1, "
               "  state = CASE WHEN died_alone + 1 >= 2 THEN 'failed' ELSE state END, "
               "  error_code = CASE WHEN died_alone + 1 >= 2 THEN 'internal' ELSE error_code END, "
               "  error_message = CASE WHEN died_alone + 1 >= 2 THEN ?2 ELSE error_message END, "
               "  finished_ms = CASE WHEN died_alone + 1 >= 2 THEN ?1 ELSE finished_ms END, "
               "  interrupted = interrupted + 1 "
               "WHERE state = 'running' AND cancel_requested = 0");
    alone.i64(1, now).text(2, kInterruptedTwice).run();
  }
  Stmt n(db_, path_,
         "UPDATE jobs SET suspect = 1, interrupted = interrupted + (?1 > 1) "
         "WHERE state = 'running' AND cancel_requested = 0");
  n.i64(1, running).run();
  Stmt s(db_, path_, kRequeueSet);
  s.i64(1, now).run();
  txn.commit();
  return static_cast<int>(counted);
}

std::optional<JobRow> JobDb::get(int64_t id) const {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_, std::string("SELECT ") + kColumns + " FROM jobs WHERE id = ?1");
  s.i64(1, id);
  if (!s.step()) return std::nullopt;
  return read_row(s);
}

std::optional<int64_t> JobDb::find_key(const std::string& key) const {
  std::lock_guard lock(mu_);
  Stmt f(db_, path_,  // by the partial index jobs_submit_key, as in insert_many
         "SELECT id FROM jobs WHERE submit_key = ?1 AND submit_key != '' AND state IN ('queued', 'running', 'completed') "
         "ORDER BY id DESC LIMIT 1");
  f.text(1, key);
  if (!f.step()) return std::nullopt;
  return f.col_i64(0);
}

std::vector<JobRow> JobDb::list(const std::string& state, int limit, bool newest_first) const {
  std::lock_guard lock(mu_);
  // Separate texts for "all" and one state, so that the latter uses the index.
  std::string sql = std::string("SELECT ") + kColumns + " FROM jobs" +
                    (state.empty() ? " WHERE ?1 = ''" : " WHERE state = ?1") + " ORDER BY id " +
                    (newest_first ? "DESC" : "ASC") + " LIMIT ?2";
  Stmt s(db_, path_, sql);
  s.text(1, state).i64(2, limit > 0 ? limit : -1);
  std::vector<JobRow> rows;
  while (s.step()) rows.push_back(read_row(s));
  return rows;
}

std::vector<JobRow> JobDb::next_queued(int limit) const {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_,
         std::string("SELECT ") + kColumns +
             " FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id ASC LIMIT ?1");
  s.i64(1, limit > 0 ? limit : -1);
  std::vector<JobRow> rows;
  while (s.step()) rows.push_back(read_row(s));
  return rows;
}

int64_t JobDb::count(const std::string& state) const {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_, state.empty() ? "SELECT count(*) FROM jobs" : "SELECT count(*) FROM jobs WHERE state = ?1");
  if (!state.empty()) s.text(1, state);
  return s.step() ? s.col_i64(0) : 0;
}

int JobDb::clear_finished() {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_, "DELETE FROM jobs WHERE state IN ('completed', 'failed', 'cancelled')");
  return s.run();
}

int JobDb::clear_queued() {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_, "UPDATE jobs SET state = 'cancelled', finished_ms = ?1 WHERE state = 'queued'");
  return s.i64(1, system_now_ms()).run();
}

void JobDb::set_paused(bool paused) {
  std::lock_guard lock(mu_);
  meta_set("queue_paused", paused ? "1" : "0");
}

bool JobDb::changed_elsewhere() {
  std::lock_guard lock(mu_);
  Stmt s(db_, path_, "PRAGMA data_version");
  const int64_t v = s.step() ? s.col_i64(0) : -1;
  const bool changed = v != data_version_ || v < 0;
  data_version_ = v;
  return changed;
}

bool JobDb::paused() const {
  std::lock_guard lock(mu_);
  return meta_get("queue_paused") == "1";
}

// ---- RunnerLock ----------------------------------------------------------

namespace {
std::string lock_path(const std::string& data_dir) { return data_dir + "/runner.lock"; }
}  // namespace

std::unique_ptr<RunnerLock> RunnerLock::try_acquire(const std::string& data_dir) {
  const std::string path = lock_path(data_dir);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot open the runner lock " + path + ": " + std::strerror(errno));
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) return nullptr;
    throw Error("cannot lock the runner lock " + path + ": " + std::strerror(err));
  }
  // Record the holder's pid, for "the queue is run by process N" messages.
  const std::string pid = std::to_string(static_cast<long long>(::getpid())) + "\n";
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] const ssize_t n = ::pwrite(fd, pid.data(), pid.size(), 0);
  }
  return std::unique_ptr<RunnerLock>(new RunnerLock(fd));
}

int64_t RunnerLock::holder_pid(const std::string& data_dir) {
  const int fd = ::open(lock_path(data_dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  ::close(fd);
  if (n <= 0) return 0;
  try {
    return std::stoll(std::string(buf, static_cast<size_t>(n)));
  } catch (const std::exception&) {
    return 0;
  }
}

RunnerLock::~RunnerLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace atelier::runtime
