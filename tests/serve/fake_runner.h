// A Runner with no arithmetic, for testing the scheduler alone: steps take
// a set time (sleeps, so a loaded machine changes nothing but the clock),
// every call is logged, and the outputs follow formulas the tests compute on
// their own.
//
// Text: the real stories260K vocabulary (prompts tokenize as in the engine)
// over a fake network. Each position's token is "stored" in a host array
// through the sequence's KV block table, exactly where the scheduler's
// bookkeeping says; the next token after position p is next_token() of the
// tokens read back through the block table at positions 0..p. So a token
// comes out right only when the scheduler stored and shared every block
// correctly (prefix sharing, preemption and recompute).
//
// Images: the row-wise stand-in network of tests/image (stand_in_model.h)
// whose UNet call sleeps.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "formats/gguf.h"
#include "image/stand_in_model.h"
#include "serve/runner.h"
#include "tokenizer/clip.h"
#include "tokenizer/tokenizer.h"

namespace atelier::test {

struct FakeCall {
  char lane = 't';  // 't' text, 'i' image
  std::chrono::steady_clock::time_point start, end;
  int rows = 0;     // text: inputs; image: tasks
  int sampled = 0;  // text: inputs that sampled
  std::vector<int32_t> sampled_second;  // text: per sampling input, its token at position 1 (which prompt it is)
};

class FakeRunner final : public Runner {
 public:
  static constexpr int kVocabLo = 3, kVocabSpan = 400;  // sampled ids stay clear of BOS/EOS
  // The fake's KV geometry: one layer, one 2-float head (tiny blocks).
  static text::LlamaHparams hparams(int n_vocab) {
    text::LlamaHparams hp;
    hp.n_vocab = n_vocab;
    hp.n_ctx_train = 512;
    hp.n_embd = 2;
    hp.n_layer = 1;
    hp.n_head = hp.n_head_kv = 1;
    hp.head_dim = hp.n_rot = 2;
    return hp;
  }
  // The token after a sequence whose stored tokens are IDS[0..n).
  static int32_t next_token(const int32_t* ids, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; ++i) h = (h ^ static_cast<uint64_t>(ids[i] + 7 * i)) * 1099511628211ull;
    return static_cast<int32_t>(kVocabLo + h % kVocabSpan);
  }

  FakeRunner(const EngineConfig& config, int text_step_ms, int image_step_ms, std::string clip_vocab)
      : config_(config), text_step_ms_(text_step_ms), image_step_ms_(image_step_ms), clip_vocab_(std::move(clip_vocab)) {}

  std::string device() const override { return "fake"; }
  // The CPU runner's admission rules.
  int64_t model_budget_bytes() const override { return config_.model_cache_bytes; }
  int64_t estimate_text_bytes(const ResolvedModel& resolved) const override {
    return model_file_bytes(resolved.path) + config_.kv_memory_bytes;
  }
  int64_t estimate_image_bytes(const ResolvedModel& resolved) const override { return model_file_bytes(resolved.path); }

  Result<std::unique_ptr<TextSlot>> load_text(const ResolvedModel& resolved) override {
    auto slot = std::make_unique<Text>();
    auto file = formats::GgufFile::open(resolved.path);
    slot->tok = tok::Tokenizer::from_gguf(*file);
    slot->tokenizer = slot->tok.get();
    slot->n_vocab = slot->tok->n_vocab();
    slot->n_ctx = 512;
    slot->kv = std::make_unique<text::KvPool>(hparams(slot->n_vocab), config_.kv_block_tokens, config_.kv_memory_bytes, KvType::F32);
    slot->stored.assign(static_cast<size_t>(slot->kv->total_blocks()) * config_.kv_block_tokens, -1);
    slot->bytes = 1000;
    return std::unique_ptr<TextSlot>(std::move(slot));
  }

  TextOutput execute_text(TextSlot& model, const TextBatch& batch) override {
    auto& m = static_cast<Text&>(model);
    FakeCall call;
    call.lane = 't';
    call.start = std::chrono::steady_clock::now();
    call.rows = static_cast<int>(batch.inputs.size());
    TextOutput out;
    out.sampled.assign(batch.inputs.size(), -1);
    const int bt = config_.kv_block_tokens;
    for (size_t i = 0; i < batch.inputs.size(); ++i) {
      const text::SeqInput& in = batch.inputs[i];
      for (int k = 0; k < in.n; ++k) {
        const int pos = in.pos0 + k;
        if (pos >= in.kv->capacity()) {
          out.status = Status::error(StatusCode::Internal, "position beyond the sequence's KV capacity");
          return out;
        }
        if (const int32_t slot = in.kv->store_slot(pos); slot >= 0) m.stored[static_cast<size_t>(slot)] = in.tokens[k];
      }
      if (!batch.samplers[i]) continue;
      // Read every position back through the block table, as attention would.
      const int n = in.pos0 + in.n;
      std::vector<int32_t> seen(static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) seen[static_cast<size_t>(p)] = m.stored[static_cast<size_t>(in.kv->block_table()[p / bt] * bt + p % bt)];
      float* logits = batch.samplers[i]->logits();
      std::fill(logits, logits + m.n_vocab, 0.0f);
      logits[next_token(seen.data(), n)] = 10.0f;
      out.sampled[i] = batch.samplers[i]->sample();
      ++call.sampled;
      call.sampled_second.push_back(n > 1 ? seen[1] : -1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(text_step_ms_));
    call.end = std::chrono::steady_clock::now();
    out.step_ms = std::chrono::duration<double, std::milli>(call.end - call.start).count();
    log(call);
    return out;
  }

  bool is_one_pass(const ResolvedModel&) override { return false; }
  Result<std::vector<ImageResult>> generate_one_pass(const ImageRequest&) override {
    return Status::error(StatusCode::Unsupported, "the fake runner has no one-pass models");
  }

  Result<std::unique_ptr<ImageSlot>> load_image(const ImageRequest&, const ResolvedModel&) override {
    auto slot = std::make_unique<ImageSlot>();
    slot->model = std::make_unique<LoadedDiffusion>();
    auto net = std::make_unique<image::test::StandInModel>();
    net->before_unet = [ms = image_step_ms_] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
    slot->model->model = std::move(net);
    slot->model->tokenizer = tok::ClipTokenizer::open(clip_vocab_);
    slot->model->name = "fake";
    slot->bytes = 1000;
    return slot;
  }

  Status execute_image(ImageSlot& model, const std::vector<image::ImageTask*>& tasks) override {
    FakeCall call;
    call.lane = 'i';
    call.start = std::chrono::steady_clock::now();
    call.rows = static_cast<int>(tasks.size());
    image::run_step(*model.model->model, tasks);
    call.end = std::chrono::steady_clock::now();
    log(call);
    return Status{};
  }

  std::vector<FakeCall> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  struct Text final : TextSlot {
    std::unique_ptr<tok::Tokenizer> tok;
    int n_vocab = 0;
    std::vector<int32_t> stored;  // per KV slot: the token stored there
  };

  void log(const FakeCall& c) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(c);
  }

  EngineConfig config_;
  int text_step_ms_, image_step_ms_;
  std::string clip_vocab_;
  std::mutex mu_;
  std::vector<FakeCall> calls_;
};

}  // namespace atelier::test
