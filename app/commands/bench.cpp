// `atelier bench text`: speed of a model against this machine's measured roofs.
#include <atelier/models.h>
#include <atelier/tools.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <filesystem>
#include <vector>
#include <memory>

#include "commands/commands.h"
#include "commands/request_options.h"
#include "commands/output.h"

namespace atelier::app {

namespace {
// The model reference resolved through the store (the engine's one resolver).
// A store blob is checked against its digest; a plain file is not hashed, as
// a bench records no digest (hashing loaded libcrypto, ~1.6 MB resident, into
// the process whose memory it reports).
Result<std::string> model_path(const std::string& ref, const std::string& store) {
  ResolveOptions ro;
  std::error_code ec;
  ro.check_digest = !std::filesystem::is_regular_file(ref, ec);
  auto r = resolve_model(ref, store, ro);
  if (!r.ok()) return r.status();
  return r->path;
}

struct BenchTextOptions {
  std::string model, store;
  TextBenchOptions bench;
  bool json = false;
  DeviceOptions device;
};

int run_bench_text(const BenchTextOptions& o) {
  if (o.model.empty() == o.bench.synth.empty())
    return fail(Status::error(StatusCode::InvalidArgument, "bench text needs -m MODEL or --synth PARAMS (one of them)"));
  auto dev = select_device(o.device.device, o.device.precision, o.bench.kv_type);
  if (!dev.ok()) return fail(dev.status());
  Result<std::string> path = std::string();
  if (o.bench.synth.empty()) path = model_path(o.model, o.store);
  if (!path.ok()) return fail(path.status());
  TextBenchOptions bo = o.bench;
  bo.device = dev->name;
  bo.precision = o.device.precision;
  auto res = bench_text(path.value(), bo);
  if (!res.ok()) return fail(res.status());
  const TextBenchResult& r = res.value();
  const double bw_frac = r.limits.mem_bandwidth_gb_per_s > 0 ? r.gen_bandwidth_gb_per_s / r.limits.mem_bandwidth_gb_per_s : 0;
  const double peak = r.integer_matmul ? r.limits.peak_int8_gop_per_s : r.limits.peak_gflop_per_s;
  const double fl_frac = peak > 0 ? r.prompt_gflop_per_s / peak : 0;
  if (o.json) {
    print_json_line({{"model", r.model.path},
                     {"n_params", r.model.n_params},
                     {"weight_types", r.model.weight_types},
                     {"weight_bytes_per_token", r.model.active_weight_bytes},
                     {"threads", r.limits.threads},
                     {"simd", r.limits.simd},
                     {"prompt_tokens", r.prompt_tokens},
                     {"gen_tokens", r.gen_tokens},
                     {"depth", r.depth},
                     {"reps", r.reps},
                     {"prompt_tokens_per_s", r.prompt_tokens_per_s.mean},
                     {"prompt_tokens_per_s_sd", r.prompt_tokens_per_s.sd},
                     {"gen_tokens_per_s", r.gen_tokens_per_s.mean},
                     {"gen_tokens_per_s_sd", r.gen_tokens_per_s.sd},
                     {"gen_bandwidth_gb_per_s", r.gen_bandwidth_gb_per_s},
                     {"prompt_gflop_per_s", r.prompt_gflop_per_s},
                     {"mem_bandwidth_gb_per_s", r.limits.mem_bandwidth_gb_per_s},
                     {"peak_gflop_per_s", r.limits.peak_gflop_per_s},
                     {"peak_int8_gop_per_s", r.limits.peak_int8_gop_per_s},
                     {"integer_matmul", r.integer_matmul},
                     {"gen_bandwidth_fraction", bw_frac},
                     {"prompt_flop_fraction", fl_frac},
                     {"peak_rss_bytes", r.peak_rss_bytes},
                     {"device", dev->name},
                     {"device_why", dev->why},
                     {"precision", dev->precision}});
    return 0;
  }
  std::printf("%s\n", device_line(dev.value()).c_str());
  std::printf("model    %s\n         %s, %.1fM params, %s; %.1f MB of weights read per token\n", r.model.path.c_str(),
              r.model.architecture.c_str(), r.model.n_params / 1e6, r.model.weight_types.c_str(), r.model.active_weight_bytes / 1e6);
  std::printf("machine  %d threads, %s; memory bandwidth %.1f GB/s, peak FMA %.1f GFLOP/s, int8 dot %.1f GOP/s (measured now)\n",
              r.limits.threads, r.limits.simd.c_str(), r.limits.mem_bandwidth_gb_per_s, r.limits.peak_gflop_per_s,
              r.limits.peak_int8_gop_per_s);
  std::printf("prompt   %4d tokens: %9.1f ± %.1f tokens/s  %7.1f G%s/s = %5.1f %% of the %s peak\n", r.prompt_tokens,
              r.prompt_tokens_per_s.mean, r.prompt_tokens_per_s.sd, r.prompt_gflop_per_s, r.integer_matmul ? "OP" : "FLOP",
              100 * fl_frac, r.integer_matmul ? "int8 dot" : "FMA");
  std::printf("generate %4d tokens: %9.1f ± %.1f tokens/s  %7.2f GB/s    = %5.1f %% of bandwidth\n", r.gen_tokens,
              r.gen_tokens_per_s.mean, r.gen_tokens_per_s.sd, r.gen_bandwidth_gb_per_s, 100 * bw_frac);
  if (r.peak_rss_bytes > 0) std::printf("memory   peak resident %.1f MB (from the load on)\n", r.peak_rss_bytes / 1e6);
  if (r.depth > 0) std::printf("(after %d tokens of context; %d repetitions after one warm-up)\n", r.depth, r.reps);
  else std::printf("(%d repetitions after one warm-up)\n", r.reps);
  return 0;
}
struct BenchServeOptions {
  std::string model, store;
  ServeBenchOptions bench;
  bool json = false;
  DeviceOptions device;
};

int run_bench_serve(const BenchServeOptions& o) {
  if (o.model.empty() == o.bench.synth.empty())
    return fail(Status::error(StatusCode::InvalidArgument, "bench serve needs -m MODEL or --synth PARAMS (one of them)"));
  // --synth: the reference it stands for, checked before any work; --type
  // fp8 is the fp8 policy (E4M3 matrices), which the device must run.
  std::string model = o.model, precision = o.device.precision;
  if (!o.bench.synth.empty()) {
    auto spec = parse_synth_model_ref("synth:" + o.bench.synth + ":" + o.bench.synth_type + ":seed=" + std::to_string(o.bench.synth_seed));
    if (!spec.ok()) return fail(spec.status());
    model = spec->canonical();
    if (spec->type == "fp8" && precision == "auto") precision = "fp8";
  }
  auto dev = select_device(o.device.device, precision, o.bench.kv_type);
  if (!dev.ok()) return fail(dev.status());
  if (!o.json) std::fprintf(stderr, "%s\n", device_line(dev.value()).c_str());
  Result<std::string> path = std::string();
  if (o.bench.synth.empty()) path = model_path(o.model, o.store);
  if (!path.ok()) return fail(path.status());
  ServeBenchOptions bo = o.bench;
  bo.device = o.device.device;
  bo.precision = precision;
  bo.gpu_memory_fraction = o.device.gpu_memory_fraction;
  auto res = bench_serve(path.value(), bo);
  if (!res.ok()) return fail(res.status());
  const auto& levels = res.value();
  const double single = levels.front().tokens_per_s, single_itl = levels.front().inter_token_ms.p99;
  const bool telemetry = std::any_of(levels.begin(), levels.end(), [](const ServeBenchLevel& l) { return l.device_busy_percent >= 0; });
  auto figures = [](const ServeBenchRound& r) {
    return nlohmann::json{{"tokens_per_s", r.tokens_per_s},
                          {"device_busy_percent", r.device_busy_percent >= 0 ? nlohmann::json(r.device_busy_percent) : nlohmann::json(nullptr)},
                          {"seconds", r.seconds},
                          {"mean_batch", r.mean_batch},
                          {"ttft_ms_p50", r.time_to_first_token_ms.p50},
                          {"ttft_ms_p99", r.time_to_first_token_ms.p99},
                          {"itl_ms_p50", r.inter_token_ms.p50},
                          {"itl_ms_p99", r.inter_token_ms.p99}};
  };
  auto p99_range = [](const ServeBenchLevel& l) {
    double lo = 1e300, hi = 0;
    for (const auto& r : l.rounds) lo = std::min(lo, r.inter_token_ms.p99), hi = std::max(hi, r.inter_token_ms.p99);
    return std::make_pair(lo, hi);
  };
  if (o.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& l : levels) {
      nlohmann::json j = figures(l);
      j["concurrency"] = l.concurrency;
      j["speedup_vs_first_level"] = single > 0 ? l.tokens_per_s / single : 0;
      j["bound_tokens_per_s"] = l.bound_tokens_per_s;
      j["bound_vs_first_level"] = single > 0 ? l.bound_tokens_per_s / single : 0;
      j["itl_p99_vs_first_level"] = single_itl > 0 ? l.inter_token_ms.p99 / single_itl : 0;
      j["rounds"] = nlohmann::json::array();
      for (const auto& r : l.rounds) j["rounds"].push_back(figures(r));
      arr.push_back(j);
    }
    print_json_line({{"model", model},
                     {"prompt_tokens", o.bench.prompt_tokens},
                     {"gen_tokens", o.bench.gen_tokens},
                     {"rounds", o.bench.rounds},
                     {"device", dev->name},
                     {"device_why", dev->why},
                     {"precision", dev->precision},
                     {"levels", arr}});
    return 0;
  }
  std::printf("model %s, %d prompt tokens and %d new tokens per request; each figure the median of %d rounds\n",
              model.c_str(), o.bench.prompt_tokens, o.bench.gen_tokens, o.bench.rounds);
  std::printf("%11s %11s %8s %10s %18s %18s %8s %16s %20s%s\n", "concurrency", "tokens/s", "x first", "mean batch", "TTFT p50/p99 ms",
              "ITL p50/p99 ms", "p99 x1st", "ITL p99 rounds", "ceiling tok/s (x first)", telemetry ? "  busy %" : "");
  for (const auto& l : levels) {
    const auto [lo, hi] = p99_range(l);
    char busy[32] = "";
    if (telemetry) std::snprintf(busy, sizeof busy, "  %6.1f", l.device_busy_percent);
    std::printf("%11d %11.1f %8.2f %10.1f %8.1f / %-8.1f %8.1f / %-8.1f %8.2f %7.1f - %-7.1f %11.0f (%.2f)%s\n", l.concurrency,
                l.tokens_per_s, single > 0 ? l.tokens_per_s / single : 0, l.mean_batch, l.time_to_first_token_ms.p50,
                l.time_to_first_token_ms.p99, l.inter_token_ms.p50, l.inter_token_ms.p99,
                single_itl > 0 ? l.inter_token_ms.p99 / single_itl : 0, lo, hi, l.bound_tokens_per_s,
                single > 0 ? l.bound_tokens_per_s / single : 0, busy);
  }
  std::printf("ceiling: each level's matrix products at this machine's peak dot rate measured in this run (int8 dots for\n"
              "integer weights, FMA otherwise; 0 on a GPU); (x first): its ratio to the first level's measured tokens/s;\n"
              "p99 x1st: the level's ITL p99 over the first level's (single-stream when the first level is 1)%s\n",
              telemetry ? ";\nbusy %: the GPU's utilisation (NVML) sampled every 100 ms through each round, averaged" : "");
  return 0;
}
}  // namespace

struct BenchImageOptions {
  std::string model, store;
  ImageBenchOptions bench;
  bool json = false;
};

int run_bench_image(const BenchImageOptions& o) {
  auto path = model_path(o.model, o.store);
  if (!path.ok()) return fail(path.status());
  auto res = bench_image(path.value(), o.bench);
  if (!res.ok()) return fail(res.status());
  const ImageBenchResult& r = res.value();
  const double peak = r.limits.peak_gflop_per_s;
  if (o.json) {
    print_json_line({{"model", o.model},
                     {"summary", r.model},
                     {"width", r.options.width},
                     {"height", r.options.height},
                     {"batch", r.options.batch},
                     {"unet_rows", r.unet_rows},
                     {"steps", r.options.steps},
                     {"unet_seconds_per_step", r.unet_seconds_per_step},
                     {"unet_gflop_per_step", r.unet_gflop_per_step},
                     {"unet_gflop_per_s", r.unet_gflop_per_s},
                     {"peak_gflop_per_s", peak},
                     {"fraction_of_peak", peak > 0 ? r.unet_gflop_per_s / peak : 0},
                     {"vae_decode_seconds", r.vae_decode_seconds},
                     {"text_encode_seconds", r.text_encode_seconds},
                     {"seconds_per_image", r.seconds_per_image},
                     {"images_per_s", r.images_per_s},
                     {"peak_rss_bytes", r.peak_rss_bytes},
                     {"threads", r.limits.threads},
                     {"simd", r.limits.simd}});
    return 0;
  }
  std::printf("model    %s\n         %s\n", o.model.c_str(), r.model.c_str());
  std::printf("machine  %d threads, %s; peak FMA %.1f GFLOP/s (measured now)\n", r.limits.threads, r.limits.simd.c_str(), peak);
  std::printf("unet     %dx%d, %d rows per call (batch %d%s): %.3f s per step, %.1f GFLOP -> %.1f GFLOP/s = %.1f %% of peak\n",
              r.options.width, r.options.height, r.unet_rows, r.options.batch, r.options.cfg ? ", CFG" : "",
              r.unet_seconds_per_step, r.unet_gflop_per_step, r.unet_gflop_per_s, peak > 0 ? 100 * r.unet_gflop_per_s / peak : 0);
  std::printf("vae      decode %.3f s per image; prompt encode %.3f s per chunk\n", r.vae_decode_seconds, r.text_encode_seconds);
  std::printf("image    %d steps: %.2f s per image, %.4f images/s\n", r.options.steps, r.seconds_per_image, r.images_per_s);
  if (r.peak_rss_bytes > 0) std::printf("memory   peak resident %.1f MB (from the load on)\n", r.peak_rss_bytes / 1e6);
  std::printf("(%d timed UNet calls after one warm-up)\n", r.options.reps);
  return 0;
}

struct BenchMixedOptions {
  std::string text_model, image_model, store;
  MixedBenchOptions bench;
  bool json = false;
};

int run_bench_mixed(const BenchMixedOptions& o) {
  auto text = model_path(o.text_model, o.store);
  if (!text.ok()) return fail(text.status());
  auto image = model_path(o.image_model, o.store);
  if (!image.ok()) return fail(image.status());
  auto res = bench_mixed(text.value(), image.value(), o.bench);
  if (!res.ok()) return fail(res.status());
  const MixedBenchResult& r = res.value();
  if (o.json) {
    print_json_line({{"text_model", o.text_model},
                     {"image_model", o.image_model},
                     {"width", o.bench.width},
                     {"height", o.bench.height},
                     {"steps", o.bench.steps},
                     {"text_jobs", o.bench.text_jobs},
                     {"gen_tokens", o.bench.gen_tokens},
                     {"image_nice", o.bench.image_nice},
                     {"text_jobs_during_image", r.text_jobs_during_image},
                     {"text_alone_ttft_ms_p50", r.text_alone_ttft_ms.p50},
                     {"text_alone_ttft_ms_p99", r.text_alone_ttft_ms.p99},
                     {"text_alone_itl_ms_p50", r.text_alone_itl_ms.p50},
                     {"text_alone_itl_ms_p99", r.text_alone_itl_ms.p99},
                     {"text_ttft_ms_p50", r.text_ttft_ms.p50},
                     {"text_ttft_ms_p99", r.text_ttft_ms.p99},
                     {"text_itl_ms_p50", r.text_itl_ms.p50},
                     {"text_itl_ms_p99", r.text_itl_ms.p99},
                     {"image_seconds_alone", r.image_seconds_alone},
                     {"image_seconds_alone_runs", r.image_seconds_alone_runs},
                     {"image_seconds_with_text", r.image_seconds_with_text},
                     {"image_slowdown", r.image_slowdown},
                     {"text_seconds_alone", r.text_seconds_alone},
                     {"image_slowdown_floor", r.image_slowdown_floor}});
    return 0;
  }
  std::printf("text  %s: %d interactive jobs of %d tokens, one after another\n", o.text_model.c_str(), o.bench.text_jobs,
              o.bench.gen_tokens);
  std::printf("image %s: %dx%d, %d steps (image lane nice %d)\n", o.image_model.c_str(), o.bench.width, o.bench.height,
              o.bench.steps, o.bench.image_nice);
  std::printf("text alone           TTFT p50/p99 %8.1f / %-8.1f ms   ITL p50/p99 %7.1f / %-7.1f ms\n", r.text_alone_ttft_ms.p50,
              r.text_alone_ttft_ms.p99, r.text_alone_itl_ms.p50, r.text_alone_itl_ms.p99);
  std::printf("text while rendering TTFT p50/p99 %8.1f / %-8.1f ms   ITL p50/p99 %7.1f / %-7.1f ms   (%d of %d jobs inside the render)\n",
              r.text_ttft_ms.p50, r.text_ttft_ms.p99, r.text_itl_ms.p50, r.text_itl_ms.p99, r.text_jobs_during_image,
              o.bench.text_jobs);
  std::printf("image alone %.2f s (before %.2f, after %.2f), with text %.2f s: %.3fx\n", r.image_seconds_alone,
              r.image_seconds_alone_runs.at(0), r.image_seconds_alone_runs.at(1), r.image_seconds_with_text, r.image_slowdown);
  std::printf("text's own work %.2f s alone: no schedule on these cores beats %.3fx (measured / floor %.3f)\n",
              r.text_seconds_alone, r.image_slowdown_floor, r.image_slowdown_floor > 0 ? r.image_slowdown / r.image_slowdown_floor : 0.0);
  return 0;
}

void add_bench_commands(CLI::App& root, int& exit_code) {
  CLI::App* bench = root.add_subcommand("bench", "Benchmarks, reported against this machine's measured limits");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchTextOptions>();
  CLI::App* text = bench->add_subcommand("text", "Prompt-processing and generation tokens/s of a text model");
  text->add_option("-m,--model", o->model, "Model: a store reference or a file (GGUF or llama2.c .bin)");
  text->add_option("--synth", o->bench.synth,
                   "Instead of -m: a random model of a synth preset's shapes made on the device, no file (8B: Llama 3.1 8B)");
  text->add_option("--type", o->bench.synth_type, "With --synth: the weights' type (bf16, f16, q8_0, q4_k_m, q4_0, q4_K, q6_K; fp8 on a GPU with FP8)")
      ->capture_default_str();
  text->add_option("--store", o->store, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  text->add_option("-p,--prompt-tokens", o->bench.prompt_tokens, "Prompt tokens processed in one batch")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  text->add_option("-n,--gen-tokens", o->bench.gen_tokens, "Tokens generated one at a time")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  text->add_option("-d,--depth", o->bench.depth, "Tokens already in the context before the prompt and before generation")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  text->add_option("--threads", o->bench.threads, "Threads (default: one per core)")->check(CLI::Range(1, 1024));
  text->add_option("--reps", o->bench.reps, "Measured repetitions")->check(CLI::Range(1, 1000))->capture_default_str();
  add_kv_type_option(*text, o->bench.kv_type);
  add_device_options(*text, o->device);
  text->add_flag("--json", o->json, "Print one JSON object");
  text->callback([o, &exit_code] { exit_code = run_bench_text(*o); });

  auto io = std::make_shared<BenchImageOptions>();
  CLI::App* img = bench->add_subcommand("image", "Seconds per UNet step and per image of a Stable Diffusion checkpoint, FLOP/s beside the peak");
  img->add_option("-m,--model", io->model, "Model: a store reference or a checkpoint (.safetensors, .ckpt, diffusers folder)")->required();
  img->add_option("--store", io->store, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  img->add_option("-W,--width", io->bench.width, "Width (multiple of 8)")->check(CLI::Range(8, 4096))->capture_default_str();
  img->add_option("-H,--height", io->bench.height, "Height (multiple of 8)")->check(CLI::Range(8, 4096))->capture_default_str();
  img->add_option("--steps", io->bench.steps, "Steps per image (for the per-image figures)")->check(CLI::Range(1, 1000))->capture_default_str();
  img->add_option("--batch", io->bench.batch, "Images per UNet call")->check(CLI::Range(1, 64))->capture_default_str();
  img->add_option("--reps", io->bench.reps, "Timed UNet calls")->check(CLI::Range(1, 1000))->capture_default_str();
  img->add_option("--threads", io->bench.threads, "Threads (default: one per core)")->check(CLI::Range(1, 1024));
  img->add_flag("!--no-cfg", io->bench.cfg, "One row per image (no classifier-free guidance)");
  img->add_flag("--json", io->json, "Print one JSON object");
  img->callback([io, &exit_code] { exit_code = run_bench_image(*io); });

  auto so = std::make_shared<BenchServeOptions>();
  CLI::App* serve = bench->add_subcommand("serve", "Aggregate tokens/s and latency percentiles of the engine under concurrent requests");
  serve->add_option("-m,--model", so->model, "Model: a store reference, a file or a synth:PARAMS[:TYPE][:seed=N] reference");
  serve->add_option("--synth", so->bench.synth,
                    "Instead of -m: a random model of a synth preset's shapes made on the engine's device, no file (8B: Llama 3.1 8B)");
  serve->add_option("--type", so->bench.synth_type, "With --synth: the weights' type (bf16, f16, f32, q8_0, q4_k_m, q4_0, q4_K, q6_K; fp8 on a GPU with FP8)")
      ->capture_default_str();
  serve->add_option("--synth-seed", so->bench.synth_seed, "With --synth: the weights' seed")->capture_default_str();
  serve->add_option("--store", so->store, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  // Parsed here, item by item: CLI11's delimiter drops an empty item ("1,,2" read as 1,2).
  serve->add_option_function<std::string>(
           "--concurrency",
           [so](const std::string& v) {
             std::vector<int> levels;
             size_t start = 0, item = 1;
             for (;; ++item) {
               const size_t end = std::min(v.find(',', start), v.size());
               const std::string x = v.substr(start, end - start);
               const bool whole = !x.empty() && x.size() <= 4 && x.find_first_not_of("0123456789") == std::string::npos;
               const int n = whole ? std::stoi(x) : 0;
               if (n < 1 || n > 4096)
                 throw CLI::ValidationError("--concurrency", "item " + std::to_string(item) + " of '" + v + "' is " +
                                                                (x.empty() ? std::string("empty") : "'" + x + "'") +
                                                                "; levels are whole numbers from 1 to 4096, comma-separated");
               levels.push_back(n);
               if (end == v.size()) break;
               start = end + 1;
             }
             so->bench.concurrency = levels;
           },
           "Concurrency levels, whole numbers from 1 to 4096, comma-separated (default: 1,4,16,32)")
      ->type_name("LIST");
  serve->add_option("-p,--prompt-tokens", so->bench.prompt_tokens, "Prompt tokens per request (random vocabulary words)")->check(CLI::Range(1, 4096))->capture_default_str();
  serve->add_option("-n,--gen-tokens", so->bench.gen_tokens, "New tokens per request")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  serve->add_option("--threads", so->bench.threads, "Threads (default: one per core)")->check(CLI::Range(1, 1024));
  serve->add_option("--max-batch", so->bench.max_batch, "Sequences decoded together per step (default: 256 on a GPU, 32 on the CPU)")->check(CLI::Range(1, 1024));
  serve->add_option("--prefill-tokens", so->bench.prefill_tokens_per_step, "Prompt tokens prefilled per step (default: 2048 on a GPU, 64 on the CPU)")->check(CLI::Range(1, 1 << 16));
  add_kv_type_option(*serve, so->bench.kv_type);
  add_device_options(*serve, so->device);
  serve->add_option("--rounds", so->bench.rounds, "Runs of each level; figures are the medians over them")->check(CLI::Range(1, 1000))->capture_default_str();
  serve->add_flag("--json", so->json, "Print one JSON object");
  serve->callback([so, &exit_code] { exit_code = run_bench_serve(*so); });

  auto mo = std::make_shared<BenchMixedOptions>();
  CLI::App* mixed = bench->add_subcommand("mixed", "Interactive text latency while an image renders, and the image's slowdown");
  mixed->add_option("-m,--model", mo->text_model, "Text model: a store reference or a file")->required();
  mixed->add_option("--image-model", mo->image_model, "Image model: a store reference or a Stable Diffusion checkpoint")->required();
  mixed->add_option("--store", mo->store, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  mixed->add_option("-W,--width", mo->bench.width, "Image width (multiple of 8)")->check(CLI::Range(8, 4096))->capture_default_str();
  mixed->add_option("-H,--height", mo->bench.height, "Image height (multiple of 8)")->check(CLI::Range(8, 4096))->capture_default_str();
  mixed->add_option("--steps", mo->bench.steps, "Image denoising steps")->check(CLI::Range(1, 1000))->capture_default_str();
  mixed->add_option("--text-jobs", mo->bench.text_jobs, "Interactive text jobs while the image renders")->check(CLI::Range(1, 1000))->capture_default_str();
  mixed->add_option("-n,--gen-tokens", mo->bench.gen_tokens, "New tokens per text job")->check(CLI::Range(2, 1 << 16))->capture_default_str();
  mixed->add_option("--text-start", mo->bench.text_start_s, "Seconds after the image started that text begins")->check(CLI::Range(0.0, 3600.0))->capture_default_str();
  mixed->add_option("--image-nice", mo->bench.image_nice, "How much lower the image lane's OS priority is (0: equal)")->check(CLI::Range(0, 19))->capture_default_str();
  mixed->add_option("--threads", mo->bench.threads, "Threads (default: one per core)")->check(CLI::Range(1, 1024));
  mixed->add_flag("--json", mo->json, "Print one JSON object");
  mixed->callback([mo, &exit_code] { exit_code = run_bench_mixed(*mo); });
}

}  // namespace atelier::app
