// atelier/engine.h — the engine: the durable job queue with its batching
// scheduler, job events and metrics
//
// Pure C++20, no Qt. Nothing here throws: every fallible call returns a
// Status or a Result whose message says what was wrong and what to do.
#pragma once

#include <atelier/requests.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atelier {

// ---------------------------------------------------------------- the engine: durable queue + batching scheduler

using JobId = int64_t;
enum class JobState { Queued, Running, Completed, Failed, Cancelled };
std::string_view job_state_name(JobState state);  // "queued", "running", ...

struct EngineConfig {
  std::string data_dir;               // holds jobs.db (SQLite, WAL); created if missing
  std::string store_dir;              // the model store requests' model references resolve in ("" = default_store_dir())
  // The device that runs the jobs (one today): "auto" (the first CUDA
  // device when the CUDA module, a driver and a device are present, else the
  // CPU; a text model that does not fit the GPU, and every image job (issue
  // 34), runs on the CPU instead, and says so), "cpu", "cuda", "cuda:N".
  // A device named outright that cannot be opened makes open() fail with
  // what is missing and how to get it.
  std::vector<std::string> devices = {"auto"};
  // On a GPU: the share of the device's memory this engine may take
  // (weights, workspaces and the KV pool, which gets what the weights leave;
  // vLLM's gpu_memory_utilization). Between 0.05 and 1.
  double gpu_memory_fraction = 0.9;
  // Matrix products' precision on a GPU (engine/src/text/precision.h):
  // "auto" (BF16, FP16 below sm_80), "bf16", "fp16", "fp8" (E4M3, sm_89+).
  // The CPU computes in each file's own types and accepts only "auto".
  std::string precision = "auto";
  int threads = 0;                    // 0: one per core
  // Sequences decoded together per step; 0: by the device (kDefaultMaxBatch*).
  int max_batch = 0;
  int max_wait_ms = 100;              // dynamic batching window from idle (adapted to load)
  int64_t kv_memory_bytes = int64_t{1} << 30;  // KV cache budget per loaded model
  // Loaded models (text: weights and KV pool; image: the checkpoint's
  // networks) stay loaded for the next job until their bytes would pass this;
  // then the least recently used ones no job is using are unloaded first. A
  // model in use is never unloaded; one larger than the budget still loads.
  int64_t model_cache_bytes = int64_t{8} << 30;
  // What one image job's weights and working memory may take (0: the
  // device's memory: this machine's, or the process's ulimit -v / -d).
  // submit() refuses an image request over it with an estimate (issue 35).
  int64_t image_memory_bytes = 0;
  // Paged KV block size in positions. Attention reads a block's rows of a
  // layer as one run, and short runs stream poorly (engine/README.md, KV).
  int kv_block_tokens = 64;
  // Prompt tokens prefilled per step, so decoding stays responsive; 0: by
  // the device. A CPU prefills a few dozen tokens in a decode step's time, a
  // GPU thousands (vLLM's chunked-prefill budget is 2048 tokens a step).
  int prefill_tokens_per_step = 0;
  int max_image_batch = 8;            // images denoised together per image step (each CFG image is 2 network rows)
  // Image steps run on their own thread and thread pool, this much lower in
  // OS priority (Linux nice) than text steps: text keeps streaming while an
  // image renders, and an image alone still uses every core. 0: equal. 4:
  // a text thread weighs 2.4 image threads; higher values favour text more
  // but also starve images behind the session's other busy programs.
  int image_nice = 4;
  // Every engine thread (and the image lane image_nice further) runs this much
  // lower in OS priority than the process's other threads: a window that
  // hosts the engine (the studio uses 5) is never starved by generation.
  int nice = 0;
  KvType kv_type = KvType::F16;
  double interactive_p99_itl_ms = 1000;  // latency target for interactive jobs
  int aging_ms = 2000;                // a waiting job gains one priority point per aging_ms
  bool execute = true;                // false: only read and write the queue (another process runs it)
  int poll_ms = 200;                  // how often the runner looks for jobs other processes queued
};

// What max_batch and prefill_tokens_per_step = 0 become, by the device the
// engine's text runs on: a GPU's step costs about the same for 1 or 256 rows
// (its products read the weights once), so it batches as vLLM does
// (max_num_seqs 256); a CPU's cost grows with the rows.
constexpr int kDefaultMaxBatchCpu = 32, kDefaultMaxBatchGpu = 256;
constexpr int kDefaultPrefillTokensCpu = 64, kDefaultPrefillTokensGpu = 2048;
// c with max_batch and prefill_tokens_per_step at 0 replaced by the device's
// defaults (Engine::open does it; a runner or scheduler made directly too).
inline EngineConfig with_batch_defaults(EngineConfig c, bool gpu) {
  if (c.max_batch <= 0) c.max_batch = gpu ? kDefaultMaxBatchGpu : kDefaultMaxBatchCpu;
  if (c.prefill_tokens_per_step <= 0) c.prefill_tokens_per_step = gpu ? kDefaultPrefillTokensGpu : kDefaultPrefillTokensCpu;
  return c;
}

// Which device a --device value names, and why it was chosen.
struct DeviceSelection {
  std::string name = "cpu";   // "cpu", "cuda:0"
  std::string description;    // the device's own ("NVIDIA H200, 139 GiB", "x86-64, avx2, 2 threads")
  bool automatic = false;     // chosen by "auto"
  std::string why;            // "auto: no CUDA module (...); running on the CPU", "asked for with --device cuda:0"
  std::string precision;      // the precision policy's label there: "weights:bf16 quant:kept act:bf16 kv:f16 acc:f32"
};
// "auto", "cpu", "cuda", "cuda:N", with --precision PRECISION and the KV
// type KV checked against what the device can run. InvalidArgument for
// anything else, or a precision the device cannot run (fp8 below sm_89;
// bf16/fp16/fp8 on a CPU named outright: auto's CPU ignores it, saying so);
// Unsupported for a named device that cannot be opened, saying what is
// missing and how to get it (--device cpu runs without it).
Result<DeviceSelection> select_device(const std::string& spec, const std::string& precision = "auto",
                                      KvType kv = KvType::F16);
// "cpu" then the CUDA devices found ("cuda:0", ...): the studio's choices.
// WHY: why there are none, when there are none.
std::vector<std::string> available_devices(std::string* why = nullptr);
// This engine's build: "atelier 0.1.0 (git v0.1-123-gabcdef)", recorded with every job.
std::string engine_build();

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
  // Where and how it ran (completed jobs; "" for jobs of older databases):
  std::string device;         // "cpu", "cuda:0"
  std::string precision;      // text/precision.h's label: "weights:bf16 quant:kept act:bf16 kv:f16 acc:f32"
  std::string engine_build;   // engine_build() of the process that ran it
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
  double busy_fraction = 0;             // time spent in model calls over the last 10 s: the busier lane's (text steps, or the image
                                        // lane's calls, the one in progress included: a single UNet call may take minutes)
  // The device that runs the jobs (the CPU: the machine's RAM from /proc/meminfo, MemTotal and MemAvailable).
  int64_t device_memory_total_bytes = 0, device_memory_free_bytes = 0;
  std::string device = "cpu";           // the device text jobs run on ("cpu" once a GPU is lost)
  // Its sensors (NVML on an NVIDIA GPU); telemetry_available false on the CPU.
  bool telemetry_available = false;
  double device_utilization_percent = 0, device_temperature_c = 0;
  int64_t device_memory_used_bytes = 0;  // the GPU's memory in use (all processes), of device_memory_total_bytes
  int64_t device_losses = 0;            // GPUs lost while running (their jobs requeued, the CPU took over)
  int64_t image_steps = 0;              // image-lane steps (one network evaluation of every image it advanced)
  Percentiles image_step_ms;            // their durations
  std::vector<std::string> active_alerts;
};

struct AlertRules {
  double throughput_drop_fraction = 0.20;  // tokens/s below (1 - x) x its recent average
  double memory_fraction = 0.90;           // KV blocks used / total; a GPU's memory used / total too
  double error_rate = 0.05;                // failed / finished over the last 100 jobs
};

// `atelier queue repair` (Engine::repair_queue).
struct QueueRepairReport {
  bool damaged = false;  // false: jobs.db was fine; nothing was done
  std::string backup;    // where the damaged jobs.db was moved
  int64_t rows = 0;      // rows (jobs and settings) salvaged from it
};

class Engine {
 public:
  // Opens the data dir, recovers the queue (jobs that were running when a
  // process died are re-queued and their partial output discarded) and, when
  // config.execute, starts the executor. Only one process executes a data
  // dir's queue at a time; a second one gets an error (use execute = false).
  static Result<std::unique_ptr<Engine>> open(const EngineConfig& config);
  ~Engine();  // stops the executor; running jobs go back to the queue
  // Rebuilds a damaged (truncated, overwritten) DATA_DIR/jobs.db: the bad file
  // is kept as jobs.db.damaged-<ms> and every readable job is copied into a
  // fresh one. Refused while a process runs the queue. A healthy database is
  // left alone (damaged = false).
  static Result<QueueRepairReport> repair_queue(const std::string& data_dir);
  // Recovers DATA_DIR's queue now, as Engine::open with execute does, when no
  // process runs it: the jobs a dead runner left running go back to the
  // queue, or fail by the crash rule (job_db.h). For a command that queues
  // through an engine that runs nothing and only then runs the queue (atelier
  // batch): what recovery fails must be seen failed before the same lines
  // are queued again, or a rerun would not queue them afresh. Ok, doing
  // nothing, while another process runs the queue (that one has recovered it).
  static Status recover_queue(const std::string& data_dir);
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
  // Idempotent forms (`atelier batch`: a rerun after a kill does each line
  // once). A non-empty KEY names the job; while a job with that key is queued,
  // running or completed, its id is returned and nothing new is queued (one
  // that failed or was cancelled is queued afresh). KEYS: one per request.
  Result<std::vector<JobId>> submit_many(const std::vector<TextRequest>& requests, const std::vector<std::string>& keys);
  Result<JobId> submit(const ImageRequest& request, const std::string& key);
  // What REQUEST will cost here (memory, an estimated time and a warning when
  // it would take unusually long; models.h estimate_image). submit() refuses
  // an image request that does not fit with the estimate's message (the
  // numbers and the largest size that fits), before anything is queued.
  Result<ImageEstimate> estimate(const ImageRequest& request) const;
  // The queued, running or completed job submitted under KEY; NotFound when none.
  Result<JobId> find_submitted(const std::string& key) const;
  Status cancel(JobId id);                    // takes effect within one step; NotFound / InvalidArgument if finished
  Status set_priority(JobId id, int priority);
  Status pause();                             // stop admitting new jobs (persistent); running ones finish
  Status resume();
  bool paused() const;                        // false when the database cannot be read
  Result<JobInfo> job(JobId id) const;
  std::vector<JobInfo> list(const JobFilter& filter = {}) const;  // empty when the database cannot be read
  Result<int> clear_finished();               // forget completed/failed/cancelled jobs; how many
  Result<int> cancel_queued();                // cancel every queued job; how many
  // Ok, or why the queue runner cannot write the job database (DiskFull when
  // the disk is full): no job starts until it can, and a job that ends
  // meanwhile is reported failed (job() says so; the database catches up
  // when it takes writes again). Always Ok for an engine that does not execute.
  Status storage_status() const;

  // Events of one job (id) or of all jobs (0), delivered on an engine thread
  // per subscription through a bounded buffer: a slow sink never stalls the
  // engine (Token events merge and Progress events coalesce when it lags).
  uint64_t subscribe(JobId id, EventSink sink);
  void unsubscribe(uint64_t subscription);

  // The device the engine chose (EngineConfig::devices) and why.
  DeviceSelection device() const;
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

}  // namespace atelier
