// The engine's thread pool: every index of a loop runs exactly once, and a
// thread that stalls mid-loop (as when another process takes its core) does
// not hold up the rest of the loop: the others take over its unclaimed share.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

namespace atelier {
namespace {

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 16, 17, 100, 1000, 4097}) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int64_t> calls{0};
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
          ASSERT_LT(b, e);
          ASSERT_GE(b, 0);
          ASSERT_LE(e, n);
          ++calls;
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " threads, n " << n << ", index " << i;
        // A few batches per thread (shrinking towards the end), not one call
        // per index.
        EXPECT_LE(calls.load(), std::min<int64_t>(n, threads * (6 + static_cast<int64_t>(std::log2(n)))))
            << threads << " threads, n " << n;
      }
    }
  }
}

TEST(ThreadPool, AStalledThreadsShareIsTakenOver) {
  ThreadPool pool(2);
  const auto caller = std::this_thread::get_id();
  constexpr int64_t n = 64;  // shares [0, 32) and [32, 64), batches of 8
  std::vector<std::thread::id> ran_on(n);
  std::atomic<bool> stalled{false};
  std::mutex mu;
  pool.parallel_for(n, [&](int64_t b, int64_t e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (int64_t i = b; i < e; ++i) ran_on[static_cast<size_t>(i)] = std::this_thread::get_id();
    }
    if (std::this_thread::get_id() == caller) {
      // The caller's first batch waits until the worker is stuck in its own.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (b == 0 && !stalled && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    } else if (b == 32) {
      // The worker's first batch of its own share: it "loses its core" here.
      stalled = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  ASSERT_TRUE(stalled) << "the worker never started its share";
  // Everything of the worker's share after its first batch ran on the caller
  // while the worker slept; nothing of the caller's share ran on the worker.
  for (int64_t i = 32; i < 40; ++i) EXPECT_NE(ran_on[static_cast<size_t>(i)], caller) << "index " << i;
  for (int64_t i = 40; i < n; ++i) EXPECT_EQ(ran_on[static_cast<size_t>(i)], caller) << "index " << i;
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(ran_on[static_cast<size_t>(i)], caller) << "index " << i;
}

}  // namespace
}  // namespace atelier
