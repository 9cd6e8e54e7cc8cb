// The scheduler of one device: it turns the durable queue into running jobs
// and hands their work to the device's Runner (serve/runner.h) as plans.
//
// One job life cycle for text and images (a JobBase each): read from the
// queue, admitted in order of aged priority (a waiting job gains a point per
// aging_ms, interactive ones start kInteractiveBoost higher) when its memory
// fits, preempted by a higher one when memory or the image batch runs out
// (kept in memory, resumed later: a text job recomputes its KV, an image job
// continues at its next step), cancelled within one step, finished into the
// database with an event and the metrics.
//
// Text, on the executor thread: continuous batching shaped as vLLM's
// schedule() / update_from_output(). At every step running sequences decode
// one token each, admitted ones prefill in chunks under a per-step token
// budget, finished and cancelled ones leave at once. KV memory is paged
// (text/kv_cache.h): a job starts only when its prompt's blocks fit,
// identical prompt prefixes share blocks, and the lowest-priority sequence is
// preempted (and later recomputed) when memory runs out.
//
// Images, on the image lane: a second thread whose device calls run at a
// lower OS priority (EngineConfig::image_nice), so a text step never waits for
// a UNet call (a 512x512 one takes seconds here) and takes the cores while it
// runs; alone, images use every core. The executor thread reads the queue and
// hands image jobs, cancels and priority changes to the lane. Every image
// step advances the running image jobs of one model by one network
// evaluation, all their images in one UNet call per latent size (each row its
// own timestep), so a new image job joins at the next step and a cancelled
// one leaves before the next call. A Preview event follows every step.
#pragma once

#include <atelier/engine.h>
#include <atelier/models.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "serve/events.h"
#include "serve/job_db.h"
#include "serve/metrics.h"
#include "serve/runner.h"

namespace atelier {

struct JobBase;
struct Sequence;
struct LoadedModel;
struct ImageJob;
struct LoadedImage;
struct TextPlan;

class Scheduler {
 public:
  Scheduler(const EngineConfig& config, runtime::JobDb& db, EventHub& hub, MetricsRecorder& metrics,
            std::unique_ptr<Runner> runner);
  ~Scheduler();  // stops the executor; running jobs go back to the queue

  void notify();                      // something changed in the queue
  void request_cancel(JobId id);      // in-process fast path (takes effect at the next step)
  bool idle() const;
  std::string device() const { return runner_->device(); }
  void fill_metrics(EngineMetrics& m) const;
  // New tokens a running job has produced so far (-1 when not running here).
  int live_new_tokens(JobId id) const;
  const AlertRules& alert_rules() const { return rules_; }
  void set_alert_rules(const AlertRules& rules);
  // The job database could not be written (a full disk): the last such
  // error, Ok once a write succeeds again. Meanwhile no job starts.
  Status storage_status() const;
  // A job that ended here while its end could not be written: the state and
  // error it ended with (the database still says "running" until a retry
  // writes it). Nothing for other jobs.
  std::optional<std::pair<JobState, Status>> unsaved_end(JobId id) const;

 private:
  void run();
  void refresh_queue(int64_t now_ms);
  bool admit(int64_t now_ms);
  void step();  // schedule_text, the runner's execute_text, update_from_output
  bool schedule_text(TextPlan& plan);  // false: nothing to run this step
  void update_from_output(const TextPlan& plan, const TextOutput& out);
  // The life cycle both kinds share.
  double effective_priority(const JobBase& j, int64_t now_ms) const;
  template <class Job>
  void order_for_admission(std::vector<std::unique_ptr<Job>>& jobs, int64_t now_ms) const;
  // The running job to preempt for REQUESTER (nullptr: any): the lowest
  // aged priority, the newest among equals; nullptr when none ranks below it.
  template <class Job>
  Job* preemption_victim(std::vector<std::unique_ptr<Job>>& running, const JobBase* requester, int64_t now_ms) const;
  // Marks J running (first admission only): the database, its Started event.
  // False when it was cancelled meanwhile (J is then done).
  bool start_job(JobBase& j, int64_t now_ms);
  void finish(Sequence& s, JobState state, const std::string& reason, const Status& error = {});
  // Records a job's end in the database (Completed: with its result, unless
  // another process cancelled it that instant) and publishes EV as the final event.
  void end_job(Event ev, JobState state, int64_t now_ms, const std::string& result_json, const std::string& version,
               const std::string& name, const Status& error = {}, const runtime::RunRecord& run = {});
  // Group commit (the text lane): the ends of a step's jobs written in one
  // transaction (one disk sync), their events held until it commits. While
  // the text thread finishes them, end_job appends here instead of publishing.
  struct DeferredEnd {
    Event ev;
    JobState state;
    int64_t now_ms;
    bool written;  // its own write succeeded (it waits for the commit)
  };
  static thread_local std::vector<DeferredEnd>* deferred_ends_;
  void end_together(const std::vector<std::pair<Sequence*, const char*>>& ending);
  // An end that cannot be saved: fails with the reason (a cancel stays one), kept in unsaved_.
  void mark_unsaved(Event& ev, JobState& state, const Status& st);
  // The end's event and bookkeeping, once it is written (or known unsaved).
  void announce_end(const Event& ev, JobState state, int64_t now_ms);
  // A step reported its device lost (TextOutput::device_lost): requeue, drop its models, carry on on the CPU.
  void device_lost(const Status& why);
  void fail_unreadable(JobId id, const Status& error, int64_t now_ms);  // a stored request that does not parse
  void announce_cancelled(JobId id, int64_t now_ms);  // a job cancelled before it ran here: event and count
  bool preempt_lowest(const Sequence* keep);
  // A database call failed (a full disk, an I/O error): records it, says so
  // once (an Alert), and holds admission back for kStorageRetryMs. Returns it as a Status.
  Status storage_failed(const std::exception& e);
  void storage_recovered();
  bool storage_blocked(int64_t now_ms) const;
  void retry_unsaved(int64_t now_ms);  // writes the ends unsaved_ holds, when the database takes them
  // At shutdown: a job that was running goes back to the queue (its partial
  // output discarded); one whose requeue cannot be written stays "running"
  // and the next start recovers it.
  void requeue_at_shutdown(JobId id);
  // Quarantine (job_db.h, recover()): the suspect held here, 0 when none; a job's end releases it.
  void release_quarantine(JobId id);
  LoadedModel* model_for(const std::string& ref, Status& error);  // resolves REF in the model store
  // The model cache (both threads, each its own models): unloads this
  // thread's least recently used idle models until NEED_BYTES more fit.
  void evict_text_models(int64_t need_bytes);
  void evict_image_models(int64_t need_bytes);
  bool ended_here(JobId id) const;  // finished_ (either thread)
  // Image jobs (scheduler.cpp, bottom), on the image lane's thread.
  void image_loop();
  void hand_to_lane(std::unique_ptr<ImageJob> job);  // executor thread
  bool in_lane(JobId id) const;
  void admit_images(int64_t now_ms);
  // Sends the lowest running image job below REQUESTER back to waiting (its
  // images in flight kept); false when none ranks below it.
  bool preempt_image_for(const ImageJob& requester, int64_t now_ms);
  void image_step();
  void finish_image(ImageJob& j, JobState state, const Status& error = {});
  // Cancel inside a model call (issue 35; core/cancel.h): the lane's thread
  // runs under lane_interrupt_, which a cancel of a job the current call
  // works for (lane_busy_) or the scheduler's stop sets; the networks stop
  // between blocks and the thread pool within a slice.
  void cancel_in_lane(JobId id);                  // executor thread: hands the cancel to the lane
  void set_lane_busy(std::vector<JobId> ids);      // image lane: the jobs its next call works for ({} after it)
  // After a call was interrupted: unloads M unless a job still holds it, so
  // the workspace a huge request grew is freed with the job.
  void drop_image_model_if_idle(LoadedImage* m);
  LoadedImage* image_model_for(const ImageRequest& r, const ResolvedModel& resolved, Status& error);

  EngineConfig config_;
  runtime::JobDb& db_;
  EventHub& hub_;
  MetricsRecorder& metrics_;
  AlertRules rules_;
  std::unique_ptr<Runner> runner_;
  std::string poison_prompt_;  // $ATELIER_TEST_CRASH_PROMPT (the fault tests' poison job), "" = none

  // Storage errors (both threads).
  mutable std::mutex storage_mu_;
  Status storage_error_;                              // Ok, or the last failed write
  std::map<JobId, std::pair<JobState, Status>> unsaved_;  // ends not yet written
  std::atomic<bool> storage_bad_{false};
  std::atomic<int64_t> storage_retry_ms_{0};          // admission waits until then
  std::atomic<JobId> quarantined_{0};                 // the suspect held here (executor takes, either thread releases)
  int held_back_ = 0;                                 // queued jobs quarantine keeps out (executor thread)

  mutable std::mutex mu_;             // guards the fields below shared with API threads
  std::condition_variable cv_;
  bool wake_ = false;
  std::set<JobId> cancel_requests_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> idle_{true};
  struct KvStats {
    int used = 0, free = 0, cached = 0;
  } kv_stats_;
  int queue_depth_ = 0, running_count_ = 0;
  std::map<JobId, int> live_tokens_;  // running jobs' progress, refreshed after every step

  // Executor-thread state.
  std::map<std::string, std::unique_ptr<LoadedModel>> models_;
  std::vector<std::unique_ptr<Sequence>> waiting_, running_;
  std::set<JobId> known_;
  int64_t last_poll_ms_ = 0;
  int64_t step_counter_ = 0;

  // Between the executor thread and the image lane.
  mutable std::mutex lane_mu_;
  std::condition_variable lane_cv_;
  bool lane_wake_ = false;
  std::vector<std::unique_ptr<ImageJob>> image_inbox_;  // queued jobs handed over, not yet taken
  std::set<JobId> image_cancels_;
  std::map<JobId, int> image_priorities_;                // priority changes of waiting image jobs
  std::unique_ptr<std::set<JobId>> image_queued_;        // the queue's ids at the last refresh
  // The pause flag read just before that refresh: the lane admits on what
  // the executor has handed over, so a job queued before a resume is seen first.
  bool image_paused_ = true;
  std::set<JobId> lane_ids_;  // handed to the lane and not yet ended there
  std::set<JobId> lane_busy_;  // the jobs the lane's current model call works for
  std::atomic<bool> lane_interrupt_{false};  // the lane thread's cancel flag (core/cancel.h)
  std::set<JobId> finished_;  // ended here: a late cancel request must not announce them again
  std::atomic<int> image_queue_depth_{0}, image_running_count_{0};
  std::atomic<int64_t> device_losses_{0};
  std::atomic<int64_t> model_bytes_{0};  // loaded models of both threads (the cache budget)
  std::atomic<int64_t> use_clock_{0};    // LRU order of the models of both threads

  // Image-lane state.
  std::map<std::string, std::unique_ptr<LoadedImage>> image_models_;
  std::vector<std::unique_ptr<ImageJob>> image_waiting_, image_running_;
  size_t image_turn_ = 0;  // which model's image jobs step next (round robin)
  bool lane_paused_ = true;  // image_paused_ as the lane last took it

  std::thread thread_, image_thread_;
};

}  // namespace atelier
