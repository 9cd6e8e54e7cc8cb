// Delivers engine events to subscribers, each on its own thread through a
// bounded buffer, so a slow subscriber never stalls the executor: when a
// buffer is full, Token events of a job merge into the last queued one (no
// text is lost) and Progress events replace the last queued Progress.
#pragma once

#include <atelier/engine.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace atelier {

class EventHub {
 public:
  static constexpr size_t kBufferEvents = 1024;
  ~EventHub();
  uint64_t subscribe(JobId job, EventSink sink);  // job 0: every job
  void unsubscribe(uint64_t id);
  void publish(const Event& event);                // never blocks on a subscriber

 private:
  struct Sub {
    JobId job = 0;
    EventSink sink;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> queue;
    bool stop = false;
    std::thread thread;
  };
  static void deliver(Sub& sub);
  static void stop_sub(const std::shared_ptr<Sub>& sub);

  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::shared_ptr<Sub>> subs_;
};

}  // namespace atelier
