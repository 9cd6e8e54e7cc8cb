// The scheduler alone, against a fake runner (fake_runner.h): admission
// under a tiny KV budget, preemption and recompute, aging for both kinds of
// job, image preemption, cancel within one step, and text steps running
// while an image step is in flight. Expected tokens come from the fake's
// formula applied to the prompt's ids here, independently of the scheduler.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/engine_test_util.h"
#include "serve/fake_runner.h"
#include "serve/runner.h"
#include "serve/scheduler.h"

using namespace atelier;
namespace fs = std::filesystem;

namespace {

const std::string kText = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";
const std::string kVocab = std::string(ATELIER_FIXTURES_DIR) + "/clip/bpe_simple_vocab_16e6.txt.gz";

int64_t epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const tok::Tokenizer& tokenizer() {
  static const std::unique_ptr<tok::Tokenizer> t = tok::Tokenizer::from_gguf(*formats::GgufFile::open(kText));
  return *t;
}

// The fake's tokens for PROMPT, computed here from its ids.
std::vector<int32_t> expected_tokens(const std::string& prompt, int n) {
  std::vector<int32_t> ids = tokenizer().encode(prompt, true, true);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(test::FakeRunner::next_token(ids.data(), static_cast<int>(ids.size())));
    ids.push_back(out.back());
  }
  return out;
}

int prompt_tokens(const std::string& prompt) { return static_cast<int>(tokenizer().encode(prompt, true, true).size()); }

TextRequest text_job(const std::string& prompt, int n, int priority = 0) {
  TextRequest r;
  r.model = kText;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.sampling.seed = 1;
  r.ignore_eos = true;
  r.priority = priority;
  return r;
}

ImageRequest picture(int steps, int priority = 0, uint64_t seed = 5) {
  ImageRequest r;
  r.model = kText;  // any file resolves; the fake runner ignores what it holds
  r.prompt = "a lighthouse at dusk";
  r.width = r.height = 64;
  r.steps = steps;
  r.sampler = "euler";
  r.seed = seed;
  r.priority = priority;
  return r;
}

struct Harness {
  fs::path dir;
  EngineConfig config;
  test::FakeRunner* runner = nullptr;
  test::EventLog log;
  std::unique_ptr<runtime::JobDb> db;
  EventHub hub;
  std::unique_ptr<MetricsRecorder> metrics;
  std::unique_ptr<Scheduler> sched;  // last: stopped first

  Harness(const std::string& tag, EngineConfig c, int text_step_ms, int image_step_ms, bool paused = false)
      : dir(test::fresh_dir(tag)), config(with_batch_defaults(std::move(c), false)) {
    fs::create_directories(dir);
    config.data_dir = dir.string();
    config.store_dir = (dir / "store").string();
    config.max_wait_ms = 0;
    config.poll_ms = 20;
    db = runtime::JobDb::open((dir / "jobs.db").string());
    db->set_paused(paused);
    metrics = std::make_unique<MetricsRecorder>(config.max_batch);
    hub.subscribe(0, std::ref(log));
    auto r = std::make_unique<test::FakeRunner>(config, text_step_ms, image_step_ms, kVocab);
    runner = r.get();
    sched = std::make_unique<Scheduler>(config, *db, hub, *metrics, std::move(r));
  }
  ~Harness() {
    sched.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  JobId add(const TextRequest& r, int64_t created_ms = 0) {
    const JobId id = db->insert(request_to_json(r), r.priority, r.interactive, r.sampling.seed, created_ms ? created_ms : epoch_ms());
    sched->notify();
    return id;
  }
  JobId add(const ImageRequest& r, int64_t created_ms = 0) {
    const JobId id = db->insert(image_request_to_json(r), r.priority, r.interactive, r.seed, created_ms ? created_ms : epoch_ms());
    sched->notify();
    return id;
  }
  void resume() {
    db->set_paused(false);
    sched->notify();
  }
  // Waits (up to a minute) until the job has ended; returns its final event.
  Event wait_end(JobId id) {
    for (int i = 0; i < 6000; ++i) {
      for (const Event& e : log.snapshot())
        if (e.job == id && (e.type == EventType::Completed || e.type == EventType::Failed || e.type == EventType::Cancelled))
          return e;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "job " << id << " did not end";
    return {};
  }
  bool wait_started(JobId id) {
    for (int i = 0; i < 6000; ++i) {
      if (index_of(EventType::Started, id) >= 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  // Position of the first event of TYPE for job ID in the log, -1 when none.
  int index_of(EventType type, JobId id) {
    const auto events = log.snapshot();
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i].type == type && events[i].job == id) return static_cast<int>(i);
    return -1;
  }
  std::string result_ids(JobId id) {
    auto row = db->get(id);
    return row ? row->result_json : "";
  }
};

std::vector<int32_t> ids_of(const Event& e) { return e.result.ids; }

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace

// Admission goes in priority order and stops at the first job whose prompt
// does not fit: a smaller, lower job must not slip in ahead of it (it would
// keep the higher one waiting for memory).
TEST(Scheduler, AdmissionStopsAtTheFirstJobThatDoesNotFit) {
  const std::string long_prompt = "Once upon a time there was a little girl named Lily who loved to play in the park";
  const std::string mid_prompt = "The cat sat on the mat and";
  const std::string short_prompt = "Hi";
  EngineConfig c;
  c.kv_block_tokens = 4;
  const int bt = c.kv_block_tokens;
  const int n_long = prompt_tokens(long_prompt), n_mid = prompt_tokens(mid_prompt), n_short = prompt_tokens(short_prompt);
  const int blocks_long = (n_long + bt - 1) / bt;
  const int total = blocks_long + 2;
  ASSERT_GT((n_mid + bt - 1) / bt, 2) << "the middle prompt must need more blocks than are left beside the long job";
  ASSERT_LE((n_short + bt - 1) / bt, 1);
  const int long_new = total * bt - n_long;  // the long job may grow to the whole pool
  c.kv_memory_bytes = text::KvPool::block_bytes_for(test::FakeRunner::hparams(tokenizer().n_vocab()), bt, KvType::F32) * total;
  Harness h("sched-admit", c, /*text_step_ms=*/25, /*image_step_ms=*/0);

  const JobId big = h.add(text_job(long_prompt, long_new, 10));
  ASSERT_TRUE(h.wait_started(big));
  // Both arrive while the big job holds all but two blocks.
  runtime::NewJob high, low;
  high.request_json = request_to_json(text_job(mid_prompt, 4, 5));
  high.priority = 5;
  low.request_json = request_to_json(text_job(short_prompt, 4, 1));
  low.priority = 1;
  const std::vector<int64_t> ids = h.db->insert_many({high, low}, epoch_ms());
  h.sched->notify();
  for (JobId id : {big, ids[0], ids[1]}) EXPECT_EQ(h.wait_end(id).type, EventType::Completed);
  // The higher job started first, and only once the big one had ended.
  EXPECT_LT(h.index_of(EventType::Started, ids[0]), h.index_of(EventType::Started, ids[1]));
  EXPECT_LT(h.index_of(EventType::Completed, big), h.index_of(EventType::Started, ids[0]));
  EXPECT_EQ(ids_of(h.wait_end(big)), expected_tokens(long_prompt, long_new));
  EXPECT_EQ(ids_of(h.wait_end(ids[0])), expected_tokens(mid_prompt, 4));
  EXPECT_EQ(ids_of(h.wait_end(ids[1])), expected_tokens(short_prompt, 4));
}

// A job that cannot fit even an empty pool is refused with a message that
// says what to change, and the queue goes on.
TEST(Scheduler, AJobLargerThanThePoolIsRefusedClearly) {
  EngineConfig c;
  c.kv_block_tokens = 4;
  c.kv_memory_bytes = text::KvPool::block_bytes_for(test::FakeRunner::hparams(tokenizer().n_vocab()), 4, KvType::F32) * 3;
  Harness h("sched-refuse", c, 1, 0);
  const JobId huge = h.add(text_job("Once upon a time", 40));
  const JobId small = h.add(text_job("Once", 3));
  const Event e = h.wait_end(huge);
  EXPECT_EQ(e.type, EventType::Failed);
  EXPECT_NE(e.message.find("KV blocks"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("max_new_tokens"), std::string::npos) << e.message;
  EXPECT_EQ(ids_of(h.wait_end(small)), expected_tokens("Once", 3));
}

// When memory runs out, the lowest job gives its blocks back and is
// recomputed later; both still produce exactly the fake's tokens (so every
// block was stored, shared and recomputed where the bookkeeping said).
TEST(Scheduler, PreemptionRecomputesToTheSameTokens) {
  EngineConfig c;
  c.kv_block_tokens = 4;
  // They differ at their first word, so the fake's log tells whose input is whose.
  const std::string p1 = "Once upon a time there was a dog", p2 = "The cat sat in the sun all day";
  const int32_t sig1 = tokenizer().encode(p1, true, true)[1], sig2 = tokenizer().encode(p2, true, true)[1];
  ASSERT_NE(sig1, sig2);
  const int n = 24;
  const int need = (std::max(prompt_tokens(p1), prompt_tokens(p2)) + n + 3) / 4;
  // Room for one whole job and a little more: two cannot both finish side by side.
  c.kv_memory_bytes = text::KvPool::block_bytes_for(test::FakeRunner::hparams(tokenizer().n_vocab()), 4, KvType::F32) * (need + 2);
  Harness h("sched-preempt", c, 2, 0, /*paused=*/true);
  const JobId low = h.add(text_job(p1, n, 0));
  const JobId high = h.add(text_job(p2, n, 3));
  h.resume();
  EXPECT_EQ(ids_of(h.wait_end(low)), expected_tokens(p1, n));
  EXPECT_EQ(ids_of(h.wait_end(high)), expected_tokens(p2, n));
  // Once: the lower job, when the two outgrew the pool (taking the higher
  // one, even if it came straight back, would count twice).
  EngineMetrics m;
  h.metrics->fill(m, epoch_ms());
  EXPECT_EQ(m.preemptions, 1);
  // The lower job was the one preempted: the higher one sampled at every step
  // from its first token to its last, the lower one skipped some.
  const auto calls = h.runner->calls();
  std::vector<std::pair<bool, bool>> steps;  // per sampling step: high sampled, low sampled
  for (const auto& call : calls) {
    if (call.lane != 't' || call.sampled == 0) continue;
    const auto has = [&](int32_t sig) { return std::count(call.sampled_second.begin(), call.sampled_second.end(), sig) > 0; };
    steps.push_back({has(sig2), has(sig1)});
  }
  const auto first_high = std::find_if(steps.begin(), steps.end(), [](auto s) { return s.first; });
  const auto last_high = std::find_if(steps.rbegin(), steps.rend(), [](auto s) { return s.first; }).base();
  ASSERT_LT(first_high, last_high);
  EXPECT_EQ(std::count_if(first_high, last_high, [](auto s) { return s.first; }), n);
  EXPECT_EQ(last_high - first_high, n) << "the higher job must never miss a step";
  EXPECT_LT(std::count_if(first_high, last_high, [](auto s) { return s.second; }), last_high - first_high)
      << "the lower job should have been preempted while the higher one ran";
  EXPECT_LT(h.index_of(EventType::Completed, high), h.index_of(EventType::Completed, low));
}

// Aging: a job that has waited long enough passes a fresher, higher one; the
// same rule for text and for image jobs. Controls: equal ages, the higher first.
TEST(Scheduler, AgingAppliesToTextAndImageJobs) {
  EngineConfig c;
  c.max_batch = 1;
  c.max_image_batch = 1;
  c.aging_ms = 1000;
  for (const bool images : {false, true}) {
    for (const bool aged : {false, true}) {
      SCOPED_TRACE(std::string(images ? "image" : "text") + (aged ? ", aged" : ", same age"));
      Harness h("sched-aging", c, 1, 1, /*paused=*/true);
      const int64_t now = epoch_ms();
      // The old job waited 10 s: 10 points, above the fresh job's 5.
      const int64_t old_ms = aged ? now - 10'000 : now;
      const JobId old_low = images ? h.add(picture(2, 0), old_ms) : h.add(text_job("Once", 3, 0), old_ms);
      const JobId fresh_high = images ? h.add(picture(2, 5), now) : h.add(text_job("Once", 3, 5), now);
      h.resume();
      EXPECT_EQ(h.wait_end(old_low).type, EventType::Completed);
      EXPECT_EQ(h.wait_end(fresh_high).type, EventType::Completed);
      if (aged)
        EXPECT_LT(h.index_of(EventType::Started, old_low), h.index_of(EventType::Started, fresh_high));
      else
        EXPECT_LT(h.index_of(EventType::Started, fresh_high), h.index_of(EventType::Started, old_low));
    }
  }
}

// A cancel takes effect at the next step: the runner sees at most the step
// that was in flight, for text and for images.
TEST(Scheduler, CancelTakesEffectWithinOneStep) {
  {
    Harness h("sched-cancel-text", {}, 30, 0);
    const JobId id = h.add(text_job("Once", 200));
    ASSERT_TRUE(h.wait_started(id));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const size_t before = h.runner->calls().size();
    ASSERT_GT(before, 0u);
    h.sched->request_cancel(id);
    EXPECT_EQ(h.wait_end(id).type, EventType::Cancelled);
    EXPECT_LE(h.runner->calls().size(), before + 1);
  }
  {
    Harness h("sched-cancel-image", {}, 0, 150);
    const JobId id = h.add(picture(50));
    ASSERT_TRUE(h.wait_started(id));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const size_t before = h.runner->calls().size();
    h.sched->request_cancel(id);
    EXPECT_EQ(h.wait_end(id).type, EventType::Cancelled);
    EXPECT_LE(h.runner->calls().size(), before + 1);
    EXPECT_LT(before, 20u) << "the job should still have been running";
  }
}

// Text steps run while an image step is in flight (the two lanes of one
// device): a whole text job finishes inside the image job's run, and text
// calls start and end within a single image call.
TEST(Scheduler, TextStepsRunWhileAnImageStepIsInFlight) {
  Harness h("sched-interleave", {}, 2, 400);
  // The text model loaded first: its load (seconds under ThreadSanitizer)
  // must not decide whether the text steps meet the image steps.
  EXPECT_EQ(h.wait_end(h.add(text_job("Once", 1))).type, EventType::Completed);
  const JobId img = h.add(picture(4));
  ASSERT_TRUE(h.wait_started(img));
  TextRequest t = text_job("Once upon a time", 16);
  t.interactive = true;
  const JobId txt = h.add(t);
  EXPECT_EQ(ids_of(h.wait_end(txt)), expected_tokens("Once upon a time", 16));
  EXPECT_EQ(h.wait_end(img).type, EventType::Completed);
  EXPECT_LT(h.index_of(EventType::Completed, txt), h.index_of(EventType::Completed, img));
  const auto calls = h.runner->calls();
  int inside = 0;
  for (const auto& i : calls) {
    if (i.lane != 'i') continue;
    for (const auto& t2 : calls)
      if (t2.lane == 't' && t2.start >= i.start && t2.end <= i.end) ++inside;
  }
  EXPECT_GE(inside, 8) << "text steps should run during image calls, not between them";
}

// A higher-priority image job takes the image batch from a running lower one,
// which waits with its images in flight and resumes where it stopped: its PNG
// is the same as when it ran undisturbed.
TEST(Scheduler, AnImageJobPreemptedByAHigherOneResumesToTheSamePicture) {
  EngineConfig c;
  c.max_image_batch = 1;
  constexpr int kLowSteps = 24;
  std::string alone;
  {
    Harness h("sched-img-alone", c, 0, 5);
    const JobId id = h.add(picture(kLowSteps, 0, 77));
    const Event e = h.wait_end(id);
    ASSERT_EQ(e.type, EventType::Completed);
    ASSERT_EQ(e.files.size(), 1u);
    alone = file_bytes(e.files[0]);
    ASSERT_FALSE(alone.empty());
  }
  Harness h("sched-img-preempt", c, 0, 60);
  const JobId low = h.add(picture(kLowSteps, 0, 77));
  // Added once the low job is inside its step loop (a step done), not after
  // a fixed sleep: on a loaded machine the prompt encoding alone can outlast
  // one, and the low job must still have most of its steps (~1.3 s) to go.
  ASSERT_TRUE(h.wait_started(low));
  for (int i = 0; i < 6000 && h.index_of(EventType::Progress, low) < 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(h.index_of(EventType::Progress, low), 0);
  const JobId high = h.add(picture(3, 10, 9));
  const Event eh = h.wait_end(high);
  const Event el = h.wait_end(low);
  ASSERT_EQ(eh.type, EventType::Completed);
  ASSERT_EQ(el.type, EventType::Completed);
  EXPECT_LT(h.index_of(EventType::Completed, high), h.index_of(EventType::Completed, low));
  EngineMetrics m;
  h.metrics->fill(m, epoch_ms());
  EXPECT_GE(m.preemptions, 1);
  ASSERT_EQ(el.files.size(), 1u);
  EXPECT_EQ(file_bytes(el.files[0]), alone);
}

// Issue 31, item 3: a job whose end cannot be written (a full disk; here the
// same failed write made by another connection holding the write lock past
// the busy timeout) no longer ends the process (before: std::terminate on
// the executor thread, "serve dies while marking a job completed"). The job
// is reported failed with the reason, the engine says so while the database
// still says "running", the next job runs once writes work, and the failed
// end reaches the database then.
TEST(SchedulerStorage, AJobWhoseEndCannotBeWrittenFailsAndTheRunnerCarriesOn) {
  EngineConfig c;
  Harness h("storage", c, 20, 0);
  const JobId a = h.add(text_job("Once upon a time", 30));
  ASSERT_TRUE(h.wait_started(a));
  sqlite3* lock = nullptr;
  ASSERT_EQ(sqlite3_open_v2((h.dir / "jobs.db").string().c_str(), &lock, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(lock, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  const Event end = h.wait_end(a);
  EXPECT_EQ(end.type, EventType::Failed);
  EXPECT_EQ(end.code, StatusCode::Io);
  EXPECT_NE(end.message.find("job " + std::to_string(a) + " could not be saved"), std::string::npos) << end.message;
  EXPECT_NE(end.message.find("locked by another process"), std::string::npos) << end.message;
  EXPECT_FALSE(h.sched->storage_status().ok());
  EXPECT_EQ(h.db->get(a)->state, "running");  // not written yet
  const auto unsaved = h.sched->unsaved_end(a);
  ASSERT_TRUE(unsaved.has_value());
  EXPECT_EQ(unsaved->first, JobState::Failed);
  sqlite3_exec(lock, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close_v2(lock);
  const JobId b = h.add(text_job("Twice upon a time", 4));
  EXPECT_EQ(h.wait_end(b).type, EventType::Completed);
  for (int i = 0; i < 6000 && h.db->get(a)->state == "running"; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto row = h.db->get(a);
  EXPECT_EQ(row->state, "failed");
  EXPECT_NE(row->error_message.find("could not be saved"), std::string::npos) << row->error_message;
  EXPECT_EQ(row->error_code, "io");
  EXPECT_TRUE(h.sched->storage_status().ok());
  EXPECT_FALSE(h.sched->unsaved_end(a).has_value());
}

// Device memory admission: a text model's KV pool on a device is what its
// free memory leaves after the reserve, the weights and the workspace, capped
// by the configured budget, in whole blocks (figures worked by hand).
TEST(KvPoolBytes, WhatTheDeviceLeavesInWholeBlocksUnderTheCap) {
  const int64_t GiB = int64_t{1} << 30, MiB = int64_t{1} << 20;
  kernels::DeviceMemory m;
  m.total_bytes = 80 * GiB, m.free_bytes = 70 * GiB, m.reserved_bytes = 1 * GiB;
  EXPECT_EQ(kv_pool_bytes(m, 16 * GiB, 512 * MiB, 0, 2 * MiB), 52 * GiB + 512 * MiB);
  EXPECT_EQ(kv_pool_bytes(m, 16 * GiB, 512 * MiB, 8 * GiB, 2 * MiB), 8 * GiB);
  EXPECT_EQ(kv_pool_bytes(m, 16 * GiB, 512 * MiB + 1, 0, 2 * MiB), 52 * GiB + 510 * MiB);  // whole blocks
  EXPECT_EQ(kv_pool_bytes(m, 69 * GiB - 3 * MiB, 0, 0, 2 * MiB), 2 * MiB);
  EXPECT_EQ(kv_pool_bytes(m, 69 * GiB - 1 * MiB, 0, 0, 2 * MiB), 0);  // not one block: the model cannot run here
  EXPECT_EQ(kv_pool_bytes(m, 70 * GiB, 0, 0, 2 * MiB), 0);
}
