// Replaces the global operator new/delete of the test binary to record the
// largest single allocation, so the hostile-input tests can prove that a
// header claiming 2^60 elements never turns into a huge allocation (a plain
// build would otherwise overcommit and "succeed"). Forwards to malloc/free,
// which ASan still intercepts.
#include "formats/formats_test_util.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<size_t> g_high_water{0};

void note(size_t n) {
  size_t cur = g_high_water.load(std::memory_order_relaxed);
  while (n > cur && !g_high_water.compare_exchange_weak(cur, n, std::memory_order_relaxed)) {
  }
}

void* allocate(size_t n) {
  note(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
}  // namespace

namespace atelier::test {
size_t alloc_high_water() { return g_high_water.load(); }
void reset_alloc_high_water() { g_high_water.store(0); }
}  // namespace atelier::test

void* operator new(size_t n) { return allocate(n); }
void* operator new[](size_t n) { return allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  note(n);
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  note(n);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
