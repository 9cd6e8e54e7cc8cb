// Synthetic model references (atelier/models.h SynthModelRef): the grammar,
// the canonical form and the digest a job records, and the engine's faces
// that take a reference (resolve_model, read_model_info, Vocabulary,
// TextModel, the queue) taking one without any file.
#include <gtest/gtest.h>

#include <atelier/engine.h>
#include <atelier/models.h>
#include <atelier/store.h>
#include <atelier/tools.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/engine_test_util.h"

using namespace atelier;
namespace fs = std::filesystem;

TEST(SynthRef, GrammarDefaultsAndCanonicalForm) {
  auto a = parse_synth_model_ref("synth:8B");
  ASSERT_TRUE(a.ok()) << a.status().message;
  EXPECT_EQ(a->params, "8B");
  EXPECT_EQ(a->type, "bf16");
  EXPECT_EQ(a->seed, 1u);
  EXPECT_EQ(a->canonical(), "synth:8B:bf16:seed=1");
  // Type and seed in either order, the type in any case.
  auto b = parse_synth_model_ref("synth:110M:seed=7:Q4_K_M");
  ASSERT_TRUE(b.ok()) << b.status().message;
  EXPECT_EQ(b->canonical(), "synth:110M:q4_k_m:seed=7");
  EXPECT_EQ(parse_synth_model_ref("synth:260K:Q4_k")->type, "q4_K");
  EXPECT_EQ(parse_synth_model_ref("synth:8B:fp8")->canonical(), "synth:8B:fp8:seed=1");
  EXPECT_TRUE(is_synth_model_ref("synth:anything"));
  EXPECT_FALSE(is_synth_model_ref("./synth:8B"));
  EXPECT_FALSE(is_synth_model_ref("stories260k:stable"));
}

TEST(SynthRef, MalformedReferencesSayWhatIsWrongAndTheGrammar) {
  const std::pair<const char*, const char*> cases[] = {
      {"synth:", "is not a dense preset"},
      {"synth:9B", "'9B' is not a dense preset (260K, 15M, 42M, 110M, 1B, 8B)"},
      {"synth:tiny", "models synth --arch ARCH --params tiny"},  // a mixture of experts: files only
      {"synth:8B:q3_K", "'q3_K' is neither a type"},
      {"synth:8B:bf16:f16", "the type is given twice"},
      {"synth:8B:seed=", "the seed '' is not a whole number"},
      {"synth:8B:seed=-1", "is not a whole number"},
      {"synth:8B:seed=1:seed=2", "the seed is given twice"},
      {"synth:8B::bf16", "'' is neither a type"},
  };
  for (const auto& [ref, why] : cases) {
    auto r = parse_synth_model_ref(ref);
    ASSERT_FALSE(r.ok()) << ref;
    EXPECT_EQ(r.status().code, StatusCode::InvalidArgument) << ref;
    EXPECT_NE(r.status().message.find(why), std::string::npos) << ref << ": " << r.status().message;
    EXPECT_NE(r.status().message.find("synth:PARAMS[:TYPE][:seed=N]"), std::string::npos) << r.status().message;
    // resolve_model refuses it the same way (no store lookup of a model "synth").
    auto resolved = resolve_model(ref, "/nonexistent-store");
    ASSERT_FALSE(resolved.ok()) << ref;
    EXPECT_EQ(resolved.status().code, StatusCode::InvalidArgument) << resolved.status().message;
  }
}

TEST(SynthRef, TheDigestIsAStableFunctionOfTheSpecNotAFileHash) {
  // Spelled differently, the same model: the same digest.
  const std::string d = parse_synth_model_ref("synth:8B")->digest();
  EXPECT_EQ(d, "synthetic-v1:8B:bf16:seed=1");
  EXPECT_EQ(parse_synth_model_ref("synth:8B:seed=1:BF16")->digest(), d);
  EXPECT_EQ(d.rfind("sha256:", 0), std::string::npos);
  // Any field changed: another digest.
  EXPECT_NE(parse_synth_model_ref("synth:8B:seed=2")->digest(), d);
  EXPECT_NE(parse_synth_model_ref("synth:8B:q8_0")->digest(), d);
  EXPECT_NE(parse_synth_model_ref("synth:1B")->digest(), d);
  // resolve_model: no store, no file, the digest without being asked to hash.
  auto r = resolve_model("synth:8B:seed=1", "/nonexistent-store");
  ASSERT_TRUE(r.ok()) << r.status().message;
  EXPECT_EQ(r->path, "synth:8B:bf16:seed=1");
  EXPECT_EQ(r->display, r->path);
  EXPECT_EQ(r->digest, d);
  EXPECT_EQ(r->kind, "text");
  EXPECT_EQ(r->format, "synthetic");
  EXPECT_FALSE(r->in_store);
}

TEST(SynthRef, HeaderAndVocabularyWithoutMakingTheModel) {
  auto info = read_model_info("synth:8B:q4_k_m");
  ASSERT_TRUE(info.ok()) << info.status().message;
  EXPECT_EQ(info->format, "synthetic");
  EXPECT_EQ(info->n_layers, 32);
  EXPECT_EQ(info->n_embd, 4096);
  EXPECT_EQ(info->n_heads, 32);
  EXPECT_EQ(info->n_kv_heads, 8);
  EXPECT_EQ(info->n_ff, 14336);
  EXPECT_EQ(info->n_vocab, 128256);
  EXPECT_EQ(info->n_ctx_train, 131072);
  // Llama 3.1 8B: 8.03B parameters, embedding and output untied.
  EXPECT_NEAR(static_cast<double>(info->n_params), 8.03e9, 0.01e9);
  auto v = Vocabulary::open("synth:8B");
  ASSERT_TRUE(v.ok()) << v.status().message;
  EXPECT_EQ(v.value()->n_vocab(), 128256);
  EXPECT_EQ(v.value()->tokenize("ab", true, false).value(), (std::vector<int32_t>{1, 3 + 'a', 3 + 'b'}));
  EXPECT_FALSE(Vocabulary::open("synth:8B:nope").ok());
}

TEST(SynthRef, ATextModelFromAReferenceGivesTheSameTextForTheSameSeed) {
  TextModelOptions o;
  o.threads = 1;
  TextRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 24;
  req.sampling.seed = 11;
  req.ignore_eos = true;
  auto gen = [&](const std::string& ref) {
    auto m = TextModel::open(ref, o);
    EXPECT_TRUE(m.ok()) << m.status().message;
    auto r = m.value()->generate(req);
    EXPECT_TRUE(r.ok()) << r.status().message;
    EXPECT_EQ(m.value()->info().path, parse_synth_model_ref(ref)->canonical());
    return r.value();
  };
  const TextResult a = gen("synth:260K:f32:seed=7"), b = gen("synth:260K:seed=7:f32");
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.text, b.text);
  ASSERT_EQ(a.ids.size(), 24u);
  EXPECT_EQ(a.prompt_ids.size(), 17u) << "BOS and a token a byte";
  const TextResult c = gen("synth:260K:f32:seed=8");
  EXPECT_NE(a.ids, c.ids) << "another seed, other weights";
}

TEST(SynthRef, TheQueueRunsOneAndRecordsItsReferenceAndDigest) {
  const fs::path dir = test::fresh_dir("synth-queue");
  EngineConfig c;
  c.data_dir = dir.string();
  c.store_dir = (dir / "store").string();
  c.threads = 1;
  c.devices = {"cpu"};
  auto e = Engine::open(c);
  ASSERT_TRUE(e.ok()) << e.status().message;
  TextRequest r;
  r.model = "synth:260K:f32:seed=7";
  r.prompt = "Once upon a time";
  r.max_new_tokens = 24;
  r.sampling.seed = 11;
  r.ignore_eos = true;
  auto id = e.value()->submit(r);
  ASSERT_TRUE(id.ok()) << id.status().message;
  ASSERT_TRUE(e.value()->wait_idle(120'000));
  const JobInfo j = e.value()->job(id.value()).value();
  ASSERT_EQ(j.state, JobState::Completed) << j.error;
  EXPECT_EQ(j.model_version, "synthetic-v1:260K:f32:seed=7");
  EXPECT_EQ(j.model_name, "synth:260K:f32:seed=7");
  // The queue's text is TextModel's (the same request and seed), as the job
  // database keeps it: a random model's byte tokens are not always UTF-8,
  // and its JSON replaces those bytes with U+FFFD.
  TextModelOptions o;
  o.threads = 1;
  auto alone = TextModel::open(r.model, o).value()->generate(r);
  ASSERT_TRUE(alone.ok());
  const std::string stored =
      nlohmann::json::parse(nlohmann::json(alone->text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  EXPECT_EQ(j.text, stored);
  EXPECT_EQ(j.stats.new_tokens, 24);
  // A request whose reference is malformed is refused at submission, nothing queued.
  r.model = "synth:8B:q3_K";
  auto bad = e.value()->submit(r);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message.find("neither a type"), std::string::npos) << bad.status().message;
  e.value().reset();
  fs::remove_all(dir);
}

TEST(SynthRef, ModelsCompareTakesTwoReferences) {
  // The same weights drawn as F32 and as Q8_0: close, not identical.
  auto q = compare_text_models("synth:260K:f32", "synth:260K:q8_0", "", 64, 1);
  ASSERT_TRUE(q.ok()) << q.status().message;
  EXPECT_EQ(q->tokens, 64);
  EXPECT_GT(q->mean_kl, 0.0);
  EXPECT_LT(q->mean_kl, 0.01);
  EXPECT_GT(q->top1_agreement, 0.9);
}

TEST(SynthRef, TheStoreRefusesThemAndTheNameSynth) {
  const fs::path dir = test::fresh_dir("synth-store");
  auto st = Store::open((dir / "store").string(), true);
  ASSERT_TRUE(st.ok()) << st.status().message;
  auto v = st.value()->resolve("synth:8B");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code, StatusCode::InvalidArgument);
  EXPECT_NE(v.status().message.find("synthetic model"), std::string::npos) << v.status().message;
  const std::string fixture = std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf";
  auto imported = st.value()->import({{fixture, "model"}}, "synth", {});
  ASSERT_FALSE(imported.ok());
  EXPECT_NE(imported.status().message.find("reserved"), std::string::npos) << imported.status().message;
  QuantizeSpec qs;
  qs.type = "q8_0";
  qs.name = "x";
  qs.store_dir = (dir / "store").string();
  auto q = quantize_model("synth:260K", qs);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message.find("synth:PARAMS:q4_k_m"), std::string::npos) << q.status().message;
  st.value().reset();
  fs::remove_all(dir);
}
