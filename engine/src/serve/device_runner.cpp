// The runner of a device that is not the host (a CUDA GPU; tests: a fake
// one), and device selection (--device). Text models load onto the device:
// weights copied there by the loader, the step's workspace reserved at load
// (max_batch decodes plus the prefill budget), and a KV pool in its memory
// sized from what its free memory leaves after them, times
// gpu_memory_fraction. Images run on the CPU runner it holds (issue 34 moves
// them), as does everything after the device is lost.
#include <atelier/devices.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "api/text_model_impl.h"
#include "formats/gguf.h"
#include "formats/sniff.h"
#include "serve/runner.h"
#include "text/precision.h"

namespace atelier {

int64_t gpu_held_back_bytes(const kernels::DeviceMemory& m, double fraction) {
  return static_cast<int64_t>(static_cast<double>(m.total_bytes) * (1.0 - fraction)) + m.reserved_bytes;
}

namespace {

// The first line of a refusal, without the colon that introduced the rest.
std::string first_line(const std::string& s) {
  std::string l = s.substr(0, s.find('\n'));
  while (!l.empty() && (l.back() == ':' || l.back() == ' ')) l.pop_back();
  return l;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

}  // namespace

namespace {
Result<DeviceSelection> pick_device(const std::string& spec, const std::vector<std::string>& candidates,
                                    const std::string& no_gpu_why) {
  DeviceSelection s;
  if (spec.empty() || spec == "auto") {
    s.automatic = true;
    std::string why = no_gpu_why;
    for (const std::string& c : candidates) {
      const kernels::DeviceChoice ch = kernels::open_device(c);
      if (!ch.device) {
        why = ch.why;
        continue;
      }
      s.name = ch.name;
      s.description = ch.device->info().description;
      s.why = "auto: " + s.name + " (" + s.description +
              "); a text model that does not fit it, and image jobs, run on the CPU";
      return s;
    }
    s.name = "cpu";
    s.description = kernels::cpu_device().info().description;
    s.why = "auto: no usable GPU (" + first_line(why.empty() ? "no CUDA device found" : why) + "); running on the CPU";
    return s;
  }
  const kernels::DeviceChoice ch = kernels::open_device(spec);
  if (!ch.device) {
    if (ch.why.rfind("unknown device", 0) == 0)
      return Status::error(StatusCode::InvalidArgument, "--device: unknown device '" + spec + "': use auto, cpu, cuda or cuda:N");
    return Status::error(StatusCode::Unsupported, "--device " + spec + ": " + ch.why);
  }
  s.name = ch.name;
  s.description = ch.device->info().description;
  s.why = "asked for with --device " + spec;
  return s;
}
}  // namespace

Result<DeviceSelection> select_device_among(const std::string& spec, const std::vector<std::string>& candidates,
                                            const std::string& no_gpu_why, const std::string& precision, KvType kv) {
  text::PrecisionChoice choice;
  if (!text::precision_choice_from_name(precision, &choice))
    return Status::error(StatusCode::InvalidArgument, "--precision must be auto, bf16, fp16 or fp8 (got '" + precision + "')");
  if (spec.empty()) return Status::error(StatusCode::InvalidArgument, "--device needs a value: auto, cpu, cuda or cuda:N");
  auto picked = pick_device(spec, candidates, no_gpu_why);
  if (!picked.ok()) return picked;
  DeviceSelection s = picked.value();
  kernels::Device* dev = kernels::open_device(s.name).device;
  if (!dev) return Status::error(StatusCode::Unsupported, "--device " + s.name + ": the device could not be opened");
  const text::DeviceCaps caps = text::device_caps(dev->info());
  if (!caps.gpu && s.automatic && choice != text::PrecisionChoice::Auto) {
    s.why += std::string(" (--precision ") + precision + " applies to a GPU only)";
    choice = text::PrecisionChoice::Auto;
  }
  // The policy refuses what the device cannot do, naming what it can.
  Status st = guarded([&]() -> Status {
    s.precision = text::precision_label(text::precision_plan(caps, choice, kv));
    return Status{};
  });
  if (!st.ok()) return st;
  return s;
}

Result<DeviceSelection> select_device(const std::string& spec, const std::string& precision, KvType kv) {
  if (spec == "auto") {
    std::string why;
    const std::vector<std::string> gpus = kernels::cuda_devices(&why);
    return select_device_among(spec, gpus, why, precision, kv);
  }
  return select_device_among(spec, {}, "", precision, kv);
}

std::vector<std::string> available_devices(std::string* why) {
  std::vector<std::string> names = {"cpu"};
  for (const std::string& n : kernels::cuda_devices(why)) names.push_back(n);
  return names;
}

namespace {

using Clock = std::chrono::steady_clock;

struct DeviceTextSlot final : TextSlot {
  // Declared first, destroyed last: the buffers below are the backend's.
  std::unique_ptr<kernels::Backend> backend;
  std::shared_ptr<text::LoadedTextModel> text;
  std::unique_ptr<text::LlamaRunner> runner;
  ~DeviceTextSlot() override {
    runner.reset();
    kv.reset();  // a member of TextSlot, which would otherwise outlive the backend
    text.reset();
  }
};

// What a text model will take on the device, read from its header.
struct Need {
  text::LlamaHparams hp;
  int64_t weights = 0, workspace = 0, block = 0, n_params = 0;
  bool known = false;  // false: the header could not be read (the loader will say why)
  int64_t total() const { return weights + workspace + block; }
};

class DeviceRunner final : public Runner {
 public:
  DeviceRunner(const EngineConfig& config, kernels::Device& device, std::string name, bool automatic)
      : config_(with_batch_defaults(config, true)),
        device_(device),
        name_(std::move(name)),
        automatic_(automatic),
        cpu_(make_cpu_runner(config)) {
    text::precision_choice_from_name(config.precision, &choice_);
    plan_ = text::precision_plan(text::device_caps(device_.info()), choice_, config.kv_type);  // Engine::open checked it
  }

  std::string device() const override { return lost_ ? "cpu" : name_; }
  kernels::DeviceMemory memory() const override { return lost_ ? cpu_->memory() : device_.memory(); }
  kernels::DeviceTelemetry telemetry() const override { return lost_ ? kernels::DeviceTelemetry{} : device_.telemetry(); }

  int64_t model_budget_bytes() const override {
    if (lost_) return cpu_->model_budget_bytes();
    const kernels::DeviceMemory m = device_.memory();
    return std::max<int64_t>(0, m.total_bytes - gpu_held_back_bytes(m, config_.gpu_memory_fraction));
  }
  int64_t estimate_text_bytes(const ResolvedModel& resolved) const override {
    if (lost_) return cpu_->estimate_text_bytes(resolved);
    const Need n = need_of(resolved);
    if (!n.known) return model_file_bytes(resolved.path);
    // A model auto puts on the CPU is the CPU's to count, but shares the cache budget.
    if (automatic_ && n.total() > usable_bytes()) return cpu_->estimate_text_bytes(resolved);
    return n.total();
  }
  int64_t estimate_image_bytes(const ResolvedModel& resolved) const override { return cpu_->estimate_image_bytes(resolved); }

  Result<std::unique_ptr<TextSlot>> load_text(const ResolvedModel& resolved) override {
    if (lost_) return cpu_->load_text(resolved);
    const Need need = need_of(resolved);
    const int64_t usable = usable_bytes();
    if (need.known && need.total() > usable) {
      if (automatic_) return cpu_->load_text(resolved);
      return Status::error(StatusCode::Unsupported, does_not_fit(resolved, need, usable));
    }
    auto slot = std::make_unique<DeviceTextSlot>();
    const int64_t free_before = device_.memory().free_bytes;
    Status st = guarded([&]() -> Status {
      slot->backend = device_.make_backend(nullptr, 0);
      TextModelOptions o;
      o.threads = config_.threads;  // the host's share: sampling
      o.kv_type = config_.kv_type;
      o.precision = config_.precision;  // the plan reaches the backend before the weights (load_text_model)
      o.tokenizer_path = resolved.file("tokenizer");
      auto opened = text::load_text_model(resolved.path, o, slot->backend.get());
      if (!opened.ok()) return opened.status();
      slot->text = opened.value();
      const text::LlamaWeights& w = slot->text->weights;
      slot->runner = std::make_unique<text::LlamaRunner>(w, *slot->backend);
      // Every step up to these sizes runs in place (a graph can replay it).
      slot->runner->reserve(reserve_rows(), config_.max_batch);
      // What is left now that the weights and the workspace are on the device.
      const kernels::DeviceMemory after = device_.memory();
      const int64_t block = text::KvPool::block_bytes_for(w.hp, config_.kv_block_tokens, config_.kv_type);
      kernels::DeviceMemory room = after;
      room.reserved_bytes = gpu_held_back_bytes(after, config_.gpu_memory_fraction);
      const int64_t pool = kv_pool_bytes(room, 0, 0, 0, block);
      if (pool == 0) {
        Need got = need;
        got.hp = w.hp;
        got.block = block;
        return Status::error(StatusCode::Unsupported, does_not_fit(resolved, got, usable) +
                                                          " (no room for one KV block once the weights and workspace were loaded)");
      }
      slot->kv = std::make_unique<text::KvPool>(w.hp, config_.kv_block_tokens, pool, config_.kv_type, *slot->backend);
      return Status{};
    });
    if (!st.ok()) {
      if (automatic_ && st.code == StatusCode::Unsupported) {
        slot.reset();  // the device's memory back first
        return cpu_->load_text(resolved);
      }
      return st;
    }
    const text::LoadedTextModel& m = *slot->text;
    slot->tokenizer = m.tokenizer.get();
    slot->n_ctx = m.n_ctx;
    slot->sliding_window = m.weights.hp.sliding_window;
    // What the device gave it: weights, vectors, workspace, KV pool.
    slot->bytes = free_before - device_.memory().free_bytes;
    if (slot->bytes <= 0)  // another process freed memory meanwhile: count what we know of
      slot->bytes = weights_on_device(m.weights) + int64_t{slot->kv->total_blocks()} * slot->kv->block_bytes();
    slot->device = name_;
    slot->precision = text::precision_label(plan_);
    // A synth:...:fp8 reference is drawn in E4M3 whatever --precision says: its record says so.
    if (auto ref = parse_synth_model_ref(resolved.path); ref.ok() && ref->type == "fp8")
      slot->precision = text::precision_label(
          text::precision_plan(text::device_caps(device_.info()), text::PrecisionChoice::FP8, config_.kv_type));
    return std::unique_ptr<TextSlot>(std::move(slot));
  }

  TextOutput execute_text(TextSlot& model, const TextBatch& batch) override {
    if (model.device == "cpu") return cpu_->execute_text(model, batch);
    auto& m = static_cast<DeviceTextSlot&>(model);
    TextOutput out;
    const auto t0 = Clock::now();
    if (lost_) {
      out.status = Status::error(StatusCode::Io, lost_message_);
      out.device_lost = true;
      return out;
    }
    // Rows whose job only needs the Sampler's rules are sampled on the
    // device (their logits never come to the host); the others' logits are
    // downloaded and sampled here (JSON constraints, logprobs).
    const size_t n = batch.inputs.size();
    inputs_ = batch.inputs;
    rows_.assign(n, kernels::SampleRow{});
    pairs_.clear();
    pair_at_.assign(n, 0);
    ids_.assign(n, -1);
    std::vector<bool> on_device(n, false);
    for (size_t i = 0; i < n; ++i) {
      text::Generation* g = batch.samplers[i];
      if (!device_sampling_ || !g || !inputs_[i].logits || inputs_[i].all_logits || !g->device_sampleable()) continue;
      pair_at_[i] = pairs_.size();
      rows_[i] = g->device_row(pairs_);
      on_device[i] = true;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!on_device[i]) continue;
      inputs_[i].sample = &rows_[i];
      inputs_[i].sample_pairs = pairs_.data() + pair_at_[i];
      inputs_[i].sampled = &ids_[i];
    }
    try {
      m.runner->forward_batch(inputs_);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      if (what.rfind(kDeviceLostPrefix, 0) == 0) {
        lost_message_ = name_ + ": " + what;
        lost_ = true;
        out.status = Status::error(StatusCode::Io, lost_message_);
        out.device_lost = true;
        return out;
      }
      out.status = guarded([&]() -> Status { throw; });
      return out;
    }
    // The host's rows' logits are here (one download per step): sampling them.
    out.sampled.assign(n, -1);
    for (size_t i = 0; i < n; ++i)
      if (on_device[i]) out.sampled[i] = batch.samplers[i]->device_sampled(ids_[i]);
    m.text->pool->parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        if (text::Generation* g = batch.samplers[static_cast<size_t>(i)]; g && !on_device[static_cast<size_t>(i)])
          out.sampled[static_cast<size_t>(i)] = g->sample();
    });
    out.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return out;
  }

  bool is_one_pass(const ResolvedModel& resolved) override { return cpu_->is_one_pass(resolved); }
  Result<std::vector<ImageResult>> generate_one_pass(const ImageRequest& request) override {
    if (Status s = images_here(); !s.ok()) return s;
    return cpu_->generate_one_pass(request);
  }
  Result<std::unique_ptr<ImageSlot>> load_image(const ImageRequest& request, const ResolvedModel& resolved) override {
    if (Status s = images_here(); !s.ok()) return s;
    return cpu_->load_image(request, resolved);
  }
  Status execute_image(ImageSlot& model, const std::vector<image::ImageTask*>& tasks) override {
    return cpu_->execute_image(model, tasks);
  }

 private:
  int reserve_rows() const { return config_.max_batch + std::max(config_.prefill_tokens_per_step, kIdlePrefillTokens); }

  // What this engine may still take on the device now.
  int64_t usable_bytes() const {
    const kernels::DeviceMemory m = device_.memory();
    return std::max<int64_t>(0, m.free_bytes - gpu_held_back_bytes(m, config_.gpu_memory_fraction));
  }

  // Image jobs run on a GPU from issue 34 on; until then auto puts them on
  // the CPU, and a GPU named outright refuses them.
  Status images_here() const {
    if (automatic_ || lost_) return Status{};
    return Status::error(StatusCode::Unsupported, "image jobs do not run on a GPU yet: this engine runs on " + name_ +
                                                      " (--device " + name_ +
                                                      "); run image jobs with --device cpu, or --device auto, which puts "
                                                      "them on the CPU");
  }

  int64_t weights_on_device(const text::LlamaWeights& w) const {
    int64_t bytes = 0;
    for (const auto& b : w.prepared) bytes += b ? b->bytes() : 0;
    return bytes;
  }

  Need need_of(const ResolvedModel& resolved) const {
    Need n;
    guarded([&]() -> Status {
      if (is_synth_model_ref(resolved.path)) {  // made on the device: its layout at this plan
        auto ref = parse_synth_model_ref(resolved.path);
        if (!ref.ok()) return Status{};
        auto layout = synth_layout(ref.value(), plan_);
        if (!layout.ok()) return Status{};
        n.weights = layout->weight_bytes;
        n.hp = layout->hp;
        n.n_params = layout->info.n_params;
        n.workspace = text::LlamaRunner::workspace_bytes(n.hp, reserve_rows(), config_.max_batch, plan_.activations);
        n.block = text::KvPool::block_bytes_for(n.hp, config_.kv_block_tokens, config_.kv_type);
        n.known = true;
        return Status{};
      }
      if (formats::sniff_model_file(resolved.path).kind != formats::FileKind::gguf) return Status{};
      auto info = read_model_info(resolved.path, resolved.file("tokenizer"));
      if (!info.ok() || info->n_heads <= 0) return Status{};
      auto file = formats::GgufFile::open(resolved.path);
      for (const formats::GgufTensor& t : file->tensors()) {
        if (t.shape.size() >= 2) {
          int64_t rows = 1;
          for (size_t i = 1; i < t.shape.size(); ++i) rows *= t.shape[i];
          n.weights += plan_.matrix_bytes(t.type, rows, t.shape[0]);
        } else {
          n.weights += t.elements() * 4;  // norms, biases: F32
        }
      }
      text::LlamaHparams& hp = n.hp;
      hp.n_vocab = info->n_vocab;
      hp.n_embd = info->n_embd;
      hp.n_layer = info->n_layers;
      hp.n_head = info->n_heads;
      hp.n_head_kv = info->n_kv_heads > 0 ? info->n_kv_heads : info->n_heads;
      hp.n_ff = info->n_ff;
      hp.head_dim = hp.n_rot = info->n_embd / info->n_heads;
      n.n_params = info->n_params;
      n.workspace = text::LlamaRunner::workspace_bytes(hp, reserve_rows(), config_.max_batch, plan_.activations);
      n.block = text::KvPool::block_bytes_for(hp, config_.kv_block_tokens, config_.kv_type);
      n.known = true;
      return Status{};
    });
    return n;
  }

  // The refusal: the figures, and what would fit.
  std::string does_not_fit(const ResolvedModel& resolved, const Need& n, int64_t usable) const {
    const kernels::DeviceMemory m = device_.memory();
    char frac[16];
    std::snprintf(frac, sizeof frac, "%.2f", config_.gpu_memory_fraction);
    std::string s = resolved.display.empty() ? resolved.path : resolved.display;
    s += " does not fit " + name_ + ": it needs " + gib(n.total()) + " (weights " + gib(n.weights) + " at " +
         text::precision_label(plan_) + ", step workspace " + gib(n.workspace) + ", one KV block " + gib(n.block) +
         "), and " + gib(usable) + " is usable (" + gib(m.free_bytes) + " free of " + gib(m.total_bytes) +
         ", --gpu-memory-fraction " + frac + "). What would fit: ";
    std::vector<std::string> ways;
    if (n.n_params > 0) {
      const int64_t q4 = n.n_params * 9 / 16;  // Q4_K_M: about 4.5 bits a weight
      if (q4 + n.workspace + n.block <= usable)
        ways.push_back("a smaller quantization (Q4_K_M: about " + gib(q4) + " of weights; `atelier models quantize`)");
      else
        ways.push_back("a smaller model (even at Q4_K_M its weights take about " + gib(q4) + ")");
    }
    if (n.weights + n.workspace <= usable)
      ways.push_back("fewer tokens in flight (--max-batch, --kv-type q8_0)");
    ways.push_back("a higher --gpu-memory-fraction when nothing else uses " + name_);
    ways.push_back("the CPU (--device cpu, or --device auto, which falls back to it)");
    for (size_t i = 0; i < ways.size(); ++i) s += (i ? "; " : "") + ways[i];
    return s;
  }

  EngineConfig config_;
  kernels::Device& device_;
  std::string name_;
  bool automatic_;
  std::unique_ptr<Runner> cpu_;
  text::PrecisionChoice choice_ = text::PrecisionChoice::Auto;
  text::PrecisionPlan plan_;
  std::atomic<bool> lost_{false};
  std::string lost_message_;  // set before lost_ (text lane only)
  // Sampling on the device (Backend::sample); ATELIER_DEVICE_SAMPLING=0
  // keeps every row on the host (the A/B of the device check).
  bool device_sampling_ = [] {
    const char* e = std::getenv("ATELIER_DEVICE_SAMPLING");
    return !(e && std::string(e) == "0");
  }();
  // One step's inputs with their sampling (text lane only).
  std::vector<text::SeqInput> inputs_;
  std::vector<kernels::SampleRow> rows_;
  std::vector<int32_t> pairs_, ids_;
  std::vector<size_t> pair_at_;
};

}  // namespace

std::unique_ptr<Runner> make_device_runner(const EngineConfig& config, kernels::Device& device, const std::string& name,
                                           bool automatic) {
  return std::make_unique<DeviceRunner>(config, device, name, automatic);
}

}  // namespace atelier
