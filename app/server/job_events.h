// Routes engine events to the HTTP requests that wait on their jobs. One
// engine subscription (all jobs) feeds a small queue per request; a job is
// registered under the same lock its submission runs in, so not even its
// Queued event can slip past. Events of jobs no request watches are dropped.
#pragma once

#include <atelier/engine.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

namespace atelier::server {

// The events of one request's jobs (several for n > 1), in arrival order.
class EventQueue {
 public:
  void push(const Event& event);
  // Waits up to timeout_ms for the next event; false on timeout.
  bool pop(Event& event, int timeout_ms);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

class JobEvents {
 public:
  explicit JobEvents(Engine& engine);
  ~JobEvents();
  JobEvents(const JobEvents&) = delete;
  JobEvents& operator=(const JobEvents&) = delete;

  // Runs SUBMIT and, when it gives an id, routes that job's events to QUEUE.
  Result<JobId> submit(const std::function<Result<JobId>()>& submit, const std::shared_ptr<EventQueue>& queue);
  void unwatch(JobId job);

  // The newest Preview of any image job still running (A1111's /progress), if any.
  std::optional<Event> latest_preview();

 private:
  Engine& engine_;
  uint64_t subscription_ = 0;
  std::mutex mu_;
  std::map<JobId, std::shared_ptr<EventQueue>> watched_;
  std::mutex preview_mu_;
  std::optional<Event> preview_;
};

}  // namespace atelier::server
