// `atelier bench text`: prompt-processing and generation speed of a model,
// reported beside this machine's memory bandwidth and peak FMA throughput
// measured in the same run (the machine is shared; absolute figures drift).
#include <atelier/engine.h>
#include <atelier/models.h>
#include <atelier/tools.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unistd.h>

#include <atelier/devices.h>

#include "core/process_memory.h"
#include "image/sd_model.h"
#include "api/text_model_impl.h"
#include "formats/gguf.h"
#include "formats/sniff.h"
#include "text/precision.h"

namespace atelier {

namespace {
MeanSd mean_sd(const std::vector<double>& v) {
  MeanSd r;
  if (v.empty()) return r;
  for (double x : v) r.mean += x;
  r.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - r.mean) * (x - r.mean);
    r.sd = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return r;
}
}  // namespace

MachineLimits measure_machine_limits(int threads) {
  ThreadPool pool(threads);
  MachineLimits m;
  m.threads = pool.threads();
  m.simd = std::string(kernels::simd_level());
  m.mem_bandwidth_gb_per_s = kernels::measure_memory_bandwidth_gb_per_s(&pool);
  m.peak_gflop_per_s = kernels::measure_peak_gflop_per_s(&pool);
  m.peak_int8_gop_per_s = kernels::measure_peak_int8_gop_per_s(&pool);
  return m;
}

Result<TextBenchResult> bench_text(const std::string& model_path, const TextBenchOptions& o) {
  if (o.prompt_tokens < 1 || o.gen_tokens < 1 || o.reps < 1 || o.threads < 0 || o.depth < 0)
    return Status::error(StatusCode::InvalidArgument,
                         "bench needs prompt tokens >= 1, generated tokens >= 1, reps >= 1, threads >= 0 and depth >= 0");
  TextModelOptions mo;
  mo.threads = o.threads;
  mo.kv_type = o.kv_type;
  mo.device = o.device;
  mo.precision = o.precision;
  mo.context_tokens = o.depth + o.prompt_tokens + o.gen_tokens;
  // The machine first, then the peak counted from the load on: the
  // bandwidth test's buffer is not the model's memory.
  const MachineLimits limits = measure_machine_limits(o.threads);
  reset_peak_rss();
  auto opened = o.synth.empty() ? text::load_text_model(model_path, mo)
                                : synth_text_model_on(o.synth, o.synth_type, o.synth_seed, mo);
  if (!opened.ok()) return opened.status();
  text::LoadedTextModel& m = *opened.value();
  return guarded([&]() -> Result<TextBenchResult> {
    TextBenchResult r;
    r.model = m.info;
    r.prompt_tokens = o.prompt_tokens;
    r.gen_tokens = o.gen_tokens;
    r.reps = o.reps;
    r.depth = o.depth;
    r.limits = limits;
    const text::LlamaHparams& hp = m.weights.hp;
    // Deterministic token ids spread over the vocabulary, as llama-bench does with random ones.
    std::vector<int32_t> prompt(static_cast<size_t>(std::max(o.prompt_tokens, o.depth)));
    uint64_t x = 12345;
    for (auto& t : prompt) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(hp.n_vocab));
    }
    std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
    // On a device (m.backend) the steps and caches are its own.
    std::optional<text::LlamaRunner> on;
    if (m.backend) on.emplace(m.weights, *m.backend);
    else on.emplace(m.weights, m.pool.get());
    text::LlamaRunner& runner = *on;
    const auto make_cache = [&](int n_ctx) {
      return m.backend ? std::make_unique<text::KvCache>(hp, n_ctx, m.options.kv_type, *m.backend)
                       : std::make_unique<text::KvCache>(hp, n_ctx, m.options.kv_type);
    };
    std::vector<double> pp, tg;
    using Clock = std::chrono::steady_clock;
    for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms caches and page-ins, not counted
      // The depth's tokens go in first, untimed, in chunks (one batch would
      // size the activations for all of them).
      auto fill_depth = [&](text::KvCache& c) {
        for (int p = 0; p < o.depth; p += 512)
          runner.forward(prompt.data() + p, std::min(512, o.depth - p), p, c, nullptr);
      };
      auto cache_owner = make_cache(o.depth + o.prompt_tokens);
      text::KvCache& cache = *cache_owner;
      fill_depth(cache);
      auto t0 = Clock::now();
      runner.forward(prompt.data(), o.prompt_tokens, o.depth, cache, logits.data());
      double s_pp = std::chrono::duration<double>(Clock::now() - t0).count();
      auto gen_owner = make_cache(o.depth + o.gen_tokens);
      text::KvCache& gen_cache = *gen_owner;
      fill_depth(gen_cache);
      auto t1 = Clock::now();
      int32_t tok = prompt[0];
      for (int i = 0; i < o.gen_tokens; ++i) {
        runner.forward(&tok, 1, o.depth + i, gen_cache, logits.data());
        tok = prompt[static_cast<size_t>(i + 1) % prompt.size()];
      }
      double s_tg = std::chrono::duration<double>(Clock::now() - t1).count();
      if (rep > 0) {
        pp.push_back(o.prompt_tokens / s_pp);
        tg.push_back(o.gen_tokens / s_tg);
      }
    }
    r.peak_rss_bytes = process_peak_rss_bytes();
    r.prompt_tokens_per_s = mean_sd(pp);
    r.gen_tokens_per_s = mean_sd(tg);
    r.gen_bandwidth_gb_per_s = static_cast<double>(m.info.active_weight_bytes) * r.gen_tokens_per_s.mean / 1e9;
    int64_t matmul_params = 0;  // per prompt token; the output matrix runs once per prompt, not per token
    for (const auto& L : m.weights.layers)
      for (const auto* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) matmul_params += w->rows * w->cols;
    r.prompt_gflop_per_s = 2.0 * static_cast<double>(matmul_params) * r.prompt_tokens_per_s.mean / 1e9;
    if (!m.weights.layers.empty()) {
      const kernels::DType t = m.weights.layers.front().w_up.type;
      r.integer_matmul = t != kernels::DType::F32 && t != kernels::DType::F16 && t != kernels::DType::BF16;
    }
    return r;
  });
}

}  // namespace atelier

namespace atelier {

namespace {
// Samples a device's utilisation every 100 ms on a thread of its own until
// stop(), which returns the mean (-1 without a device or its sensors).
class TelemetrySampler {
 public:
  explicit TelemetrySampler(kernels::Device* device) {
    if (!device) return;
    thread_ = std::thread([this, device] {
      std::unique_lock lock(mu_);
      do {
        lock.unlock();
        const kernels::DeviceTelemetry t = device->telemetry();
        lock.lock();
        if (t.available) sum_ += t.utilization_percent, ++n_;
      } while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_; }));
    });
  }
  ~TelemetrySampler() { stop(); }
  double stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    std::lock_guard lock(mu_);
    return n_ > 0 ? sum_ / n_ : -1;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  double sum_ = 0;
  int n_ = 0;
  std::thread thread_;
};
}  // namespace

Result<std::vector<ServeBenchLevel>> bench_serve(const std::string& model_path_in, const ServeBenchOptions& o) {
  if (o.concurrency.empty() || o.prompt_tokens < 1 || o.gen_tokens < 1 || o.max_batch < 0 || o.rounds < 1)
    return Status::error(StatusCode::InvalidArgument,
                         "bench serve needs concurrency levels, and prompt tokens, generated tokens and rounds >= 1");
  for (int c : o.concurrency)
    if (c < 1 || c > 4096) return Status::error(StatusCode::InvalidArgument, "concurrency levels must be between 1 and 4096");
  if (model_path_in.empty() == o.synth.empty())
    return Status::error(StatusCode::InvalidArgument, "bench serve needs a model or a synthetic preset (--synth), one of them");
  std::string model_path = model_path_in;
  if (!o.synth.empty()) {
    auto spec = parse_synth_model_ref("synth:" + o.synth + ":" + o.synth_type + ":seed=" + std::to_string(o.synth_seed));
    if (!spec.ok()) return spec.status();
    model_path = spec->canonical();
  }
  const bool synthetic = is_synth_model_ref(model_path);
  auto vocab = Vocabulary::open(model_path);
  if (!vocab.ok()) return vocab.status();
  // The ceiling of a round at concurrency c (see bound_tokens_per_s): its
  // matrix products at the peak dot rate. Per row every matrix but the
  // embedding table and the output one; the output matrix (the embedding
  // table when tied) per sampled row. Matrices under ~1.9 bytes a weight are
  // integer ones, which run on the int8 dot units. (No memory term: whether
  // the weights stream from DRAM or stay in a large L3 depends on the machine.)
  double row_params = 0, out_params = 0, matrix_bytes = 0, embd_params = 0;
  auto count = [&](const std::string& name, double n, double bytes) {
    if (name == "token_embd.weight") embd_params = n;
    else if (name == "output.weight") out_params = n;
    else row_params += n, matrix_bytes += bytes;
  };
  if (synthetic) {
    auto layout = synth_layout(parse_synth_model_ref(model_path).value(), text::PrecisionPlan{});
    if (!layout.ok()) return layout.status();
    for (const SynthLayout::Matrix& m : layout->matrices)
      count(m.name, static_cast<double>(m.rows * m.cols), static_cast<double>(kernels::dtype_row_bytes(m.type, m.cols) * m.rows));
  } else if (formats::sniff_model_file(model_path).kind == formats::FileKind::gguf) {
    Status st = guarded([&]() -> Status {
      const auto f = formats::GgufFile::open(model_path);
      for (const auto& t : f->tensors())
        if (t.shape.size() >= 2) count(t.name, static_cast<double>(t.elements()), static_cast<double>(t.bytes));
      return Status{};
    });
    if (!st.ok()) return st;
  }
  if (out_params == 0) out_params = embd_params;
  const bool integer = row_params > 0 && matrix_bytes < 1.9 * row_params;

  // Distinct prompts of printable vocabulary pieces, so no two share a prefix.
  std::vector<std::string> words;
  for (int id = 0; id < vocab.value()->n_vocab(); ++id) {
    const std::string p = vocab.value()->token_piece(id);
    if (p.size() >= 2 && std::all_of(p.begin(), p.end(), [](char c) { return c >= ' ' && c < 127; })) words.push_back(p);
  }
  if (words.empty()) return Status::error(StatusCode::InvalidModel, model_path + ": no printable vocabulary pieces to build prompts from");
  uint64_t x = 0x2545F4914F6CDD1Dull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const std::string dir = (std::filesystem::temp_directory_path() / ("atelier-bench-serve-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  EngineConfig cfg;
  cfg.data_dir = dir;
  cfg.threads = o.threads;
  cfg.max_batch = o.max_batch;
  cfg.kv_type = o.kv_type;
  cfg.prefill_tokens_per_step = o.prefill_tokens_per_step;
  cfg.devices = {o.device};
  cfg.precision = o.precision;
  cfg.gpu_memory_fraction = o.gpu_memory_fraction;
  auto opened = Engine::open(cfg);
  if (!opened.ok()) return opened.status();
  Engine& e = *opened.value();
  auto make_request = [&](int seed, int n) {
    TextRequest r;
    r.model = model_path;
    // Words until the prompt is prompt_tokens long (BOS included), as the model's tokenizer counts.
    for (;;) {
      auto ids = vocab.value()->tokenize(r.prompt, true, false);
      if (!ids.ok() || static_cast<int>(ids.value().size()) >= o.prompt_tokens) break;
      r.prompt += words[next() % words.size()];
    }
    // A synthetic vocabulary counts a byte a token: exactly prompt_tokens.
    if (synthetic)
      while (r.prompt.size() > 1 && static_cast<int>(vocab.value()->tokenize(r.prompt, true, false)->size()) > o.prompt_tokens)
        r.prompt.pop_back();
    r.max_new_tokens = n;
    r.ignore_eos = true;
    r.sampling.seed = static_cast<uint64_t>(seed);
    return r;
  };
  // Warm-up: loads the model and touches the code paths, outside every measurement.
  if (auto id = e.submit(make_request(0, 4)); !id.ok()) return id.status();
  e.wait_idle(24 * 3600 * 1000);
  if (const EngineMetrics m = e.metrics(); m.failed > 0) {
    auto jobs = e.list({});
    return Status::error(StatusCode::Internal, "bench serve: the warm-up request failed" +
                                                   (jobs.empty() ? std::string() : ": " + jobs.front().error));
  }
  // Where the engine runs: the CPU's limits are this run's ceiling there; a
  // GPU's sensors (NVML) are sampled through each round.
  const std::string device = e.metrics().device;
  MachineLimits limits;
  kernels::Device* gpu = nullptr;
  if (device == "cpu") limits = measure_machine_limits(o.threads);
  else gpu = kernels::open_device(device).device;
  const double peak_ops = 1e9 * (integer ? limits.peak_int8_gop_per_s : limits.peak_gflop_per_s);
  auto ceiling_seconds = [&](int c) {
    const double ops = static_cast<double>(c) * ((o.prompt_tokens + o.gen_tokens) * 2.0 * row_params + o.gen_tokens * 2.0 * out_params);
    return peak_ops > 0 ? ops / peak_ops : 0;
  };
  std::vector<ServeBenchLevel> levels;
  int seed = 0;
  for (int c : o.concurrency) {
    ServeBenchLevel lv;
    lv.concurrency = c;
    const double ceiling_s = ceiling_seconds(c);
    lv.bound_tokens_per_s = ceiling_s > 0 ? static_cast<double>(c) * o.gen_tokens / ceiling_s : 0;
    for (int round = 0; round < o.rounds; ++round) {
      e.pause();  // queue the whole round first: the requests arrive "at once"
      e.reset_metrics();
      std::vector<TextRequest> reqs;
      for (int i = 0; i < c; ++i) reqs.push_back(make_request(++seed, o.gen_tokens));
      if (auto ids = e.submit_many(reqs); !ids.ok()) return ids.status();
      const auto t0 = std::chrono::steady_clock::now();
      TelemetrySampler busy(gpu);
      e.resume();
      e.wait_idle(24 * 3600 * 1000);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double busy_percent = busy.stop();
      const EngineMetrics m = e.metrics();
      if (m.failed > 0) return Status::error(StatusCode::Internal, "bench serve: a request failed at concurrency " + std::to_string(c));
      ServeBenchRound r;
      r.seconds = seconds;
      r.tokens_per_s = static_cast<double>(c) * o.gen_tokens / seconds;
      r.time_to_first_token_ms = m.time_to_first_token_ms;
      r.inter_token_ms = m.inter_token_ms;
      int64_t steps = 0, seqs = 0;
      for (size_t k = 1; k < m.batch_size_histogram.size(); ++k) {
        steps += m.batch_size_histogram[k];
        seqs += static_cast<int64_t>(k) * m.batch_size_histogram[k];
      }
      r.mean_batch = steps ? static_cast<double>(seqs) / static_cast<double>(steps) : 0;
      r.device_busy_percent = busy_percent;
      lv.rounds.push_back(r);
    }
    // Each figure of the level: the median of that figure over its rounds.
    auto median = [&](auto&& field) {
      std::vector<double> v;
      for (const ServeBenchRound& r : lv.rounds) v.push_back(field(r));
      std::sort(v.begin(), v.end());
      const size_t n = v.size();
      return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    };
    for (double ServeBenchRound::*f : {&ServeBenchRound::seconds, &ServeBenchRound::tokens_per_s, &ServeBenchRound::mean_batch,
                                       &ServeBenchRound::device_busy_percent})
      lv.*f = median([f](const ServeBenchRound& r) { return r.*f; });
    for (Percentiles ServeBenchRound::*f : {&ServeBenchRound::time_to_first_token_ms, &ServeBenchRound::inter_token_ms})
      for (double Percentiles::*q : {&Percentiles::p50, &Percentiles::p99})
        (lv.*f).*q = median([f, q](const ServeBenchRound& r) { return (r.*f).*q; });
    levels.push_back(lv);
  }
  opened.value().reset();
  std::filesystem::remove_all(dir);
  return levels;
}

}  // namespace atelier

namespace atelier {

Result<ImageBenchResult> bench_image(const std::string& model_path, const ImageBenchOptions& o) {
  if (o.width < 8 || o.height < 8 || o.width % 8 || o.height % 8 || o.steps < 1 || o.batch < 1 || o.batch > 64 ||
      o.reps < 1 || o.threads < 0)
    return Status::error(StatusCode::InvalidArgument,
                         "bench image needs a size in multiples of 8, steps >= 1, a batch of 1..64, reps >= 1, threads >= 0");
  return guarded([&]() -> Result<ImageBenchResult> {
    using Clock = std::chrono::steady_clock;
    ThreadPool pool(o.threads);
    const MachineLimits limits = measure_machine_limits(pool.threads());
    reset_peak_rss();  // the peak from the load on (see bench_text)
    auto model = image::SdModel::open(model_path);
    ImageBenchResult r;
    r.model = model->info().summary;
    r.options = o;
    r.limits = limits;
    const int h = o.height / 8, w = o.width / 8;
    r.unet_rows = o.batch * (o.cfg ? 2 : 1);
    const auto be = kernels::cpu_device().make_backend(&pool);
    const image::UnetTiming t = image::time_unet(*model, r.unet_rows, h, w, o.reps, *be);
    r.unet_seconds_per_step = t.seconds_per_step;
    r.unet_gflop_per_step = t.flops_per_step / 1e9;
    r.unet_gflop_per_s = t.gflop_per_s;
    // One prompt chunk and one decode (after a warm-up of each).
    std::vector<int32_t> ids(77, model->pad_token());
    ids[0] = 49406;
    ids[1] = 49407;
    model->encode_prompt(ids.data(), nullptr, 77, &pool);
    auto t0 = Clock::now();
    model->encode_prompt(ids.data(), nullptr, 77, &pool);
    r.text_encode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::vector<float> latent(static_cast<size_t>(model->latent_channels()) * h * w, 0.1f);
    t0 = Clock::now();
    model->vae_decode(latent.data(), h, w, &pool);
    r.vae_decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.peak_rss_bytes = process_peak_rss_bytes();
    r.seconds_per_image = o.steps * r.unet_seconds_per_step / o.batch + r.vae_decode_seconds +
                          (o.cfg ? 2 : 1) * r.text_encode_seconds / o.batch;
    r.images_per_s = 1.0 / r.seconds_per_image;
    return r;
  });
}

}  // namespace atelier

namespace atelier {

namespace {
// Polls until the job has ended (the engine's own events would do too; a
// database read every 20 ms does not disturb the measurement).
Result<JobInfo> wait_job(Engine& e, JobId id) {
  for (;;) {
    auto info = e.job(id);
    if (!info.ok()) return info.status();
    const JobState s = info->state;
    if (s == JobState::Completed) return info;
    if (s == JobState::Failed || s == JobState::Cancelled)
      return Status::error(StatusCode::Internal, "bench mixed: job " + std::to_string(id) + " ended " +
                                                     std::string(job_state_name(s)) + ": " + info->error);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}
}  // namespace

Result<MixedBenchResult> bench_mixed(const std::string& text_model_path, const std::string& image_model_path,
                                     const MixedBenchOptions& o) {
  if (o.width < 8 || o.height < 8 || o.width % 8 || o.height % 8 || o.steps < 1 || o.text_jobs < 1 || o.gen_tokens < 2 ||
      o.text_start_s < 0 || o.threads < 0)
    return Status::error(StatusCode::InvalidArgument,
                         "bench mixed needs a size in multiples of 8, steps >= 1, text jobs >= 1, gen tokens >= 2, threads >= 0");
  const std::string dir = (std::filesystem::temp_directory_path() / ("atelier-bench-mixed-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  EngineConfig cfg;
  cfg.data_dir = dir;
  cfg.threads = o.threads;
  cfg.image_nice = o.image_nice;
  auto opened = Engine::open(cfg);
  if (!opened.ok()) return opened.status();
  Engine& e = *opened.value();
  int seed = 0;
  auto text_request = [&](int n) {
    TextRequest r;
    r.model = text_model_path;
    r.prompt = "Once upon a time, in a small house by the sea, there lived a painter who";
    r.max_new_tokens = n;
    r.ignore_eos = true;
    r.interactive = true;
    r.sampling.seed = static_cast<uint64_t>(++seed);
    return r;
  };
  auto image_request = [&](int w, int h, int steps) {
    ImageRequest r;
    r.model = image_model_path;
    r.prompt = "a lighthouse on a cliff at dusk, oil painting";
    r.width = w;
    r.height = h;
    r.steps = steps;
    r.seed = 1;
    r.output = dir + "/image.png";
    return r;
  };
  auto run_text = [&](int jobs, const std::function<bool()>& go_on) -> Result<int> {
    int done = 0;
    for (int i = 0; i < jobs && go_on(); ++i) {
      auto id = e.submit(text_request(o.gen_tokens));
      if (!id.ok()) return id.status();
      if (auto info = wait_job(e, id.value()); !info.ok()) return info.status();
      ++done;
    }
    return done;
  };
  auto image_seconds = [](const JobInfo& info) { return static_cast<double>(info.finished_ms - info.started_ms) / 1000.0; };
  MixedBenchResult r;
  Status st = [&]() -> Status {
    // Warm-up: loads both models (the image one under the same key, at a tiny size).
    auto warm_text = e.submit(text_request(4));
    if (!warm_text.ok()) return warm_text.status();
    if (auto info = wait_job(e, warm_text.value()); !info.ok()) return info.status();
    auto warm_image = e.submit(image_request(64, 64, 1));
    if (!warm_image.ok()) return warm_image.status();
    if (auto info = wait_job(e, warm_image.value()); !info.ok()) return info.status();

    e.reset_metrics();
    const auto text_t0 = std::chrono::steady_clock::now();
    if (auto n = run_text(o.text_jobs, [] { return true; }); !n.ok()) return n.status();
    r.text_seconds_alone = std::chrono::duration<double>(std::chrono::steady_clock::now() - text_t0).count();
    EngineMetrics m = e.metrics();
    r.text_alone_ttft_ms = m.time_to_first_token_ms;
    r.text_alone_itl_ms = m.inter_token_ms;

    auto alone = e.submit(image_request(o.width, o.height, o.steps));
    if (!alone.ok()) return alone.status();
    auto alone_info = wait_job(e, alone.value());
    if (!alone_info.ok()) return alone_info.status();
    r.image_seconds_alone = image_seconds(alone_info.value());

    e.reset_metrics();
    auto mixed = e.submit(image_request(o.width, o.height, o.steps));
    if (!mixed.ok()) return mixed.status();
    for (;;) {  // until it has run text_start_s
      auto info = e.job(mixed.value());
      if (!info.ok()) return info.status();
      if (info->state != JobState::Queued && info->state != JobState::Running) break;
      if (info->state == JobState::Running) {
        const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
        if (now_ms - info->started_ms >= static_cast<int64_t>(o.text_start_s * 1000)) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    auto image_running = [&] {
      auto info = e.job(mixed.value());
      return info.ok() && info->state == JobState::Running;
    };
    auto during = run_text(o.text_jobs, image_running);
    if (!during.ok()) return during.status();
    m = e.metrics();  // before the image ends: only gaps while it rendered
    r.text_ttft_ms = m.time_to_first_token_ms;
    r.text_itl_ms = m.inter_token_ms;
    auto mixed_info = wait_job(e, mixed.value());
    if (!mixed_info.ok()) return mixed_info.status();
    r.text_jobs_during_image = during.value();
    // A text job that ended after the image did was not "during" it.
    if (r.text_jobs_during_image > 0) {
      auto last = e.list(JobFilter{std::nullopt, 1, true});
      if (!last.empty() && last.front().kind == "text" && last.front().finished_ms > mixed_info->finished_ms)
        --r.text_jobs_during_image;
    }
    r.image_seconds_with_text = image_seconds(mixed_info.value());
    // Alone once more, after: the mean of the two runs around the mixed one
    // cancels a shared machine's drifting load out of the ratio.
    auto after = e.submit(image_request(o.width, o.height, o.steps));
    if (!after.ok()) return after.status();
    auto after_info = wait_job(e, after.value());
    if (!after_info.ok()) return after_info.status();
    r.image_seconds_alone_runs = {r.image_seconds_alone, image_seconds(after_info.value())};
    r.image_seconds_alone = 0.5 * (r.image_seconds_alone_runs[0] + r.image_seconds_alone_runs[1]);
    r.image_slowdown = r.image_seconds_alone > 0 ? r.image_seconds_with_text / r.image_seconds_alone : 0;
    // Only the jobs that ran inside the render took time from it.
    const double text_inside_s = r.text_seconds_alone * r.text_jobs_during_image / std::max(1, o.text_jobs);
    r.image_slowdown_floor = r.image_seconds_alone > 0 ? (r.image_seconds_alone + text_inside_s) / r.image_seconds_alone : 0;
    return Status{};
  }();
  opened.value().reset();
  std::filesystem::remove_all(dir);
  if (!st.ok()) return st;
  return r;
}

}  // namespace atelier
