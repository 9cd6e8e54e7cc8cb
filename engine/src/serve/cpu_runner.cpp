// The CPU runner: text models on their own thread pool (at the engine's
// nice), diffusion models on pools at EngineConfig::image_nice, so that a
// text step takes the cores from a running UNet call instead of waiting for it.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "api/text_model_impl.h"
#include "core/thread_pool.h"
#include "serve/runner.h"
#include "text/precision.h"

namespace atelier {

int64_t kv_pool_bytes(const kernels::DeviceMemory& device, int64_t weight_bytes, int64_t workspace_bytes,
                      int64_t cap_bytes, int64_t block_bytes) {
  if (block_bytes <= 0) return 0;
  int64_t left = device.free_bytes - device.reserved_bytes - weight_bytes - workspace_bytes;
  if (cap_bytes > 0) left = std::min(left, cap_bytes);
  return left < block_bytes ? 0 : left / block_bytes * block_bytes;
}

namespace {

struct CpuTextSlot final : TextSlot {
  std::shared_ptr<text::LoadedTextModel> text;
  std::unique_ptr<kernels::Backend> backend;  // the text lane's, over the model's pool
  std::unique_ptr<text::LlamaRunner> runner;
};

struct CpuImageSlot final : ImageSlot {
  ~CpuImageSlot() override { model.reset(); }  // the model runs on the pool: it goes first
  std::unique_ptr<ThreadPool> pool;
};

class CpuRunner final : public Runner {
 public:
  explicit CpuRunner(const EngineConfig& config) : config_(with_batch_defaults(config, false)) {}
  std::string device() const override { return "cpu"; }

  int64_t model_budget_bytes() const override { return config_.model_cache_bytes; }
  int64_t estimate_text_bytes(const ResolvedModel& resolved) const override {
    return model_file_bytes(resolved.path) + config_.kv_memory_bytes;
  }
  int64_t estimate_image_bytes(const ResolvedModel& resolved) const override { return model_file_bytes(resolved.path); }

  Result<std::unique_ptr<TextSlot>> load_text(const ResolvedModel& resolved) override {
    TextModelOptions o;
    o.threads = config_.threads;
    o.kv_type = config_.kv_type;
    o.tokenizer_path = resolved.file("tokenizer");
    auto opened = text::load_text_model(resolved.path, o);
    if (!opened.ok()) return opened.status();
    auto slot = std::make_unique<CpuTextSlot>();
    slot->text = opened.value();
    text::LoadedTextModel& m = *slot->text;
    Status st = guarded([&]() -> Status {
      slot->kv = std::make_unique<text::KvPool>(m.weights.hp, config_.kv_block_tokens, config_.kv_memory_bytes,
                                                config_.kv_type);
      slot->backend = kernels::cpu_device().make_backend(m.pool.get());
      slot->runner = std::make_unique<text::LlamaRunner>(m.weights, *slot->backend);
      return Status{};
    });
    if (!st.ok()) return st;
    slot->tokenizer = m.tokenizer.get();
    slot->n_ctx = m.n_ctx;
    slot->sliding_window = m.weights.hp.sliding_window;
    slot->bytes = m.info.weight_bytes + int64_t{slot->kv->total_blocks()} * slot->kv->block_bytes();
    slot->precision = text::precision_label(text::precision_plan({}, text::PrecisionChoice::Auto, config_.kv_type));
    return std::unique_ptr<TextSlot>(std::move(slot));
  }

  TextOutput execute_text(TextSlot& model, const TextBatch& batch) override {
    auto& m = static_cast<CpuTextSlot&>(model);
    TextOutput out;
    const auto t0 = std::chrono::steady_clock::now();
    out.status = guarded([&]() -> Status {
      m.runner->forward_batch(batch.inputs);
      return Status{};
    });
    if (out.status.ok()) {
      // Sampling is per sequence (its own logits, sampler and random stream),
      // so the sequences sample in parallel; the same tokens as one after another.
      out.sampled.assign(batch.inputs.size(), -1);
      m.text->pool->parallel_for(static_cast<int64_t>(batch.inputs.size()), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          if (text::Generation* g = batch.samplers[static_cast<size_t>(i)]) out.sampled[static_cast<size_t>(i)] = g->sample();
      });
    }
    out.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

  bool is_one_pass(const ResolvedModel& resolved) override {
    // A header that does not even parse goes the diffusion way, whose loader names what is wrong.
    bool one_pass = false;
    guarded([&]() -> Status {
      one_pass = is_one_pass_image_model(resolved, resolved.path);
      return Status{};
    });
    return one_pass;
  }

  Result<std::vector<ImageResult>> generate_one_pass(const ImageRequest& request) override {
    return generate_image(request, config_.store_dir);
  }

  Result<std::unique_ptr<ImageSlot>> load_image(const ImageRequest& request, const ResolvedModel& resolved) override {
    auto slot = std::make_unique<CpuImageSlot>();
    slot->pool = std::make_unique<ThreadPool>(config_.threads, config_.image_nice);
    Status st = guarded([&]() -> Status {
      slot->model = load_diffusion(request, resolved, resolved.path, slot->pool.get());
      return Status{};
    });
    if (!st.ok()) return st;
    // The checkpoint's size stands for what it holds loaded (F16 stays F16).
    slot->bytes = model_file_bytes(resolved.path);
    return std::unique_ptr<ImageSlot>(std::move(slot));
  }

  Status execute_image(ImageSlot& model, const std::vector<image::ImageTask*>& tasks) override {
    return guarded([&]() -> Status {
      image::run_step(*model.model->model, tasks);
      return Status{};
    });
  }

 private:
  EngineConfig config_;
};

}  // namespace

int64_t model_file_bytes(const std::string& path) {
  if (is_synth_model_ref(path)) return synth_model_bytes(path);  // no file: what a file of its weights would hold
  std::error_code ec;
  int64_t bytes = 0;
  if (std::filesystem::is_directory(path, ec)) {
    for (const auto& f : std::filesystem::recursive_directory_iterator(path, ec))
      if (f.is_regular_file(ec)) bytes += static_cast<int64_t>(f.file_size(ec));
    return bytes;
  }
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(n);
}

std::unique_ptr<Runner> make_cpu_runner(const EngineConfig& config) { return std::make_unique<CpuRunner>(config); }

}  // namespace atelier
