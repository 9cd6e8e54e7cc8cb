#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

namespace atelier {

namespace {

// A forward pass calls parallel_for ~100 times per token, back to back. Waking
// a sleeping worker through a futex took 20-40 us here (a 2048 x 768
// matrix-vector product: 22 us on one thread, 60 us on two), so both sides
// spin this long before they sleep; an idle pool stops spinning after it.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// True when pred() held within kSpin.
template <class Pred>
bool spin_until(Pred&& pred) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return pred();
  }
}

// One contiguous chunk per thread. Chunks taken in turn from a shared
// counter (several per thread) were tried: generation got ~10 % slower (each
// thread's weight stream kept restarting) with no clear gain at 16 rows.
void run_chunk(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int index, int parts) {
  const int64_t begin = n * index / parts, end = n * (index + 1) / parts;
  if (begin < end) fn(begin, end);
}

}  // namespace

int ThreadPool::hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int threads) : n_threads_(threads > 0 ? threads : hardware_threads()) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();  // no system call when every worker is spinning
  run_chunk(fn, n, 0, n_threads_);
  auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
  job_ = nullptr;
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  auto ready = [&] {
    return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunk(*job_, job_n_, index, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // the caller may be between its check and its wait
      done_cv_.notify_one();
    }
  }
}

}  // namespace atelier
