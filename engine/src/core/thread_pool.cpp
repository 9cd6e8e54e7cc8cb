#include "core/thread_pool.h"

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "core/cancel.h"

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

// A share's unclaimed units [front, back) in one word, so that its owner
// (from the front) and a thief (from the back) claim batches by one
// compare-and-swap each.
constexpr uint64_t pack(int64_t front, int64_t back) {
  return static_cast<uint64_t>(front) | (static_cast<uint64_t>(back) << 32);
}
constexpr int64_t front_of(uint64_t v) { return static_cast<int64_t>(v & 0xFFFFFFFFu); }
constexpr int64_t back_of(uint64_t v) { return static_cast<int64_t>(v >> 32); }

// Batches per share (at most; they shrink towards its end): a thread that
// loses its core mid-share holds up at most one batch; the rest is taken over
// by the others.
constexpr int64_t kBatchesPerShare = 4;

// Under a cancel flag (core/cancel.h) a claimed batch runs in slices of about
// this long, sized as it goes (from one unit, doubling while a slice is
// quicker, halving while slower), and stops once the flag is set: a loop
// whose batch would take minutes (attention over a 4096x4096 picture's
// latents) stops within a slice. Results are the same (split-invariant loops).
constexpr auto kSliceFast = std::chrono::milliseconds(5), kSliceSlow = std::chrono::milliseconds(40);

void run_sliced(const std::function<void(int64_t, int64_t)>& fn, int64_t b, int64_t e, const std::atomic<bool>& cancel,
                int64_t& slice) {
  while (b < e && !cancel.load(std::memory_order_relaxed)) {
    const int64_t s = std::min(e, b + slice);
    const auto t0 = std::chrono::steady_clock::now();
    fn(b, s);
    const auto took = std::chrono::steady_clock::now() - t0;
    if (took < kSliceFast) slice *= 2;
    else if (took > kSliceSlow && slice > 1) slice /= 2;
    b = s;
  }
}

}  // namespace

int ThreadPool::hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::lower_this_thread_priority(int nice) {
#if defined(__linux__)
  if (nice <= 0) return;
  // On Linux a nice value belongs to a thread (its tid), not to the process.
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) ::setpriority(PRIO_PROCESS, tid, std::min(19, now + nice));
#else
  (void)nice;
#endif
}

ThreadPool::ThreadPool(int threads, int nice)
    : n_threads_(threads > 0 ? threads : hardware_threads()), shares_(new Share[static_cast<size_t>(n_threads_)]) {
  for (int i = 1; i < n_threads_; ++i)
    workers_.emplace_back([this, i, nice] {
      lower_this_thread_priority(nice);
      worker(i);
    });
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
  const std::atomic<bool>* cancel = current_cancel_flag();
  if (cancel && cancel->load(std::memory_order_relaxed)) return;  // cancelled: the call's remaining loops are skipped
  if (n_threads_ == 1 || n == 1) {
    if (cancel) {
      int64_t slice = 1;
      run_sliced(fn, 0, n, *cancel, slice);
    } else {
      fn(0, n);
    }
    return;
  }
  if (n > 0x7FFFFFFF) {  // beyond a packed share: halve the range instead
    const int64_t half = n / 2;
    parallel_for(half, fn);
    parallel_for(n - half, [&](int64_t b, int64_t e) { fn(half + b, half + e); });
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    cancel_ = cancel;
    batch_ = std::max<int64_t>(1, (n / n_threads_ + kBatchesPerShare - 1) / kBatchesPerShare);
    for (int t = 0; t < n_threads_; ++t)
      shares_[t].range.store(pack(n * t / n_threads_, n * (t + 1) / n_threads_), std::memory_order_relaxed);
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();  // no system call when every worker is spinning
  run_share(0);
  auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
  job_ = nullptr;
}

// The thread's own share front to back in batches (one contiguous stream, as
// a static split gives), then the other shares' leftovers from their backs.
// Every unit runs exactly once; which thread runs it never changes a result
// (the kernels' loops are split-invariant).
void ThreadPool::run_share(int index) {
  const std::function<void(int64_t, int64_t)>& fn = *job_;
  auto claim = [&](int t, bool from_front, int64_t& b, int64_t& e) {
    std::atomic<uint64_t>& r = shares_[t].range;
    uint64_t v = r.load(std::memory_order_acquire);
    for (;;) {
      const int64_t f = front_of(v), bk = back_of(v);
      if (f >= bk) return false;
      // Halving towards the end (guided): the last batches are small, so
      // the threads finish together.
      const int64_t k = std::min(batch_, std::max<int64_t>(1, (bk - f) / 2));
      const uint64_t next = from_front ? pack(f + k, bk) : pack(f, bk - k);
      if (r.compare_exchange_weak(v, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
        b = from_front ? f : bk - k;
        e = from_front ? f + k : bk;
        return true;
      }
    }
  };
  const std::atomic<bool>* cancel = cancel_;
  int64_t slice = 1;
  auto run = [&](int64_t b, int64_t e) {
    if (cancel) run_sliced(fn, b, e, *cancel, slice);
    else fn(b, e);
  };
  // Once cancelled, what is unclaimed stays so: the loop ends when every thread has stopped.
  auto stopped = [&] { return cancel && cancel->load(std::memory_order_relaxed); };
  int64_t b = 0, e = 0;
  while (!stopped() && claim(index, true, b, e)) run(b, e);
  for (int s = 1; s < n_threads_; ++s)
    while (!stopped() && claim((index + s) % n_threads_, false, b, e)) run(b, e);
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
    run_share(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // the caller may be between its check and its wait
      done_cv_.notify_one();
    }
  }
}

}  // namespace atelier
