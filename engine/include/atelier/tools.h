// atelier/tools.h — headless tools: benchmarks, synthetic models, model
// discovery
//
// Pure C++20, no Qt. Nothing here throws: every fallible call returns a
// Status or a Result whose message says what was wrong and what to do.
#pragma once

#include <atelier/engine.h>
#include <atelier/models.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace atelier {

// ---------------------------------------------------------------- benchmarks

struct MachineLimits {
  double mem_bandwidth_gb_per_s = 0;  // streaming read, all threads
  double peak_gflop_per_s = 0;        // fp32 FMA at the active SIMD level, all threads
  double peak_int8_gop_per_s = 0;     // int8 dot instruction (VNNI dpbusd on avx512), all threads
  int threads = 0;
  std::string simd;                   // "avx512", "avx2", "scalar"
};
MachineLimits measure_machine_limits(int threads);

struct TextBenchOptions {
  int prompt_tokens = 128;
  int gen_tokens = 64;
  int depth = 0;  // tokens already in the context before the prompt and before generation (llama-bench -d)
  int reps = 3;
  int threads = 0;
  KvType kv_type = KvType::F16;
  std::string device = "cpu";  // a name select_device() returned: where the weights, KV and steps live
  std::string precision = "auto";  // --precision on a GPU (TextModelOptions::precision)
  // Non-empty: no file; a synth preset ("8B": Llama 3.1 8B's shapes) made on
  // the device with random weights of synth_type (bf16, q8_0, q4_k_m, ...).
  std::string synth, synth_type = "bf16";
  uint64_t synth_seed = 1;
};

struct MeanSd {
  double mean = 0, sd = 0;
};

struct TextBenchResult {
  ModelInfo model;
  MachineLimits limits;
  int prompt_tokens = 0, gen_tokens = 0, reps = 0, depth = 0;
  MeanSd prompt_tokens_per_s, gen_tokens_per_s;
  double gen_bandwidth_gb_per_s = 0;  // weight bytes per token x tokens/s
  double prompt_gflop_per_s = 0;      // 2 x params x prompt tokens/s
  // The layers' matmuls run on int8 dot instructions (quantized weights):
  // prompt_gflop_per_s then compares with limits.peak_int8_gop_per_s, not
  // the fp32 FMA peak.
  bool integer_matmul = false;
  // The process's peak resident memory (Linux VmHWM) from the model load to
  // the end of the runs: weights, KV, activations (the machine measurements
  // run before and are not counted where /proc/self/clear_refs resets the
  // mark). 0 where the system does not say.
  int64_t peak_rss_bytes = 0;
};
Result<TextBenchResult> bench_text(const std::string& model_path, const TextBenchOptions& options);

// `atelier bench serve`: the engine under concurrent load. One engine (the
// model loaded and warmed up first); at each concurrency level that many
// requests are queued at once, and aggregate generated tokens/s and the
// engine's own latency percentiles (time to first token counted from
// submission) are reported.
struct ServeBenchOptions {
  std::vector<int> concurrency = {1, 4, 16, 32};
  int prefill_tokens_per_step = EngineConfig{}.prefill_tokens_per_step;
  int prompt_tokens = 32;  // per request, BOS included: random vocabulary words until the tokenizer counts this many (or one more word)
  int gen_tokens = 64;     // per request (end-of-sequence ignored)
  int threads = 0;
  int max_batch = 0;  // 0: the device's default (EngineConfig)
  KvType kv_type = KvType::F16;
  std::string device = "auto";     // EngineConfig::devices
  std::string precision = "auto";  // EngineConfig::precision
  double gpu_memory_fraction = 0.9;
  // Each level is run this many times, its requests arriving together each
  // time; a level's figures are the medians over its rounds. One round of 64
  // tokens holds 63 inter-token gaps per stream, so its P99 is nearly its
  // largest gap, and one slow moment of a shared machine moves it.
  int rounds = 3;
  // Non-empty: no model file; the synthetic model synth:SYNTH:SYNTH_TYPE:seed=SYNTH_SEED
  // (atelier/models.h SynthModelRef, made on the engine's device at load),
  // its prompts of exactly prompt_tokens tokens. model_path must then be "".
  std::string synth, synth_type = "bf16";
  uint64_t synth_seed = 1;
};

struct ServeBenchRound {
  double tokens_per_s = 0;  // generated tokens / wall time, all requests
  double seconds = 0;
  Percentiles time_to_first_token_ms, inter_token_ms;
  double mean_batch = 0;    // mean sequences decoded per step
  // The device's own utilisation (Device::telemetry: NVML's share of time a
  // kernel ran) sampled every 100 ms through the round, averaged; -1 where
  // the device reports none (the CPU).
  double device_busy_percent = -1;
};

// The medians over the level's rounds, and each round.
struct ServeBenchLevel : ServeBenchRound {
  int concurrency = 0;
  // What this machine allows at this level, from the limits measured at the
  // start of the run: every token's matrix products at the peak dot rate (an
  // upper bound: attention, sampling and memory are taken as free). 0 when
  // the engine runs on a GPU (the CPU's peak says nothing of it).
  double bound_tokens_per_s = 0;
  std::vector<ServeBenchRound> rounds;
};

// MODEL_PATH: a file or any reference resolve_model takes (synth:... too), or "" with options.synth.
Result<std::vector<ServeBenchLevel>> bench_serve(const std::string& model_path, const ServeBenchOptions& options);

// `atelier bench image`: a Stable Diffusion checkpoint's UNet step time at a
// size and batch, beside this machine's peak FMA rate measured in the same
// run, plus the VAE decode and prompt encode, and what that makes per image.
struct ImageBenchOptions {
  int width = 512, height = 512;  // pixels, multiples of 8
  int steps = 20;                 // for the per-image figures
  int batch = 1;                  // images per UNet call (each image 2 rows with CFG)
  bool cfg = true;
  int reps = 2;                   // timed UNet calls after one warm-up
  int threads = 0;
};
struct ImageBenchResult {
  std::string model;              // what the checkpoint is ("SD 1.x, UNet 320 ch, ...")
  MachineLimits limits;
  ImageBenchOptions options;
  int unet_rows = 0;              // samples per UNet call (batch, x2 with CFG)
  double unet_seconds_per_step = 0;
  double unet_gflop_per_step = 0;  // analytic: convolutions, linear layers, attention products
  double unet_gflop_per_s = 0;
  double vae_decode_seconds = 0;   // one image
  double text_encode_seconds = 0;  // one 77-token chunk
  double seconds_per_image = 0;    // steps UNet calls / batch + decode + the prompt (and negative) encode
  double images_per_s = 0;
  int64_t peak_rss_bytes = 0;      // as TextBenchResult's: from the load through the UNet, encode and decode runs
};
Result<ImageBenchResult> bench_image(const std::string& model_path, const ImageBenchOptions& options);

// `atelier bench mixed`: interactive text while a Stable Diffusion image
// renders on the same engine. After a warm-up (both models loaded), it runs
// the text jobs alone, the image alone, the image again with the text jobs
// submitted one after another from text_start_s after the image started
// (each interactive, end-of-sequence ignored), and the image alone once more.
// Text figures are the engine's own (time to first token from submission,
// inter-token gaps at sampling); image seconds are from its start to its PNG.
struct MixedBenchOptions {
  int width = 512, height = 512;  // the image, multiples of 8
  int steps = 4;                  // its denoising steps (euler_a, CFG 7: two UNet rows a step)
  int text_jobs = 3;              // interactive text jobs while the image renders, one after another
  int gen_tokens = 64;            // new tokens per text job
  double text_start_s = 2.0;      // after the image job started (its prompt encoded, the UNet running)
  int threads = 0;
  int image_nice = EngineConfig{}.image_nice;
};
struct MixedBenchResult {
  Percentiles text_alone_ttft_ms, text_alone_itl_ms;  // the text jobs with nothing else running
  Percentiles text_ttft_ms, text_itl_ms;              // the same jobs while the image renders
  int text_jobs_during_image = 0;                     // text jobs that finished before the image did
  double image_seconds_alone = 0, image_seconds_with_text = 0;  // alone: the mean of the runs before and after
  std::vector<double> image_seconds_alone_runs;
  double image_slowdown = 0;                          // with text / alone
  // The text jobs' own work: their wall time alone, on every core. A machine
  // whose cores are all busy with the image must find that time somewhere,
  // so (image alone + this share) / image alone is the least slowdown any
  // schedule can give; image_slowdown / image_slowdown_floor is the rest.
  double text_seconds_alone = 0;
  double image_slowdown_floor = 0;
};
Result<MixedBenchResult> bench_mixed(const std::string& text_model_path, const std::string& image_model_path,
                                     const MixedBenchOptions& options);

// ---------------------------------------------------------------- synthetic models

struct SynthTextSpec {
  std::string arch = "llama";   // llama, qwen3, gemma3, phi3, mixtral, qwen3moe, gpt-oss (synth_text_archs)
  std::string params = "110M";  // 260K, 15M, 42M, 110M, 1B (llama2.c / TinyLlama shapes)
  std::string type = "q8_0";    // f32, f16, bf16, q8_0, q4_0, q4_K, q6_K
  uint64_t seed = 1;
  std::string chat_template;    // written as tokenizer.chat_template when not empty
  // Further control tokens (a chat format's markers, e.g. gpt-oss's <|channel|>),
  // after the byte tokens, so that a template's markers are single tokens.
  std::vector<std::string> special_tokens;
};
// Writes a GGUF of spec.arch's tensor layout, names and keys (as llama.cpp
// reads them) with deterministic random weights: the same spec, the same bytes.
Status synth_text_model(const SynthTextSpec& spec, const std::string& out_path);
std::vector<std::string> synth_text_archs();
std::vector<std::string> synth_param_presets();

// A Stable Diffusion-shaped single-file checkpoint (.safetensors, original
// layout) with deterministic random weights: SD 1.5 (OpenAI CLIP) or SD 2.1
// (OpenCLIP, v-prediction); full size (about 1.07B parameters for sd15) or
// narrowed by width_mult (channels rounded to multiples of 32, the group
// norms' groups). unet_heads 0: the architecture's rule (SD1: 8 heads, SD2:
// 64-wide heads). InvalidArgument on a bad value; Io on a write failure.
struct SynthImageSpec {
  std::string arch = "sd15";  // sd15, sd21
  double width_mult = 1.0;    // (0, 1]
  int unet_heads = 0;
  std::string type = "f16";   // f32, f16, bf16
  uint64_t seed = 1;
};
Status synth_image_model(const SynthImageSpec& spec, const std::string& out_path);

// ---------------------------------------------------------------- quantization

// How well a candidate model (e.g. a quantized one) reproduces a reference
// model on a text, teacher-forced: both read the same tokens, and every
// position's next-token distributions are compared.
struct QualityReport {
  std::string text;            // what was read ("the built-in TinyStories-style text" or the file)
  int tokens = 0;              // tokens read (BOS included)
  int positions = 0;           // next-token predictions scored (tokens - 1)
  double perplexity_reference = 0, perplexity_candidate = 0;
  double mean_kl = 0, max_kl = 0;  // KL(reference || candidate), nats per position
  double top1_agreement = 0;   // fraction of positions whose most likely token agrees
};

// Loads both text models and compares them on TEXT_PATH ("" = a built-in
// TinyStories-style text, the kind stories260K was trained on). At most
// max_tokens tokens are read (also capped by the smaller model's training
// context). The vocabularies must agree. NotFound / InvalidArgument / the
// loader's errors.
// Where each model runs (`models compare --device/--precision`): device
// names select_device() returned ("cpu", "cuda:0") and --precision names
// (auto, bf16, fp16, fp8), so fp8's cost against BF16 on one GPU is
// `--device cuda:0 --reference-precision bf16 --precision fp8` on one file.
struct CompareDevices {
  std::string device = "cpu", precision = "auto";  // the candidate's
  std::string reference_device;                    // "" = device
  std::string reference_precision = "auto";
};
Result<QualityReport> compare_text_models(const std::string& reference_path, const std::string& candidate_path,
                                          const std::string& text_path = "", int max_tokens = 512, int threads = 0,
                                          const CompareDevices& on = {});

// `atelier models quantize`: a new store version from an F32/F16/BF16 GGUF.
struct QuantizeSpec {
  std::string type;           // a weight type (quantize_types()) for every matrix, or
  std::string recipe;         // a recipe (quantize_recipes()): exactly one of the two
  std::string name;           // the new version's model ("" = the source's own)
  std::string text_path;      // the quality report's text ("" = built-in)
  int max_tokens = 512;       // tokens of the quality report's text
  bool quality = true;        // false: write and install only
  std::string store_dir;      // "" = default_store_dir()
  int threads = 0;
  std::function<void(const std::string&)> on_note;  // progress lines for people
};

struct QuantizedTensor {
  std::string name, type;     // the type written
  std::string wanted;         // what the recipe asked for, when a fallback changed it ("" otherwise)
  int64_t cols = 0, rows = 0, bytes = 0;
};

struct QuantizeResult {
  std::string model;          // the new version: model@version
  int version = 0;
  std::string digest;         // "sha256:..." of the written file
  std::string source;         // source model@version (or path)
  std::string source_digest;
  std::string recipe;         // the type or recipe name
  std::string tool;           // "atelier 0.1.0 (git ...)"
  int64_t file_bytes = 0, source_file_bytes = 0;
  // Weight bytes read per generated token (every layer matrix and the output
  // matrix; one embedding row is negligible).
  int64_t bytes_per_token = 0, source_bytes_per_token = 0;
  std::vector<QuantizedTensor> tensors;
  std::vector<std::string> fallbacks;  // one line per tensor whose row width forced a wider type
  bool has_quality = false;
  QualityReport quality;
};

std::vector<std::string> quantize_types();    // "f32", "f16", "bf16", "q8_0", ... every type matmul runs
std::vector<std::string> quantize_recipes();  // "q4_k_m", "mixed"
// InvalidArgument: bad type/recipe, a source that is not an F32/F16/BF16
// text GGUF; NotFound: REF; Io: writing or installing.
Result<QuantizeResult> quantize_model(const std::string& ref, const QuantizeSpec& spec);

// ---------------------------------------------------------------- model discovery

struct ModelFile {
  std::string path;
  std::string kind;    // "text" or "image" (format "unknown": by its name, and the summary says why it cannot load)
  std::string format;  // "gguf", "llama2c", "safetensors", "pytorch", "diffusers" (from the content), "unknown"
  int64_t bytes = 0;
  std::string summary;  // "llama, 64-dim, 5 layers, vocab 512" or the reason it cannot load
};
// Lists the model files directly inside the given folders (missing folders are skipped).
std::vector<ModelFile> scan_model_folders(const std::vector<std::string>& folders);
// One file (or diffusers folder) as scan_model_folders describes it, headers
// only: NotFound, InvalidArgument when it is no model file, InvalidModel
// (with the reason) when it is one that cannot load.
Result<ModelFile> inspect_model_file(const std::string& path);

}  // namespace atelier
