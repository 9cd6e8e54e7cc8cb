// This process's resident memory as Linux reports it (/proc/self/status):
// for the benchmarks' peak RSS figures, the memory tests and the
// ATELIER_TRACE_MEMORY phase lines. Header-only; 0 / false where the system
// does not say (not Linux, /proc not mounted).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace atelier {

namespace detail {
// The "KEY:   N kB" line of /proc/self/status, in bytes.
inline int64_t proc_status_kb(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  int64_t v = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      v = std::strtoll(line + n + 1, nullptr, 10) * 1024;
      break;
    }
  std::fclose(f);
  return v;
}
}  // namespace detail

// Resident now (VmRSS: anonymous memory plus mapped file pages).
inline int64_t process_rss_bytes() { return detail::proc_status_kb("VmRSS"); }
// The high-water mark of VmRSS (VmHWM), since the start or the last reset.
inline int64_t process_peak_rss_bytes() { return detail::proc_status_kb("VmHWM"); }
// Resets VmHWM to the current VmRSS (writing 5 to /proc/self/clear_refs,
// Linux 4.0+), so a peak can be read for one phase. False when refused.
inline bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// Gives the heap's free pages back to the system after a phase that freed
// much (glibc keeps freed chunks below its mmap threshold, up to 32 MB each).
inline void trim_heap() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

// With ATELIER_TRACE_MEMORY set, one stderr line per phase boundary:
// "memory: PHASE rss 1234.5 MB, peak 2345.6 MB". For finding where memory goes.
inline void trace_memory(const char* phase) {
  static const bool on = std::getenv("ATELIER_TRACE_MEMORY") != nullptr;
  if (!on) return;
  std::fprintf(stderr, "memory: %s rss %.1f MB, peak %.1f MB\n", phase, process_rss_bytes() / 1e6,
               process_peak_rss_bytes() / 1e6);
}

}  // namespace atelier
