// The public TextModel API: events, cancellation, validation, model info.
#include <atelier/models.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/engine_test_util.h"

using namespace atelier;

namespace {
const std::string kFix = ATELIER_FIXTURES_DIR;

std::shared_ptr<TextModel> open_stories(KvType kv = KvType::F16) {
  TextModelOptions o;
  o.threads = 2;
  o.kv_type = kv;
  auto m = TextModel::open(kFix + "/text/stories260K.gguf", o);
  EXPECT_TRUE(m.ok()) << m.status().message;
  return m.value();
}

TextRequest greedy(int n) {
  TextRequest r;
  r.prompt = "Once upon a time";
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  return r;
}
}  // namespace

TEST(TextModel, InfoFromHeader) {
  auto m = open_stories();
  const ModelInfo& i = m->info();
  EXPECT_EQ(i.format, "gguf");
  EXPECT_EQ(i.architecture, "llama");
  EXPECT_EQ(i.tokenizer, "llama");
  EXPECT_EQ(i.n_vocab, 512);
  EXPECT_EQ(i.n_layers, 5);
  // 48 F32 tensors: embeddings 512x64 (tied output), 5 x (4 attention + 3 ffn matrices + 2 norms), final norm.
  const int64_t per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 172 + 2 * 64;
  EXPECT_EQ(i.n_params, 512 * 64 + 64 + 512 * 64 + 5 * per_layer);
}

TEST(TextModel, EventsConcatenateToResultAndMatchGoldenIds) {
  auto m = open_stories(KvType::F32);
  std::string streamed;
  std::vector<int32_t> ids;
  auto r = m->generate(greedy(60), [&](const TokenEvent& ev) {
    EXPECT_EQ(ev.index, static_cast<int>(ids.size()));
    ids.push_back(ev.id);
    streamed += ev.text;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().message;
  EXPECT_EQ(streamed, r->text);
  EXPECT_EQ(ids, r->ids);
  std::ifstream golden(kFix + "/text/golden-once-upon-a-time-greedy.ids");
  std::vector<int32_t> want;
  for (int32_t id; golden >> id;) want.push_back(id);
  std::vector<int32_t> all = r->prompt_ids;
  all.insert(all.end(), r->ids.begin(), r->ids.end());
  EXPECT_EQ(all, want);
  EXPECT_EQ(r->stats.stop_reason, "length");
}

TEST(TextModel, CancelTakesEffectAtOnce) {
  auto m = open_stories();
  int seen = 0;
  auto r = m->generate(greedy(50), [&](const TokenEvent&) { return ++seen < 3; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(r->ids.size(), 3u);
  EXPECT_EQ(r->stats.stop_reason, "cancelled");
}

TEST(TextModel, StopStringIsHeldBackAndCut) {
  auto m = open_stories();
  TextRequest req = greedy(60);
  req.stop = {"girl named"};
  std::string streamed;
  auto r = m->generate(req, [&](const TokenEvent& ev) {
    streamed += ev.text;
    return true;
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, ", there was a little ");
  EXPECT_EQ(streamed, r->text);  // "girl" was never shown before "named" decided it
  EXPECT_EQ(r->stats.stop_reason, "stop");
}

TEST(TextModel, InvalidRequestsAreRefused) {
  auto m = open_stories();
  TextRequest zero = greedy(0);
  auto r = m->generate(zero);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code, StatusCode::InvalidArgument);
  TextRequest topp = greedy(5);
  topp.sampling.top_p = 0;
  EXPECT_EQ(m->generate(topp).status().code, StatusCode::InvalidArgument);
  TextRequest stop = greedy(5);
  stop.stop = {""};
  EXPECT_EQ(m->generate(stop).status().code, StatusCode::InvalidArgument);
}

TEST(TextModel, PromptLongerThanContextIsRefused) {
  TextModelOptions o;
  o.context_tokens = 8;
  auto m = TextModel::open(kFix + "/text/stories260K.gguf", o);
  ASSERT_TRUE(m.ok());
  TextRequest r = greedy(4);
  r.prompt = "Once upon a time there was a girl who liked to play in the park";
  auto res = m.value()->generate(r);
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message.find("context"), std::string::npos) << res.status().message;
}

TEST(TextModel, OpenErrors) {
  auto missing = TextModel::open("/no/such/file.gguf");
  EXPECT_EQ(missing.status().code, StatusCode::NotFound);
  auto readme = TextModel::open(kFix + "/README.md");
  EXPECT_FALSE(readme.ok());
  EXPECT_NE(readme.status().message.find("README.md"), std::string::npos);
  auto vocab_only = TextModel::open(kFix + "/vocab/ggml-vocab-gpt-2.gguf");
  EXPECT_FALSE(vocab_only.ok());  // a vocabulary without weights
  EXPECT_NE(vocab_only.status().message.find("ggml-vocab-gpt-2.gguf"), std::string::npos) << vocab_only.status().message;
}

// The header-only reader agrees with the loaded model on everything it fills.
TEST(TextModelInfo, HeaderReadMatchesTheLoadedModel) {
  const std::string path = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";
  auto model = atelier::TextModel::open(path);
  ASSERT_TRUE(model.ok()) << model.status().message;
  auto read = atelier::read_model_info(path);
  ASSERT_TRUE(read.ok()) << read.status().message;
  const atelier::ModelInfo& a = model.value()->info();
  const atelier::ModelInfo& b = read.value();
  EXPECT_EQ(b.architecture, a.architecture);
  EXPECT_EQ(b.tokenizer, a.tokenizer);
  EXPECT_EQ(b.n_vocab, a.n_vocab);
  EXPECT_EQ(b.n_ctx_train, a.n_ctx_train);
  EXPECT_EQ(b.n_embd, a.n_embd);
  EXPECT_EQ(b.n_layers, a.n_layers);
  EXPECT_EQ(b.n_heads, a.n_heads);
  EXPECT_EQ(b.n_kv_heads, a.n_kv_heads);
  EXPECT_EQ(b.n_ff, a.n_ff);
  EXPECT_EQ(b.bos_token, a.bos_token);
  EXPECT_EQ(b.eos_token, a.eos_token);
  EXPECT_EQ(b.bos_token, "<s>");  // the fixture's vocabulary
  EXPECT_EQ(b.chat_template, "");
  EXPECT_EQ(b.n_params, a.n_params);
  EXPECT_EQ(atelier::read_model_info("/nonexistent.gguf").status().code, atelier::StatusCode::NotFound);
}

// The context is the model's training length, with no 4096 cap: the fixture
// with llama.context_length 8192 accepts max_new_tokens 6000, which 4096
// refused, and refuses one beyond 8192.
TEST(TextModel, ContextIsTheTrainingLengthWithoutACap) {
  const std::string path = test::stories_with_context(8192);
  ASSERT_FALSE(path.empty());
  auto m = TextModel::open(path);
  ASSERT_TRUE(m.ok()) << m.status().message;
  EXPECT_EQ(m.value()->info().n_ctx_train, 8192);
  TextRequest r = greedy(6000);
  r.stop = {" "};  // ends at the first word: validation is what is under test
  auto res = m.value()->generate(r);
  EXPECT_TRUE(res.ok()) << res.status().message;
  r.max_new_tokens = 8193;
  auto beyond = m.value()->generate(r);
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message.find("8192"), std::string::npos) << beyond.status().message;
  std::filesystem::remove(path);
}
