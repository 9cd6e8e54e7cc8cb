// The job database: every allowed and refused state transition, exactly-once
// under races between threads and between processes, recovery of running
// jobs, migrations from hand-made old databases and refusal of newer ones,
// persistence across reopen and kill -9, the pause flag, and the runner lock.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "serve/job_db.h"

using atelier::runtime::JobDb;
using atelier::runtime::JobRow;
using atelier::runtime::NewJob;
using atelier::runtime::RunRecord;
using atelier::runtime::RunnerLock;
namespace fs = std::filesystem;

namespace {

// A fresh folder per test, unique across the parallel processes ctest starts.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("atelier-jobdb-") + info->test_suite_name() + "-" + info->name() + "-" +
                       std::to_string(::getpid()) + "-" + std::to_string(counter_++);
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string dir() const { return path_.string(); }
  std::string db() const { return (path_ / "jobs.db").string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// Runs BODY in a forked child and returns its pid; the child exits with
// BODY's return value (98 on an exception) without running atexit handlers.
pid_t fork_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 98;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
      rc = 98;
    } catch (...) {
      rc = 98;
    }
    ::_exit(rc);
  }
  return pid;
}

// The child's exit code, or -signal when it was killed.
int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
}

void write_i64(int fd, int64_t v) {
  const char* p = reinterpret_cast<const char*>(&v);
  size_t left = sizeof(v);
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n <= 0) ::_exit(97);
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Reads one int64; false at end of file.
bool read_i64(int fd, int64_t* v) {
  char* p = reinterpret_cast<char*>(v);
  size_t got = 0;
  while (got < sizeof(*v)) {
    const ssize_t n = ::read(fd, p + got, sizeof(*v) - got);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    got += static_cast<size_t>(n);
  }
  return true;
}

// Blocks until the parent closes the write end of PIPE (a start barrier).
void wait_barrier(int read_fd) {
  char c;
  while (::read(read_fd, &c, 1) < 0 && errno == EINTR) {
  }
}

void exec_sql(sqlite3* db, const char* sql) {
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "") << " in " << sql;
}

// Puts a new job into STATE through the public transitions.
int64_t job_in_state(JobDb& db, const std::string& state) {
  const int64_t id = db.insert("{\"prompt\":\"x\"}", 0, false, 7, 1000);
  if (state == "queued") return id;
  if (state == "cancelled") {
    EXPECT_TRUE(db.cancel(id, 1500));
    return id;
  }
  EXPECT_TRUE(db.mark_running(id, 2000));
  if (state == "completed") {
    EXPECT_TRUE(db.complete(id, "{\"text\":\"ok\"}", "sha256:abc", 3000));
  }
  if (state == "failed") {
    EXPECT_TRUE(db.fail(id, "oom", "out of memory", 3000));
  }
  return id;
}

std::string state_of(const JobDb& db, int64_t id) {
  auto row = db.get(id);
  return row ? row->state : "<missing>";
}

const std::vector<std::string> kStates = {"queued", "running", "completed", "failed", "cancelled"};

// Runs BODY in a forked child that then holds still, and kills it with
// SIGKILL once BODY has returned: a process that dies right after its last
// write. True when BODY returned true and the kill is what ended the child.
bool run_then_kill9(const std::function<bool()>& body) {
  int out[2];
  if (::pipe(out) != 0) return false;
  const pid_t kid = fork_child([&] {
    ::close(out[0]);
    write_i64(out[1], body() ? 1 : 0);
    ::pause();
    return 0;
  });
  ::close(out[1]);
  int64_t ok = 0;
  const bool reported = read_i64(out[0], &ok);
  ::close(out[0]);
  ::kill(kid, SIGKILL);
  return wait_child(kid) == -SIGKILL && reported && ok == 1;
}

}  // namespace

TEST(JobDb, CreatesAFreshDatabaseAtTheCurrentVersionInWalMode) {
  TempDir t;
  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->schema_version(), JobDb::kSchemaVersion);
  EXPECT_EQ(db->count(""), 0);
  EXPECT_FALSE(db->paused());
  db->insert("{}", 0, false, 0, 1);
  EXPECT_TRUE(fs::exists(t.db() + "-wal"));

  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(t.db().c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &s, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)), "wal");
  sqlite3_finalize(s);
  // The queue order is served by an index.
  ASSERT_EQ(sqlite3_prepare_v2(raw,
                               "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE state = 'queued' "
                               "ORDER BY priority DESC, id ASC LIMIT 8",
                               -1, &s, nullptr),
            SQLITE_OK);
  std::string plan;
  while (sqlite3_step(s) == SQLITE_ROW) plan += reinterpret_cast<const char*>(sqlite3_column_text(s, 3)) + std::string("\n");
  sqlite3_finalize(s);
  sqlite3_close(raw);
  EXPECT_NE(plan.find("jobs_queue"), std::string::npos) << plan;
  EXPECT_EQ(plan.find("TEMP B-TREE"), std::string::npos) << plan;
}

TEST(JobDb, InsertStoresEveryField) {
  TempDir t;
  auto db = JobDb::open(t.db());
  const std::string req = "{\"prompt\":\"caf\xc3\xa9 \\\"quoted\\\"\\n\",\"n\":64}";
  const uint64_t seed = std::numeric_limits<uint64_t>::max() - 5;
  const int64_t id = db->insert(req, -3, true, seed, 1700000000123);
  EXPECT_GT(id, 0);
  auto row = db->get(id);
  ASSERT_TRUE(row);
  EXPECT_EQ(row->id, id);
  EXPECT_EQ(row->state, "queued");
  EXPECT_EQ(row->priority, -3);
  EXPECT_TRUE(row->interactive);
  EXPECT_EQ(row->request_json, req);
  EXPECT_EQ(row->created_ms, 1700000000123);
  EXPECT_EQ(row->started_ms, 0);
  EXPECT_EQ(row->finished_ms, 0);
  EXPECT_EQ(row->seed, seed);
  EXPECT_EQ(row->model_version, "");
  EXPECT_EQ(row->result_json, "");
  EXPECT_EQ(row->error_code, "");
  EXPECT_EQ(row->attempts, 0);
  EXPECT_FALSE(row->cancel_requested);
  EXPECT_FALSE(db->get(id + 1000));

  // A string with an embedded NUL survives too (bound by length).
  const std::string nul("a\0b", 3);
  const int64_t id2 = db->insert(nul, 0, false, 0, 1);
  EXPECT_EQ(db->get(id2)->request_json, nul);

  auto ids = db->insert_many({{"{\"a\":1}", 5, false, 1, ""}, {"{\"a\":2}", 6, true, 2, ""}}, 42);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[1], ids[0] + 1);
  EXPECT_EQ(db->get(ids[1])->request_json, "{\"a\":2}");
  EXPECT_EQ(db->get(ids[1])->priority, 6);
  EXPECT_TRUE(db->get(ids[1])->interactive);
  EXPECT_EQ(db->get(ids[0])->created_ms, 42);
}

TEST(JobDb, TransitionsSetTheirFields) {
  TempDir t;
  auto db = JobDb::open(t.db());
  const int64_t a = db->insert("{}", 0, false, 1, 100);
  ASSERT_TRUE(db->mark_running(a, 200));
  auto r = *db->get(a);
  EXPECT_EQ(r.state, "running");
  EXPECT_EQ(r.started_ms, 200);
  EXPECT_EQ(r.attempts, 1);
  ASSERT_TRUE(db->complete(a, "{\"text\":\"hi\"}", "sha256:feed", 300));
  r = *db->get(a);
  EXPECT_EQ(r.state, "completed");
  EXPECT_EQ(r.result_json, "{\"text\":\"hi\"}");
  EXPECT_EQ(r.model_version, "sha256:feed");
  EXPECT_EQ(r.finished_ms, 300);
  EXPECT_EQ(r.started_ms, 200);
  EXPECT_EQ(r.created_ms, 100);

  const int64_t b = db->insert("{}", 0, false, 1, 100);
  ASSERT_TRUE(db->mark_running(b, 200));
  ASSERT_TRUE(db->fail(b, "kv_oom", "the job needs 900 KV blocks; the budget holds 512", 250));
  r = *db->get(b);
  EXPECT_EQ(r.state, "failed");
  EXPECT_EQ(r.error_code, "kv_oom");
  EXPECT_EQ(r.error_message, "the job needs 900 KV blocks; the budget holds 512");
  EXPECT_EQ(r.finished_ms, 250);

  const int64_t c = db->insert("{}", 0, false, 1, 100);
  ASSERT_TRUE(db->cancel(c, 150));
  r = *db->get(c);
  EXPECT_EQ(r.state, "cancelled");
  EXPECT_EQ(r.finished_ms, 150);
  EXPECT_EQ(r.attempts, 0);
}

// Every operation from every state: which are allowed, and where they lead.
TEST(JobDb, StateMachineAllowsExactlyTheDocumentedTransitions) {
  TempDir t;
  auto db = JobDb::open(t.db());
  struct Op {
    std::string name;
    std::function<bool(JobDb&, int64_t)> run;
    // state -> resulting state when allowed; absent = refused
    std::map<std::string, std::string> allowed;
  };
  const std::vector<Op> ops = {
      {"mark_running", [](JobDb& d, int64_t id) { return d.mark_running(id, 5000); }, {{"queued", "running"}}},
      {"complete", [](JobDb& d, int64_t id) { return d.complete(id, "{}", "v", 5000); }, {{"running", "completed"}}},
      {"fail",
       [](JobDb& d, int64_t id) { return d.fail(id, "e", "m", 5000); },
       {{"queued", "failed"}, {"running", "failed"}}},
      {"cancel",
       [](JobDb& d, int64_t id) { return d.cancel(id, 5000); },
       {{"queued", "cancelled"}, {"running", "cancelled"}}},
      {"request_cancel",
       [](JobDb& d, int64_t id) { return d.request_cancel(id, 5000); },
       {{"queued", "cancelled"}, {"running", "running"}}},
      {"requeue", [](JobDb& d, int64_t id) { return d.requeue(id); }, {{"running", "queued"}}},
      {"set_priority",
       [](JobDb& d, int64_t id) { return d.set_priority(id, 9); },
       {{"queued", "queued"}, {"running", "running"}}},
  };
  for (const Op& op : ops) {
    for (const std::string& from : kStates) {
      SCOPED_TRACE(op.name + " from " + from);
      const int64_t id = job_in_state(*db, from);
      const JobRow before = *db->get(id);
      ASSERT_EQ(before.state, from);
      const auto it = op.allowed.find(from);
      const bool ok = op.run(*db, id);
      if (it == op.allowed.end()) {
        EXPECT_FALSE(ok);
        const JobRow after = *db->get(id);
        EXPECT_EQ(after.state, from);
        EXPECT_EQ(after.priority, before.priority);
        EXPECT_EQ(after.finished_ms, before.finished_ms);
        EXPECT_EQ(after.result_json, before.result_json);
        EXPECT_EQ(after.error_code, before.error_code);
        EXPECT_EQ(after.attempts, before.attempts);
        EXPECT_EQ(after.cancel_requested, before.cancel_requested);
      } else {
        EXPECT_TRUE(ok);
        EXPECT_EQ(state_of(*db, id), it->second);
      }
      // The same operation a second time: only the idempotent ones succeed again.
      if (ok && op.name != "set_priority" && op.name != "request_cancel") {
        EXPECT_FALSE(op.run(*db, id));
      }
    }
    // An unknown id is refused by everything.
    EXPECT_FALSE(op.run(*db, 999999)) << op.name;
  }
}

TEST(JobDb, RequestCancelFlagsARunningJobForItsRunner) {
  TempDir t;
  auto db = JobDb::open(t.db());
  const int64_t queued = db->insert("{}", 0, false, 0, 1);
  const int64_t running = db->insert("{}", 0, false, 0, 1);
  const int64_t other = db->insert("{}", 0, false, 0, 1);
  ASSERT_TRUE(db->mark_running(running, 2));
  ASSERT_TRUE(db->mark_running(other, 2));
  EXPECT_TRUE(db->cancel_requests().empty());

  EXPECT_TRUE(db->request_cancel(queued));  // system clock form
  EXPECT_EQ(state_of(*db, queued), "cancelled");
  EXPECT_GT(db->get(queued)->finished_ms, 1600000000000);
  EXPECT_TRUE(db->cancel_requests().empty());  // only running jobs are listed

  EXPECT_TRUE(db->request_cancel(running, 10));
  EXPECT_EQ(state_of(*db, running), "running");
  EXPECT_TRUE(db->get(running)->cancel_requested);
  EXPECT_EQ(db->get(running)->finished_ms, 0);
  EXPECT_EQ(db->cancel_requests(), std::vector<int64_t>{running});

  // The runner acts on it.
  EXPECT_TRUE(db->cancel(running, 20));
  EXPECT_TRUE(db->cancel_requests().empty());
  EXPECT_EQ(state_of(*db, other), "running");

  // A requested cancel wins over a requeue: the job does not come back.
  EXPECT_TRUE(db->request_cancel(other, 30));
  EXPECT_TRUE(db->requeue(other));
  EXPECT_EQ(state_of(*db, other), "cancelled");
  EXPECT_GT(db->get(other)->finished_ms, 0);
  EXPECT_FALSE(db->mark_running(other, 40));
}

TEST(JobDb, RequeueDiscardsTheRunAndAllowsAnotherAttempt) {
  TempDir t;
  auto db = JobDb::open(t.db());
  const int64_t id = db->insert("{}", 3, false, 0, 1);
  ASSERT_TRUE(db->mark_running(id, 10));
  ASSERT_TRUE(db->requeue(id));
  JobRow r = *db->get(id);
  EXPECT_EQ(r.state, "queued");
  EXPECT_EQ(r.started_ms, 0);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.priority, 3);
  ASSERT_TRUE(db->mark_running(id, 20));
  EXPECT_EQ(db->get(id)->attempts, 2);
  EXPECT_EQ(db->get(id)->started_ms, 20);
  ASSERT_TRUE(db->complete(id, "{\"text\":\"done\"}", "v1", 30));
  EXPECT_FALSE(db->requeue(id));
}

TEST(JobDb, NextQueuedOrdersByPriorityThenId) {
  TempDir t;
  auto db = JobDb::open(t.db());
  const int64_t a = db->insert("{}", 0, false, 0, 1);
  const int64_t b = db->insert("{}", 10, true, 0, 1);
  const int64_t c = db->insert("{}", 0, false, 0, 1);
  const int64_t d = db->insert("{}", 10, false, 0, 1);
  const int64_t e = db->insert("{}", -5, false, 0, 1);
  const int64_t f = db->insert("{}", 20, false, 0, 1);
  ASSERT_TRUE(db->mark_running(f, 2));  // not queued any more
  auto ids = [](const std::vector<JobRow>& rows) {
    std::vector<int64_t> v;
    for (const auto& r : rows) v.push_back(r.id);
    return v;
  };
  EXPECT_EQ(ids(db->next_queued(0)), (std::vector<int64_t>{b, d, a, c, e}));
  EXPECT_EQ(ids(db->next_queued(2)), (std::vector<int64_t>{b, d}));
  ASSERT_TRUE(db->set_priority(e, 11));
  EXPECT_EQ(ids(db->next_queued(0)), (std::vector<int64_t>{e, b, d, a, c}));
  ASSERT_TRUE(db->cancel(b, 3));
  EXPECT_EQ(ids(db->next_queued(3)), (std::vector<int64_t>{e, d, a}));
}

TEST(JobDb, ListAndCount) {
  TempDir t;
  auto db = JobDb::open(t.db());
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(db->insert("{\"i\":" + std::to_string(i) + "}", 0, false, 0, i));
  ASSERT_TRUE(db->mark_running(ids[1], 10));
  ASSERT_TRUE(db->mark_running(ids[2], 10));
  ASSERT_TRUE(db->complete(ids[2], "{}", "v", 11));
  ASSERT_TRUE(db->cancel(ids[3], 12));
  EXPECT_EQ(db->count(""), 6);
  EXPECT_EQ(db->count("queued"), 3);
  EXPECT_EQ(db->count("running"), 1);
  EXPECT_EQ(db->count("completed"), 1);
  EXPECT_EQ(db->count("cancelled"), 1);
  EXPECT_EQ(db->count("failed"), 0);

  auto all = db->list("", 0, false);
  ASSERT_EQ(all.size(), 6u);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].id, ids[i]);
  auto newest = db->list("", 2, true);
  ASSERT_EQ(newest.size(), 2u);
  EXPECT_EQ(newest[0].id, ids[5]);
  EXPECT_EQ(newest[1].id, ids[4]);
  auto queued = db->list("queued", 0, true);
  ASSERT_EQ(queued.size(), 3u);
  EXPECT_EQ(queued[0].id, ids[5]);
  EXPECT_EQ(queued[2].id, ids[0]);
  EXPECT_EQ(queued[2].request_json, "{\"i\":0}");
  EXPECT_TRUE(db->list("failed", 10, false).empty());
}

TEST(JobDb, ClearFinishedAndClearQueued) {
  TempDir t;
  auto db = JobDb::open(t.db());
  std::map<std::string, int64_t> by_state;
  for (const auto& s : kStates) by_state[s] = job_in_state(*db, s);
  const int64_t queued2 = db->insert("{}", 0, false, 0, 1);

  EXPECT_EQ(db->clear_finished(), 3);
  EXPECT_FALSE(db->get(by_state["completed"]));
  EXPECT_FALSE(db->get(by_state["failed"]));
  EXPECT_FALSE(db->get(by_state["cancelled"]));
  EXPECT_EQ(db->count(""), 3);
  EXPECT_EQ(db->clear_finished(), 0);

  EXPECT_EQ(db->clear_queued(), 2);
  EXPECT_EQ(state_of(*db, by_state["queued"]), "cancelled");
  EXPECT_EQ(state_of(*db, queued2), "cancelled");
  EXPECT_GT(db->get(queued2)->finished_ms, 0);
  EXPECT_EQ(state_of(*db, by_state["running"]), "running");  // a running job is not touched
  EXPECT_EQ(db->clear_queued(), 0);

  // Ids are never reused, even after the newest rows were deleted.
  EXPECT_EQ(db->clear_finished(), 2);
  const int64_t fresh = db->insert("{}", 0, false, 0, 1);
  EXPECT_GT(fresh, queued2);
}

TEST(JobDb, RecoverRequeuesRunningJobsAndKeepsTheRest) {
  TempDir t;
  std::map<std::string, int64_t> by_state;
  int64_t cancel_wanted = 0;
  {
    auto db = JobDb::open(t.db());
    for (const auto& s : kStates) by_state[s] = job_in_state(*db, s);
    by_state["running2"] = job_in_state(*db, "running");
    cancel_wanted = job_in_state(*db, "running");
    ASSERT_TRUE(db->request_cancel(cancel_wanted, 2500));
  }  // the engine stops without cleaning up
  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->recover(), 2);
  EXPECT_EQ(state_of(*db, by_state["queued"]), "queued");
  EXPECT_EQ(state_of(*db, by_state["running"]), "queued");
  EXPECT_EQ(state_of(*db, by_state["running2"]), "queued");
  EXPECT_EQ(state_of(*db, by_state["completed"]), "completed");
  EXPECT_EQ(state_of(*db, by_state["failed"]), "failed");
  EXPECT_EQ(state_of(*db, by_state["cancelled"]), "cancelled");
  EXPECT_EQ(state_of(*db, cancel_wanted), "cancelled");
  EXPECT_EQ(db->get(by_state["completed"])->result_json, "{\"text\":\"ok\"}");
  const JobRow r = *db->get(by_state["running"]);
  EXPECT_EQ(r.started_ms, 0);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(db->count("running"), 0);
  EXPECT_EQ(db->recover(), 0);
  // The recovered job runs again and completes once.
  ASSERT_TRUE(db->mark_running(r.id, 9000));
  EXPECT_EQ(db->get(r.id)->attempts, 2);
  EXPECT_TRUE(db->complete(r.id, "{}", "v", 9001));
  EXPECT_FALSE(db->complete(r.id, "{}", "v", 9002));
}

TEST(JobDb, EverythingPersistsAcrossCloseAndReopen) {
  TempDir t;
  int64_t a = 0, b = 0, c = 0;
  {
    auto db = JobDb::open(t.db());
    a = db->insert("{\"p\":\"a\"}", 4, true, 123456789012345ull, 11);
    b = job_in_state(*db, "completed");
    c = job_in_state(*db, "failed");
    db->set_paused(true);
  }
  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->schema_version(), JobDb::kSchemaVersion);
  EXPECT_TRUE(db->paused());
  JobRow r = *db->get(a);
  EXPECT_EQ(r.request_json, "{\"p\":\"a\"}");
  EXPECT_EQ(r.priority, 4);
  EXPECT_TRUE(r.interactive);
  EXPECT_EQ(r.seed, 123456789012345ull);
  EXPECT_EQ(r.created_ms, 11);
  r = *db->get(b);
  EXPECT_EQ(r.state, "completed");
  EXPECT_EQ(r.model_version, "sha256:abc");
  EXPECT_EQ(r.result_json, "{\"text\":\"ok\"}");
  EXPECT_EQ(r.finished_ms, 3000);
  r = *db->get(c);
  EXPECT_EQ(r.error_code, "oom");
  EXPECT_EQ(r.error_message, "out of memory");
}

TEST(JobDb, PauseFlagIsPersistentAndSharedBetweenConnections) {
  TempDir t;
  auto one = JobDb::open(t.db());
  auto two = JobDb::open(t.db());
  EXPECT_FALSE(one->paused());
  one->set_paused(true);
  EXPECT_TRUE(one->paused());
  EXPECT_TRUE(two->paused());
  two->set_paused(false);
  EXPECT_FALSE(one->paused());
  one->set_paused(true);
  one.reset();
  two.reset();
  EXPECT_TRUE(JobDb::open(t.db())->paused());
}

// changed_elsewhere() reports commits by other connections only: a runner
// re-reads the queue when another process changed it, not after its own writes.
TEST(JobDb, ChangedElsewhereSeesOnlyOtherConnections) {
  TempDir t;
  auto runner = JobDb::open(t.db());
  auto other = JobDb::open(t.db());
  EXPECT_TRUE(runner->changed_elsewhere());  // first call: nothing seen yet
  EXPECT_FALSE(runner->changed_elsewhere());
  runner->insert("{}", 0, false, 0, 1);
  runner->set_paused(true);
  EXPECT_FALSE(runner->changed_elsewhere()) << "its own writes";
  other->insert("{}", 0, false, 0, 2);
  EXPECT_TRUE(runner->changed_elsewhere());
  EXPECT_FALSE(runner->changed_elsewhere());
  other->set_paused(false);
  EXPECT_TRUE(runner->changed_elsewhere());
  EXPECT_FALSE(other->changed_elsewhere() && other->changed_elsewhere());
}

// ---- migrations ----------------------------------------------------------

namespace {
// The version-1 schema exactly as that version created it.
const char* kV1Schema = R"sql(
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
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
INSERT INTO meta (key, value) VALUES ('schema_version', '1');
)sql";

void make_db(const std::string& path, const char* sql) {
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  exec_sql(raw, sql);
  sqlite3_close(raw);
}
}  // namespace

TEST(JobDbMigrations, EmptyFileAndVersionZeroAreMigratedToTheCurrentVersion) {
  TempDir t;
  const std::string empty = t.dir() + "/empty.db";
  make_db(empty, "PRAGMA user_version = 0");  // a valid SQLite file with no tables
  {
    auto db = JobDb::open(empty);
    EXPECT_EQ(db->schema_version(), JobDb::kSchemaVersion);
    EXPECT_GT(db->insert("{}", 0, false, 0, 1), 0);
  }
  const std::string v0 = t.dir() + "/v0.db";
  make_db(v0,
          "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
          "INSERT INTO meta VALUES ('schema_version', '0'), ('queue_paused', '1');");
  auto db = JobDb::open(v0);
  EXPECT_EQ(db->schema_version(), JobDb::kSchemaVersion);
  EXPECT_TRUE(db->paused());  // other meta rows are kept
  const int64_t id = db->insert("{}", 0, false, 0, 1);
  EXPECT_TRUE(db->mark_running(id, 2));
}

TEST(JobDbMigrations, VersionOneDatabaseKeepsItsJobsAndGainsNewColumns) {
  TempDir t;
  make_db(t.db(), kV1Schema);
  make_db(t.db(),
          "INSERT INTO jobs (state, priority, request_json, created_ms, seed, attempts, started_ms) "
          "VALUES ('queued', 2, '{\"old\":1}', 100, -1, 0, 0), "
          "('running', 0, '{\"old\":2}', 101, 5, 1, 150), "
          "('completed', 0, '{\"old\":3}', 102, 6, 1, 160);"
          "UPDATE jobs SET result_json = '{\"text\":\"r\"}', model_version = 'm', finished_ms = 170 "
          "WHERE state = 'completed';");
  {
    auto db = JobDb::open(t.db());
    EXPECT_EQ(db->schema_version(), JobDb::kSchemaVersion);
    ASSERT_EQ(db->count(""), 3);
    JobRow r = *db->get(1);
    EXPECT_EQ(r.request_json, "{\"old\":1}");
    EXPECT_EQ(r.priority, 2);
    EXPECT_EQ(r.seed, std::numeric_limits<uint64_t>::max());  // -1 stored = 2^64 - 1
    EXPECT_FALSE(r.cancel_requested);
    EXPECT_EQ(db->get(3)->result_json, "{\"text\":\"r\"}");
    // The running job of the old version is recovered; the new column works.
    EXPECT_EQ(db->recover(), 1);
    EXPECT_TRUE(db->mark_running(2, 200));
    EXPECT_TRUE(db->request_cancel(2, 201));
    EXPECT_EQ(db->cancel_requests(), std::vector<int64_t>{2});
  }
  // Reopening an up-to-date database changes nothing.
  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->schema_version(), JobDb::kSchemaVersion);
  EXPECT_EQ(db->count(""), 3);
  EXPECT_TRUE(db->get(2)->cancel_requested);
}

// Issue 33: where and how a job ran is recorded beside its model digest; an
// older database gains the columns (its jobs keep "" there) and requeue clears them.
TEST(JobDbMigrations, AnOlderDatabaseGainsTheDeviceThePrecisionAndTheBuildOfEachJob) {
  TempDir t;
  make_db(t.db(), kV1Schema);
  make_db(t.db(),
          "INSERT INTO jobs (state, request_json, created_ms, result_json, model_version, finished_ms) "
          "VALUES ('completed', '{}', 100, '{\"text\":\"r\"}', 'sha256:old', 170), ('queued', '{}', 101, '', '', 0);");
  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->schema_version(), JobDb::kSchemaVersion);
  const JobRow old = *db->get(1);
  EXPECT_EQ(old.model_version, "sha256:old");
  EXPECT_EQ(old.device, "");
  EXPECT_EQ(old.precision, "");
  ASSERT_TRUE(db->mark_running(2, 200));
  ASSERT_TRUE(db->requeue(2));
  ASSERT_TRUE(db->mark_running(2, 210));
  const RunRecord run{"cuda:0", "weights:bf16 quant:kept act:bf16 kv:f16 acc:f32", "atelier 0.1.0 (git x)"};
  ASSERT_TRUE(db->complete(2, "{}", "sha256:new", 220, "m@1", run));
  JobRow r = *db->get(2);
  EXPECT_EQ(r.device, "cuda:0");
  EXPECT_EQ(r.precision, run.precision);
  EXPECT_EQ(r.engine_build, run.engine_build);
  EXPECT_EQ(r.model_version, "sha256:new");
}

TEST(JobDbMigrations, RefusesADatabaseFromANewerAtelier) {
  TempDir t;
  {
    auto db = JobDb::open(t.db());
    db->insert("{}", 0, false, 0, 1);
  }
  const std::string future = std::to_string(JobDb::kSchemaVersion + 1);
  make_db(t.db(), ("UPDATE meta SET value = '" + future + "' WHERE key = 'schema_version'").c_str());
  try {
    JobDb::open(t.db());
    FAIL() << "a newer database was opened";
  } catch (const atelier::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("made by a newer Atelier"), std::string::npos) << msg;
    EXPECT_NE(msg.find(t.db()), std::string::npos) << msg;
    EXPECT_NE(msg.find("schema version " + future), std::string::npos) << msg;
  }
  // Left as it was.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(t.db().c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &s, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(s, 0))), future);
  sqlite3_finalize(s);
  sqlite3_close(raw);
}

TEST(JobDbMigrations, ClearErrorsForFilesThatAreNotJobDatabases) {
  TempDir t;
  const std::string junk = t.dir() + "/junk.db";
  {
    std::FILE* f = std::fopen(junk.c_str(), "wb");
    ASSERT_TRUE(f);
    const std::string text(4096, 'x');
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  try {
    JobDb::open(junk);
    FAIL() << "junk opened";
  } catch (const atelier::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(junk), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a database"), std::string::npos) << msg;
  }
  const std::string missing = t.dir() + "/no/such/dir/jobs.db";
  try {
    JobDb::open(missing);
    FAIL() << "opened in a missing folder";
  } catch (const atelier::Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string bad_version = t.dir() + "/bad.db";
  make_db(bad_version,
          "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
          "INSERT INTO meta VALUES ('schema_version', 'two');");
  EXPECT_THROW(JobDb::open(bad_version), atelier::Error);
}

TEST(JobDbMigrations, ProcessesOpeningANewDatabaseAtOnceMigrateItOnce) {
  TempDir t;
  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; ++k) {
    kids.push_back(fork_child([&] {
      ::close(gate[1]);
      wait_barrier(gate[0]);
      auto db = JobDb::open(t.db());
      db->insert("{}", 0, false, 0, 1);
      return db->schema_version() == JobDb::kSchemaVersion ? 0 : 1;
    }));
  }
  ::close(gate[0]);
  ::close(gate[1]);
  for (pid_t p : kids) EXPECT_EQ(wait_child(p), 0);
  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->count(""), 4);
  EXPECT_EQ(db->schema_version(), JobDb::kSchemaVersion);
}

// ---- exactly once under races -------------------------------------------

namespace {
// Each worker walks every job: mark_running, then complete with its own name.
// Returns how many of each it won.
struct Wins {
  std::vector<int64_t> started, completed;
};
Wins race_over(JobDb& db, const std::vector<int64_t>& ids, int worker) {
  Wins w;
  for (int64_t id : ids) {
    if (db.mark_running(id, 1000 + worker)) w.started.push_back(id);
    if (db.complete(id, "{\"by\":" + std::to_string(worker) + "}", "v", 2000 + worker)) w.completed.push_back(id);
  }
  return w;
}

void check_exactly_once(const JobDb& db, const std::vector<int64_t>& ids, const std::vector<Wins>& wins) {
  std::map<int64_t, int> started, completed;
  std::map<int64_t, int> completer;
  for (size_t k = 0; k < wins.size(); ++k) {
    for (int64_t id : wins[k].started) ++started[id];
    for (int64_t id : wins[k].completed) {
      ++completed[id];
      completer[id] = static_cast<int>(k);
    }
  }
  for (int64_t id : ids) {
    SCOPED_TRACE("job " + std::to_string(id));
    EXPECT_EQ(started[id], 1);
    EXPECT_EQ(completed[id], 1);
    const JobRow r = *db.get(id);
    EXPECT_EQ(r.state, "completed");
    EXPECT_EQ(r.attempts, 1);
    EXPECT_EQ(r.result_json, "{\"by\":" + std::to_string(completer[id]) + "}");
    EXPECT_EQ(r.finished_ms, 2000 + completer[id]);
  }
}
}  // namespace

TEST(JobDbRace, ThreadsSharingOneConnectionStartAndCompleteEachJobOnce) {
  TempDir t;
  auto db = JobDb::open(t.db());
  std::vector<int64_t> ids;
  for (int i = 0; i < 200; ++i) ids.push_back(db->insert("{}", 0, false, 0, 1));
  constexpr int kThreads = 6;
  std::vector<Wins> wins(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k)
    threads.emplace_back([&, k] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      wins[static_cast<size_t>(k)] = race_over(*db, ids, k);
    });
  for (auto& th : threads) th.join();
  check_exactly_once(*db, ids, wins);
}

TEST(JobDbRace, ThreadsWithTheirOwnConnectionsStartAndCompleteEachJobOnce) {
  TempDir t;
  std::vector<int64_t> ids;
  {
    auto db = JobDb::open(t.db());
    for (int i = 0; i < 200; ++i) ids.push_back(db->insert("{}", 0, false, 0, 1));
  }
  constexpr int kThreads = 6;
  std::vector<std::unique_ptr<JobDb>> conns;
  for (int k = 0; k < kThreads; ++k) conns.push_back(JobDb::open(t.db()));
  std::vector<Wins> wins(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k)
    threads.emplace_back([&, k] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      wins[static_cast<size_t>(k)] = race_over(*conns[static_cast<size_t>(k)], ids, k);
    });
  for (auto& th : threads) th.join();
  check_exactly_once(*conns[0], ids, wins);
}

TEST(JobDbRace, ProcessesStartAndCompleteEachJobOnce) {
  TempDir t;
  std::vector<int64_t> ids;
  {
    auto db = JobDb::open(t.db());
    for (int i = 0; i < 200; ++i) ids.push_back(db->insert("{}", 0, false, 0, 1));
  }  // closed: no connection is carried across fork
  constexpr int kProcs = 4;
  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  std::vector<pid_t> kids;
  std::vector<int> results;
  for (int k = 0; k < kProcs; ++k) {
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    kids.push_back(fork_child([&, k] {
      ::close(gate[1]);
      ::close(out[0]);
      auto db = JobDb::open(t.db());
      wait_barrier(gate[0]);
      const Wins w = race_over(*db, ids, k);
      // Started ids, a -1 separator, then completed ids.
      for (int64_t id : w.started) write_i64(out[1], id);
      write_i64(out[1], -1);
      for (int64_t id : w.completed) write_i64(out[1], id);
      return 0;
    }));
    ::close(out[1]);
    results.push_back(out[0]);
  }
  ::close(gate[0]);
  ::close(gate[1]);  // go
  std::vector<Wins> wins(kProcs);
  for (int k = 0; k < kProcs; ++k) {
    int64_t v;
    bool sep = false;
    while (read_i64(results[static_cast<size_t>(k)], &v)) {
      if (v == -1) {
        sep = true;
        continue;
      }
      (sep ? wins[static_cast<size_t>(k)].completed : wins[static_cast<size_t>(k)].started).push_back(v);
    }
    ::close(results[static_cast<size_t>(k)]);
    EXPECT_TRUE(sep);
  }
  for (pid_t p : kids) EXPECT_EQ(wait_child(p), 0);
  auto db = JobDb::open(t.db());
  check_exactly_once(*db, ids, wins);
}

// ---- crashes ---------------------------------------------------------------

TEST(JobDbCrash, EveryAcknowledgedInsertSurvivesSigkill) {
  TempDir t;
  { JobDb::open(t.db()); }
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t kid = fork_child([&]() -> int {
    ::close(out[0]);
    auto db = JobDb::open(t.db());
    for (int i = 0;; ++i) {
      const int64_t id = db->insert("{\"n\":" + std::to_string(i) + "}", i % 3, false, static_cast<uint64_t>(i), i);
      write_i64(out[1], id);  // acknowledged
      write_i64(out[1], i);
    }
  });
  ::close(out[1]);
  std::vector<std::pair<int64_t, int64_t>> acked;
  int64_t id, n;
  while (acked.size() < 150 && read_i64(out[0], &id) && read_i64(out[0], &n)) acked.emplace_back(id, n);
  ::kill(kid, SIGKILL);  // mid-insert of the next one, most likely
  EXPECT_EQ(wait_child(kid), -SIGKILL);
  ::close(out[0]);
  ASSERT_EQ(acked.size(), 150u);

  auto db = JobDb::open(t.db());
  EXPECT_GE(db->count(""), 150);
  for (const auto& [jid, i] : acked) {
    auto r = db->get(jid);
    ASSERT_TRUE(r) << "acknowledged job " << jid << " lost";
    EXPECT_EQ(r->state, "queued");
    EXPECT_EQ(r->request_json, "{\"n\":" + std::to_string(i) + "}");
    EXPECT_EQ(r->seed, static_cast<uint64_t>(i));
  }
}

TEST(JobDbCrash, AJobKilledRightAfterInsertReturnsIsThere) {
  TempDir t;
  for (int round = 0; round < 5; ++round) {
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    const pid_t kid = fork_child([&] {
      ::close(out[0]);
      auto db = JobDb::open(t.db());
      const int64_t id = db->insert("{\"round\":" + std::to_string(round) + "}", 0, true, 99, 5);
      write_i64(out[1], id);
      ::kill(::getpid(), SIGKILL);  // no destructor, no checkpoint, no close
      return 1;
    });
    ::close(out[1]);
    int64_t id = 0;
    ASSERT_TRUE(read_i64(out[0], &id));
    ::close(out[0]);
    EXPECT_EQ(wait_child(kid), -SIGKILL);
    auto db = JobDb::open(t.db());
    auto r = db->get(id);
    ASSERT_TRUE(r) << "round " << round;
    EXPECT_EQ(r->request_json, "{\"round\":" + std::to_string(round) + "}");
    EXPECT_EQ(db->count(""), round + 1);
  }
}

TEST(JobDbCrash, ARunnerKilledMidRunLeavesJobsThatRecoverAndCompleteOnce) {
  TempDir t;
  std::vector<int64_t> ids;
  {
    auto db = JobDb::open(t.db());
    for (int i = 0; i < 4; ++i) ids.push_back(db->insert("{}", 0, false, 0, 1));
  }
  ASSERT_TRUE(run_then_kill9([&] {
    auto db = JobDb::open(t.db());
    db->mark_running(ids[0], 10);
    db->complete(ids[0], "{\"text\":\"first\"}", "v", 11);
    db->mark_running(ids[1], 12);
    db->mark_running(ids[2], 12);
    return true;
  }));

  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->recover(), 2);
  EXPECT_EQ(state_of(*db, ids[0]), "completed");
  EXPECT_EQ(db->get(ids[0])->result_json, "{\"text\":\"first\"}");
  for (int64_t id : {ids[1], ids[2], ids[3]}) {
    EXPECT_EQ(state_of(*db, id), "queued");
    EXPECT_TRUE(db->mark_running(id, 20));
    EXPECT_TRUE(db->complete(id, "{}", "v", 21));
  }
  EXPECT_FALSE(db->mark_running(ids[0], 30));
  EXPECT_EQ(db->count("completed"), 4);
  EXPECT_EQ(db->get(ids[1])->attempts, 2);
  EXPECT_EQ(db->get(ids[3])->attempts, 1);
}

// ---- runner lock -------------------------------------------------------------

TEST(RunnerLock, OnlyOneHolderAtATime) {
  TempDir t;
  auto lock = RunnerLock::try_acquire(t.dir());
  ASSERT_TRUE(lock);
  EXPECT_EQ(RunnerLock::holder_pid(t.dir()), ::getpid());
  EXPECT_FALSE(RunnerLock::try_acquire(t.dir()));  // a second one in this process

  const pid_t kid = fork_child([&] { return RunnerLock::try_acquire(t.dir()) ? 1 : 0; });
  EXPECT_EQ(wait_child(kid), 0) << "the child acquired a lock the parent holds";

  lock.reset();
  const pid_t kid2 = fork_child([&] { return RunnerLock::try_acquire(t.dir()) ? 0 : 1; });
  EXPECT_EQ(wait_child(kid2), 0) << "the child could not acquire a free lock";
  EXPECT_TRUE(RunnerLock::try_acquire(t.dir()));
}

TEST(RunnerLock, IsReleasedWhenTheHolderIsKilled) {
  TempDir t;
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t kid = fork_child([&] {
    ::close(out[0]);
    auto lock = RunnerLock::try_acquire(t.dir());
    write_i64(out[1], lock ? 1 : 0);
    ::pause();
    return 0;
  });
  ::close(out[1]);
  int64_t got = -1;
  ASSERT_TRUE(read_i64(out[0], &got));
  ::close(out[0]);
  ASSERT_EQ(got, 1);
  EXPECT_FALSE(RunnerLock::try_acquire(t.dir()));
  EXPECT_EQ(RunnerLock::holder_pid(t.dir()), kid);
  ::kill(kid, SIGKILL);
  EXPECT_EQ(wait_child(kid), -SIGKILL);
  auto lock = RunnerLock::try_acquire(t.dir());
  EXPECT_TRUE(lock);
  EXPECT_EQ(RunnerLock::holder_pid(t.dir()), ::getpid());
}

TEST(RunnerLock, MissingDataDirIsAClearError) {
  TempDir t;
  const std::string dir = t.dir() + "/missing";
  try {
    RunnerLock::try_acquire(dir);
    FAIL() << "locked in a missing folder";
  } catch (const atelier::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/runner.lock"), std::string::npos) << e.what();
  }
  EXPECT_EQ(RunnerLock::holder_pid(dir), 0);
}

// Crash-loop protection (issue 14, reworked in issue 31): only a job that
// was running ALONE at two process deaths is failed. Jobs that were running
// together when the process died are suspects, requeued however often that
// happens (with continuous batching every job in flight is "running", and
// two deaths used to fail them all); one death alone is not counted twice,
// and a clean requeue is no death at all.
TEST(JobDbCrashLoop, OnlyAJobRunningAloneAtTwoDeathsIsFailed) {
  TempDir t;
  int64_t a = 0, b = 0, c = 0, requeued = 0;
  {
    auto db = JobDb::open(t.db());
    a = db->insert("{\"n\":1}", 0, false, 0, 1);
    b = db->insert("{\"n\":2}", 0, false, 0, 1);
    c = db->insert("{\"n\":3}", 0, false, 0, 1);
    requeued = db->insert("{\"n\":4}", 0, false, 0, 1);
    // A clean shutdown's requeue is no interruption, however often.
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(db->mark_running(requeued, 10));
      ASSERT_TRUE(db->requeue(requeued));
    }
    for (int64_t id : {a, b, c}) ASSERT_TRUE(db->mark_running(id, 10));
  }  // first death: a, b and c running together
  for (int death = 2; death <= 3; ++death) {
    auto db = JobDb::open(t.db());
    EXPECT_EQ(db->recover(), 3) << "death " << death - 1;
    for (int64_t id : {a, b, c}) {
      const JobRow r = *db->get(id);
      EXPECT_EQ(r.state, "queued") << "a job that died in company is a suspect, not failed: " << id;
      EXPECT_TRUE(r.suspect);
      EXPECT_EQ(r.died_alone, 0);
      EXPECT_EQ(r.interrupted, death - 1);
      ASSERT_TRUE(db->mark_running(id, 20));
    }
  }  // the second and third deaths: the three together again
  {
    auto db = JobDb::open(t.db());
    EXPECT_EQ(db->recover(), 3);
    for (int64_t id : {a, b, c}) EXPECT_EQ(state_of(*db, id), "queued");
    EXPECT_FALSE(db->get(requeued)->suspect);
    EXPECT_EQ(db->get(requeued)->interrupted, 0);
    ASSERT_TRUE(db->mark_running(b, 30));
  }  // b dies alone once: counted, still queued
  {
    auto db = JobDb::open(t.db());
    EXPECT_EQ(db->recover(), 1);
    EXPECT_EQ(state_of(*db, b), "queued");
    EXPECT_EQ(db->get(b)->died_alone, 1);
    ASSERT_TRUE(db->mark_running(a, 40));
    ASSERT_TRUE(db->complete(a, "{}", "v", 41));
    ASSERT_TRUE(db->mark_running(b, 42));
  }  // b dies alone a second time: failed, with the reason
  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->recover(), 1);
  const JobRow v = *db->get(b);
  EXPECT_EQ(v.state, "failed");
  EXPECT_EQ(v.error_message.rfind("interrupted twice; retry to run it again", 0), 0u) << v.error_message;
  EXPECT_NE(v.error_message.find("alone"), std::string::npos) << v.error_message;
  EXPECT_EQ(v.error_code, "internal");
  EXPECT_EQ(v.died_alone, 2);
  EXPECT_GT(v.finished_ms, 0);
  EXPECT_EQ(state_of(*db, a), "completed");
  EXPECT_EQ(state_of(*db, c), "queued");
  EXPECT_EQ(state_of(*db, requeued), "queued");
  EXPECT_EQ(db->recover(), 0);
  EXPECT_EQ(state_of(*db, b), "failed");
}

// A job whose cancel was requested is cancelled by recovery, and still counts
// as company: the one beside it did not die alone.
TEST(JobDbCrashLoop, ACancelledNeighbourIsCompanyAndIsCancelled) {
  TempDir t;
  int64_t lone = 0, cancelled = 0;
  {
    auto db = JobDb::open(t.db());
    lone = db->insert("{}", 0, false, 0, 1);
    cancelled = db->insert("{}", 0, false, 0, 1);
    ASSERT_TRUE(db->mark_running(lone, 10));
    ASSERT_TRUE(db->mark_running(cancelled, 10));
    ASSERT_TRUE(db->request_cancel(cancelled, 11));
  }
  auto db = JobDb::open(t.db());
  EXPECT_EQ(db->recover(), 1);
  EXPECT_EQ(state_of(*db, cancelled), "cancelled");
  EXPECT_EQ(state_of(*db, lone), "queued");
  EXPECT_TRUE(db->get(lone)->suspect);
  EXPECT_EQ(db->get(lone)->died_alone, 0);
}

// With nothing running, recovery writes nothing: a runner can start on a
// database that takes no writes (a full disk). Seen here as a read-only file.
TEST(JobDbCrashLoop, RecoveryWithNothingRunningWritesNothing) {
  TempDir t;
  int64_t id = 0;
  {
    auto db = JobDb::open(t.db());
    id = db->insert("{}", 0, false, 0, 1);
  }
  {
    auto db = JobDb::open(t.db());
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open_v2(t.db().c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    // Another connection holds the write lock: any write of recover() would wait 5 s and throw.
    ASSERT_EQ(sqlite3_exec(raw, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(db->recover(), 0);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "recover() waited for the write lock";
    sqlite3_exec(raw, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close_v2(raw);
  }
  EXPECT_EQ(state_of(*JobDb::open(t.db()), id), "queued");
}

// A kill -9 while the job runs alone, twice, in real processes.
TEST(JobDbCrashLoop, TwoKillsWhileRunningAloneFailTheJob) {
  TempDir t;
  int64_t id = 0;
  {
    auto db = JobDb::open(t.db());
    id = db->insert("{}", 0, false, 0, 1);
  }
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(run_then_kill9([&] {
      auto db = JobDb::open(t.db());
      db->recover();
      return db->mark_running(id, 100);
    }));
  }
  auto db = JobDb::open(t.db());
  db->recover();
  EXPECT_EQ(state_of(*db, id), "failed");
  EXPECT_NE(db->get(id)->error_message.find("interrupted twice"), std::string::npos);
}

// Idempotent submission (issue 14, `atelier batch` reruns): a key names one job
// while it is queued, running or completed; a failed or cancelled one is queued afresh.
TEST(JobDbKeys, AKeyedJobIsInsertedOnceUntilItFails) {
  TempDir t;
  auto db = JobDb::open(t.db());
  std::vector<bool> fresh;
  const auto first = db->insert_many({{"{\"a\":1}", 0, false, 1, "k1"}, {"{\"b\":1}", 0, false, 2, "k2"}, {"{}", 0, false, 3, ""}}, 5, &fresh);
  EXPECT_EQ(fresh, (std::vector<bool>{true, true, true}));
  fresh.clear();
  const auto again = db->insert_many({{"{\"a\":2}", 0, false, 1, "k1"}, {"{\"b\":2}", 0, false, 2, "k2"}, {"{}", 0, false, 3, ""}}, 6, &fresh);
  EXPECT_EQ(fresh, (std::vector<bool>{false, false, true}));
  EXPECT_EQ(again[0], first[0]);
  EXPECT_EQ(again[1], first[1]);
  EXPECT_NE(again[2], first[2]);  // no key: always a new job
  EXPECT_EQ(db->get(first[0])->request_json, "{\"a\":1}");  // the earlier job is kept as it was
  EXPECT_EQ(db->find_key("k1"), first[0]);
  // Running and completed still count; failed and cancelled do not.
  ASSERT_TRUE(db->mark_running(first[0], 7));
  EXPECT_EQ(db->insert_many({{"{}", 0, false, 1, "k1"}}, 8)[0], first[0]);
  ASSERT_TRUE(db->complete(first[0], "{}", "v", 9));
  EXPECT_EQ(db->insert_many({{"{}", 0, false, 1, "k1"}}, 10)[0], first[0]);
  ASSERT_TRUE(db->fail(first[1], "io", "x", 11));
  EXPECT_FALSE(db->find_key("k2").has_value());
  const int64_t retried = db->insert_many({{"{}", 0, false, 2, "k2"}}, 12)[0];
  EXPECT_NE(retried, first[1]);
  EXPECT_EQ(db->find_key("k2"), retried);
  EXPECT_EQ(db->count(""), 5);
}

// Issue 31, item 9: `atelier batch` queued 4k lines in 7 s, 16k in 62 s and
// 100k never: each keyed insert looked its key up by walking every queued row
// (the partial index on submit_key was not used). A keyed insert must cost the
// same beside 40,000 queued jobs as in an empty queue. Two timings of the same
// 1,000 keyed inserts, not an absolute bound: before the fix the second took
// about 50 times the first (2,000 beside 60,000: 41 s against 0.7 s).
TEST(JobDbKeys, AKeyedInsertDoesNotWalkTheQueue) {
  TempDir t;
  auto db = JobDb::open(t.db());
  auto keyed = [](const std::string& tag) {
    std::vector<NewJob> jobs;
    for (int i = 0; i < 1000; ++i) jobs.push_back({"{}", 0, false, 1, tag + std::to_string(i)});
    return jobs;
  };
  auto seconds = [&](const std::vector<NewJob>& jobs) {
    const auto t0 = std::chrono::steady_clock::now();
    db->insert_many(jobs, 1);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double empty_s = seconds(keyed("a"));
  db->insert_many(std::vector<NewJob>(40000, NewJob{"{}", 0, false, 1, ""}), 2);  // no keys: no lookups
  const double full_s = seconds(keyed("b"));
  EXPECT_LT(full_s, 4 * empty_s + 0.3) << "1,000 keyed inserts took " << empty_s << " s into an empty queue and " << full_s
                                       << " s beside 41,000 queued jobs";
  // And the keys still find their jobs.
  EXPECT_EQ(db->insert_many({{"{}", 0, false, 1, "b999"}}, 3)[0], db->find_key("b999"));
  EXPECT_EQ(db->count("queued"), 42000);
}
