// atelier/requests.h — the plain request and result values: what a job asks
// for and what it gives back (text and image), and their JSON form
//
// Pure C++20, no Qt. Nothing here throws: every fallible call returns a
// Status or a Result whose message says what was wrong and what to do.
#pragma once

#include <atelier/status.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace atelier {

// ---------------------------------------------------------------- text

// Sampling, applied in llama.cpp's order: penalties, top-k, top-p, min-p,
// temperature, then a draw. temperature <= 0 is greedy (argmax).
struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;              // <= 0: off
  float top_p = 0.95f;         // >= 1: off
  float min_p = 0.05f;         // <= 0: off
  float repeat_penalty = 1.0f; // 1: off (CTRL-style: divide positive logits, multiply negative)
  int repeat_last_n = 64;      // window for all three penalties
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  static constexpr uint64_t kRandomSeed = UINT64_MAX;
  uint64_t seed = kRandomSeed;  // kRandomSeed: pick one (reported in the stats)
};

// The precision keys and values are cached in. Q8_0 (GGML's blocks, as
// llama.cpp's `-ctk q8_0 -ctv q8_0`) holds half of F16's bytes at a small
// cost in accuracy; it needs a head size that is a multiple of 32. F32 is
// the CPU's only; BF16 and FP8 a GPU's only: FP8 is OCP MXFP8 (E4M3 values
// in blocks of 32 with one shared power-of-two scale, 33 bytes per 32
// values: kernels::DType::MXFP8), also a head size that is a multiple of 32.
enum class KvType { F32, F16, Q8_0, BF16, FP8 };
// "f32", "f16", "q8_0", "bf16", "fp8"; kv_type_from_name returns false for any other name.
const char* kv_type_name(KvType t);
bool kv_type_from_name(const std::string& name, KvType* t);
// Bytes of `values` cached keys or values at type t (F32 4, F16/BF16 2, Q8_0
// 34 per 32, FP8 33 per 32): what memory admission and the studio's sizing count.
int64_t kv_type_bytes(KvType t, int64_t values);

struct TextRequest {
  std::string model;                // a store reference (NAME, NAME@V, NAME:CHANNEL, sha256:HEX) or a model file path; see resolve_model
  std::string prompt;
  int max_new_tokens = 128;         // 1..context
  SamplingParams sampling;
  std::vector<std::string> stop;    // generation ends before the first occurrence of any of these
  bool add_bos = true;              // when the vocabulary uses a BOS token
  bool parse_special = true;        // "<|eot_id|>" etc. in the prompt become their tokens
  bool ignore_eos = false;          // keep generating past end-of-sequence (benchmarks)
  // Structured output: a JSON Schema (type, properties, required,
  // additionalProperties, items, enum, const). Tokens are drawn only where
  // the text stays a prefix of one JSON value valid for it, and generation
  // ends ("stop") when the value is complete. "" = free text.
  std::string json_schema;
  // With json_schema: free text until the new text holds this trigger, then
  // one value valid for the schema, then free text again (the trigger may
  // come again) -- a tool call's arguments constrained once the call has
  // started. "" = the whole answer is the one value.
  std::string json_trigger;
  // Log-probabilities of the model's distribution (before penalties and
  // sampling filters) for each new token, and the top_logprobs (0..20) most
  // likely tokens at each position: TextResult::logprobs.
  bool logprobs = false;
  int top_logprobs = 0;
  // Queue placement (Engine only). Higher priority is admitted first; an
  // interactive job counts kInteractiveBoost above its priority and has a latency target.
  int priority = 0;
  bool interactive = false;
  static constexpr int kInteractiveBoost = 100;
};

// The JSON form of a request: the job database stores it, `atelier batch`
// reads one per line. Keys: model, prompt, max_new_tokens, stop, add_bos,
// parse_special, ignore_eos, json_schema, json_trigger, logprobs, top_logprobs, priority, interactive, and sampling{temperature, top_k,
// top_p, min_p, repeat_penalty, repeat_last_n, frequency_penalty,
// presence_penalty, seed}; all but model and prompt optional. Unknown keys are
// refused (a typo should not silently fall back to a default).
std::string request_to_json(const TextRequest& request);
Result<TextRequest> request_from_json(std::string_view json);

// One sampled token. `text` is what a display may show now: the token's
// bytes, minus anything held back because it may start a stop string or is
// an incomplete UTF-8 sequence (released with a later token). Concatenating
// every event's `text` gives a prefix of the result text; whatever was still
// held back when generation ended is the rest of TextResult::text.
struct TokenEvent {
  int index = 0;       // 0-based among new tokens
  int32_t id = 0;
  std::string piece;   // this token's own bytes (may be a partial UTF-8 sequence)
  std::string text;
};

struct TextStats {
  int prompt_tokens = 0;
  double prompt_ms = 0;
  double prompt_tokens_per_s = 0;
  int new_tokens = 0;
  double gen_ms = 0;
  double new_tokens_per_s = 0;
  std::string stop_reason;  // "eos", "length", "stop", "context", "cancelled"
  uint64_t seed = 0;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;                               // natural log of its probability
  std::vector<std::pair<int32_t, float>> top;      // the most likely tokens there and their logprobs, best first
};

struct TextResult {
  std::string text;                 // the new text (stop string excluded)
  std::vector<int32_t> prompt_ids;  // including BOS
  std::vector<int32_t> ids;         // new tokens
  TextStats stats;
  std::vector<TokenLogprob> logprobs;  // one per new token when the request asked for logprobs
};

// ---------------------------------------------------------------- image requests

// One image job. width and height: multiples of 8 in 8..4096 (the init image
// and mask are resized to them); batch_count 1..100 rounds of batch_size 1..16
// images denoised together; image i uses seed + i. seed kRandomSeed: one is
// picked (reported in ImageResult::seed).
//
// Stable Diffusion 1.x/2.x checkpoints (single .safetensors/.ckpt file or a
// diffusers folder) run the whole pipeline: CLIP prompt (A1111 emphasis and
// 75-token chunks), negative prompt and CFG, the sampler on discrete or Karras
// sigmas, torch-compatible initial noise (rng "cuda": Philox as on a GPU,
// "cpu": mt19937), img2img (init_image, strength) and inpainting (mask,
// white = repaint). The QuickDraw CVAE is a one-pass decoder: steps, cfg,
// sampler and negative prompt are recorded but unused, and its z comes from
// torch's CPU generator whatever rng says.
struct ImageRequest {
  std::string model;                 // a store reference or a model file path (see resolve_model)
  std::string prompt;
  std::string negative_prompt;
  int width = 512, height = 512;
  int steps = 20;
  float cfg_scale = 7.0f;
  std::string sampler = "euler_a";   // euler, euler_a, heun, dpmpp_2m, ddim, lcm (A1111 names too)
  std::string scheduler = "discrete";  // sigma schedule: discrete or karras (DDIM and LCM use their own)
  uint64_t seed = SamplingParams::kRandomSeed;
  std::string rng = "cuda";          // "cuda" (torch's Philox) or "cpu" (torch's mt19937)
  int batch_count = 1;
  int batch_size = 1;
  std::string init_image;            // img2img: a picture file
  float strength = 0.75f;            // img2img: denoising strength in (0, 1]
  std::string mask;                  // inpainting (with init_image): a picture, white = repaint
  std::string tokenizer;             // SD: CLIP's bpe_simple_vocab_16e6.txt.gz ("" = the store's, else beside the model)
  std::string preview_decoder;       // SD: a TAESD decoder file for previews ("" = linear latent-to-RGB)
  std::string prediction = "auto";   // SD: auto, eps or v (v for SD 2.x 768-v checkpoints)
  int threads = 0;                   // 0: one per core (generate_image; the engine uses its own pool)
  // Through the engine's queue:
  std::string output;                // PNG path ("" = DATA_DIR/images/job-ID.png); a batch writes -1.png ... -N.png
  int priority = 0;
  bool interactive = false;
};
// What an image request will cost on the device that runs it (the CPU:
// this machine's memory, or the process's ulimit -v / -d), from the model's
// shapes, without running it. Engine::submit refuses a request that does not
// fit (the same rule generate_image applies before any work); a warning says
// when it would take unusually long.
struct ImageEstimate {
  int64_t weight_bytes = 0;      // the model's weights, loaded
  int64_t working_bytes = 0;     // workspaces (classifier-free guidance: 2 x batch_size UNet rows), latents, the picture
  int64_t limit_bytes = 0;       // what the device offers (0: unknown)
  std::string limit_source;      // "this machine has", "this process may use (ulimit -v)"
  bool fits = true;
  int fit_width = 0, fit_height = 0;  // !fits: the largest size of the same shape that fits (0 x 0: none)
  double unet_flops = 0;         // every UNet evaluation of the request
  double seconds = 0;            // the whole request here, estimated from unet_flops and this machine's measured FMA peak (0: not estimated)
  std::string message;           // !fits: why, with the numbers and the size that fits
  std::string warning;           // set when it would take unusually long (kImageWarnSeconds)
};
inline constexpr double kImageWarnSeconds = 15 * 60;
// The JSON form ("kind": "image" plus the fields above), for the job database and batch files.
std::string image_request_to_json(const ImageRequest& request);
Result<ImageRequest> image_request_from_json(std::string_view json);
// True when a JSON request says "kind": "image".
bool is_image_request_json(std::string_view json);

struct ImageResult {
  int width = 0, height = 0, channels = 0;  // channels: 1 grey, 3 RGB
  std::vector<uint8_t> pixels;              // row-major, interleaved
  uint64_t seed = 0;
  std::string parameters;                   // AUTOMATIC1111's "parameters" text
};

// Reported after every denoising step of every image (and once per image for
// one-pass models), with a small RGB preview of the current estimate.
struct ImageProgress {
  int image = 0, images = 1;         // 0-based index of the image, of how many
  int step = 0, steps = 1;           // steps done of this image
  double seconds = 0;                // since generation started
  int preview_width = 0, preview_height = 0;
  std::vector<uint8_t> preview_rgb;  // interleaved RGB; empty for one-pass models
};
// Return false to cancel: generation stops before the next network call and
// generate_image returns Cancelled.
using ImageProgressFn = std::function<bool(const ImageProgress&)>;

}  // namespace atelier
