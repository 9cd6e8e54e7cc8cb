// The serving layer (engine/src/serve) through the Engine, with the fixture
// text model and a narrow SD 1.5-shaped checkpoint: text keeps streaming
// while an image job renders (the image lane), aging applies to image jobs
// as to text jobs, the model cache unloads and reloads models without
// changing their output, and failed jobs record their status name.
#include <atelier/engine.h>
#include <atelier/models.h>
#include <atelier/tools.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "engine/engine_test_util.h"
#include "formats/gguf.h"

using namespace atelier;

namespace fs = std::filesystem;

namespace {

const std::string kText = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";
const std::string kTextBin = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.bin";
const std::string kVocab = std::string(ATELIER_FIXTURES_DIR) + "/clip/bpe_simple_vocab_16e6.txt.gz";

const std::string& narrow_model() { return test::narrow_sd_model(); }

ImageRequest image_request(int size, int steps, uint64_t seed) {
  ImageRequest r;
  r.model = narrow_model();
  r.prompt = "a fox in the snow";
  r.width = r.height = size;
  r.steps = steps;
  r.seed = seed;
  r.tokenizer = kVocab;
  return r;
}

TextRequest text_request(const std::string& model, int n) {
  TextRequest r;
  r.model = model;
  r.prompt = "Once upon a time";
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.interactive = true;
  return r;
}

using test::EventLog;
using test::fresh_dir;

std::unique_ptr<Engine> open_engine(const fs::path& dir, EngineConfig c = {}) {
  c.data_dir = dir.string();
  c.store_dir = (dir / "store").string();
  c.threads = 2;
  c.max_wait_ms = 0;
  auto e = Engine::open(c);
  EXPECT_TRUE(e.ok()) << e.status().message;
  return e.ok() ? std::move(e.value()) : nullptr;
}

JobState wait_final(Engine& e, JobId id) {
  for (int i = 0; i < 120'000 / 5; ++i) {
    auto info = e.job(id);
    if (info.ok() && info->state != JobState::Queued && info->state != JobState::Running) return info->state;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return JobState::Running;
}

}  // namespace

// Text steps no longer wait for image steps: a whole text job runs between
// two of a running image job's steps (before the lane, each of its tokens
// waited for one UNet call, so it saw a Preview per token).
TEST(Serve, TextStreamsWhileAnImageRenders) {
  const fs::path dir = fresh_dir("stream");
  auto e = open_engine(dir);
  ASSERT_TRUE(e);
  auto log = std::make_shared<EventLog>();
  e->subscribe(0, [log](const Event& ev) { (*log)(ev); });
  // Warm the text model, so the text job's time is its steps.
  auto warm = e->submit(text_request(kText, 2));
  ASSERT_TRUE(warm.ok());
  ASSERT_EQ(wait_final(*e, warm.value()), JobState::Completed);

  ImageRequest ir = image_request(128, 8, 5);
  ir.output = (dir / "img.png").string();
  auto img = e->submit(ir);
  ASSERT_TRUE(img.ok());
  // Until the image has made its first step.
  for (int i = 0; i < 60'000 / 5; ++i) {
    const auto ev = log->snapshot();
    if (std::any_of(ev.begin(), ev.end(), [&](const Event& x) { return x.job == img.value() && x.type == EventType::Preview; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const size_t mark = log->snapshot().size();
  auto txt = e->submit(text_request(kText, 24));
  ASSERT_TRUE(txt.ok());
  ASSERT_EQ(wait_final(*e, txt.value()), JobState::Completed);
  auto img_info = e->job(img.value());
  ASSERT_TRUE(img_info.ok());
  EXPECT_EQ(img_info->state, JobState::Running) << "the image job should still be rendering";
  ASSERT_TRUE(e->wait_idle(120'000));
  int previews_during_text = 0, tokens = 0;
  bool text_done = false;
  const auto events = log->snapshot();
  for (size_t i = mark; i < events.size(); ++i) {
    const Event& ev = events[i];
    if (ev.job == txt.value() && ev.type == EventType::Token) ++tokens;
    if (ev.job == txt.value() && ev.type == EventType::Completed) text_done = true;
    if (!text_done && ev.job == img.value() && ev.type == EventType::Preview) ++previews_during_text;
  }
  EXPECT_TRUE(text_done);
  EXPECT_GT(tokens, 0);
  EXPECT_LE(previews_during_text, 2) << "text tokens waited for image steps";
  EXPECT_EQ(e->job(img.value())->state, JobState::Completed);
  const EngineMetrics m = e->metrics();
  EXPECT_EQ(m.image_steps, 8) << "one lane step per denoising step";
  EXPECT_GT(m.image_step_ms.p50, 0.0);
  e.reset();
  fs::remove_all(dir);
}

// Aging applies to image jobs as to text jobs: an older job of lower
// priority is admitted before a newer one once it has waited long enough.
TEST(Serve, ImageJobsAgeLikeTextJobs) {
  for (const bool fast_aging : {true, false}) {
    const fs::path dir = fresh_dir(fast_aging ? "age-fast" : "age-slow");
    EngineConfig c;
    c.max_image_batch = 1;  // one at a time, so the order shows
    c.aging_ms = fast_aging ? 1 : 1'000'000;
    auto e = open_engine(dir, c);
    ASSERT_TRUE(e);
    auto log = std::make_shared<EventLog>();
    e->subscribe(0, [log](const Event& ev) { (*log)(ev); });
    e->pause();
    ImageRequest a = image_request(64, 1, 1), b = image_request(64, 1, 2);
    a.priority = 0;
    b.priority = 5;
    a.output = (dir / "a.png").string();
    b.output = (dir / "b.png").string();
    auto ia = e->submit(a);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a is 50 aging points older
    auto ib = e->submit(b);
    ASSERT_TRUE(ia.ok() && ib.ok());
    e->resume();
    ASSERT_TRUE(e->wait_idle(120'000));
    std::vector<JobId> started;
    for (const Event& ev : log->snapshot())
      if (ev.type == EventType::Started) started.push_back(ev.job);
    ASSERT_EQ(started.size(), 2u);
    if (fast_aging) EXPECT_EQ(started.front(), ia.value()) << "the older job aged past the higher priority";
    else EXPECT_EQ(started.front(), ib.value()) << "priority first while aging is slow";
    e.reset();
    fs::remove_all(dir);
  }
}

// A tiny model cache unloads the idle model before loading the next; a
// model loaded again gives the same tokens.
TEST(Serve, ModelCacheEvictsAndReloadsToTheSameTokens) {
  const fs::path dir = fresh_dir("cache");
  EngineConfig c;
  c.model_cache_bytes = 1;  // every new model evicts the idle ones
  c.kv_memory_bytes = int64_t{8} << 20;
  auto e = open_engine(dir, c);
  ASSERT_TRUE(e);
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& m : {kText, kTextBin, kText}) {
    auto id = e->submit(text_request(m, 16));
    ASSERT_TRUE(id.ok()) << id.status().message;
    ASSERT_EQ(wait_final(*e, id.value()), JobState::Completed) << m;
    auto info = e->job(id.value());
    ASSERT_TRUE(info.ok());
    ids.push_back({});
    EXPECT_FALSE(info->text.empty());
    ids.back().assign(info->text.begin(), info->text.end());
  }
  EXPECT_EQ(ids[0], ids[2]);
  e.reset();
  fs::remove_all(dir);
}

// A failed job records its status name (job database migration 4).
TEST(Serve, FailedJobsRecordTheirStatusName) {
  const fs::path dir = fresh_dir("errcode");
  auto e = open_engine(dir);
  ASSERT_TRUE(e);
  // The model is there at submission and gone when the job is admitted.
  const fs::path copy = dir / "gone.gguf";
  fs::copy_file(kText, copy);
  TextRequest r = text_request(copy.string(), 4);
  e->pause();
  auto id = e->submit(r);
  ASSERT_TRUE(id.ok()) << id.status().message;
  fs::remove(copy);
  e->resume();
  ASSERT_EQ(wait_final(*e, id.value()), JobState::Failed);
  auto info = e->job(id.value());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->error_code, "not_found") << info->error;
  EXPECT_EQ(status_code_name(StatusCode::InvalidModel), "invalid_model");
  e.reset();
  fs::remove_all(dir);
}

// Issue 35: the metrics say the engine is busy while only an image job runs
// (busy_fraction counted only text steps: 0 during minutes of UNet calls), and
// give the device's memory (the CPU's: the machine's RAM).
TEST(Serve, MetricsShowImageWorkAndTheDeviceMemory) {
  const fs::path dir = fresh_dir("busy");
  auto e = open_engine(dir);
  ASSERT_TRUE(e);
  EngineMetrics idle = e->metrics();
  EXPECT_EQ(idle.busy_fraction, 0.0);
  EXPECT_GT(idle.device_memory_total_bytes, int64_t{64} << 20);
  EXPECT_GT(idle.device_memory_free_bytes, 0);
  EXPECT_LE(idle.device_memory_free_bytes, idle.device_memory_total_bytes);
  auto log = std::make_shared<EventLog>();
  e->subscribe(0, [log](const Event& ev) { (*log)(ev); });
  ImageRequest ir = image_request(128, 8, 9);
  ir.output = (dir / "img.png").string();
  auto img = e->submit(ir);
  ASSERT_TRUE(img.ok());
  // Until the image has made its first step: the prompt encoding and a UNet call are behind it.
  bool stepped = false;
  for (int i = 0; i < 60'000 / 5 && !stepped; ++i) {
    const auto ev = log->snapshot();
    stepped = std::any_of(ev.begin(), ev.end(), [&](const Event& x) { return x.job == img.value() && x.type == EventType::Preview; });
    if (!stepped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(stepped);
  const EngineMetrics busy = e->metrics();
  EXPECT_GT(busy.busy_fraction, 0.0) << "an image job runs: the engine is not idle";
  EXPECT_LE(busy.busy_fraction, 1.0);
  ASSERT_TRUE(e->wait_idle(120'000));
  EXPECT_EQ(e->job(img.value())->state, JobState::Completed);
  e.reset();
  fs::remove_all(dir);
}

// A cancel of a text job takes effect within one text step even while an
// image step (a long UNet call) is running on the lane.
TEST(Serve, TextCancelDoesNotWaitForAnImageStep) {
  const fs::path dir = fresh_dir("cancel");
  auto e = open_engine(dir);
  ASSERT_TRUE(e);
  auto log = std::make_shared<EventLog>();
  e->subscribe(0, [log](const Event& ev) { (*log)(ev); });
  ImageRequest ir = image_request(128, 6, 7);
  ir.output = (dir / "img.png").string();
  auto img = e->submit(ir);
  ASSERT_TRUE(img.ok());
  TextRequest tr = text_request(kText, 300);  // long enough to be cancelled mid-stream
  auto txt = e->submit(tr);
  ASSERT_TRUE(txt.ok());
  // Until the text job has streamed a few tokens.
  for (int i = 0; i < 60'000 / 2; ++i) {
    const auto ev = log->snapshot();
    if (std::count_if(ev.begin(), ev.end(), [&](const Event& x) { return x.job == txt.value() && x.type == EventType::Token; }) >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(e->cancel(txt.value()).ok());
  ASSERT_EQ(wait_final(*e, txt.value()), JobState::Cancelled);
  const double cancel_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto img_info = e->job(img.value());
  ASSERT_TRUE(img_info.ok());
  EXPECT_NE(img_info->state, JobState::Cancelled);
  ASSERT_TRUE(e->wait_idle(120'000));
  EXPECT_EQ(e->job(img.value())->state, JobState::Completed);
  EXPECT_LT(cancel_ms, e->metrics().image_step_ms.p50) << "the cancel waited for an image step";
  // Nothing of the text job after its Cancelled event.
  const auto events = log->snapshot();
  size_t cancelled_at = events.size();
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].job == txt.value() && events[i].type == EventType::Cancelled) cancelled_at = i;
  ASSERT_LT(cancelled_at, events.size());
  int tokens_after_cancel = 0;
  for (size_t i = cancelled_at; i < events.size(); ++i)
    if (events[i].job == txt.value() && events[i].type == EventType::Token) ++tokens_after_cancel;
  EXPECT_EQ(tokens_after_cancel, 0);
  e.reset();
  fs::remove_all(dir);
}

// Admission and preemption under a tiny KV budget still hold while an image
// job renders on the lane: jobs that fit run (taking memory back from lower
// ones when they must) to the tokens they make alone; one that can never fit
// is refused with its reason.
TEST(Serve, TinyKvBudgetAdmitsPreemptsAndRefusesBesideAnImage) {
  const fs::path dir = fresh_dir("kv");
  EngineConfig c;
  c.kv_block_tokens = 16;
  c.kv_memory_bytes = 7 * 10240;  // stories260K: 10240 bytes per 16-token block; two 40-token jobs at a time
  auto e = open_engine(dir, c);
  ASSERT_TRUE(e);
  e->pause();
  ImageRequest ir = image_request(128, 6, 9);
  ir.output = (dir / "img.png").string();
  auto img = e->submit(ir);
  ASSERT_TRUE(img.ok());
  std::vector<TextRequest> reqs;
  std::vector<JobId> ids;
  for (int i = 0; i < 4; ++i) {
    TextRequest r = text_request(kText, 36);
    r.interactive = false;
    r.priority = i;  // later ones rank higher: they take memory back
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 100 + i;
    reqs.push_back(r);
    auto id = e->submit(r);
    ASSERT_TRUE(id.ok());
    ids.push_back(id.value());
  }
  TextRequest huge = text_request(kText, 400);  // 400+ tokens never fit in 7 blocks
  auto hj = e->submit(huge);
  ASSERT_TRUE(hj.ok());
  e->resume();
  ASSERT_TRUE(e->wait_idle(120'000));
  auto model = TextModel::open(kText);
  ASSERT_TRUE(model.ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto info = e->job(ids[i]);
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info->state, JobState::Completed) << info->error;
    auto alone = model.value()->generate(reqs[i]);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(info->text, alone->text) << "job " << i;
  }
  auto h = e->job(hj.value());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->state, JobState::Failed);
  EXPECT_EQ(h->error_code, "invalid_argument");
  EXPECT_NE(h->error.find("KV"), std::string::npos) << h->error;
  EXPECT_EQ(e->job(img.value())->state, JobState::Completed);
  EXPECT_GT(e->metrics().preemptions, 0) << "memory never ran out";
  e.reset();
  fs::remove_all(dir);
}

// Sliding-window attention through the scheduler: a sequence gives back the
// KV blocks behind its window as it goes, so a job 11 blocks long runs in a
// pool of 4 (the same model without a window is refused there; with the
// blocks kept, the job never finishes), and its tokens equal the contiguous
// cache's (TextModel::generate, which never pages) with the same window.
TEST(Serve, SlidingWindowJobsRunInABoundedKvPool) {
  const fs::path dir = fresh_dir("window");
  fs::create_directories(dir);
  const std::string windowed = (dir / "stories260K-window16.gguf").string();
  {
    auto src = formats::GgufFile::open(kText);
    formats::GgufWriter wr;
    for (const auto& [k, v] : src->metadata()) wr.set_value(k, v);
    for (const auto& t : src->tensors()) wr.add_tensor(t.name, t.shape, t.type, t.data, t.bytes);
    wr.set_u32("llama.attention.sliding_window", 16);
    wr.write(windowed);
  }
  EngineConfig c;
  c.kv_block_tokens = 16;
  c.kv_memory_bytes = 4 * 10240;  // stories260K: 10240 bytes per 16-token block
  auto e = open_engine(dir / "engine", c);
  ASSERT_TRUE(e);
  TextRequest r = text_request(windowed, 150);  // 19 prompt tokens + 150: 11 blocks
  r.interactive = false;
  r.prompt = "Once upon a time, there was a little girl named Lily. She loved";  // longer than the window
  TextRequest plain = r;
  plain.model = kText;
  auto id = e->submit(r);
  auto pid = e->submit(plain);
  ASSERT_TRUE(id.ok() && pid.ok());
  ASSERT_TRUE(e->wait_idle(120'000));
  auto job = e->job(id.value());
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->state, JobState::Completed) << job->error;
  auto model = TextModel::open(windowed);
  ASSERT_TRUE(model.ok());
  auto alone = model.value()->generate(r);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(job->text, alone->text);
  EXPECT_EQ(alone->ids.size(), 150u);
  auto refused = e->job(pid.value());
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->state, JobState::Failed);
  EXPECT_NE(refused->error.find("KV blocks"), std::string::npos) << refused->error;
  e.reset();
  fs::remove_all(dir);
}
