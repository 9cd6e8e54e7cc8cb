#include "server/job_events.h"

#include <chrono>

namespace atelier::server {

void EventQueue::push(const Event& event) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(event);
  }
  cv_.notify_one();
}

bool EventQueue::pop(Event& event, int timeout_ms) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); })) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

JobEvents::JobEvents(Engine& engine) : engine_(engine) {
  subscription_ = engine_.subscribe(0, [this](const Event& ev) {
    if (ev.type == EventType::Preview) {
      std::lock_guard lock(preview_mu_);
      preview_ = ev;
    } else if (ev.type == EventType::Completed || ev.type == EventType::Failed || ev.type == EventType::Cancelled) {
      std::lock_guard lock(preview_mu_);
      if (preview_ && preview_->job == ev.job) preview_.reset();
    }
    std::shared_ptr<EventQueue> queue;
    {
      std::lock_guard lock(mu_);
      auto it = watched_.find(ev.job);
      if (it == watched_.end()) return;
      queue = it->second;
    }
    queue->push(ev);
  });
}

JobEvents::~JobEvents() { engine_.unsubscribe(subscription_); }

Result<JobId> JobEvents::submit(const std::function<Result<JobId>()>& submit, const std::shared_ptr<EventQueue>& queue) {
  // The engine publishes without waiting on subscribers, so holding the lock
  // across submit only delays delivery until the job is registered.
  std::lock_guard lock(mu_);
  auto id = submit();
  if (id.ok()) watched_[id.value()] = queue;
  return id;
}

std::optional<Event> JobEvents::latest_preview() {
  std::lock_guard lock(preview_mu_);
  return preview_;
}

void JobEvents::unwatch(JobId job) {
  std::lock_guard lock(mu_);
  watched_.erase(job);
}

}  // namespace atelier::server
