// Structured output (json_schema) and logprobs through the public API on the
// real stories260K: the queue (several jobs sharing steps) gives what
// TextModel::generate gives alone, every output parses as a value of its
// schema (nlohmann plus the rules by hand), and the request fields survive
// their JSON form.
#include <atelier/engine.h>
#include <atelier/models.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <thread>

#include "engine/engine_test_util.h"

namespace atelier {
namespace {

const std::string kModel = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";
const char* kSchema = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
  "mood":{"enum":["happy","sad"]},"tags":{"type":"array","items":{"type":"string"}}},
  "required":["name","age","mood","tags"],"additionalProperties":false})";

TextRequest request(uint64_t seed) {
  TextRequest r;
  r.model = kModel;
  r.prompt = "Once upon a time";
  r.max_new_tokens = 120;
  r.sampling.seed = seed;
  r.sampling.temperature = 1.0f;
  r.json_schema = kSchema;
  r.logprobs = true;
  r.top_logprobs = 3;
  return r;
}

void expect_valid(const std::string& text) {
  const auto v = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(v.is_discarded()) << text;
  ASSERT_TRUE(v.is_object()) << text;
  EXPECT_EQ(v.size(), 4u) << text;
  EXPECT_TRUE(v["name"].is_string()) << text;
  EXPECT_TRUE(v["age"].is_number_integer()) << text;
  EXPECT_TRUE(v["mood"] == "happy" || v["mood"] == "sad") << text;
  ASSERT_TRUE(v["tags"].is_array()) << text;
  for (const auto& t : v["tags"]) EXPECT_TRUE(t.is_string()) << text;
}

TEST(StructuredOutput, RequestFieldsSurviveTheirJsonForm) {
  const TextRequest r = request(5);
  auto back = request_from_json(request_to_json(r));
  ASSERT_TRUE(back.ok()) << back.status().message;
  EXPECT_EQ(back->json_schema, r.json_schema);
  EXPECT_TRUE(back->logprobs);
  EXPECT_EQ(back->top_logprobs, 3);
  EXPECT_EQ(request_to_json(back.value()), request_to_json(r));
}

TEST(StructuredOutput, QueueMatchesGenerateAloneAndEveryOutputIsValid) {
  auto model = TextModel::open(kModel);
  ASSERT_TRUE(model.ok()) << model.status().message;
  std::map<uint64_t, TextResult> alone;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto r = model.value()->generate(request(seed));
    ASSERT_TRUE(r.ok()) << r.status().message;
    EXPECT_EQ(r->stats.stop_reason, "stop");
    expect_valid(r->text);
    ASSERT_EQ(r->logprobs.size(), r->ids.size());
    for (size_t i = 0; i < r->ids.size(); ++i) {
      EXPECT_EQ(r->logprobs[i].id, r->ids[i]);
      EXPECT_LE(r->logprobs[i].logprob, 0.0f);
      ASSERT_EQ(r->logprobs[i].top.size(), 3u);
      EXPECT_GE(r->logprobs[i].top[0].second, r->logprobs[i].top[1].second);
      EXPECT_LE(r->logprobs[i].logprob, r->logprobs[i].top[0].second);
    }
    alone[seed] = r.value();
  }

  const auto dir = test::fresh_dir("structured");
  EngineConfig c;
  c.data_dir = dir.string();
  c.store_dir = (dir / "store").string();
  auto engine = Engine::open(c);
  ASSERT_TRUE(engine.ok()) << engine.status().message;
  Engine& e = *engine.value();
  auto log = std::make_shared<test::EventLog>();
  const uint64_t sub = e.subscribe(0, [log](const Event& ev) { (*log)(ev); });
  e.pause();  // all six share steps
  std::map<JobId, uint64_t> seeds;
  for (uint64_t seed = 1; seed <= 6; ++seed) seeds[e.submit(request(seed)).value()] = seed;
  e.resume();
  ASSERT_TRUE(e.wait_idle(120'000));
  e.unsubscribe(sub);  // delivers every event already published, then stops
  int completed = 0;
  for (const Event& ev : log->snapshot()) {
    if (ev.type != EventType::Completed) continue;
    ++completed;
    const TextResult& want = alone[seeds.at(ev.job)];
    EXPECT_EQ(ev.result.text, want.text);
    ASSERT_EQ(ev.result.logprobs.size(), want.logprobs.size());
    for (size_t i = 0; i < want.logprobs.size(); ++i) {
      EXPECT_EQ(ev.result.logprobs[i].id, want.logprobs[i].id);
      EXPECT_NEAR(ev.result.logprobs[i].logprob, want.logprobs[i].logprob, 1e-4);
    }
  }
  EXPECT_EQ(completed, 6);
  std::filesystem::remove_all(dir);
}

TEST(StructuredOutput, RefusedWhenTheSchemaIsUnsupportedOrTheTokensTooFew) {
  auto model = TextModel::open(kModel);
  ASSERT_TRUE(model.ok());
  TextRequest r = request(1);
  r.max_new_tokens = 10;  // {"name":"","age":0,"mood":"sad","tags":[]} needs 42
  auto few = model.value()->generate(r);
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.status().code, StatusCode::InvalidArgument);
  EXPECT_NE(few.status().message.find("42"), std::string::npos) << few.status().message;
  r = request(1);
  r.json_schema = R"({"type":"string","format":"email"})";
  auto format = model.value()->generate(r);
  ASSERT_FALSE(format.ok());
  EXPECT_NE(format.status().message.find("format"), std::string::npos);
}

}  // namespace
}  // namespace atelier
