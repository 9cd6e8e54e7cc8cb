#include "serve/events.h"

namespace atelier {

EventHub::~EventHub() {
  std::map<uint64_t, std::shared_ptr<Sub>> subs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    subs.swap(subs_);
  }
  for (auto& [id, sub] : subs) stop_sub(sub);
}

uint64_t EventHub::subscribe(JobId job, EventSink sink) {
  auto sub = std::make_shared<Sub>();
  sub->job = job;
  sub->sink = std::move(sink);
  // The thread owns a reference, so a Sub detached by an unsubscribe from inside its own sink stays alive.
  sub->thread = std::thread([sub] { deliver(*sub); });
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  subs_[id] = std::move(sub);
  return id;
}

void EventHub::unsubscribe(uint64_t id) {
  std::shared_ptr<Sub> sub;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = subs_.find(id);
    if (it == subs_.end()) return;
    sub = it->second;
    subs_.erase(it);
  }
  stop_sub(sub);
}

void EventHub::stop_sub(const std::shared_ptr<Sub>& sub) {
  {
    std::lock_guard<std::mutex> lock(sub->mu);
    sub->stop = true;
  }
  sub->cv.notify_one();
  if (sub->thread.get_id() == std::this_thread::get_id()) {
    sub->thread.detach();  // unsubscribing from inside its own sink; the thread ends after this event
  } else if (sub->thread.joinable()) {
    sub->thread.join();
  }
}

void EventHub::publish(const Event& event) {
  std::vector<std::shared_ptr<Sub>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, sub] : subs_)
      if (sub->job == 0 || sub->job == event.job) targets.push_back(sub);
  }
  for (auto& sub : targets) {
    {
      std::lock_guard<std::mutex> lock(sub->mu);
      std::deque<Event>& q = sub->queue;
      Event* last = q.empty() ? nullptr : &q.back();
      const bool same_job = last && last->job == event.job;
      if (same_job && last->type == event.type &&
          (event.type == EventType::Progress ||
           (event.type == EventType::Preview && last->image.image == event.image.image))) {
        *last = event;  // progress and an image's previews always coalesce: only the newest matters
      } else if (q.size() >= kBufferEvents && event.type == EventType::Token && same_job &&
                 last->type == EventType::Token) {
        last->text += event.text;  // merge under backpressure: the text stays complete
        last->index = event.index;
        last->token_id = event.token_id;
      } else {
        q.push_back(event);  // terminal and segment events are never dropped
      }
    }
    sub->cv.notify_one();
  }
}

void EventHub::deliver(Sub& sub) {
  for (;;) {
    Event ev;
    {
      std::unique_lock<std::mutex> lock(sub.mu);
      sub.cv.wait(lock, [&] { return sub.stop || !sub.queue.empty(); });
      if (sub.queue.empty()) return;  // stopped and drained
      ev = std::move(sub.queue.front());
      sub.queue.pop_front();
    }
    try {
      sub.sink(ev);
    } catch (...) {
      // A throwing subscriber must not take the engine down; its event is dropped.
    }
  }
}

}  // namespace atelier
