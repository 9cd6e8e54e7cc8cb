// atelier/engine.h — the one public header of the engine.
//
// Plain request and result values, a TextModel handle, and the headless
// utilities the command line and the window share. Pure C++20, no Qt.
// Nothing here throws: every fallible call returns a Status or a Result whose
// message says what was wrong and what to do.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace atelier {

// ---------------------------------------------------------------- status

enum class StatusCode {
  Ok = 0,
  InvalidArgument,  // a request value is out of range; nothing was done
  NotFound,         // a file or model does not exist
  InvalidModel,     // a model file is truncated, corrupt or inconsistent
  Unsupported,      // a valid file using something we do not implement (architecture, type)
  Io,               // reading or writing failed (disk full, permissions)
  Internal,         // a bug: please report it
  Cancelled,        // the caller cancelled the work (e.g. a progress callback said stop)
};

// "ok", "invalid_argument", "not_found", "invalid_model", "unsupported", "io",
// "internal", "cancelled": what the job database records as a failed job's error_code.
std::string_view status_code_name(StatusCode code);

struct Status {
  StatusCode code = StatusCode::Ok;
  std::string message;
  bool ok() const { return code == StatusCode::Ok; }
  static Status error(StatusCode c, std::string m) { return {c, std::move(m)}; }
};

template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

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

enum class KvType { F32, F16 };

struct TextModelOptions {
  int threads = 0;                  // 0: one per hardware thread
  KvType kv_type = KvType::F16;
  int context_tokens = 0;           // 0: the model's training context, capped at 4096
  std::string tokenizer_path;       // llama2.c .bin models: tokenizer.bin (default: tokenizer.bin / tok512.bin beside the model)
};

struct TextRequest {
  std::string model;                // a store reference (NAME, NAME@V, NAME:CHANNEL, sha256:HEX) or a model file path; see resolve_model
  std::string prompt;
  int max_new_tokens = 128;         // 1..context
  SamplingParams sampling;
  std::vector<std::string> stop;    // generation ends before the first occurrence of any of these
  bool add_bos = true;              // when the vocabulary uses a BOS token
  bool parse_special = true;        // "<|eot_id|>" etc. in the prompt become their tokens
  bool ignore_eos = false;          // keep generating past end-of-sequence (benchmarks)
  // Queue placement (Engine only). Higher priority is admitted first; an
  // interactive job counts kInteractiveBoost above its priority and has a latency target.
  int priority = 0;
  bool interactive = false;
  static constexpr int kInteractiveBoost = 100;
};

// The JSON form of a request: the job database stores it, `atelier batch`
// reads one per line. Keys: model, prompt, max_new_tokens, stop, add_bos,
// parse_special, ignore_eos, priority, interactive, and sampling{temperature, top_k,
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

struct TextResult {
  std::string text;                 // the new text (stop string excluded)
  std::vector<int32_t> prompt_ids;  // including BOS
  std::vector<int32_t> ids;         // new tokens
  TextStats stats;
};

struct ModelInfo {
  std::string path;
  std::string format;        // "gguf", "llama2c"
  std::string architecture;  // "llama"
  std::string name;
  std::string tokenizer;     // "llama", "gpt2", "bert"
  std::string weight_types;  // e.g. "q8_0 (85), f32 (25)"
  int64_t n_params = 0;
  int64_t weight_bytes = 0;  // bytes of every matrix read once per generated token
  int n_vocab = 0, n_ctx_train = 0, n_embd = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, n_ff = 0;
  std::string chat_template;        // GGUF tokenizer.chat_template ("" when the model has none)
  std::string bos_token, eos_token; // the texts of the BOS and EOS tokens ("" when the vocabulary has none)
};

// ---------------------------------------------------------------- chat templates

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", ...
  std::string content;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;  // variables the template sees
  std::vector<std::pair<std::string, std::string>> variables;  // further string variables (NAME=VALUE)
};

// Renders a Jinja chat template as Hugging Face's apply_chat_template does
// (trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now,
// tojson). MESSAGES_JSON: a JSON array of message objects (role, content and
// whatever else templates read: tool_calls, name ...). InvalidArgument with
// "chat template error at line N: ..." on a template error or a
// raise_exception, or when the messages are not a JSON array.
Result<std::string> render_chat_template(const std::string& template_text, const std::string& messages_json,
                                         const ChatTemplateOptions& options = {});
Result<std::string> render_chat_template(const std::string& template_text, const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options = {});

// The prompt a chat model continues: its own template (with its BOS/EOS texts)
// when it has one, else the plain format, one block per message:
//   "System: <content>\n\n" for system messages, "User: <content>\n" and
//   "Assistant: <content>\n" for the others, then "Assistant:" when
//   add_generation_prompt (stop generation at "\nUser:").
Result<std::string> format_chat_prompt(const ModelInfo& model, const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt = true);

class TextModel {
 public:
  // Loads a GGUF or llama2.c model. InvalidModel/Unsupported/NotFound with a clear message otherwise.
  static Result<std::shared_ptr<TextModel>> open(const std::string& path, const TextModelOptions& options = {});
  ~TextModel();
  TextModel(const TextModel&) = delete;
  TextModel& operator=(const TextModel&) = delete;

  const ModelInfo& info() const;
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_bos, bool parse_special) const;
  std::string token_piece(int32_t id) const;

  // Runs one request to completion on the calling thread. on_token is called
  // for every sampled token; returning false cancels (stop_reason "cancelled").
  Result<TextResult> generate(const TextRequest& request,
                              const std::function<bool(const TokenEvent&)>& on_token = {});

  struct Impl;
  Impl& impl() { return *impl_; }  // engine-internal (defined in engine/src)

 private:
  explicit TextModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A tokenizer on its own: from a GGUF (weights not needed, so vocabulary-only
// files work), a Hugging Face tokenizer.json, or a llama2.c tokenizer.bin.
class Vocabulary {
 public:
  static Result<std::shared_ptr<Vocabulary>> open(const std::string& path);
  ~Vocabulary();
  Vocabulary(const Vocabulary&) = delete;
  Vocabulary& operator=(const Vocabulary&) = delete;

  std::string model() const;  // "llama", "gpt2", "bert"
  int n_vocab() const;
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_bos, bool parse_special) const;
  std::string token_piece(int32_t id) const;

  struct Impl;

 private:
  explicit Vocabulary(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
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

// ---------------------------------------------------------------- the engine: durable queue + batching scheduler

using JobId = int64_t;
enum class JobState { Queued, Running, Completed, Failed, Cancelled };
std::string_view job_state_name(JobState state);  // "queued", "running", ...

struct EngineConfig {
  std::string data_dir;               // holds jobs.db (SQLite, WAL); created if missing
  std::string store_dir;              // the model store requests' model references resolve in ("" = default_store_dir())
  std::vector<std::string> devices = {"cpu"};  // one executor per device; "cpu" until the CUDA backend lands
  int threads = 0;                    // 0: one per core
  int max_batch = 32;                 // sequences decoded together per step
  int max_wait_ms = 100;              // dynamic batching window from idle (adapted to load)
  int64_t kv_memory_bytes = int64_t{1} << 30;  // KV cache budget per loaded model
  // Loaded models (text: weights and KV pool; image: the checkpoint's
  // networks) stay loaded for the next job until their bytes would pass this;
  // then the least recently used ones no job is using are unloaded first. A
  // model in use is never unloaded; one larger than the budget still loads.
  int64_t model_cache_bytes = int64_t{8} << 30;
  int kv_block_tokens = 16;           // paged KV block size
  int prefill_tokens_per_step = 64;   // prompt tokens prefilled per step, so decoding stays responsive
  int max_image_batch = 8;            // images denoised together per image step (each CFG image is 2 network rows)
  // Image steps run on their own thread and thread pool, this much lower in
  // OS priority (Linux nice) than text steps: text keeps streaming while an
  // image renders, and an image alone still uses every core. 0: equal. 4:
  // a text thread weighs 2.4 image threads; higher values favour text more
  // but also starve images behind the session's other busy programs.
  int image_nice = 4;
  KvType kv_type = KvType::F16;
  double interactive_p99_itl_ms = 1000;  // latency target for interactive jobs
  int aging_ms = 2000;                // a waiting job gains one priority point per aging_ms
  bool execute = true;                // false: only read and write the queue (another process runs it)
  int poll_ms = 200;                  // how often the runner looks for jobs other processes queued
};

struct JobStats {
  double queue_wait_ms = 0, time_to_first_token_ms = 0, total_ms = 0, tokens_per_s = 0;
  int prompt_tokens = 0, new_tokens = 0, cached_prompt_tokens = 0;
};

struct JobInfo {
  JobId id = 0;
  JobState state = JobState::Queued;
  std::string kind = "text";  // "text" or "image"
  TextRequest request;        // text jobs
  ImageRequest image_request; // image jobs
  std::vector<std::string> files;  // completed image jobs: the PNGs written
  int priority = 0;
  int64_t created_ms = 0, started_ms = 0, finished_ms = 0;  // unix epoch ms, 0 = not yet
  uint64_t seed = 0;
  std::string model_version;  // what produced the result: "sha256:<64 hex>" of the model file
  std::string model_name;     // the same, for people: "stories260k@1", or the file path for a plain file
  int attempts = 0;
  std::string text;           // the result (completed jobs)
  std::string stop_reason;
  JobStats stats;             // final figures; while running, new_tokens is live progress
  std::string error;          // failed jobs
  std::string error_code;     // failed jobs: status_code_name of the failure ("not_found", ...)
};

struct JobFilter {
  std::optional<JobState> state;
  int limit = 1000;
  bool newest_first = false;
};

enum class EventType { Queued, Started, Token, Segment, Progress, Preview, Completed, Failed, Cancelled, Alert };
std::string_view event_type_name(EventType type);

// One event. Per job, events arrive in order: Queued, Started, Token/Segment/
// Progress..., then exactly one of Completed, Failed, Cancelled. Alerts have job 0.
struct Event {
  EventType type = EventType::Queued;
  JobId job = 0;
  int index = 0;              // Token: index among new tokens; Token events merged under backpressure carry the last index
  int32_t token_id = 0;
  std::string text;           // Token: displayable text (see TokenEvent); Segment: a finished sentence or paragraph
  double progress = 0;        // Progress: new tokens / max_new_tokens (images: steps done / all steps)
  ImageProgress image;        // Preview (image jobs, after every denoising step; coalesced per job under backpressure)
  std::vector<std::string> files;  // Completed image jobs: the PNGs written
  TextResult result;          // Completed
  JobStats stats;             // Completed, Failed, Cancelled
  StatusCode code = StatusCode::Ok;  // Failed
  std::string message;        // Failed, Alert
};
using EventSink = std::function<void(const Event&)>;

struct Percentiles {
  double p50 = 0, p99 = 0;
};

struct EngineMetrics {
  double tokens_per_s = 0;              // generated tokens/s over the last 10 s
  double recent_tokens_per_s = 0;       // same, averaged over the last minute (for the alert)
  Percentiles time_to_first_token_ms, inter_token_ms;
  std::vector<int64_t> batch_size_histogram;  // [k] = steps that decoded k sequences (k = 0..max_batch)
  int queue_depth = 0, running = 0;
  int64_t completed = 0, failed = 0, cancelled = 0;
  int64_t preemptions = 0;              // sequences whose KV memory was taken back (recomputed later)
  int kv_blocks_used = 0, kv_blocks_free = 0, kv_blocks_cached = 0;
  double prefix_cache_hit_rate = 0;     // prompt tokens served from shared blocks / prompt tokens
  double busy_fraction = 0;             // executor time spent in model steps over the last 10 s
  int64_t image_steps = 0;              // image-lane steps (one network evaluation of every image it advanced)
  Percentiles image_step_ms;            // their durations
  std::vector<std::string> active_alerts;
};

struct AlertRules {
  double throughput_drop_fraction = 0.20;  // tokens/s below (1 - x) x its recent average
  double memory_fraction = 0.90;           // KV blocks used / total
  double error_rate = 0.05;                // failed / finished over the last 100 jobs
};

class Engine {
 public:
  // Opens the data dir, recovers the queue (jobs that were running when a
  // process died are re-queued and their partial output discarded) and, when
  // config.execute, starts the executor. Only one process executes a data
  // dir's queue at a time; a second one gets an error (use execute = false).
  static Result<std::unique_ptr<Engine>> open(const EngineConfig& config);
  ~Engine();  // stops the executor; running jobs go back to the queue
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (InvalidArgument, nothing queued) and stores the request; returns its id.
  Result<JobId> submit(const TextRequest& request);
  // An image job (see ImageRequest): its images' denoising steps share network
  // calls with other image jobs on the same model and size; a random seed is
  // fixed at submission so a re-run after a crash gives the same images.
  Result<JobId> submit(const ImageRequest& request);
  // Many at once, in one transaction (one disk sync): all are queued or none.
  // The first invalid request is named (by index) in the error.
  Result<std::vector<JobId>> submit_many(const std::vector<TextRequest>& requests);
  Status cancel(JobId id);                    // takes effect within one step; NotFound / InvalidArgument if finished
  Status set_priority(JobId id, int priority);
  void pause();                               // stop admitting new jobs (persistent); running ones finish
  void resume();
  bool paused() const;
  Result<JobInfo> job(JobId id) const;
  std::vector<JobInfo> list(const JobFilter& filter = {}) const;
  int clear_finished();                       // forget completed/failed/cancelled jobs
  int cancel_queued();                        // cancel every queued job

  // Events of one job (id) or of all jobs (0), delivered on an engine thread
  // per subscription through a bounded buffer: a slow sink never stalls the
  // engine (Token events merge and Progress events coalesce when it lags).
  uint64_t subscribe(JobId id, EventSink sink);
  void unsubscribe(uint64_t subscription);

  EngineMetrics metrics() const;
  void reset_metrics();  // start the windows, percentiles and counters afresh (benchmarks)
  void set_alert_rules(const AlertRules& rules);
  // Blocks until no job is queued or running (or timeout); true when idle.
  bool wait_idle(int timeout_ms);

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------- image

// Generates every image of the request on the calling thread. InvalidArgument:
// a bad request value, a prompt naming no class (QuickDraw); NotFound: no such
// file; Unsupported: another kind of model; InvalidModel: a damaged file.
Result<std::vector<ImageResult>> generate_image(const ImageRequest& request);
// The same, resolving request.model in the model store at STORE_DIR ("" =
// default_store_dir()), reporting progress (may be empty).
Result<std::vector<ImageResult>> generate_image(const ImageRequest& request, const std::string& store_dir,
                                                const ImageProgressFn& progress = {});

// Where image INDEX of COUNT goes when a request names OUT: OUT itself for
// one image, OUT-1.png ... OUT-N.png (the stem numbered) for several.
std::string numbered_output_path(const std::string& out, int index, int count);

// Writes a progress report's preview as an RGB PNG. InvalidArgument when it has none; Io on failure.
Status write_preview_png(const ImageProgress& progress, const std::string& path);

// Writes result as an 8-bit PNG with two text chunks: "parameters"
// (result.parameters, A1111's format) and "atelier" (the request as JSON, its
// seed replaced by result.seed). Written to PATH.tmp then renamed. Io with the
// system's reason on failure; InvalidArgument for an empty result.
Status write_png(const ImageResult& result, const ImageRequest& request, const std::string& path);

// ---------------------------------------------------------------- model references

// Where the model store lives by default: $ATELIER_HOME, else
// $XDG_DATA_HOME/atelier, else ~/.local/share/atelier (the queue's default
// data dir too).
std::string default_store_dir();

// What a model reference names. The one place where references are resolved:
// the command line, the engine's queue and the window all call resolve_model.
struct ResolvedModel {
  std::string path;          // the file to load: a blob in the store, or the plain file
  std::string digest;        // "sha256:<64 hex>" of that file; "" for a plain file unless check_digest
  std::string display;       // "stories260k@1", or the plain file's path
  std::string name;          // the store model's name ("" for a plain file)
  int version = 0;           // its version number (0 for a plain file)
  std::string kind;          // "text" or "image" ("" for a plain file)
  std::string format;        // "gguf", "safetensors", "pytorch", "llama2c" ("" for a plain file)
  std::vector<std::pair<std::string, std::string>> files;  // role -> path, every file of the version
  bool in_store = false;
  std::string file(const std::string& role) const;  // the path of ROLE, "" when absent
};

struct ResolveOptions {
  // Hash the file before it is used: a store blob must still hash to its
  // digest (a corrupted blob is refused with InvalidModel), a plain file gets
  // its digest computed. Done once per file per process (a file whose size or
  // modification time changed is hashed again), so jobs do not rehash.
  bool check_digest = false;
};

// REF: a path to an existing file (used as it is, no store entry needed), or
// a store reference: NAME (prod, else stable, else the newest version),
// NAME@VERSION, NAME:CHANNEL, sha256:HEX (at least 12 digits). STORE_DIR ""
// means default_store_dir(); a store that does not exist yet is not created.
// NotFound names what to pull or import; InvalidArgument for a malformed
// reference; InvalidModel for a corrupted blob (with check_digest).
Result<ResolvedModel> resolve_model(const std::string& ref, const std::string& store_dir = "",
                                    const ResolveOptions& options = {});

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
  int reps = 3;
  int threads = 0;
};

struct MeanSd {
  double mean = 0, sd = 0;
};

struct TextBenchResult {
  ModelInfo model;
  MachineLimits limits;
  int prompt_tokens = 0, gen_tokens = 0, reps = 0;
  MeanSd prompt_tokens_per_s, gen_tokens_per_s;
  double gen_bandwidth_gb_per_s = 0;  // weight bytes per token x tokens/s
  double prompt_gflop_per_s = 0;      // 2 x params x prompt tokens/s
  // The layers' matmuls run on int8 dot instructions (quantized weights):
  // prompt_gflop_per_s then compares with limits.peak_int8_gop_per_s, not
  // the fp32 FMA peak.
  bool integer_matmul = false;
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
  int max_batch = 32;
  // Each level is run this many times, its requests arriving together each
  // time; a level's figures are the medians over its rounds. One round of 64
  // tokens holds 63 inter-token gaps per stream, so its P99 is nearly its
  // largest gap, and one slow moment of a shared machine moves it.
  int rounds = 3;
};

struct ServeBenchRound {
  double tokens_per_s = 0;  // generated tokens / wall time, all requests
  double seconds = 0;
  Percentiles time_to_first_token_ms, inter_token_ms;
  double mean_batch = 0;    // mean sequences decoded per step
};

// The medians over the level's rounds, and each round.
struct ServeBenchLevel : ServeBenchRound {
  int concurrency = 0;
  std::vector<ServeBenchRound> rounds;
};

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
};
Result<ImageBenchResult> bench_image(const std::string& model_path, const ImageBenchOptions& options);

// `atelier bench mixed`: interactive text while a Stable Diffusion image
// renders on the same engine. After a warm-up (both models loaded), it runs
// the text jobs alone, the image alone, the image again with the text jobs
// submitted one after another from text_start_s after the image started
// (each interactive, end-of-sequence ignored), and the image alone once more. Text figures are the engine's
// own (time to first token from submission, inter-token gaps at sampling);
// image seconds are from its start to its PNG.
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
};
Result<MixedBenchResult> bench_mixed(const std::string& text_model_path, const std::string& image_model_path,
                                     const MixedBenchOptions& options);

// ---------------------------------------------------------------- synthetic models

struct SynthTextSpec {
  std::string arch = "llama";
  std::string params = "110M";  // 260K, 15M, 42M, 110M, 1B (llama2.c / TinyLlama shapes)
  std::string type = "q8_0";    // f32, f16, bf16, q8_0, q4_0, q4_K, q6_K
  uint64_t seed = 1;
};
// Writes a LLaMA-shaped GGUF with deterministic random weights.
Status synth_text_model(const SynthTextSpec& spec, const std::string& out_path);
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

// ---------------------------------------------------------------- model discovery

struct ModelFile {
  std::string path;
  std::string kind;    // "text" or "image"
  std::string format;  // "gguf", "llama2c", "safetensors", "pytorch"
  int64_t bytes = 0;
  std::string summary;  // "llama, 64-dim, 5 layers, vocab 512" or the reason it cannot load
};
// Lists the model files directly inside the given folders (missing folders are skipped).
std::vector<ModelFile> scan_model_folders(const std::vector<std::string>& folders);

}  // namespace atelier
