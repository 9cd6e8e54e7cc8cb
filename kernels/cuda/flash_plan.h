// Which rows of a paged-attention call take the tiled tensor-core kernel
// (flash.cu), found on the device without a host synchronisation: runs of
// consecutive rows of one sequence (the same row_table, row_len rising by 1
// from row to row: a prefill chunk) of at least kFlashMinRun rows, cut into
// query tiles of up to kFlashTileRows rows from each run's first row. Every
// other row (decode rows are runs of 1, short chunks, rows of length 0)
// stays on the flash-decoding kernel.
//
// Plain C++ (no CUDA headers) so the op suite's host tests run the same
// code: the device's plan kernel gives each of its kFlashPlanThreads threads
// one segment of the rows (flash_segment) and runs the four passes below
// over its segment, combining the segments' carries by block scans between
// them; flash_plan_host runs the same passes over `segments` segments one
// after another.
#pragma once

#include <cstdint>
#include <vector>

#ifdef __CUDACC__
#define ATELIER_HD __host__ __device__
#else
#define ATELIER_HD
#endif

namespace atelier::kernels::cuda {

constexpr int kFlashMinRun = 16;    // shorter runs stay on the flash-decoding kernel
constexpr int kFlashTileRows = 64;  // query rows per tile
constexpr int kFlashPlanThreads = 256;

struct FlashTile {
  int32_t row = 0;   // the tile's first row
  int32_t rows = 0;  // 1 .. kFlashTileRows consecutive rows
};

// At most this many tiles: each run of L >= 16 rows gives ceil(L / 64) <= L / 16.
constexpr int64_t flash_max_tiles(int64_t rows) { return rows / kFlashMinRun; }

// Whether row i continues row i - 1's run.
ATELIER_HD inline bool flash_continues(const int32_t* len, const int32_t* table, int64_t i) {
  return i > 0 && len[i] > 0 && len[i - 1] > 0 && table[i] == table[i - 1] && len[i] == len[i - 1] + 1;
}

// Rows [a, b) of segment s of `segments` (empty past the rows).
ATELIER_HD inline void flash_segment(int64_t s, int64_t segments, int64_t rows, int64_t& a, int64_t& b) {
  const int64_t per = (rows + segments - 1) / segments;
  a = s * per < rows ? s * per : rows;
  b = a + per < rows ? a + per : rows;
}

// Pass 1: the segment's first and last run starts (rows / -1 where none:
// the identities of the min and max scans that carry them).
ATELIER_HD inline void flash_breaks(const int32_t* len, const int32_t* table, int64_t a, int64_t b, int64_t rows,
                                    int64_t& first, int64_t& last) {
  first = rows, last = -1;
  for (int64_t i = a; i < b; ++i)
    if (!flash_continues(len, table, i)) {
      if (first == rows) first = i;
      last = i;
    }
}

// Pass 2, forward: each row's run start; `carry`: the last run start before
// the segment (the max of the earlier segments' `last`).
ATELIER_HD inline void flash_starts(const int32_t* len, const int32_t* table, int64_t a, int64_t b, int64_t carry,
                                    int32_t* start) {
  for (int64_t i = a; i < b; ++i) {
    if (!flash_continues(len, table, i)) carry = i;
    start[i] = static_cast<int32_t>(carry);
  }
}

// The tile of row i of a run [start, end): whether the run is tiled, and
// whether row i begins a tile.
ATELIER_HD inline bool flash_run_tiled(int64_t start, int64_t end) { return end - start >= kFlashMinRun; }
ATELIER_HD inline bool flash_tile_first(int64_t i, int64_t start, int64_t end) {
  return flash_run_tiled(start, end) && (i - start) % kFlashTileRows == 0;
}

// Pass 3, backward: each row's run end (exclusive); `next`: the first run
// start after the segment (the min of the later segments' `first`). Returns
// the tiles that begin in the segment.
ATELIER_HD inline int64_t flash_ends(const int32_t* len, const int32_t* table, int64_t a, int64_t b, int64_t next,
                                     const int32_t* start, int32_t* end) {
  int64_t tiles = 0;
  for (int64_t i = b - 1; i >= a; --i) {
    end[i] = static_cast<int32_t>(next);
    if (!flash_continues(len, table, i)) next = i;
    tiles += flash_tile_first(i, start[i], end[i]);
  }
  return tiles;
}

// Pass 4, forward: each row's flag (1: the tile kernel computes it) and the
// tiles that begin in the segment, numbered from `base` (the tiles of the
// earlier segments), in row order.
ATELIER_HD inline void flash_assign(int64_t a, int64_t b, int64_t base, const int32_t* start, const int32_t* end,
                                    int32_t* tiled, FlashTile* tiles) {
  for (int64_t i = a; i < b; ++i) {
    tiled[i] = flash_run_tiled(start[i], end[i]) ? 1 : 0;
    if (flash_tile_first(i, start[i], end[i])) {
      const int64_t n = end[i] - i < kFlashTileRows ? end[i] - i : kFlashTileRows;
      tiles[base++] = FlashTile{static_cast<int32_t>(i), static_cast<int32_t>(n)};
    }
  }
}

// The four passes over `segments` segments in turn (the device runs them
// side by side): start, end and tiled hold `rows` ints, tiles
// flash_max_tiles(rows). Returns the number of tiles.
inline int64_t flash_plan_host(const int32_t* len, const int32_t* table, int64_t rows, int64_t segments,
                               int32_t* start, int32_t* end, int32_t* tiled, FlashTile* tiles) {
  int64_t carry = -1;
  for (int64_t s = 0; s < segments; ++s) {
    int64_t a, b, first, last;
    flash_segment(s, segments, rows, a, b);
    flash_breaks(len, table, a, b, rows, first, last);
    flash_starts(len, table, a, b, carry, start);
    carry = last > carry ? last : carry;
  }
  int64_t next = rows, count = 0;
  std::vector<int64_t> counts(static_cast<size_t>(segments));
  for (int64_t s = segments - 1; s >= 0; --s) {
    int64_t a, b, first, last;
    flash_segment(s, segments, rows, a, b);
    flash_breaks(len, table, a, b, rows, first, last);
    counts[static_cast<size_t>(s)] = flash_ends(len, table, a, b, next, start, end);
    next = first < next ? first : next;
  }
  for (int64_t s = 0; s < segments; ++s) {
    int64_t a, b;
    flash_segment(s, segments, rows, a, b);
    flash_assign(a, b, count, start, end, tiled, tiles);
    count += counts[static_cast<size_t>(s)];
  }
  return count;
}

}  // namespace atelier::kernels::cuda
