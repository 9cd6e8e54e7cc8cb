// Backend::fill_random on the device (`bench text --synth 8B`): an 8B
// model's weights drawn in place in well under a second, where the host's
// draw and quantization would take minutes. Same distribution as the host's
// (uniform in [-scale, scale), or the quantized types' codes spread over
// that range), not its bits (backend.h allows it).
#include "matmul.cuh"
#include "quant.cuh"

namespace atelier::kernels::cuda {

namespace {

// SplitMix64's finaliser over (seed + row, position): a counter-based draw.
__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ uint64_t draw(uint64_t seed, int64_t row, int64_t pos) {
  return mix((seed + static_cast<uint64_t>(row)) * 0x100000001b3ull ^ mix(static_cast<uint64_t>(pos)));
}
__device__ __forceinline__ float uniform_pm1(uint64_t u) {
  return static_cast<float>(static_cast<double>(u >> 11) * 0x1.0p-52 - 1.0);
}

// Float rows (F32 / F16 / BF16: yt) of cols elements.
__global__ void fill_float_kernel(void* dst, int yt, int64_t rows, int64_t cols, uint64_t seed, float scale) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    st(dst, yt, i, scale * uniform_pm1(draw(seed, i / cols, i % cols)));
}

// E4M3_ROWS: the row's scale (scale / 448) in its header, codes of uniform values.
__global__ void fill_e4m3_kernel(uint8_t* dst, int64_t row_bytes, int64_t rows, int64_t cols, uint64_t seed,
                                 float scale) {
  const int64_t n = rows * (cols + 16);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / (cols + 16), b = i % (cols + 16);
    uint8_t* row = dst + r * row_bytes;
    if (b < 16) {
      const float s = scale / 448.0f;
      row[b] = b < 4 ? reinterpret_cast<const uint8_t*>(&s)[b] : 0;
    } else {
      row[b] = __nv_cvt_float_to_fp8(448.0f * uniform_pm1(draw(seed, r, b - 16)), __NV_SATFINITE, __NV_E4M3);
    }
  }
}

// Quantized rows: every byte random, then each block's scale fields set so
// its values span about [-scale, scale] (all 6-bit sub-block scales and mins
// 63 for the K types).
__global__ void fill_bytes_kernel(uint8_t* dst, int64_t bytes, int64_t row_bytes, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < bytes; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = static_cast<uint8_t>(draw(seed, i / row_bytes, i % row_bytes) >> 24);
}
__device__ __forceinline__ void put_f16(uint8_t* p, float v) {
  const __half h = __float2half_rn(v);
  const uint16_t u = *reinterpret_cast<const uint16_t*>(&h);
  p[0] = static_cast<uint8_t>(u & 0xff);
  p[1] = static_cast<uint8_t>(u >> 8);
}
__global__ void fix_blocks_kernel(uint8_t* dst, int wt, int64_t blocks, int64_t block_bytes, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < blocks; i += int64_t{gridDim.x} * blockDim.x) {
    uint8_t* b = dst + i * block_bytes;  // rows are whole blocks, back to back
    switch (wt) {
      case kWQ8_0: put_f16(b, scale / 127.0f); break;           // d * q, q in [-128, 127]
      case kWQ4_0: put_f16(b, scale / 8.0f); break;             // d * (q - 8), q in [0, 15]
      case kWQ4_K:                                              // d*63*q - dmin*63, q in [0, 15]
      case kWQ5_K:                                              // q in [0, 31]
        put_f16(b, 2.0f * scale / ((wt == kWQ4_K ? 15.0f : 31.0f) * 63.0f));
        put_f16(b + 2, scale / 63.0f);
        for (int j = 0; j < 12; ++j) b[4 + j] = 0xff;
        break;
      default:                                                  // Q6_K: d * 127 * (q - 32), q in [0, 63]
        for (int j = 0; j < 16; ++j) b[192 + j] = 127;
        put_f16(b + 208, scale / (32.0f * 127.0f));
        break;
    }
  }
}

}  // namespace

bool fill_random(cudaStream_t s, void* dst, DType t, int64_t rows, int64_t cols, uint64_t seed, float scale) {
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  if (row_bytes <= 0 || rows <= 0) return row_bytes > 0;
  auto* p = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      fill_float_kernel<<<grid_for(rows * cols), 256, 0, s>>>(dst, static_cast<int>(t), rows, cols, seed, scale);
      break;
    case DType::E4M3_ROWS:
      fill_e4m3_kernel<<<grid_for(rows * (cols + 16)), 256, 0, s>>>(p, row_bytes, rows, cols, seed, scale);
      break;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: {
      fill_bytes_kernel<<<grid_for(rows * row_bytes), 256, 0, s>>>(p, rows * row_bytes, row_bytes, seed);
      CUDA_LAUNCHED();
      const int64_t blocks = rows * (cols / dtype_block_elems(t));
      fix_blocks_kernel<<<grid_for(blocks), 256, 0, s>>>(p, static_cast<int>(t), blocks, dtype_block_bytes(t), scale);
      break;
    }
    default:
      return false;
  }
  CUDA_LAUNCHED();
  return true;
}

}  // namespace atelier::kernels::cuda
