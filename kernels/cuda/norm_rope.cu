// Norms over rows, one block per row: sums of squares and means in FP32 over
// a fixed tree (block_sum), so a row's bits never depend on the other rows.
#include "norm_rope.cuh"
#include "rope.cuh"

namespace atelier::kernels::cuda {

namespace {

constexpr int kNormThreads = 256;

// x += delta (stored in x's type) when delta, then y = x / rms(x) * weight
// when y; the norm reads x as stored.
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(void* x, int xt, const void* delta, int dt, const float* weight, void* y, int yt, int64_t dim,
                    float eps) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = ld(x, xt, o + j);
    if (delta) {
      v = rounded(xt, v + ld(delta, dt, o + j));
      st(x, xt, o + j, v);
    }
    ss = fmaf(v, v, ss);
  }
  if (!y) return;
  const float sum = block_sum(ss, scratch);
  const float scale = 1.0f / sqrtf(sum / static_cast<float>(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float v = ld(x, xt, o + j) * scale;
    st(y, yt, o + j, weight ? v * weight[j] : v);
  }
}

// Two passes: the mean, then the variance about it.
__global__ void __launch_bounds__(kNormThreads)
    layer_norm_kernel(const void* x, int xt, void* y, int yt, int64_t dim, const float* gamma, const float* beta,
                      float eps) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x * dim;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) s += ld(x, xt, o + j);
  const float mean = block_sum(s, scratch) / static_cast<float>(dim);
  float v2 = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float d = ld(x, xt, o + j) - mean;
    v2 = fmaf(d, d, v2);
  }
  const float inv = 1.0f / sqrtf(block_sum(v2, scratch) / static_cast<float>(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = (ld(x, xt, o + j) - mean) * inv;
    if (gamma) v *= gamma[j];
    if (beta) v += beta[j];
    st(y, yt, o + j, v);
  }
}

__global__ void rope_kernel(void* x, int xt, const int32_t* positions, RopeArgs a) {
  extern __shared__ float cs[];
  const int64_t r = blockIdx.x;
  rope_angles(a, positions[r], cs, cs + a.rot_dim / 2);
  __syncthreads();
  rope_apply(x, xt, r * int64_t{a.n_heads} * a.head_dim, a, cs, cs + a.rot_dim / 2);
}

}  // namespace

void rms_norm(cudaStream_t s, Act x, const float* weight, Act y, int64_t rows, int64_t dim, float eps) {
  if (rows <= 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(x.data(), act_code(x), nullptr, 0, weight,
                                                                       y.data(), act_code(y), dim, eps);
  CUDA_LAUNCHED();
}

void add_rms_norm(cudaStream_t s, Act x, Act delta, const float* weight, Act y, int64_t rows, int64_t dim, float eps) {
  if (rows <= 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(
      x.data(), act_code(x), delta.data(), act_code(delta), weight, weight ? y.data() : nullptr,
      weight ? act_code(y) : 0, dim, eps);
  CUDA_LAUNCHED();
}

void layer_norm(cudaStream_t s, Act x, Act y, int64_t rows, int64_t dim, const float* gamma, const float* beta,
                float eps) {
  if (rows <= 0) return;
  layer_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(x.data(), act_code(x), y.data(),
                                                                          act_code(y), dim, gamma, beta, eps);
  CUDA_LAUNCHED();
}

void rope(cudaStream_t s, Act x, int64_t rows, const int32_t* positions, const RopeParams& p) {
  if (rows <= 0 || p.rot_dim <= 0) return;
  rope_kernel<<<static_cast<unsigned>(rows), 128, static_cast<size_t>(p.rot_dim) * sizeof(float), s>>>(
      x.data(), act_code(x), positions, rope_args(p));
  CUDA_LAUNCHED();
}

}  // namespace atelier::kernels::cuda
