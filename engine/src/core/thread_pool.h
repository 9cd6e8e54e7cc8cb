// A fixed pool of worker threads that runs the kernels' parallel loops.
// The calling thread takes part, so a pool of N threads uses N-1 workers.
#pragma once

#include <atelier/kernels.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace atelier {

class ThreadPool final : public kernels::Executor {
 public:
  // threads <= 0: one per hardware thread. nice > 0 lowers the workers' OS
  // priority by that much (Linux: per thread), so a background pool (image
  // steps) yields its cores to the text pool whenever both have work.
  explicit ThreadPool(int threads = 0, int nice = 0);
  // Lowers the calling thread's OS priority by NICE (no-op for nice <= 0 or
  // where threads have no priority of their own). Cannot be undone.
  static void lower_this_thread_priority(int nice);
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const override { return n_threads_; }
  // Gives each thread a contiguous share of [0, n), run front to back in a
  // few batches; a thread done with its share takes batches from the back of
  // the others' (so a thread that loses its core to another process does not
  // hold up the loop). Not re-entrant: one parallel_for at a time per pool.
  // Called under a cancel flag (core/cancel.h), batches run in short slices
  // and the loop stops early once the flag is set (the output is then
  // incomplete: the caller's next cancellation point throws).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) override;

  static int hardware_threads();

 private:
  void worker(int index);
  void run_share(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  // A new job is published by bumping generation_ (under mu_, so sleepers
  // cannot miss it); pending_ counts the workers still on it. Both are
  // atomics so that workers and the caller can spin on them briefly before
  // sleeping on the condition variables.
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  const std::atomic<bool>* cancel_ = nullptr;  // the caller's cancel flag for the current job
  int64_t batch_ = 1;
  struct alignas(64) Share {
    std::atomic<uint64_t> range{0};  // unclaimed [front, back), packed
  };
  std::unique_ptr<Share[]> shares_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace atelier
