// Engine: the public handle over the durable job queue (serve/job_db), the
// batching executor (serve/scheduler.cpp), event delivery and metrics.
#include <atelier/engine.h>
#include <atelier/json_input.h>
#include <atelier/models.h>
#include <atelier/backend.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "formats/sniff.h"
#include "serve/events.h"
#include "api/image_job.h"
#include "serve/metrics.h"
#include "serve/job_db.h"
#include "serve/scheduler.h"
#include "api/text_model_impl.h"
#include "text/precision.h"
#include <atelier/devices.h>

namespace atelier {

namespace fs = std::filesystem;
using nlohmann::json;

std::string_view status_code_name(StatusCode c) {
  switch (c) {
    case StatusCode::Ok: return "ok";
    case StatusCode::InvalidArgument: return "invalid_argument";
    case StatusCode::NotFound: return "not_found";
    case StatusCode::InvalidModel: return "invalid_model";
    case StatusCode::Unsupported: return "unsupported";
    case StatusCode::Io: return "io";
    case StatusCode::Internal: return "internal";
    case StatusCode::Cancelled: return "cancelled";
    case StatusCode::DiskFull: return "disk_full";
  }
  return "internal";
}

std::string_view job_state_name(JobState s) {
  switch (s) {
    case JobState::Queued: return "queued";
    case JobState::Running: return "running";
    case JobState::Completed: return "completed";
    case JobState::Failed: return "failed";
    case JobState::Cancelled: return "cancelled";
  }
  return "unknown";
}

std::string_view event_type_name(EventType t) {
  switch (t) {
    case EventType::Queued: return "queued";
    case EventType::Started: return "started";
    case EventType::Token: return "token";
    case EventType::Segment: return "segment";
    case EventType::Progress: return "progress";
    case EventType::Preview: return "preview";
    case EventType::Completed: return "completed";
    case EventType::Failed: return "failed";
    case EventType::Cancelled: return "cancelled";
    case EventType::Alert: return "alert";
  }
  return "unknown";
}

namespace {
int64_t epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

JobState parse_state(const std::string& s) {
  for (JobState st : {JobState::Queued, JobState::Running, JobState::Completed, JobState::Failed, JobState::Cancelled})
    if (job_state_name(st) == s) return st;
  return JobState::Failed;
}

JobInfo to_info(const runtime::JobRow& row) {
  JobInfo j;
  j.id = row.id;
  j.state = parse_state(row.state);
  if (is_image_request_json(row.request_json)) {
    j.kind = "image";
    if (auto req = image_request_from_json(row.request_json); req.ok()) j.image_request = req.value();
  } else if (auto req = request_from_json(row.request_json); req.ok()) {
    j.request = req.value();
  }
  j.priority = row.priority;
  j.created_ms = row.created_ms;
  j.started_ms = row.started_ms;
  j.finished_ms = row.finished_ms;
  j.seed = row.seed;
  j.model_version = row.model_version;
  j.model_name = row.model_name;
  j.device = row.device;
  j.precision = row.precision;
  j.engine_build = row.engine_build;
  j.attempts = row.attempts;
  if (!row.error_message.empty()) j.error = row.error_message;
  j.error_code = row.error_code;
  if (!row.result_json.empty()) {
    // Read back bounded (json_input.h), like every JSON input: a damaged row is an empty result, not a crash.
    const auto parsed = parse_json(row.result_json, "the job's stored result");
    const json r = parsed.ok() ? parsed.value() : json();
    if (r.is_object()) {
      j.text = r.value("text", "");
      if (r.contains("files") && r["files"].is_array())
        for (const auto& f : r["files"]) j.files.push_back(f.get<std::string>());
      j.stop_reason = r.value("stop_reason", "");
      if (r.contains("stats")) {
        const json& s = r["stats"];
        j.stats.queue_wait_ms = s.value("queue_wait_ms", 0.0);
        j.stats.time_to_first_token_ms = s.value("time_to_first_token_ms", 0.0);
        j.stats.total_ms = s.value("total_ms", 0.0);
        j.stats.tokens_per_s = s.value("tokens_per_s", 0.0);
        j.stats.prompt_tokens = s.value("prompt_tokens", 0);
        j.stats.cached_prompt_tokens = s.value("cached_prompt_tokens", 0);
        j.stats.new_tokens = s.value("new_tokens", 0);
      }
    }
  }
  return j;
}
}  // namespace

struct Engine::Impl {
  EngineConfig config;
  std::unique_ptr<runtime::JobDb> db;
  std::unique_ptr<runtime::RunnerLock> lock;
  EventHub hub;
  std::unique_ptr<MetricsRecorder> metrics;
  DeviceSelection device;  // what EngineConfig::devices chose (a runner only)
  std::unique_ptr<Scheduler> scheduler;  // last: stopped first, while the rest still exists
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::open(const EngineConfig& c) {
  auto bad = [](const std::string& m) { return Status::error(StatusCode::InvalidArgument, m); };
  if (c.data_dir.empty()) return bad("the engine needs a data dir");
  if (c.max_batch < 0 || c.max_batch > 1024) return bad("max_batch must be between 1 and 1024 (0: the device's default)");
  if (c.image_memory_bytes < 0) return bad("image_memory_bytes must be 0 (the device's memory) or positive");
  if (c.max_wait_ms < 0 || c.max_wait_ms > 60'000) return bad("max_wait_ms must be between 0 and 60000");
  if (c.kv_memory_bytes <= 0) return bad("the KV memory budget must be positive");
  if (c.kv_block_tokens < 1 || c.kv_block_tokens > 4096) return bad("kv_block_tokens must be between 1 and 4096");
  if (c.prefill_tokens_per_step < 0) return bad("prefill_tokens_per_step must be at least 1 (0: the device's default)");
  if (c.threads < 0) return bad("threads must be >= 0 (0: one per core)");
  if (c.poll_ms < 1) return bad("poll_ms must be at least 1");
  if (c.nice < 0 || c.nice > 19 || c.image_nice < 0 || c.image_nice > 19) return bad("nice and image_nice must be between 0 and 19");
  if (c.devices.size() != 1) return bad("devices: name one device (auto, cpu, cuda or cuda:N); several are not supported yet");
  if (!(c.gpu_memory_fraction >= 0.05 && c.gpu_memory_fraction <= 1.0))
    return bad("gpu_memory_fraction must be between 0.05 and 1 (the share of the GPU's memory the engine may take)");
  text::PrecisionChoice precision;
  if (!text::precision_choice_from_name(c.precision, &precision))
    return bad("precision must be auto, bf16, fp16 or fp8 (got '" + c.precision + "')");
  // The device first, so that a GPU named outright but missing fails before any work.
  DeviceSelection device;
  kernels::Device* dev = nullptr;
  if (c.execute) {
    auto sel = select_device(c.devices.front(), c.precision, c.kv_type);
    if (!sel.ok()) return sel.status();
    device = sel.value();
    dev = kernels::open_device(device.name).device;
    if (!dev) return Status::error(StatusCode::Unsupported, "--device " + device.name + ": the device could not be opened");
  }
  // The batch caps the device decides where the caller left them at 0.
  const EngineConfig cfg = with_batch_defaults(c, dev && !dev->info().host_memory);
  return guarded([&]() -> Result<std::unique_ptr<Engine>> {
    std::error_code ec;
    fs::create_directories(cfg.data_dir, ec);
    if (ec) return Status::error(StatusCode::Io, cfg.data_dir + ": cannot create the data dir: " + ec.message());
    auto impl = std::make_unique<Impl>();
    impl->config = cfg;
    impl->db = runtime::JobDb::open((fs::path(cfg.data_dir) / "jobs.db").string());
    impl->metrics = std::make_unique<MetricsRecorder>(cfg.max_batch);
    if (cfg.execute) {
      impl->lock = runtime::RunnerLock::try_acquire(cfg.data_dir);
      if (!impl->lock)
        return Status::error(StatusCode::InvalidArgument,
                             "another Atelier process is running the queue in " + cfg.data_dir +
                                 "; add jobs with `atelier queue add` instead, or stop it first");
      impl->db->recover();
      impl->device = device;
      std::unique_ptr<Runner> runner = dev->info().host_memory ? make_cpu_runner(cfg)
                                                               : make_device_runner(cfg, *dev, device.name, device.automatic);
      impl->scheduler = std::make_unique<Scheduler>(cfg, *impl->db, impl->hub, *impl->metrics, std::move(runner));
    }
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
  });
}

Status Engine::recover_queue(const std::string& data_dir) {
  return guarded([&]() -> Status {
    std::error_code ec;
    if (!fs::exists(fs::path(data_dir) / "jobs.db", ec)) return Status{};  // no queue yet: nothing ran
    auto lock = runtime::RunnerLock::try_acquire(data_dir);
    if (!lock) return Status{};  // a live runner recovered it when it started
    runtime::JobDb::open((fs::path(data_dir) / "jobs.db").string())->recover();
    return Status{};
  });
}

Result<QueueRepairReport> Engine::repair_queue(const std::string& data_dir) {
  const std::string path = (fs::path(data_dir) / "jobs.db").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::error(StatusCode::NotFound, "no job database at " + path);
  return guarded([&]() -> Result<QueueRepairReport> {
    auto lock = runtime::RunnerLock::try_acquire(data_dir);
    if (!lock)
      return Status::error(StatusCode::InvalidArgument, "another Atelier process is running the queue in " + data_dir + "; stop it first");
    const auto r = runtime::JobDb::repair(path);
    return QueueRepairReport{r.damaged, r.backup, r.rows};
  });
}

namespace {
// Validates a request and fixes its seed, so the stored request reproduces the job exactly.
// The model reference stays as written; the runner resolves it when the job
// starts and records the digest of what it loaded.
// CHECKED remembers each model reference's outcome (a batch names few models).
// The context a job of this model gets in the runner (default_context_tokens,
// as TextModel::open sets it). 1 << 20 when the header cannot be read (the
// runner then reports what is wrong with the file).
int runner_context(const ResolvedModel& m) {
  // GGUF headers only: a llama2.c checkpoint is read whole, too slow for a submit.
  if (!is_synth_model_ref(m.path) && formats::sniff_model_file(m.path).kind != formats::FileKind::gguf) return 1 << 20;
  auto info = read_model_info(m.path, m.file("tokenizer"));
  if (!info.ok()) return 1 << 20;
  return default_context_tokens(info->n_ctx_train);
}

struct ModelCheck {
  Status status;
  int n_ctx = 1 << 20;
};

Result<TextRequest> prepare(const TextRequest& request, const std::string& store_dir, std::map<std::string, ModelCheck>& checked) {
  if (request.model.empty()) return Status::error(StatusCode::InvalidArgument, "the request names no model");
  auto seen = checked.find(request.model);
  if (seen == checked.end()) {
    auto resolved = resolve_model(request.model, store_dir);
    ModelCheck c;
    if (resolved.ok()) c.n_ctx = runner_context(resolved.value());
    else c.status = resolved.status();
    seen = checked.emplace(request.model, c).first;
  }
  if (!seen->second.status.ok()) return seen->second.status;
  // The same limit `atelier text` applies, so a batch line and the flag agree.
  if (Status s = validate_request(request, seen->second.n_ctx); !s.ok()) return s;
  TextRequest r = request;
  if (r.sampling.seed == SamplingParams::kRandomSeed) {
    std::random_device rd;
    r.sampling.seed = ((static_cast<uint64_t>(rd()) << 32) | rd()) & 0x7fffffffffffffffull;
  }
  return r;
}

// Stores jobs in one transaction, announces them and wakes the executor.
Result<std::vector<JobId>> insert_jobs(Engine::Impl& impl, const std::vector<runtime::NewJob>& jobs) {
  return guarded([&]() -> Result<std::vector<JobId>> {
    std::vector<bool> fresh;
    std::vector<JobId> ids = impl.db->insert_many(jobs, epoch_ms(), &fresh);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!fresh[i]) continue;  // an earlier job with the same key: already announced
      const JobId id = ids[i];
      Event ev;
      ev.type = EventType::Queued;
      ev.job = id;
      impl.hub.publish(ev);
    }
    if (impl.scheduler) impl.scheduler->notify();
    return ids;
  });
}
}  // namespace

Result<JobId> Engine::submit(const TextRequest& request) {
  auto ids = submit_many({request});
  if (!ids.ok()) return ids.status();
  return ids.value().front();
}

Result<std::vector<JobId>> Engine::submit_many(const std::vector<TextRequest>& requests) {
  return submit_many(requests, std::vector<std::string>(requests.size()));
}

Result<std::vector<JobId>> Engine::submit_many(const std::vector<TextRequest>& requests, const std::vector<std::string>& keys) {
  if (keys.size() != requests.size())
    return Status::error(StatusCode::InvalidArgument, "submit_many: one key per request (\"\" for none)");
  std::vector<runtime::NewJob> jobs;
  std::map<std::string, ModelCheck> checked;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto r = prepare(requests[i], impl_->config.store_dir, checked);
    if (!r.ok()) {
      if (requests.size() == 1) return r.status();
      return Status::error(r.status().code, "request " + std::to_string(i) + ": " + r.status().message);
    }
    jobs.push_back({request_to_json(r.value()), r->priority, r->interactive, r->sampling.seed, keys[i]});
  }
  return insert_jobs(*impl_, jobs);
}

Result<JobId> Engine::submit(const ImageRequest& request) { return submit(request, ""); }

Result<JobId> Engine::submit(const ImageRequest& request, const std::string& key) {
  if (Status st = validate_image_request(request); !st.ok()) return st;
  // Checked now, not after the render: the model is an image model and the output can be written.
  if (Status st = check_image_model_kind(request.model, impl_->config.store_dir); !st.ok()) return st;
  if (Status st = check_image_output(request.output); !st.ok()) return st;
  // Memory is admitted before a job is accepted (issue 35): what cannot fit
  // is refused now, not found out when the job starts. An estimate that
  // cannot be made leaves the loader to say what is wrong when the job runs.
  if (auto est = estimate(request); est.ok() && !est->fits) return Status::error(StatusCode::InvalidArgument, est->message);
  ImageRequest r = request;
  // Fixed now, so the job's images are the same whenever (and however often) it runs.
  if (r.seed == SamplingParams::kRandomSeed) r.seed = pick_image_seed();
  auto ids = insert_jobs(*impl_, {{image_request_to_json(r), r.priority, r.interactive, r.seed, key}});
  if (!ids.ok()) return ids.status();
  return ids.value().front();
}

Result<ImageEstimate> Engine::estimate(const ImageRequest& request) const {
  return estimate_image(request, impl_->config.store_dir, impl_->config.image_memory_bytes);
}

Result<JobId> Engine::find_submitted(const std::string& key) const {
  return guarded([&]() -> Result<JobId> {
    if (auto id = impl_->db->find_key(key)) return *id;
    return Status::error(StatusCode::NotFound, "no job was submitted under this key");
  });
}

Status Engine::cancel(JobId id) {
  return guarded([&]() -> Status {
    auto row = impl_->db->get(id);
    if (!row) return Status::error(StatusCode::NotFound, "no job " + std::to_string(id));
    if (row->state != "queued" && row->state != "running")
      return Status::error(StatusCode::InvalidArgument, "job " + std::to_string(id) + " is already " + row->state);
    // The in-process executor first: the database write below waits for a sync.
    if (impl_->scheduler) impl_->scheduler->request_cancel(id);
    impl_->db->request_cancel(id);
    return Status{};
  });
}

Status Engine::set_priority(JobId id, int priority) {
  return guarded([&]() -> Status {
    if (!impl_->db->set_priority(id, priority))
      return Status::error(StatusCode::NotFound, "no queued or running job " + std::to_string(id));
    if (impl_->scheduler) impl_->scheduler->notify();
    return Status{};
  });
}

Status Engine::pause() {
  return guarded([&]() -> Status {
    impl_->db->set_paused(true);
    if (impl_->scheduler) impl_->scheduler->notify();
    return Status{};
  });
}

Status Engine::resume() {
  return guarded([&]() -> Status {
    impl_->db->set_paused(false);
    if (impl_->scheduler) impl_->scheduler->notify();
    return Status{};
  });
}

bool Engine::paused() const {
  try {
    return impl_->db->paused();
  } catch (const std::exception&) {
    return false;
  }
}

Status Engine::storage_status() const { return impl_->scheduler ? impl_->scheduler->storage_status() : Status{}; }

namespace {
// A job whose end the runner could not write (a full disk) ended all the
// same: say how, not the "running" the database still holds.
void apply_unsaved_end(const Scheduler* scheduler, JobInfo& info) {
  if (!scheduler || info.state != JobState::Running) return;
  if (auto end = scheduler->unsaved_end(info.id)) {
    info.state = end->first;
    if (!end->second.ok()) {
      info.error = end->second.message;
      info.error_code = std::string(status_code_name(end->second.code));
    }
  }
}
}  // namespace

Result<JobInfo> Engine::job(JobId id) const {
  return guarded([&]() -> Result<JobInfo> {
    auto row = impl_->db->get(id);
    if (!row) return Status::error(StatusCode::NotFound, "no job " + std::to_string(id));
    JobInfo info = to_info(*row);
    apply_unsaved_end(impl_->scheduler.get(), info);
    if (info.state == JobState::Running && impl_->scheduler)
      info.stats.new_tokens = std::max(0, impl_->scheduler->live_new_tokens(id));
    return info;
  });
}

std::vector<JobInfo> Engine::list(const JobFilter& f) const {
  std::vector<JobInfo> out;
  try {
    for (const auto& row : impl_->db->list(f.state ? std::string(job_state_name(*f.state)) : "", f.limit, f.newest_first)) {
      out.push_back(to_info(row));
      apply_unsaved_end(impl_->scheduler.get(), out.back());
    }
  } catch (const std::exception&) {
    out.clear();
  }
  return out;
}

Result<int> Engine::clear_finished() {
  return guarded([&]() -> Result<int> { return impl_->db->clear_finished(); });
}

Result<int> Engine::cancel_queued() {
  return guarded([&]() -> Result<int> {
    const int n = impl_->db->clear_queued();
    if (impl_->scheduler) impl_->scheduler->notify();
    return n;
  });
}

uint64_t Engine::subscribe(JobId id, EventSink sink) { return impl_->hub.subscribe(id, std::move(sink)); }
void Engine::unsubscribe(uint64_t subscription) { impl_->hub.unsubscribe(subscription); }

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  if (impl_->scheduler) impl_->scheduler->fill_metrics(m);
  else {
    try {
      m.queue_depth = static_cast<int>(impl_->db->count("queued"));
    } catch (const std::exception&) {
      // unreadable now: the depth stays 0
    }
  }
  impl_->metrics->fill(m, epoch_ms());
  if (!impl_->scheduler) {
    // Nothing runs here: the machine's memory, as the CPU runner would say.
    const kernels::DeviceMemory device = kernels::cpu_device().memory();
    m.device_memory_total_bytes = device.total_bytes;
    m.device_memory_free_bytes = device.free_bytes;
  }
  return m;
}

DeviceSelection Engine::device() const {
  DeviceSelection d = impl_->device;
  if (impl_->scheduler) {
    const std::string now = impl_->scheduler->device();
    if (now != d.name) {  // the GPU was lost: the CPU took over
      d.why = d.name + " was lost while running; its jobs were requeued and run on the CPU";
      d.name = now;
      d.description = kernels::cpu_device().info().description;
    }
  }
  return d;
}

void Engine::reset_metrics() { impl_->metrics->reset(); }

void Engine::set_alert_rules(const AlertRules& rules) {
  if (impl_->scheduler) impl_->scheduler->set_alert_rules(rules);
}

bool Engine::wait_idle(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    bool empty = false;
    try {
      empty = impl_->db->count("queued") == 0 && impl_->db->count("running") == 0;
    } catch (const std::exception&) {
      // unreadable now: not idle; the deadline ends the wait
    }
    if (empty && (!impl_->scheduler || impl_->scheduler->idle())) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace atelier
