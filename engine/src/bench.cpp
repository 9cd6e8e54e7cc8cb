// `atelier bench text`: prompt-processing and generation speed of a model,
// reported beside this machine's memory bandwidth and peak FMA throughput
// measured in the same run (the machine is shared; absolute figures drift).
#include <atelier/engine.h>

#include <chrono>
#include <cmath>

#include "text_model_impl.h"

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
  return m;
}

Result<TextBenchResult> bench_text(const std::string& model_path, const TextBenchOptions& o) {
  if (o.prompt_tokens < 1 || o.gen_tokens < 1 || o.reps < 1 || o.threads < 0)
    return Status::error(StatusCode::InvalidArgument,
                         "bench needs prompt tokens >= 1, generated tokens >= 1, reps >= 1 and threads >= 0");
  TextModelOptions mo;
  mo.threads = o.threads;
  mo.context_tokens = o.prompt_tokens + o.gen_tokens;
  auto opened = TextModel::open(model_path, mo);
  if (!opened.ok()) return opened.status();
  TextModel& model = *opened.value();
  TextModel::Impl& m = model.impl();
  return guarded([&]() -> Result<TextBenchResult> {
    TextBenchResult r;
    r.model = m.info;
    r.prompt_tokens = o.prompt_tokens;
    r.gen_tokens = o.gen_tokens;
    r.reps = o.reps;
    r.limits = measure_machine_limits(m.pool->threads());
    const text::LlamaHparams& hp = m.weights.hp;
    // Deterministic token ids spread over the vocabulary, as llama-bench does with random ones.
    std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_tokens));
    uint64_t x = 12345;
    for (auto& t : prompt) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(hp.n_vocab));
    }
    std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
    text::LlamaRunner runner(m.weights, m.pool.get());
    std::vector<double> pp, tg;
    using Clock = std::chrono::steady_clock;
    for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms caches and page-ins, not counted
      text::KvCache cache(hp, o.prompt_tokens + o.gen_tokens, m.options.kv_type == KvType::F16);
      auto t0 = Clock::now();
      runner.forward(prompt.data(), o.prompt_tokens, 0, cache, logits.data());
      double s_pp = std::chrono::duration<double>(Clock::now() - t0).count();
      text::KvCache gen_cache(hp, o.gen_tokens, m.options.kv_type == KvType::F16);
      auto t1 = Clock::now();
      int32_t tok = prompt[0];
      for (int i = 0; i < o.gen_tokens; ++i) {
        runner.forward(&tok, 1, i, gen_cache, logits.data());
        tok = prompt[static_cast<size_t>(i + 1) % prompt.size()];
      }
      double s_tg = std::chrono::duration<double>(Clock::now() - t1).count();
      if (rep > 0) {
        pp.push_back(o.prompt_tokens / s_pp);
        tg.push_back(o.gen_tokens / s_tg);
      }
    }
    r.prompt_tokens_per_s = mean_sd(pp);
    r.gen_tokens_per_s = mean_sd(tg);
    r.gen_bandwidth_gb_per_s = static_cast<double>(m.info.weight_bytes) * r.gen_tokens_per_s.mean / 1e9;
    int64_t matmul_params = 0;  // per prompt token; the output matrix runs once per prompt, not per token
    for (const auto& L : m.weights.layers)
      for (const auto* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) matmul_params += w->rows * w->cols;
    r.prompt_gflop_per_s = 2.0 * static_cast<double>(matmul_params) * r.prompt_tokens_per_s.mean / 1e9;
    return r;
  });
}

}  // namespace atelier
