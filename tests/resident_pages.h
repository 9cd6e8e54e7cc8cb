// Whether the page holding ADDR is mapped into this process right now, from
// /proc/self/pagemap (bit 63: present). For anonymous memory that is "the
// page is committed"; for a file mapping it is "this process holds the page"
// (mincore would answer for the page cache instead). The memory tests use it
// to see from outside what an allocation committed or a loader let go.
#pragma once

#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>

namespace atelier::test {

inline bool page_mapped(const void* addr) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << "cannot open /proc/self/pagemap";
  if (fd < 0) return false;
  uint64_t entry = 0;
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(addr) / page * sizeof entry);
  const ssize_t n = ::pread(fd, &entry, sizeof entry, at);
  ::close(fd);
  EXPECT_EQ(n, static_cast<ssize_t>(sizeof entry)) << "cannot read /proc/self/pagemap";
  return (entry >> 63) & 1;
}

}  // namespace atelier::test
