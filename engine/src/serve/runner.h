// The runner: what the scheduler asks one device to do. The scheduler owns
// the jobs (admission, priority, preemption, cancel, finishing); a runner
// owns what computes (weights, KV storage, activations, threads) and executes
// the plans it is handed, without knowing which job an input belongs to.
//
// A runner has two lanes, like a GPU's two streams: execute_text is called
// from the scheduler's text thread and execute_image (and the image models'
// own calls: prompt encoding, decoding) from its image thread, at the same
// time; each lane's calls come one at a time. Loading happens on the lane
// that uses the model.
//
// The CPU runner (cpu_runner.cpp) is today's engine; tests/serve drives the
// scheduler with a fake one (timed steps, no arithmetic).
#pragma once

#include <atelier/backend.h>
#include <atelier/engine.h>
#include <atelier/models.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/image_job.h"
#include "text/generation.h"
#include "text/kv_cache.h"
#include "text/llama.h"

namespace atelier {

// Device memory admission (issue 32): the KV pool a text model gets on a
// device is what the device's free memory leaves once the model's weights
// (at the device's precision), its step workspace and what the device
// holds back are counted: at most cap_bytes (EngineConfig::kv_memory_bytes;
// 0: no cap), in whole blocks of block_bytes, and 0 when not one block fits
// (the model cannot run there: the runner refuses it with these figures).
// The CPU runner keeps the configured budget, whose pages are committed
// only as they fill.
// The prompt tokens a step prefills when no sequence is decoding (the
// scheduler's budget then; prefill_tokens_per_step otherwise): with
// max_batch decodes, what a device runner reserves its workspace for.
inline constexpr int kIdlePrefillTokens = 1024;

int64_t kv_pool_bytes(const kernels::DeviceMemory& device, int64_t weight_bytes, int64_t workspace_bytes,
                      int64_t cap_bytes, int64_t block_bytes);

// A text model loaded on the device, as the scheduler sees it; the runner
// keeps its weights and executor in a subclass.
struct TextSlot {
  virtual ~TextSlot() = default;
  const tok::Tokenizer* tokenizer = nullptr;
  int n_ctx = 0;                     // the most tokens one sequence may hold
  int sliding_window = 0;            // > 0: attention sees only this many positions (blocks behind it are given back)
  std::unique_ptr<text::KvPool> kv;  // block bookkeeping on the host, rows in the device's buffer
  int64_t bytes = 0;                 // weights and KV: what the model cache counts
  std::string device = "cpu";        // where it runs ("cuda:0"; "cpu" for auto's fallback)
  std::string precision;             // text/precision.h's label, recorded with each job
};

// An image model loaded on the device: the pipeline's view of it (the
// DiffusionModel whose calls run on the device) and its CLIP vocabulary.
struct ImageSlot {
  virtual ~ImageSlot() = default;
  std::unique_ptr<LoadedDiffusion> model;
  int64_t bytes = 0;
  std::string device = "cpu";
  std::string precision = "weights:file act:f32";
};

// One text step: every input stores its tokens' KV; an input whose sampler is
// set gets its last token's logits in sampler->logits() and samples from them.
struct TextBatch {
  std::vector<text::SeqInput> inputs;
  std::vector<text::Generation*> samplers;  // per input; nullptr: no logits wanted
};

struct TextOutput {
  Status status;
  std::vector<int32_t> sampled;  // per input, -1 where it sampled nothing
  double step_ms = 0;            // the forward pass and sampling
  // The device was lost during the step (the CUDA module's sticky error,
  // "CUDA device lost: ..."): every model on it is gone; the runner runs
  // what it loads from now on on the CPU, and the scheduler requeues the
  // jobs that were running there.
  bool device_lost = false;
};

// The prefix of the CUDA module's sticky error: the device cannot be used
// again by this process.
inline constexpr const char kDeviceLostPrefix[] = "CUDA device lost:";

class Runner {
 public:
  virtual ~Runner() = default;
  virtual std::string device() const = 0;  // "cpu", "cuda:0"; "cpu" once a GPU was lost
  // The device's memory and sensors now, for the metrics (the CPU: the machine's RAM, no sensors).
  virtual kernels::DeviceMemory memory() const { return kernels::cpu_device().memory(); }
  virtual kernels::DeviceTelemetry telemetry() const { return {}; }

  // Memory admission (issue 32): the bytes loaded models may hold on the
  // device together (the model cache's budget), and what a model will hold
  // once loaded (weights at the device's precision, its KV pool,
  // workspaces). The scheduler unloads idle models until a new one's
  // estimate fits the budget. On the CPU the budget is
  // EngineConfig::model_cache_bytes and a model's estimate its file's bytes
  // (plus the KV budget for text), as before; a GPU runner's come from its
  // kernels::Device::memory().
  virtual int64_t model_budget_bytes() const = 0;
  virtual int64_t estimate_text_bytes(const ResolvedModel& resolved) const = 0;
  virtual int64_t estimate_image_bytes(const ResolvedModel& resolved) const = 0;

  // Loads the text model RESOLVED names, with a KV pool of the engine's budget.
  virtual Result<std::unique_ptr<TextSlot>> load_text(const ResolvedModel& resolved) = 0;
  // One forward pass over every input of BATCH (all on MODEL), then sampling.
  virtual TextOutput execute_text(TextSlot& model, const TextBatch& batch) = 0;

  // A one-pass generator (the QuickDraw CVAE): no steps to share, made whole.
  virtual bool is_one_pass(const ResolvedModel& resolved) = 0;
  virtual Result<std::vector<ImageResult>> generate_one_pass(const ImageRequest& request) = 0;
  // Loads a diffusion model (what the request says about prediction,
  // preview decoder and vocabulary is part of what is loaded).
  virtual Result<std::unique_ptr<ImageSlot>> load_image(const ImageRequest& request, const ResolvedModel& resolved) = 0;
  // One network evaluation of every task (all on MODEL): image::run_step.
  virtual Status execute_image(ImageSlot& model, const std::vector<image::ImageTask*>& tasks) = 0;
};

// Bytes of a model file, or of every file of a diffusers folder (0 when
// unreadable): what the model cache expects a model to hold before it loads.
int64_t model_file_bytes(const std::string& path);

// The CPU runner over the engine's configuration (threads, KV type and
// budget, the image lane's OS priority, the store).
std::unique_ptr<Runner> make_cpu_runner(const EngineConfig& config);

// A runner for a device that is not the host (serve/device_runner.cpp): text
// models load onto DEVICE (weights, workspace reserved at load, KV pool in
// its memory, sized from what its free memory leaves times
// EngineConfig::gpu_memory_fraction), in the precision policy of
// text/precision.h. AUTOMATIC (--device auto): a text model that does not
// fit, and every image job, runs on the CPU instead (the slot says so);
// else they are refused with the figures and what would fit. After a step
// throws kDeviceLostPrefix the device is not used again: everything then
// loads on the CPU.
std::unique_ptr<Runner> make_device_runner(const EngineConfig& config, kernels::Device& device, const std::string& name,
                                           bool automatic);

// select_device with the candidates "auto" tries given (cuda_devices() for
// the public one; tests pass a registered fake device's name). NO_GPU_WHY:
// why the candidates are empty, for auto's note.
Result<DeviceSelection> select_device_among(const std::string& spec, const std::vector<std::string>& candidates,
                                            const std::string& no_gpu_why, const std::string& precision = "auto",
                                            KvType kv = KvType::F16);

// The device bytes a GPU keeps free of this engine: total x (1 - fraction),
// plus what the device holds back. What kv_pool_bytes sees as reserved.
int64_t gpu_held_back_bytes(const kernels::DeviceMemory& m, double gpu_memory_fraction);

}  // namespace atelier
