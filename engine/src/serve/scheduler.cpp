#include "serve/scheduler.h"

#include <algorithm>
#include <optional>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/cancel.h"
#include "core/thread_pool.h"
#include "api/image_job.h"
#include "text/kv_cache.h"
#include "text/generation.h"
#include "api/text_model_impl.h"

namespace atelier {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {
// After a failed database write (a full disk) no job starts for this long; then admission tries again.
constexpr int64_t kStorageRetryMs = 1000;

int64_t epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
int64_t epoch_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
// The positions a sequence holds in its KV blocks at once: all of them, or
// with sliding-window attention the window, one step's prompt chunk (at most
// a window too, see schedule_text) and a block of slack: blocks behind the
// window are given back after each step.
int64_t live_positions(const TextSlot& slot, int64_t positions) {
  if (slot.sliding_window <= 0) return positions;
  return std::min<int64_t>(positions, 2 * int64_t{slot.sliding_window} + slot.kv->block_tokens());
}
// A model reference that no longer resolves when its job starts. Submit
// checked it, so it went away since the job was queued (`models remove
// --force`, a deleted file). Nothing pins a version at submit (the reference
// is resolved when the job starts, so a promoted channel applies), so the job
// fails, text and image alike, saying so.
Status gone_since_queued(const std::string& ref, Status st) {
  if (st.code == StatusCode::NotFound)
    st.message = "model \"" + ref + "\" was removed after this job was queued (" + st.message +
                 "); import or pull it again, then retry the job";
  return st;
}
// A sentence or paragraph ends at the last ". ", "! ", "? " (or before a newline) or blank line.
size_t segment_end(const std::string& s) {
  size_t end = std::string::npos;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    const char c = s[i], n = s[i + 1];
    if (((c == '.' || c == '!' || c == '?') && (n == ' ' || n == '\n')) || (c == '\n' && n == '\n')) end = i + 2;
  }
  return end;
}
}  // namespace

// What both kinds of job carry through their life cycle.
struct JobBase {
  JobId id = 0;
  int priority = 0;
  bool interactive = false;
  int64_t created_ms = 0, started_ms = 0;
  Clock::time_point enqueued, started;
  bool started_once = false, cancel = false, done = false;
  bool poison = false;  // its prompt holds $ATELIER_TEST_CRASH_PROMPT: starting it kills the process (fault tests)
};

struct LoadedModel {
  std::string path, version, name;  // version: "sha256:<hex>"; name: "stories260k@1" or the file's canonical path
  std::unique_ptr<TextSlot> slot;   // on the runner's device
  int64_t bytes = 0, last_used = 0;  // the model cache's size and LRU stamp
};

struct Sequence : JobBase {
  TextRequest req;
  Clock::time_point last_token;
  LoadedModel* model = nullptr;
  int n_prompt = 0, n_past = 0, cached_prompt_tokens = 0;
  std::unique_ptr<text::PagedSeq> kv;
  std::unique_ptr<text::Generation> gen;  // tokens (prompt, then generated), sampler, stream; made at first admission
  std::string segment;
  double ttft_ms = 0;
  bool has_first = false;
};

struct LoadedImage {
  std::string key, version, name;  // version: "sha256:<hex>" ("" for a diffusers folder)
  std::unique_ptr<ImageSlot> slot;  // on the runner's device
  int64_t bytes = 0, last_used = 0;  // the model cache's size and LRU stamp
};

struct ImageJob : JobBase {
  ImageRequest req;
  LoadedImage* model = nullptr;
  std::unique_ptr<ImageRun> run;      // images in flight (kept while preempted)
  std::vector<ImageResult> one_pass;  // a one-pass generator's images (QuickDraw), made at admission
  std::string version, name;          // the model that made them
};

Scheduler::Scheduler(const EngineConfig& config, runtime::JobDb& db, EventHub& hub, MetricsRecorder& metrics,
                     std::unique_ptr<Runner> runner)
    : config_(with_batch_defaults(config, runner && runner->device() != "cpu")),
      db_(db),
      hub_(hub),
      metrics_(metrics),
      runner_(std::move(runner)) {
  if (const char* p = std::getenv("ATELIER_TEST_CRASH_PROMPT"); p && *p) poison_prompt_ = p;
  image_thread_ = std::thread([this] { image_loop(); });
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  stop_ = true;
  lane_interrupt_ = true;  // a model call under way stops within a slice: shutdown never waits on a step
  notify();
  thread_.join();
  image_thread_.join();
}

void Scheduler::notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_one();
  {
    // A resume (or a stop) concerns the image lane's waiting jobs too.
    std::lock_guard<std::mutex> lock(lane_mu_);
    lane_wake_ = true;
  }
  lane_cv_.notify_one();
}

bool Scheduler::idle() const {
  if (!idle_.load()) return false;
  std::lock_guard<std::mutex> lock(lane_mu_);
  return lane_ids_.empty();
}

bool Scheduler::ended_here(JobId id) const {
  std::lock_guard<std::mutex> lock(lane_mu_);
  return finished_.count(id) > 0;
}

bool Scheduler::in_lane(JobId id) const {
  std::lock_guard<std::mutex> lock(lane_mu_);
  return lane_ids_.count(id) > 0;
}

void Scheduler::hand_to_lane(std::unique_ptr<ImageJob> job) {
  {
    std::lock_guard<std::mutex> lock(lane_mu_);
    lane_ids_.insert(job->id);
    image_inbox_.push_back(std::move(job));
    lane_wake_ = true;
  }
  lane_cv_.notify_one();
}

void Scheduler::cancel_in_lane(JobId id) {
  {
    std::lock_guard<std::mutex> lock(lane_mu_);
    image_cancels_.insert(id);
    lane_wake_ = true;
    if (lane_busy_.count(id)) lane_interrupt_ = true;
  }
  lane_cv_.notify_one();
}

void Scheduler::set_lane_busy(std::vector<JobId> ids) {
  std::lock_guard<std::mutex> lock(lane_mu_);
  lane_busy_ = std::set<JobId>(ids.begin(), ids.end());
  metrics_.on_image_lane(!ids.empty(), epoch_us());
  // A cancel that came while the lane was between calls stops the next one at its first cancellation point.
  for (JobId id : ids)
    if (image_cancels_.count(id)) lane_interrupt_ = true;
}

void Scheduler::drop_image_model_if_idle(LoadedImage* m) {
  const auto uses = [&](const auto& j) { return j && !j->done && j->model == m; };
  if (std::any_of(image_running_.begin(), image_running_.end(), uses) ||
      std::any_of(image_waiting_.begin(), image_waiting_.end(), uses))
    return;
  for (auto it = image_models_.begin(); it != image_models_.end(); ++it)
    if (it->second.get() == m) {
      model_bytes_ -= m->bytes;
      image_models_.erase(it);
      return;
    }
}

void Scheduler::request_cancel(JobId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_requests_.insert(id);
  }
  notify();
}

void Scheduler::set_alert_rules(const AlertRules& rules) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_ = rules;
}

void Scheduler::fill_metrics(EngineMetrics& m) const {
  std::lock_guard<std::mutex> lock(mu_);
  m.kv_blocks_used = kv_stats_.used;
  m.kv_blocks_free = kv_stats_.free;
  m.kv_blocks_cached = kv_stats_.cached;
  m.queue_depth = queue_depth_ + image_queue_depth_.load();
  m.running = running_count_ + image_running_count_.load();
  m.device = runner_->device();
  m.device_losses = device_losses_.load();
  const kernels::DeviceMemory mem = runner_->memory();
  m.device_memory_total_bytes = mem.total_bytes;
  m.device_memory_free_bytes = mem.free_bytes;
  const kernels::DeviceTelemetry t = runner_->telemetry();
  m.telemetry_available = t.available;
  if (t.available) {
    m.device_utilization_percent = t.utilization_percent;
    m.device_temperature_c = t.temperature_c;
    m.device_memory_used_bytes = t.memory_used_bytes;
    if (t.memory_total_bytes > 0) m.device_memory_total_bytes = t.memory_total_bytes;
  }
}

int Scheduler::live_new_tokens(JobId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_tokens_.find(id);
  return it == live_tokens_.end() ? -1 : it->second;
}

namespace {
// Aging: a waiting job gains a point per aging_ms, so low priorities are not
// starved; the same rule for text and image jobs.
double aged_priority(int priority, bool interactive, int64_t created_ms, int64_t now_ms, int aging_ms) {
  const double age = static_cast<double>(std::max<int64_t>(0, now_ms - created_ms)) / std::max(1, aging_ms);
  return priority + (interactive ? TextRequest::kInteractiveBoost : 0) + age;
}
}  // namespace

double Scheduler::effective_priority(const JobBase& j, int64_t now_ms) const {
  return aged_priority(j.priority, j.interactive, j.created_ms, now_ms, config_.aging_ms);
}

template <class Job>
void Scheduler::order_for_admission(std::vector<std::unique_ptr<Job>>& jobs, int64_t now) const {
  std::stable_sort(jobs.begin(), jobs.end(), [&](const auto& a, const auto& b) {
    const double pa = effective_priority(*a, now), pb = effective_priority(*b, now);
    return pa > pb || (pa == pb && a->id < b->id);
  });
}

template <class Job>
Job* Scheduler::preemption_victim(std::vector<std::unique_ptr<Job>>& running, const JobBase* requester, int64_t now) const {
  Job* victim = nullptr;
  for (auto& j : running) {
    if (!j || j.get() == requester || j->done) continue;
    const double pj = effective_priority(*j, now);
    if (!victim || pj < effective_priority(*victim, now) || (pj == effective_priority(*victim, now) && j->id > victim->id))
      victim = j.get();
  }
  if (victim && requester && effective_priority(*victim, now) >= effective_priority(*requester, now)) return nullptr;
  return victim;
}

bool Scheduler::start_job(JobBase& j, int64_t now) {
  if (j.started_once) return true;
  bool marked = false;
  try {
    marked = db_.mark_running(j.id, now);
    storage_recovered();
  } catch (const std::exception& e) {
    storage_failed(e);  // not started: it waits (not done) until the database takes writes
    return false;
  }
  if (!marked) {  // cancelled meanwhile
    j.done = true;
    release_quarantine(j.id);
    return false;
  }
  // The fault tests' poison job: a deterministic process death while it runs.
  if (j.poison) std::raise(SIGKILL);
  j.started_once = true;
  j.started_ms = now;
  j.started = Clock::now();
  Event ev;
  ev.type = EventType::Started;
  ev.job = j.id;
  hub_.publish(ev);
  return true;
}

LoadedModel* Scheduler::model_for(const std::string& ref, Status& error) {
  // Resolved for every job it admits (one catalogue read), so a channel
  // promoted while the runner runs applies to the next job; the blob's
  // sha256 is checked when first loaded (resolve_model caches the check).
  ResolveOptions ro;
  ro.check_digest = true;
  auto resolved = resolve_model(ref, config_.store_dir, ro);
  if (!resolved.ok()) {
    error = gone_since_queued(ref, resolved.status());
    return nullptr;
  }
  const std::string path = resolved->path;
  auto it = models_.find(path);
  if (it != models_.end()) {
    it->second->last_used = ++use_clock_;
    return it->second.get();
  }
  // Room first: what it will hold on the device.
  evict_text_models(runner_->estimate_text_bytes(resolved.value()));
  auto slot = runner_->load_text(resolved.value());
  if (!slot.ok()) {
    error = slot.status();
    return nullptr;
  }
  auto lm = std::make_unique<LoadedModel>();
  lm->path = path;
  lm->version = resolved->digest;
  if (resolved->in_store || resolved->format == "synthetic") {  // synth:...: its canonical reference
    lm->name = resolved->display;
  } else {
    std::error_code ec;
    lm->name = std::filesystem::weakly_canonical(path, ec).string();
  }
  lm->slot = std::move(slot.value());
  lm->bytes = lm->slot->bytes;
  lm->last_used = ++use_clock_;
  model_bytes_ += lm->bytes;
  LoadedModel* raw = lm.get();
  models_[path] = std::move(lm);
  return raw;
}

namespace {
// Unloads the least recently used models of MODELS that IN_USE says no job
// holds until NEED more bytes fit the budget (or only models in use are left).
// BYTES counts both lanes' loaded models; each lane evicts only its own.
template <class Models, class InUse>
void evict_lru(Models& models, std::atomic<int64_t>& bytes, int64_t need, int64_t budget, InUse in_use) {
  while (!models.empty() && bytes.load() + need > budget) {
    auto victim = models.end();
    for (auto it = models.begin(); it != models.end(); ++it) {
      if (in_use(it->second.get())) continue;
      if (victim == models.end() || it->second->last_used < victim->second->last_used) victim = it;
    }
    if (victim == models.end()) return;  // every loaded model is in use
    bytes -= victim->second->bytes;
    models.erase(victim);
  }
}
}  // namespace

void Scheduler::evict_text_models(int64_t need) {
  evict_lru(models_, model_bytes_, need, runner_->model_budget_bytes(), [&](const LoadedModel* m) {
    const auto uses = [&](const auto& s) { return s->model == m; };
    return std::any_of(running_.begin(), running_.end(), uses) || std::any_of(waiting_.begin(), waiting_.end(), uses);
  });
}

void Scheduler::evict_image_models(int64_t need) {
  evict_lru(image_models_, model_bytes_, need, runner_->model_budget_bytes(), [&](const LoadedImage* m) {
    // A preempted job waits with its images in flight on its model.
    const auto uses = [&](const auto& j) { return j && j->model == m && j->run; };
    return std::any_of(image_running_.begin(), image_running_.end(), uses) ||
           std::any_of(image_waiting_.begin(), image_waiting_.end(), uses);
  });
}

void Scheduler::run() {
  // Threads inherit their creator's nice: the text pools made here follow.
  ThreadPool::lower_this_thread_priority(config_.nice);
  std::deque<Clock::time_point> arrivals;  // recent submissions, for the adaptive batching window
  int64_t last_alert_check = 0;
  while (!stop_) {
   // A database call that throws (a full disk, an I/O error) must not end
   // the process: it is reported, and the loop tries again a little later.
   try {
    const int64_t now = epoch_ms();
    retry_unsaved(now);
    std::set<JobId> cancels;
    bool woken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancels.swap(cancel_requests_);
      woken = wake_;
      wake_ = false;
    }
    for (JobId id : cancels) {
      bool found = false;
      for (auto& s : running_)
        if (s->id == id) s->cancel = found = true;
      for (auto& s : waiting_)
        if (s->id == id && !s->done) {
          finish(*s, JobState::Cancelled, "cancelled");
          found = true;
        }
      if (!found && in_lane(id)) {
        cancel_in_lane(id);
        found = true;
      }
      if (!found && !ended_here(id)) announce_cancelled(id, now);  // cancelled while still only in the database
      known_.insert(id);
    }
    std::erase_if(waiting_, [](const auto& s) { return s->done; });
    // This process's submissions, cancels and pauses wake the loop; another
    // process's show in the database's data version, checked every poll_ms.
    // Re-reading the queue only then keeps a ~0.1-0.4 ms query out of the
    // decode steps (one in every ~20 at 16 sequences).
    bool poll = woken;
    if (!poll && now - last_poll_ms_ >= config_.poll_ms) {
      last_poll_ms_ = now;
      poll = db_.changed_elsewhere();
    }
    if (poll) {
      const size_t before = waiting_.size();
      refresh_queue(now);
      for (size_t i = before; i < waiting_.size(); ++i) arrivals.push_back(Clock::now());
    }
    while (!arrivals.empty() && arrivals.front() < Clock::now() - std::chrono::seconds(1)) arrivals.pop_front();

    // Dynamic batching window: from idle, wait until max_batch jobs wait or the
    // oldest has waited the window; the window shrinks with the arrival rate so
    // a lone request (or any interactive one) starts at once.
    bool hold = false;
    int wait_ms = config_.poll_ms;
    if (running_.empty() && !waiting_.empty() && !db_.paused()) {
      bool interactive = false;
      Clock::time_point oldest = Clock::now();
      for (const auto& s : waiting_) {
        interactive |= s->req.interactive;
        oldest = std::min(oldest, s->enqueued);
      }
      const double rate_fill = std::min(1.0, static_cast<double>(arrivals.size()) / std::max(1, config_.max_batch));
      const double window = interactive ? 0.0 : config_.max_wait_ms * rate_fill;
      const double waited = ms_between(oldest, Clock::now());
      if (static_cast<int>(waiting_.size()) < config_.max_batch && waited < window) {
        hold = true;
        wait_ms = std::max(1, static_cast<int>(window - waited));
      }
    }
    if (!hold) admit(now);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_depth_ = static_cast<int>(waiting_.size()) + held_back_;
      running_count_ = static_cast<int>(running_.size());
      kv_stats_ = {};
      for (const auto& [path, m] : models_) {
        kv_stats_.used += m->slot->kv->used_blocks();
        kv_stats_.free += m->slot->kv->free_blocks();
        kv_stats_.cached += m->slot->kv->cached_blocks();
      }
    }
    idle_ = running_.empty() && waiting_.empty();  // and the image lane's (idle())
    if (now - last_alert_check >= 1000) {
      last_alert_check = now;
      EngineMetrics m;
      fill_metrics(m);
      metrics_.fill(m, now);
      AlertRules rules;
      {
        std::lock_guard<std::mutex> lock(mu_);
        rules = rules_;
      }
      for (const std::string& a : metrics_.check_alerts(rules, m)) {
        Event ev;
        ev.type = EventType::Alert;
        ev.message = a;
        hub_.publish(ev);
      }
    }
    if (!running_.empty()) {
      step();
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this] { return wake_ || stop_.load(); });
   } catch (const std::exception& e) {
    storage_failed(e);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(kStorageRetryMs), [this] { return stop_.load(); });
   }
  }
  // Shutdown: what was running goes back to the queue.
  for (auto& s : running_) requeue_at_shutdown(s->id);
  for (auto& s : waiting_)
    if (s->started_once) requeue_at_shutdown(s->id);
  retry_unsaved(std::numeric_limits<int64_t>::max());
}

void Scheduler::refresh_queue(int64_t now) {
  last_poll_ms_ = now;
  const bool paused = db_.paused();  // before the queue: every job queued before a resume is in it
  if (paused) {
    // A pause reaches the lane before the jobs handed to it below, a resume
    // after them (further down): it never admits one of them alone under the
    // previous refresh's state.
    std::lock_guard<std::mutex> lock(lane_mu_);
    image_paused_ = true;
  }
  std::set<JobId> queued;
  const std::vector<runtime::JobRow> rows = db_.next_queued(0);
  // Quarantine (job_db.h, recover()): while suspects of a process death wait,
  // jobs run one at a time, suspects first (the fewest lone deaths first,
  // then queue order), so the one that kills the process dies alone.
  const runtime::JobRow* suspect = nullptr;
  for (const runtime::JobRow& row : rows)
    if (row.suspect && !known_.count(row.id) && (!suspect || row.died_alone < suspect->died_alone)) suspect = &row;
  const bool quarantine = suspect || quarantined_.load() != 0;
  const bool empty_here = running_.empty() && waiting_.empty() && [this] {
    std::lock_guard<std::mutex> lock(lane_mu_);
    return lane_ids_.empty();
  }();
  held_back_ = 0;
  for (const runtime::JobRow& row : rows) {
    queued.insert(row.id);
    if (quarantine && !known_.count(row.id)) {
      if (&row != suspect || !empty_here || quarantined_.load() != 0) {
        ++held_back_;
        continue;
      }
      quarantined_ = row.id;
    }
    if (known_.count(row.id)) {
      for (auto& s : waiting_)
        if (s->id == row.id) s->priority = row.priority;
      std::lock_guard<std::mutex> lock(lane_mu_);
      if (lane_ids_.count(row.id)) image_priorities_[row.id] = row.priority;
      continue;
    }
    known_.insert(row.id);
    if (is_image_request_json(row.request_json)) {
      auto ireq = image_request_from_json(row.request_json);
      if (ireq.ok()) {
        auto j = std::make_unique<ImageJob>();
        j->id = row.id;
        j->req = ireq.value();
        j->priority = row.priority;
        j->interactive = j->req.interactive;
        j->created_ms = row.created_ms;
        j->poison = !poison_prompt_.empty() && j->req.prompt.find(poison_prompt_) != std::string::npos;
        hand_to_lane(std::move(j));
        continue;
      }
      fail_unreadable(row.id, ireq.status(), now);
      continue;
    }
    auto req = request_from_json(row.request_json);
    if (!req.ok()) {
      fail_unreadable(row.id, req.status(), now);
      continue;
    }
    auto s = std::make_unique<Sequence>();
    s->id = row.id;
    s->req = req.value();
    s->priority = row.priority;
    s->interactive = s->req.interactive;
    s->created_ms = row.created_ms;
    s->enqueued = Clock::now();
    s->poison = !poison_prompt_.empty() && s->req.prompt.find(poison_prompt_) != std::string::npos;
    waiting_.push_back(std::move(s));
  }
  // Jobs another process cancelled or cleared while they waited here (the
  // image lane compares its waiting jobs with the same snapshot).
  {
    std::lock_guard<std::mutex> lock(lane_mu_);
    image_queued_ = std::make_unique<std::set<JobId>>(queued);
    image_paused_ = paused;
    lane_wake_ = true;
  }
  lane_cv_.notify_one();
  for (auto& s : waiting_) {
    if (!s->started_once && !queued.count(s->id)) {
      s->done = true;
      announce_cancelled(s->id, now);
    }
  }
  std::erase_if(waiting_, [](const auto& s) { return s->done; });
  // Cancels requested by other processes: running sequences stop at the next
  // step; preempted ones (still "running" in the database) end here.
  for (int64_t id : db_.cancel_requests()) {
    if (in_lane(id)) cancel_in_lane(id);
    for (auto& s : running_)
      if (s->id == id) s->cancel = true;
    for (auto& s : waiting_)
      if (s->id == id && !s->done) finish(*s, JobState::Cancelled, "cancelled");
  }
  std::erase_if(waiting_, [](const auto& s) { return s->done; });
}

bool Scheduler::preempt_lowest(const Sequence* requester) {
  Sequence* victim = preemption_victim(running_, requester, epoch_ms());
  if (!victim) return false;
  // Recompute later: keep the generation (tokens, sampler, stream); give the memory back.
  metrics_.on_preempt();
  victim->kv.reset();
  victim->n_past = 0;
  victim->enqueued = Clock::now();
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == victim; });
  waiting_.push_back(std::move(*it));
  running_.erase(it);
  return true;
}

bool Scheduler::admit(int64_t now) {
  if (db_.paused() || storage_blocked(now)) return false;
  // Jobs queued (or a resume) since this iteration's refresh compete for admission too.
  bool fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh = wake_;
    wake_ = false;
  }
  if (fresh) refresh_queue(now);
  if (waiting_.empty()) return false;
  order_for_admission(waiting_, now);
  const std::string current = running_.empty() ? waiting_.front()->req.model : running_.front()->req.model;
  const bool latency_pressure = metrics_.interactive_p99_inter_token_ms() > config_.interactive_p99_itl_ms;
  bool admitted = false;
  // A snapshot: preemption below appends to waiting_.
  std::vector<Sequence*> order;
  for (auto& p : waiting_) order.push_back(p.get());
  for (Sequence* sp : order) {
    Sequence& s = *sp;
    if (static_cast<int>(running_.size()) >= config_.max_batch) break;
    if (s.done || s.req.model != current) continue;
    if (latency_pressure && !s.req.interactive) continue;  // defer batch jobs while interactive ones miss their target
    Status err;
    LoadedModel* m = s.model ? s.model : model_for(s.req.model, err);
    if (!m) {
      finish(s, JobState::Failed, "error", err);
      continue;
    }
    s.model = m;
    const tok::Tokenizer& tokenizer = *m->slot->tokenizer;
    if (!s.gen) {
      std::vector<int32_t> prompt;
      Status st = guarded([&]() -> Status {
        prompt = tokenizer.encode(s.req.prompt, s.req.add_bos, s.req.parse_special);
        return Status{};
      });
      s.n_prompt = static_cast<int>(prompt.size());
      if (st.ok() && s.n_prompt == 0) st = Status::error(StatusCode::InvalidArgument, "the prompt is empty and the model has no BOS token");
      if (st.ok() && s.n_prompt >= m->slot->n_ctx)
        st = Status::error(StatusCode::InvalidArgument, "the prompt has " + std::to_string(s.n_prompt) +
                                                            " tokens but the context holds " + std::to_string(m->slot->n_ctx));
      const int64_t need = (live_positions(*m->slot, std::min<int64_t>(m->slot->n_ctx, int64_t{s.n_prompt} + s.req.max_new_tokens)) +
                            m->slot->kv->block_tokens() - 1) /
                           m->slot->kv->block_tokens();
      if (st.ok() && need > m->slot->kv->total_blocks())
        st = Status::error(StatusCode::InvalidArgument,
                           "the job needs " + std::to_string(need) + " KV blocks (" +
                               std::to_string(need * m->slot->kv->block_bytes() / (1 << 20)) + " MiB) but the KV pool holds " +
                               std::to_string(m->slot->kv->total_blocks()) +
                               "; raise the KV memory budget or lower max_new_tokens");
      if (!st.ok()) {
        finish(s, JobState::Failed, "error", st);
        continue;
      }
      // As TextModel::generate: the last sampled token needs no KV slot, so
      // the sequence may hold n_ctx + 1 tokens.
      s.gen = std::make_unique<text::Generation>(tokenizer, s.req, std::move(prompt), m->slot->n_ctx + 1);
    }
    s.kv = std::make_unique<text::PagedSeq>(*m->slot->kv);
    const int cached = s.kv->attach_prefix(s.gen->token_data(), s.gen->n_tokens() - 1);
    s.n_past = cached;
    // With a sliding window the first step's chunk, not the whole prompt, must fit.
    const int upto = m->slot->sliding_window > 0 ? std::min(s.gen->n_tokens(), cached + m->slot->sliding_window) : s.gen->n_tokens();
    const int need_now = s.kv->blocks_for(upto) - static_cast<int>(s.kv->blocks().size());
    while (m->slot->kv->free_blocks() < need_now && preempt_lowest(&s)) {
    }
    if (m->slot->kv->free_blocks() < need_now) {
      s.kv.reset();  // admission in priority order: lower jobs wait behind this one
      s.n_past = 0;
      break;
    }
    if (!s.started_once) {
      if (!start_job(s, now)) {
        s.kv.reset();
        s.n_past = 0;
        if (!s.done) break;  // the database takes no writes: it waits, and so do the jobs after it
        continue;
      }
      s.cached_prompt_tokens = cached;
      metrics_.on_prompt(s.n_prompt, cached);
    }
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& p) { return p.get() == sp; });
    running_.push_back(std::move(*it));
    waiting_.erase(it);
    admitted = true;
  }
  std::erase_if(waiting_, [](const auto& s) { return s->done; });
  return admitted;
}

// A text step, shaped as vLLM's: schedule() picks the sequences and their
// token counts (a plan), the runner executes it (forward pass and sampling),
// update_from_output() applies the sampled tokens (events, stops, finishing).
struct TextPlan {
  int64_t now_ms = 0;
  LoadedModel* model = nullptr;
  TextBatch batch;                 // what the runner computes
  std::vector<Sequence*> owners;   // whose each input is
};

// The device is gone (the CUDA module's sticky error): every model on it is
// unusable. The jobs that were running go back to the queue once, as after a
// crash (their partial output discarded), and the runner loads what they
// need on the CPU from now on.
void Scheduler::device_lost(const Status& why) {
  ++device_losses_;
  int requeued = 0;
  auto back = [&](Sequence& s) {
    s.kv.reset();
    s.done = true;
    known_.erase(s.id);  // read again from the queue
    try {
      if (db_.requeue(s.id)) ++requeued;
    } catch (const std::exception& e) {
      storage_failed(e);  // it stays "running": the next start recovers it
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_tokens_.erase(s.id);
  };
  for (auto& s : running_) back(*s);
  for (auto& s : waiting_)
    if (s->started_once) back(*s);  // preempted: running in the database
  std::erase_if(running_, [](const auto& s) { return s->done; });
  std::erase_if(waiting_, [](const auto& s) { return s->done; });
  for (auto it = models_.begin(); it != models_.end();) {
    if (it->second->slot->device != "cpu") {
      model_bytes_ -= it->second->bytes;
      it = models_.erase(it);
    } else {
      ++it;
    }
  }
  Event ev;
  ev.type = EventType::Alert;
  ev.message = why.message + "; " + std::to_string(requeued) + " running job" + (requeued == 1 ? "" : "s") +
               " requeued; serving on the CPU from now on";
  hub_.publish(ev);
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = true;  // the requeued jobs are read again at the top of the loop
}

void Scheduler::step() {
  TextPlan plan;
  if (!schedule_text(plan)) return;
  update_from_output(plan, runner_->execute_text(*plan.model->slot, plan.batch));
}

bool Scheduler::schedule_text(TextPlan& plan) {
  const int64_t now = plan.now_ms = epoch_ms();
  ++step_counter_;
  const bool latency_pressure = metrics_.interactive_p99_inter_token_ms() > config_.interactive_p99_itl_ms;
  bool any_interactive = false;
  for (const auto& s : running_) any_interactive |= s->req.interactive;
  const bool defer_batch = latency_pressure && any_interactive && step_counter_ % 2 == 1;

  std::stable_sort(running_.begin(), running_.end(), [&](const auto& a, const auto& b) {
    return effective_priority(*a, now) > effective_priority(*b, now);
  });
  {
    // A cancel that arrived since the top of the loop still stops this step.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : running_)
      if (cancel_requests_.erase(s->id)) s->cancel = true;
  }
  for (auto& s : running_)
    if (s->cancel && !s->done) finish(*s, JobState::Cancelled, "cancelled");
  std::erase_if(running_, [](const auto& s) { return s->done; });

  std::vector<text::SeqInput> inputs;
  std::vector<Sequence*> owners;
  // The prefill budget protects the inter-token latency of sequences that
  // are decoding; when none is, there is nothing to protect, so prompts are
  // prefilled in as few steps as possible (all jobs then start decoding
  // together, and the first token comes sooner).
  bool any_decoding = false;
  for (const auto& s : running_) any_decoding |= s->gen->n_tokens() - s->n_past == 1;
  int budget = any_decoding ? config_.prefill_tokens_per_step : std::max(config_.prefill_tokens_per_step, kIdlePrefillTokens);
  // A snapshot: preemption below moves sequences out of running_.
  std::vector<Sequence*> order;
  for (auto& p : running_) order.push_back(p.get());
  for (Sequence* s : order) {
    if (!s->kv) continue;  // preempted for an earlier one this step
    if (defer_batch && !s->req.interactive) continue;
    const int pending = s->gen->n_tokens() - s->n_past;
    int n = pending;
    if (pending > 1) {
      n = std::min(pending, budget);
      // A windowed sequence prefills a window at a time, so that what it
      // holds stays bounded by live_positions (a resumed one included).
      if (const int w = s->model->slot->sliding_window; w > 0) n = std::min(n, w);
      if (n <= 0) continue;
    }
    bool fits = s->kv->reserve(s->n_past + n);
    while (!fits && preempt_lowest(nullptr) ) {
      // preempt_lowest(nullptr) may have taken s itself; then stop.
      if (std::none_of(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == s; })) break;
      fits = s->kv->reserve(s->n_past + n);
    }
    if (!fits) continue;  // s was preempted (or nothing could be freed this step)
    if (pending > 1) budget -= n;
    text::SeqInput in;
    in.tokens = s->gen->token_data() + s->n_past;
    in.n = n;
    in.pos0 = s->n_past;
    in.kv = s->kv.get();
    in.logits = s->n_past + n == s->gen->n_tokens() ? s->gen->logits() : nullptr;
    inputs.push_back(in);
    owners.push_back(s);
  }
  // Inputs of sequences preempted after they were added must not run.
  std::vector<text::SeqInput> live;
  std::vector<Sequence*> live_owners;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (owners[i]->kv) {
      live.push_back(inputs[i]);
      live_owners.push_back(owners[i]);
    }
  }
  if (live.empty()) return false;
  plan.model = live_owners.front()->model;
  for (size_t i = 0; i < live.size(); ++i) plan.batch.samplers.push_back(live[i].logits ? live_owners[i]->gen.get() : nullptr);
  plan.batch.inputs = std::move(live);
  plan.owners = std::move(live_owners);
  return true;
}

void Scheduler::update_from_output(const TextPlan& plan, const TextOutput& out) {
  const int64_t now = plan.now_ms;
  const std::vector<text::SeqInput>& live = plan.batch.inputs;
  const std::vector<Sequence*>& live_owners = plan.owners;
  if (out.device_lost) return device_lost(out.status);
  if (!out.status.ok()) {
    for (Sequence* s : live_owners) finish(*s, JobState::Failed, "error", out.status);
    std::erase_if(running_, [](const auto& s) { return s->done; });
    return;
  }
  const std::vector<int32_t>& sampled = out.sampled;
  const double step_ms = out.step_ms;
  int decoded = 0, generated = 0;
  // Every token of a step is sampled at the same moment: one timestamp for all.
  const auto t = Clock::now();
  std::vector<std::pair<Sequence*, const char*>> ending;
  for (size_t i = 0; i < live.size(); ++i) {
    Sequence& s = *live_owners[i];
    s.n_past += live[i].n;
    s.kv->publish(s.gen->token_data(), s.n_past);
    // The next query (at n_past) attends from n_past + 1 - window on.
    if (const int w = s.model->slot->sliding_window; w > 0) s.kv->release_before(s.n_past + 1 - w);
    if (live[i].n == 1) ++decoded;
    if (!live[i].logits) continue;
    const int32_t id = sampled[i];
    if (s.gen->ends_with_eos(id)) {
      ending.push_back({&s, "eos"});
      continue;
    }
    ++generated;
    const TokenEvent token = s.gen->accept(id);
    if (!s.has_first) {
      s.has_first = true;
      s.ttft_ms = static_cast<double>(epoch_ms() - s.created_ms);
      metrics_.on_first_token(s.ttft_ms);
    } else {
      metrics_.on_inter_token(ms_between(s.last_token, t), s.req.interactive);
    }
    s.last_token = t;
    Event ev;
    ev.type = EventType::Token;
    ev.job = s.id;
    ev.index = token.index;
    ev.token_id = token.id;
    ev.text = token.text;
    s.segment += ev.text;
    hub_.publish(ev);
    if (const size_t end = segment_end(s.segment); end != std::string::npos) {
      Event seg;
      seg.type = EventType::Segment;
      seg.job = s.id;
      seg.text = s.segment.substr(0, end);
      s.segment.erase(0, end);
      hub_.publish(seg);
    }
    if (s.gen->new_ids().size() % 8 == 0) {
      Event pr;
      pr.type = EventType::Progress;
      pr.job = s.id;
      pr.progress = static_cast<double>(s.gen->new_ids().size()) / s.req.max_new_tokens;
      hub_.publish(pr);
    }
    if (const char* reason = s.gen->end_reason()) ending.push_back({&s, reason});
  }
  // After every token of the step is out: finishing writes the database,
  // which must not delay the other sequences' tokens; several ends are one
  // transaction (one disk sync, not one each).
  if (ending.size() > 1) end_together(ending);
  else
    for (auto& [s, reason] : ending) finish(*s, JobState::Completed, reason);
  std::erase_if(running_, [](const auto& s) { return s->done; });
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_tokens_.clear();
    for (const auto& s : running_) live_tokens_[s->id] = static_cast<int>(s->gen->new_ids().size());
  }
  metrics_.on_step(now, decoded, generated, step_ms);
}

void Scheduler::finish(Sequence& s, JobState state, const std::string& reason, const Status& error) {
  const int64_t now = epoch_ms();
  JobStats stats;
  stats.prompt_tokens = s.n_prompt;
  stats.new_tokens = s.gen ? static_cast<int>(s.gen->new_ids().size()) : 0;
  stats.cached_prompt_tokens = s.cached_prompt_tokens;
  stats.queue_wait_ms = s.started_ms ? static_cast<double>(s.started_ms - s.created_ms) : static_cast<double>(now - s.created_ms);
  stats.time_to_first_token_ms = s.ttft_ms;
  stats.total_ms = static_cast<double>(now - s.created_ms);
  const double gen_ms = s.started_once ? ms_between(s.started, Clock::now()) : 0.0;
  stats.tokens_per_s = gen_ms > 0 ? stats.new_tokens * 1000.0 / gen_ms : 0.0;
  Event ev;
  ev.job = s.id;
  ev.stats = stats;
  if (state == JobState::Completed) {
    TextResult r;
    r.text = s.gen->text();
    r.prompt_ids = s.gen->prompt_ids();
    r.ids = s.gen->new_ids();
    r.stats.prompt_tokens = s.n_prompt;
    r.stats.new_tokens = stats.new_tokens;
    r.stats.new_tokens_per_s = stats.tokens_per_s;
    r.stats.stop_reason = reason;
    r.stats.seed = s.gen->seed();
    r.logprobs = s.gen->logprobs();  // API server: logprobs (text/generation)
    const json result = {{"text", r.text},
                         {"stop_reason", reason},
                         {"prompt_ids", r.prompt_ids},
                         {"ids", r.ids},
                         {"seed", r.stats.seed},
                         {"stats",
                          {{"queue_wait_ms", stats.queue_wait_ms},
                           {"time_to_first_token_ms", stats.time_to_first_token_ms},
                           {"total_ms", stats.total_ms},
                           {"tokens_per_s", stats.tokens_per_s},
                           {"prompt_tokens", stats.prompt_tokens},
                           {"cached_prompt_tokens", stats.cached_prompt_tokens},
                           {"new_tokens", stats.new_tokens}}}};
    if (!s.segment.empty() || s.gen->released() < r.text.size()) {
      Event seg;
      seg.type = EventType::Segment;
      seg.job = s.id;
      seg.text = s.segment + r.text.substr(std::min(s.gen->released(), r.text.size()));
      hub_.publish(seg);
    }
    ev.result = std::move(r);
    s.kv.reset();
    s.done = true;
    return end_job(ev, state, now, result.dump(-1, ' ', false, json::error_handler_t::replace), s.model->version, s.model->name,
                   {}, {s.model->slot->device, s.model->slot->precision, engine_build()});
  }
  s.kv.reset();
  s.done = true;
  end_job(ev, state, now, "", "", "", error);
}

thread_local std::vector<Scheduler::DeferredEnd>* Scheduler::deferred_ends_ = nullptr;

void Scheduler::end_together(const std::vector<std::pair<Sequence*, const char*>>& ending) {
  std::optional<runtime::JobDb::Batch> batch;
  try {
    batch.emplace(db_);
  } catch (const std::exception& e) {
    storage_failed(e);  // no batch: each end on its own, as one alone
  }
  std::vector<DeferredEnd> ends;
  if (batch) deferred_ends_ = &ends;
  for (const auto& [s, reason] : ending) finish(*s, JobState::Completed, reason);
  deferred_ends_ = nullptr;
  if (!batch) return;
  try {
    batch->commit();
    storage_recovered();
  } catch (const std::exception& e) {
    const Status st = storage_failed(e);
    for (DeferredEnd& d : ends)
      if (d.written) mark_unsaved(d.ev, d.state, st);
  }
  batch.reset();  // the connection back to the other threads before the events go out
  for (const DeferredEnd& d : ends) announce_end(d.ev, d.state, d.now_ms);
}

void Scheduler::mark_unsaved(Event& ev, JobState& state, const Status& st) {
  // A result that cannot be saved is no result: the job fails with the
  // reason (a cancel stays a cancel), which unsaved_ holds and
  // retry_unsaved() writes when it can; until then the database says
  // "running" and Engine::job() says what happened.
  Status end;
  if (state != JobState::Cancelled) {
    state = JobState::Failed;
    end = Status::error(st.code, "job " + std::to_string(ev.job) + " could not be saved: " + st.message);
    ev.type = EventType::Failed;
    ev.code = end.code;
    ev.message = end.message;
    ev.result = {};
    ev.files.clear();
  }
  std::lock_guard<std::mutex> lock(storage_mu_);
  unsaved_[ev.job] = {state, end};
}

void Scheduler::end_job(Event ev, JobState state, int64_t now, const std::string& result_json, const std::string& version,
                        const std::string& name, const Status& error, const runtime::RunRecord& run) {
  bool written = false;
  try {
    if (state == JobState::Completed) {
      ev.type = EventType::Completed;
      if (!db_.complete(ev.job, result_json, version, now, name, run)) {
        state = JobState::Cancelled;  // cancelled by another process in the same instant
        ev.type = EventType::Cancelled;
      }
    } else if (state == JobState::Cancelled) {
      db_.cancel(ev.job, now);
      ev.type = EventType::Cancelled;
    } else {
      db_.fail(ev.job, std::string(status_code_name(error.code)), error.message, now);
      ev.type = EventType::Failed;
      ev.code = error.code;
      ev.message = error.message;
    }
    written = true;
    if (!deferred_ends_) storage_recovered();  // in a batch: once it commits
  } catch (const std::exception& e) {
    // The end cannot be written (a full disk).
    mark_unsaved(ev, state, storage_failed(e));
  }
  if (deferred_ends_) {
    deferred_ends_->push_back({std::move(ev), state, now, written});
    return;
  }
  announce_end(ev, state, now);
}

void Scheduler::announce_end(const Event& ev, JobState state, int64_t now) {
  // Published before the job leaves the lane: once idle() holds (wait_idle),
  // every job's last event is in its subscribers' queues.
  hub_.publish(ev);
  {
    std::lock_guard<std::mutex> lock(lane_mu_);
    finished_.insert(ev.job);
    lane_ids_.erase(ev.job);
  }
  metrics_.on_finish(state, now);
  release_quarantine(ev.job);
}

void Scheduler::announce_cancelled(JobId id, int64_t now) {
  Event ev;
  ev.type = EventType::Cancelled;
  ev.job = id;
  hub_.publish(ev);
  metrics_.on_finish(JobState::Cancelled, now);
  release_quarantine(id);
}

void Scheduler::fail_unreadable(JobId id, const Status& error, int64_t now) {
  try {
    db_.fail(id, std::string(status_code_name(StatusCode::InvalidArgument)), error.message, now);
  } catch (const std::exception& e) {
    storage_failed(e);
    std::lock_guard<std::mutex> lock(storage_mu_);
    unsaved_[id] = {JobState::Failed, Status::error(StatusCode::InvalidArgument, error.message)};
  }
  release_quarantine(id);
  Event ev;
  ev.type = EventType::Failed;
  ev.job = id;
  ev.code = StatusCode::InvalidArgument;
  ev.message = error.message;
  hub_.publish(ev);
  metrics_.on_finish(JobState::Failed, now);
}

// ---- storage errors and quarantine ------------------------------------------

void Scheduler::requeue_at_shutdown(JobId id) {
  try {
    db_.requeue(id);
  } catch (const std::exception& e) {
    storage_failed(e);
  }
}

Status Scheduler::storage_failed(const std::exception& e) {
  const auto* err = dynamic_cast<const Error*>(&e);
  const Status st = Status::error(err ? err->code() : StatusCode::Io, e.what());
  bool first;
  {
    std::lock_guard<std::mutex> lock(storage_mu_);
    first = storage_error_.ok();
    storage_error_ = st;
  }
  storage_bad_ = true;
  storage_retry_ms_ = epoch_ms() + kStorageRetryMs;
  if (first) {  // once per episode, not once per retry
    Event ev;
    ev.type = EventType::Alert;
    ev.code = st.code;
    ev.message = "no job starts until the job database can be written again: " + st.message;
    hub_.publish(ev);
  }
  return st;
}

void Scheduler::storage_recovered() {
  if (!storage_bad_.load()) return;
  storage_bad_ = false;
  std::lock_guard<std::mutex> lock(storage_mu_);
  storage_error_ = {};
}

bool Scheduler::storage_blocked(int64_t now) const { return storage_bad_.load() && now < storage_retry_ms_.load(); }

Status Scheduler::storage_status() const {
  std::lock_guard<std::mutex> lock(storage_mu_);
  return storage_error_;
}

std::optional<std::pair<JobState, Status>> Scheduler::unsaved_end(JobId id) const {
  std::lock_guard<std::mutex> lock(storage_mu_);
  auto it = unsaved_.find(id);
  if (it == unsaved_.end()) return std::nullopt;
  return it->second;
}

void Scheduler::retry_unsaved(int64_t now) {
  std::map<JobId, std::pair<JobState, Status>> todo;
  {
    std::lock_guard<std::mutex> lock(storage_mu_);
    if (unsaved_.empty() || now < storage_retry_ms_.load()) return;
    todo = unsaved_;
  }
  for (const auto& [id, end] : todo) {
    try {
      if (end.first == JobState::Cancelled) db_.cancel(id, epoch_ms());
      else db_.fail(id, std::string(status_code_name(end.second.code)), end.second.message, epoch_ms());
      storage_recovered();
    } catch (const std::exception& e) {
      storage_failed(e);
      return;
    }
    std::lock_guard<std::mutex> lock(storage_mu_);
    unsaved_.erase(id);
  }
}

void Scheduler::release_quarantine(JobId id) {
  JobId held = id;
  if (quarantined_.compare_exchange_strong(held, 0)) notify();  // the next suspect may start
}

// ---- image jobs ----------------------------------------------------------------

void Scheduler::image_loop() {
  // This thread takes part in its pool's loops: it yields to text too.
  ThreadPool::lower_this_thread_priority(config_.nice + config_.image_nice);
  CancelScope cancel_scope(&lane_interrupt_);
  auto sweep = [this](std::vector<std::unique_ptr<ImageJob>>& jobs) {
    // Jobs that left without end_job (cancelled between reading and starting) leave the lane too.
    std::lock_guard<std::mutex> lock(lane_mu_);
    for (const auto& j : jobs)
      if (!j || j->done) lane_ids_.erase(j ? j->id : 0);
    std::erase_if(jobs, [](const auto& j) { return !j || j->done; });
  };
  while (!stop_) {
   try {
    const int64_t now = epoch_ms();
    std::vector<std::unique_ptr<ImageJob>> inbox;
    std::set<JobId> cancels;
    std::map<JobId, int> priorities;
    std::unique_ptr<std::set<JobId>> queued;
    {
      std::lock_guard<std::mutex> lock(lane_mu_);
      inbox.swap(image_inbox_);
      cancels.swap(image_cancels_);
      priorities.swap(image_priorities_);
      queued = std::move(image_queued_);
      lane_paused_ = image_paused_;
      lane_wake_ = false;
      // The cancels taken here end their jobs below; a later one sets it again.
      lane_interrupt_ = stop_.load();
    }
    for (auto& j : inbox) image_waiting_.push_back(std::move(j));
    for (auto& j : image_waiting_)
      if (auto it = priorities.find(j->id); it != priorities.end()) j->priority = it->second;
    for (JobId id : cancels) {
      for (auto& j : image_running_)
        if (j->id == id) j->cancel = true;
      for (auto& j : image_waiting_)
        if (j->id == id && !j->done) finish_image(*j, JobState::Cancelled);
    }
    if (queued) {
      // Another process cancelled or cleared these while they waited here
      // (a preempted job is "running" in the database: its cancel comes as a request).
      for (auto& j : image_waiting_) {
        if (!j->done && !j->started_once && !queued->count(j->id)) {
          j->done = true;
          {
            std::lock_guard<std::mutex> lock(lane_mu_);
            finished_.insert(j->id);
          }
          announce_cancelled(j->id, now);
        }
      }
    }
    sweep(image_waiting_);
    admit_images(now);
    sweep(image_waiting_);
    image_queue_depth_ = static_cast<int>(image_waiting_.size());
    image_running_count_ = static_cast<int>(image_running_.size());
    if (!image_running_.empty()) {
      image_step();
      sweep(image_running_);
      image_running_count_ = static_cast<int>(image_running_.size());
      continue;
    }
    std::unique_lock<std::mutex> lock(lane_mu_);
    // Waiting jobs (a paused queue) are looked at again every poll_ms.
    lane_cv_.wait_for(lock, std::chrono::milliseconds(std::max(1, config_.poll_ms)),
                      [this] { return lane_wake_ || stop_.load(); });
   } catch (const std::exception& e) {
    storage_failed(e);  // as in run(): reported, tried again later
    std::unique_lock<std::mutex> lock(lane_mu_);
    lane_cv_.wait_for(lock, std::chrono::milliseconds(kStorageRetryMs), [this] { return stop_.load(); });
   }
  }
  // Shutdown: what was running goes back to the queue.
  for (auto& j : image_running_) requeue_at_shutdown(j->id);
  for (auto& j : image_waiting_)
    if (j->started_once && !j->done) requeue_at_shutdown(j->id);
}

LoadedImage* Scheduler::image_model_for(const ImageRequest& r, const ResolvedModel& resolved, Status& error) {
  // What load_image reads from the request is part of the key.
  const std::string key = resolved.path + "|" + r.prediction + "|" + r.preview_decoder + "|" + r.tokenizer;
  if (auto it = image_models_.find(key); it != image_models_.end()) {
    it->second->last_used = ++use_clock_;
    return it->second.get();
  }
  evict_image_models(runner_->estimate_image_bytes(resolved));
  auto slot = runner_->load_image(r, resolved);
  if (!slot.ok()) {
    error = slot.status();
    return nullptr;
  }
  auto lm = std::make_unique<LoadedImage>();
  lm->slot = std::move(slot.value());
  lm->bytes = lm->slot->bytes;
  lm->key = key;
  lm->version = resolved.digest;
  lm->name = resolved.in_store ? resolved.display : resolved.path;
  lm->last_used = ++use_clock_;
  model_bytes_ += lm->bytes;
  LoadedImage* raw = lm.get();
  image_models_[key] = std::move(lm);
  return raw;
}

bool Scheduler::preempt_image_for(const ImageJob& requester, int64_t now) {
  ImageJob* victim = preemption_victim(image_running_, &requester, now);
  if (!victim) return false;
  // Its images stay in flight (latents, sampler state): it resumes at its next step.
  metrics_.on_preempt();
  auto it = std::find_if(image_running_.begin(), image_running_.end(), [&](const auto& p) { return p.get() == victim; });
  image_waiting_.push_back(std::move(*it));
  image_running_.erase(it);
  return true;
}

void Scheduler::admit_images(int64_t now) {
  if (lane_paused_ || image_waiting_.empty() || storage_blocked(now)) return;
  order_for_admission(image_waiting_, now);
  const auto running_images = [&] {
    int images = 0;
    for (const auto& j : image_running_) images += j->req.batch_size;
    return images;
  };
  int images = running_images();
  // A snapshot: preemption below appends to image_waiting_.
  std::vector<ImageJob*> order;
  for (auto& p : image_waiting_) order.push_back(p.get());
  for (ImageJob* jp : order) {
    ImageJob& j = *jp;
    if (j.done) continue;
    // A job larger than the whole budget still runs, alone.
    const auto full = [&] { return images > 0 && images + j.req.batch_size > config_.max_image_batch; };
    while (full() && preempt_image_for(j, now)) images = running_images();
    if (full()) break;  // admission in priority order: lower jobs wait behind this one
    if (!j.run) {
      const Result<ResolvedModel> resolved = resolve_image_model(j.req.model, config_.store_dir);
      if (!resolved.ok()) {
        finish_image(j, JobState::Failed, gone_since_queued(j.req.model, resolved.status()));
        continue;
      }
      if (runner_->is_one_pass(resolved.value())) {
        // A one-pass generator (QuickDraw) has no steps to share: made here, whole.
        j.version = resolved->digest;
        j.name = resolved->in_store ? resolved->display : resolved->path;
        if (!start_job(j, now)) {
          if (j.done) continue;
          break;  // the database takes no writes: it waits
        }
        metrics_.on_image_lane(true, epoch_us());
        auto made = runner_->generate_one_pass(j.req);
        metrics_.on_image_lane(false, epoch_us());
        if (!made.ok()) {
          finish_image(j, JobState::Failed, made.status());
          continue;
        }
        j.one_pass = std::move(made.value());
        finish_image(j, JobState::Completed);
        continue;
      }
      Status err;
      set_lane_busy({j.id});
      LoadedImage* m = image_model_for(j.req, resolved.value(), err);
      set_lane_busy({});
      if (!m && err.code == StatusCode::Cancelled) return;  // the loop's next turn ends it (or shuts down)
      if (!m) {
        finish_image(j, JobState::Failed, err);
        continue;
      }
      if (!start_job(j, now)) {
        if (j.done) continue;
        break;  // the database takes no writes: it waits
      }
      j.model = m;
      // Encodes the prompts (and an init image): a model call, done once.
      set_lane_busy({j.id});
      err = guarded([&]() -> Status {
        j.run = std::make_unique<ImageRun>(*m->slot->model, j.req, config_.image_memory_bytes);
        return Status{};
      });
      set_lane_busy({});
      if (err.code == StatusCode::Cancelled) {
        // Started and interrupted: the loop's next turn ends it (a stop requeues it).
        drop_image_model_if_idle(m);
        return;
      }
      if (!err.ok()) {
        finish_image(j, JobState::Failed, err);
        continue;
      }
    }
    images += j.req.batch_size;
    auto it = std::find_if(image_waiting_.begin(), image_waiting_.end(), [&](const auto& p) { return p.get() == jp; });
    image_running_.push_back(std::move(*it));
    image_waiting_.erase(it);
  }
  // The lane's sweep removes the finished entries (and releases their ids).
}

void Scheduler::image_step() {
  for (auto& j : image_running_)
    if (j->cancel && !j->done) finish_image(*j, JobState::Cancelled);
  std::erase_if(image_running_, [](const auto& j) { return j->done; });
  if (image_running_.empty()) return;
  // One model per step, taking turns; its jobs' live images share the calls.
  std::vector<LoadedImage*> models;
  for (const auto& j : image_running_)
    if (std::find(models.begin(), models.end(), j->model) == models.end()) models.push_back(j->model);
  LoadedImage* m = models[image_turn_++ % models.size()];
  std::vector<ImageJob*> jobs;
  std::vector<image::ImageTask*> tasks;
  for (auto& j : image_running_)
    if (j->model == m) {
      jobs.push_back(j.get());
      for (image::ImageTask* t : j->run->live()) tasks.push_back(t);
    }
  const auto t0 = Clock::now();
  std::vector<JobId> ids;
  for (ImageJob* j : jobs) ids.push_back(j->id);
  set_lane_busy(ids);
  const Status st = runner_->execute_image(*m->slot, tasks);
  set_lane_busy({});
  if (st.code == StatusCode::Cancelled) {
    // Interrupted inside the call: the tasks were not advanced (a sampler
    // feeds only after the network returns), so the others redo this step;
    // the cancelled job ends at the loop's next turn.
    for (ImageJob* j : jobs) {
      std::lock_guard<std::mutex> lock(lane_mu_);
      if (image_cancels_.count(j->id)) j->cancel = true;
    }
    for (ImageJob* j : jobs)
      if (j->cancel && !j->done) finish_image(*j, JobState::Cancelled);
    std::erase_if(image_running_, [](const auto& j) { return j->done; });
    drop_image_model_if_idle(m);
    return;
  }
  metrics_.on_image_step(static_cast<int>(tasks.size()), ms_between(t0, Clock::now()));
  if (!st.ok()) {
    for (ImageJob* j : jobs) finish_image(*j, JobState::Failed, st);
    std::erase_if(image_running_, [](const auto& j) { return j->done; });
    return;
  }
  for (ImageJob* j : jobs) {
    const double seconds = ms_between(j->started, Clock::now()) / 1000.0;
    int done_steps = 0, all_steps = 0;
    set_lane_busy({j->id});
    std::vector<ImageProgress> reports;
    const Status previewed = guarded([&]() -> Status {
      reports = j->run->progress(seconds, true);  // a TAESD preview decoder runs here
      return Status{};
    });
    if (!previewed.ok() && previewed.code != StatusCode::Cancelled) {
      set_lane_busy({});
      finish_image(*j, JobState::Failed, previewed);
      continue;
    }
    for (ImageProgress& p : reports) {
      done_steps += p.step;
      all_steps += p.steps;
      Event ev;
      ev.type = EventType::Preview;
      ev.job = j->id;
      ev.image = std::move(p);
      hub_.publish(ev);
    }
    Event pr;
    pr.type = EventType::Progress;
    pr.job = j->id;
    pr.progress = all_steps ? static_cast<double>(done_steps) / all_steps : 0.0;
    hub_.publish(pr);
    Status err = guarded([&]() -> Status {
      j->run->advance();  // decodes a finished round
      return Status{};
    });
    if (err.code == StatusCode::Cancelled) {
      // Interrupted while decoding (or writing below): the loop's next turn
      // ends it as cancelled, or the shutdown requeues it.
    } else if (!err.ok()) {
      finish_image(*j, JobState::Failed, err);
    } else if (j->run->done()) {
      finish_image(*j, JobState::Completed);
    }
    set_lane_busy({});
  }
  std::erase_if(image_running_, [](const auto& j) { return j->done; });
}

void Scheduler::finish_image(ImageJob& j, JobState state, const Status& error) {
  const int64_t now = epoch_ms();
  Event ev;
  ev.job = j.id;
  ev.stats.queue_wait_ms = static_cast<double>((j.started_ms ? j.started_ms : now) - j.created_ms);
  ev.stats.total_ms = static_cast<double>(now - j.created_ms);
  if (state == JobState::Completed) {
    // DATA_DIR/images/job-ID.png unless the request names a file; a batch numbers them.
    const std::vector<ImageResult>& results = j.run ? j.run->results() : j.one_pass;
    std::string base = j.req.output;
    if (base.empty()) base = (std::filesystem::path(config_.data_dir) / "images" / ("job-" + std::to_string(j.id) + ".png")).string();
    std::error_code ec;
    if (const auto parent = std::filesystem::path(base).parent_path(); !parent.empty())
      std::filesystem::create_directories(parent, ec);
    std::vector<std::string> files;
    json seeds = json::array();
    Status written;
    for (size_t i = 0; i < results.size() && written.ok(); ++i) {
      const std::string path = numbered_output_path(base, static_cast<int>(i), static_cast<int>(results.size()));
      written = write_png(results[i], j.req, path);
      files.push_back(path);
      seeds.push_back(results[i].seed);
    }
    if (written.code == StatusCode::Cancelled && stop_) return;  // still running: the shutdown requeues it
    if (written.code == StatusCode::Cancelled) return finish_image(j, JobState::Cancelled);
    if (!written.ok()) return finish_image(j, JobState::Failed, written);
    const json result = {{"files", files}, {"seeds", seeds}, {"stats", {{"queue_wait_ms", ev.stats.queue_wait_ms}, {"total_ms", ev.stats.total_ms}}}};
    ev.files = files;
    const std::string version = j.model ? j.model->version : j.version, name = j.model ? j.model->name : j.name;
    j.run.reset();
    j.done = true;
    // Images run on the CPU (a GPU's image path is issue 34).
    runtime::RunRecord run{"cpu", j.model ? j.model->slot->precision : "weights:file act:f32", engine_build()};
    return end_job(ev, state, now, result.dump(-1, ' ', false, json::error_handler_t::replace), version, name, {}, run);
  }
  j.run.reset();
  j.done = true;
  end_job(ev, state, now, "", "", "", error);
}

}  // namespace atelier
