// Routing, the experts' weighted sum and gpt-oss's SwiGLU (moe.cuh). Small
// next to the experts' products: simple kernels, each row on its own.
#include <string>

#include "moe.cuh"

namespace atelier::kernels::cuda {

namespace {

#define GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

constexpr double kMinWeightSum = 6.103515625e-5;  // llama.cpp clamps the sum to F16's smallest normal

// One warp per row: kernels::moe_route_ref's arithmetic (in double: the
// selection values, softmax over all or over the chosen k, the norm), so the
// ids are the reference's, ties to the lower expert. Shared: n selection
// values (double), k chosen weights (double), k chosen ids, n taken flags.
__global__ void moe_route_kernel(const void* logits, int lt, int n, int k, int stride, int gating, bool norm,
                                 float scale, int32_t* ids, float* weights) {
  extern __shared__ double sh[];
  double* p = sh;
  double* w = p + n;
  int* sel = reinterpret_cast<int*>(w + k);
  uint8_t* taken = reinterpret_cast<uint8_t*>(sel + k);
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x;
  for (int e = lane; e < n; e += 32) {
    const double v = ld(logits, lt, row * n + e);
    p[e] = gating == 1 ? 1.0 / (1.0 + exp(-v)) : v;  // 1: sigmoid
    taken[e] = 0;
  }
  __syncwarp();
  if (gating == 0) {  // softmax over all n
    double m = -INFINITY;
    for (int e = lane; e < n; e += 32) m = fmax(m, p[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    for (int e = lane; e < n; e += 32) p[e] = exp(p[e] - m);
    __syncwarp();
    double sum = 0;
    if (lane == 0)
      for (int e = 0; e < n; ++e) sum += p[e];  // in order, as the reference
    sum = __shfl_sync(0xffffffffu, sum, 0);
    __syncwarp();
    for (int e = lane; e < n; e += 32) p[e] /= sum;
    __syncwarp();
  }
  // k passes: the largest value not yet taken, the lower expert among equals
  // (each lane scans its experts in ascending order, then a butterfly on
  // (value, expert) in that order; lane 0's choice is everyone's).
  for (int j = 0; j < k; ++j) {
    int best = -1;
    double bv = 0;
    for (int e = lane; e < n; e += 32)
      if (!taken[e] && (best < 0 || p[e] > bv)) best = e, bv = p[e];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const int ob = __shfl_xor_sync(0xffffffffu, best, o);
      const double ov = __shfl_xor_sync(0xffffffffu, bv, o);
      if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) best = ob, bv = ov;
    }
    best = __shfl_sync(0xffffffffu, best, 0);
    if (lane == 0) {
      sel[j] = best;
      w[j] = best >= 0 ? p[best] : 0.0;
      if (best >= 0) taken[best] = 1;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  if (gating == 2) {  // softmax over the chosen k (gpt-oss); w[0] is their largest
    const double m = w[0];
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += (w[j] = exp(w[j] - m));
    for (int j = 0; j < k; ++j) w[j] /= sum;
  }
  if (norm) {
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += w[j];
    sum = fmax(sum, kMinWeightSum);
    for (int j = 0; j < k; ++j) w[j] /= sum;
  }
  const bool scaled = scale != 0.0f && scale != 1.0f;
  for (int j = 0; j < k; ++j) {
    ids[row * stride + j] = sel[j];
    weights[row * stride + j] = static_cast<float>(scaled ? w[j] * scale : w[j]);
  }
}

// out[r] = w[r k] y[r k] + w[r k + 1] y[r k + 1] + ..., each product rounded
// before its add (no FMA), as kernels::moe_combine.
__global__ void moe_combine_kernel(const void* y, int yt, const float* w, void* out, int ot, int k, int64_t dim,
                                   int64_t n) {
  GRID_LOOP(i, n) {
    const int64_t r = i / dim, c = i % dim;
    const float* wr = w + r * k;
    const int64_t y0 = r * k * dim + c;
    float o = __fmul_rn(wr[0], ld(y, yt, y0));
    for (int j = 1; j < k; ++j) o = __fadd_rn(o, __fmul_rn(wr[j], ld(y, yt, y0 + j * dim)));
    st(out, ot, i, o);
  }
}

// kernels::swiglu_oai: g = min(gate, limit), u = clamp(up, -limit, limit),
// g * sigmoid(alpha g) * (u + 1); std::min / std::clamp's comparisons.
__global__ void swiglu_oai_kernel(const void* gate, int gt, const void* up, int ut, void* out, int ot, int64_t n,
                                  float alpha, float limit) {
  GRID_LOOP(i, n) {
    const float gv = ld(gate, gt, i), uv = ld(up, ut, i);
    const float g = limit < gv ? limit : gv;
    const float u = uv < -limit ? -limit : limit < uv ? limit : uv;
    st(out, ot, i, g / (1.0f + expf(alpha * -g)) * (u + 1.0f));
  }
}

}  // namespace

void moe_route(cudaStream_t s, Act logits, int64_t rows, const MoeRouting& r, int32_t* ids, float* weights) {
  const int n = r.n_expert, k = r.k < r.n_expert ? r.k : r.n_expert;
  if (rows <= 0 || n <= 0 || k <= 0) return;
  const size_t shared = static_cast<size_t>(n + k) * sizeof(double) + static_cast<size_t>(k) * sizeof(int) +
                        static_cast<size_t>(n);
  if (shared > 48 * 1024) throw std::logic_error("CUDA moe_route: " + std::to_string(n) + " experts (at most 4096)");
  moe_route_kernel<<<static_cast<unsigned>(rows), 32, shared, s>>>(logits.data(), act_code(logits), n, k, r.k,
                                                                   static_cast<int>(r.gating), r.norm, r.scale, ids,
                                                                   weights);
  CUDA_LAUNCHED();
}

void moe_combine(cudaStream_t s, Act y, const float* weights, Act out, int64_t rows, int k, int64_t dim) {
  const int64_t n = rows * dim;
  if (n <= 0 || k <= 0) return;
  moe_combine_kernel<<<grid_for(n), 256, 0, s>>>(y.data(), act_code(y), weights, out.data(), act_code(out), k, dim, n);
  CUDA_LAUNCHED();
}

void swiglu_oai(cudaStream_t s, Act gate, Act up, Act out, int64_t rows, int64_t dim, float alpha, float limit) {
  const int64_t n = rows * dim;
  if (n <= 0) return;
  swiglu_oai_kernel<<<grid_for(n), 256, 0, s>>>(gate.data(), act_code(gate), up.data(), act_code(up), out.data(),
                                                act_code(out), n, alpha, limit);
  CUDA_LAUNCHED();
}

}  // namespace atelier::kernels::cuda
