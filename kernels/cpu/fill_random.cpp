// Backend::fill_random's default (backend.h): rows drawn on the host, encoded,
// and uploaded in pieces, so every backend has it; a device draws in place.
#include <atelier/backend.h>
#include <atelier/splitmix.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace atelier::kernels {


void Backend::fill_random(Buffer& dst, int64_t offset, DType t, int64_t rows, int64_t cols, uint64_t seed, float scale) {
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  if (row_bytes <= 0)
    throw std::invalid_argument("fill_random: " + std::to_string(cols) + " columns are not whole blocks of " +
                                std::string(dtype_name(t)));
  const int64_t piece_rows = std::max<int64_t>(1, (int64_t{64} << 20) / row_bytes);
  std::vector<uint8_t> piece(static_cast<size_t>(std::min(rows, piece_rows) * row_bytes));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r0 = 0; r0 < rows; r0 += piece_rows) {
    const int64_t n = std::min(piece_rows, rows - r0);
    for (int64_t r = 0; r < n; ++r) {
      SplitMix64 rng{seed + static_cast<uint64_t>(r0 + r)};
      for (float& v : row) v = scale * rng.uniform_pm1();
      if (!quantize_row(t, row.data(), piece.data() + r * row_bytes, cols))
        throw std::invalid_argument("fill_random: no quantizer for " + std::string(dtype_name(t)));
    }
    upload(dst, offset + r0 * row_bytes, piece.data(), n * row_bytes);
  }
}

}  // namespace atelier::kernels
