// MappedFile::release: pages read once leave the process (VmRSS falls by
// about the bytes released), only whole pages inside the range and the
// mapping go, and the bytes read afterwards are still the file's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <vector>

#include "core/process_memory.h"
#include "formats/mapped_file.h"
#include "formats_test_util.h"

namespace atelier::formats {
namespace {

using atelier::test::TempDir;

// n bytes, each a function of its offset (so a page faulted back in can be checked).
std::string write_pattern(const TempDir& dir, size_t n) {
  const std::string path = dir.file("pattern.bin");
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(n));
  return path;
}

uint64_t touch(const MappedFile& m) {
  uint64_t sum = 0;
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < m.size(); i += page) sum += m.data()[i];
  return sum;
}

TEST(MappedFile, ReleaseDropsTheRangesPagesFromRss) {
  if (process_rss_bytes() == 0) GTEST_SKIP() << "no /proc/self/status here";
  TempDir dir("mapped-release");
  constexpr size_t kBytes = size_t{96} << 20;
  const std::string path = write_pattern(dir, kBytes);
  MappedFile m(path);
  const int64_t before = process_rss_bytes();
  const uint64_t sum = touch(m);
  const int64_t mapped = process_rss_bytes();
  // Reading every page maps them all (the file was just written: in the page cache).
  ASSERT_GT(mapped - before, static_cast<int64_t>(kBytes) * 9 / 10) << "RSS " << before << " -> " << mapped;
  EXPECT_EQ(m.release(m.data(), m.size()), kBytes);
  const int64_t after = process_rss_bytes();
  EXPECT_LT(after, mapped - static_cast<int64_t>(kBytes) * 9 / 10) << "RSS " << mapped << " -> " << after;
  // The same bytes come back when read again.
  EXPECT_EQ(touch(m), sum);
  for (size_t i : {size_t{0}, size_t{4095}, size_t{4096}, kBytes / 2 + 17, kBytes - 1})
    EXPECT_EQ(m.data()[i], static_cast<uint8_t>((i * 2654435761u) >> 13)) << i;
}

TEST(MappedFile, ReleaseKeepsPartialPagesAndIgnoresOtherMemory) {
  TempDir dir("mapped-partial");
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t n = 10 * page + 123;  // the last page is partial
  const std::string path = write_pattern(dir, n);
  MappedFile m(path);
  // [1, 1 + 2 pages) holds one whole page, the second.
  EXPECT_EQ(m.release(m.data() + 1, 2 * page), page);
  // Inside one page: nothing.
  EXPECT_EQ(m.release(m.data() + 10, page - 20), 0u);
  // A range ending at the file's end takes its last, partial page along.
  EXPECT_EQ(m.release(m.data() + 8 * page, 2 * page + 123), 3 * page);
  // Ranges reaching outside are clipped to the mapping; memory that is not
  // the mapping's is never touched (MADV_DONTNEED would zero a heap page).
  std::vector<uint8_t> heap(4 * page, 7);
  EXPECT_EQ(m.release(heap.data(), heap.size()), 0u);
  EXPECT_EQ(heap[page + 5], 7);
  EXPECT_EQ(m.release(m.data() + 9 * page, 5 * page), page + page);  // 9th page and the partial 10th
  EXPECT_TRUE(m.contains(m.data(), n));
  EXPECT_TRUE(m.contains(m.data() + n - 1, 1));
  EXPECT_FALSE(m.contains(m.data() + n - 1, 2));
  EXPECT_FALSE(m.contains(heap.data(), 1));
  for (uint64_t i = 0; i < n; i += 97) EXPECT_EQ(m.data()[i], static_cast<uint8_t>((i * 2654435761u) >> 13)) << i;
}

}  // namespace
}  // namespace atelier::formats
