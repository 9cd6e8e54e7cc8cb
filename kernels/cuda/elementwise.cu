// Element-wise ops: grid-stride loops, FP32 arithmetic, stores rounded to the
// output's type. Softmax: one block per row, FP32 max and sum (fixed tree).
#include "elementwise.cuh"

namespace atelier::kernels::cuda {

namespace {

#define GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

__global__ void add_kernel(const void* a, int at, const void* b, int bt, void* y, int yt, int64_t n) {
  GRID_LOOP(i, n) st(y, yt, i, ld(a, at, i) + ld(b, bt, i));
}
__global__ void add_bias_kernel(void* x, int xt, const float* bias, int64_t dim, int64_t n) {
  GRID_LOOP(i, n) st(x, xt, i, ld(x, xt, i) + bias[i % dim]);
}

__device__ __forceinline__ float act_fn(int a, float x) {
  switch (a) {
    case 0: return x / (1.0f + expf(-x));                                // silu
    case 1: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));  // erf GELU
    case 2: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    default: return x / (1.0f + expf(-1.702f * x));                     // quick GELU
  }
}
__global__ void activation_kernel(int a, const void* x, int xt, void* y, int yt, int64_t n) {
  GRID_LOOP(i, n) st(y, yt, i, act_fn(a, ld(x, xt, i)));
}
__global__ void swiglu_kernel(const void* g, int gt, const void* u, int ut, void* y, int yt, int64_t n) {
  GRID_LOOP(i, n) {
    const float gv = ld(g, gt, i);
    st(y, yt, i, gv / (1.0f + expf(-gv)) * ld(u, ut, i));
  }
}
// act(gate) * up (gemma's GELU-tanh feed-forward; silu gives swiglu).
__global__ void glu_kernel(int a, const void* g, int gt, const void* u, int ut, void* y, int yt, int64_t n) {
  GRID_LOOP(i, n) st(y, yt, i, act_fn(a, ld(g, gt, i)) * ld(u, ut, i));
}
__global__ void geglu_kernel(const void* x, int xt, void* y, int yt, int64_t dim, int64_t n) {
  GRID_LOOP(i, n) {
    const int64_t r = i / dim, j = i % dim;
    const float v = ld(x, xt, r * 2 * dim + j), g = ld(x, xt, r * 2 * dim + dim + j);
    st(y, yt, i, v * act_fn(1, g));
  }
}
__global__ void affine_kernel(const void* x, int xt, void* y, int yt, int64_t n, Affine a, bool add, bool mul,
                              bool div, bool clamp) {
  GRID_LOOP(i, n) {
    float v = ld(x, xt, i);
    if (add) v += a.add;
    if (mul) v *= a.mul;
    if (div) v /= a.div;
    if (clamp) v = fminf(fmaxf(v, a.lo), a.hi);
    st(y, yt, i, v);
  }
}
__global__ void relu_kernel(const void* x, int xt, void* y, int yt, int64_t n) {
  GRID_LOOP(i, n) st(y, yt, i, fmaxf(ld(x, xt, i), 0.0f));
}
__global__ void tanh_clamp_kernel(const void* x, int xt, void* y, int yt, int64_t n, float limit) {
  GRID_LOOP(i, n) st(y, yt, i, tanhf(ld(x, xt, i) / limit) * limit);
}
__global__ void copy_kernel(const void* x, int xt, void* y, int yt, int64_t n) {
  GRID_LOOP(i, n) st(y, yt, i, ld(x, xt, i));
}
// Element (b, r, j) of x's [n][rows][cols] to y's [n][cols][rows].
__global__ void transpose_kernel(const void* x, int xt, void* y, int yt, int64_t rows, int64_t cols, int64_t total) {
  GRID_LOOP(i, total) {
    const int64_t b = i / (rows * cols), rem = i % (rows * cols), r = rem / cols, j = rem % cols;
    st(y, yt, b * rows * cols + j * rows + r, ld(x, xt, i));
  }
}
__global__ void copy_rows_kernel(const void* x, int xt, const int32_t* ids, void* y, int yt, int64_t dim) {
  const int64_t r = blockIdx.x, src = int64_t{ids[r]} * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) st(y, yt, r * dim + j, ld(x, xt, src + j));
}

constexpr int kSoftmaxThreads = 256;
__global__ void __launch_bounds__(kSoftmaxThreads) softmax_kernel(void* x, int xt, int64_t n) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x * n;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, ld(x, xt, o + j));
  m = block_max(m, scratch);
  if (m == -INFINITY) m = 0.0f;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += expf(ld(x, xt, o + j) - m);
  s = block_sum(s, scratch);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) st(x, xt, o + j, expf(ld(x, xt, o + j) - m) * inv);
}

}  // namespace

#define LAUNCH(kernel, n, ...)                                        \
  do {                                                                \
    if ((n) <= 0) return;                                             \
    kernel<<<grid_for(n), 256, 0, s>>>(__VA_ARGS__);                  \
    CUDA_LAUNCHED();                                                  \
  } while (0)

void add(cudaStream_t s, Act a, Act b, Act y, int64_t n) {
  LAUNCH(add_kernel, n, a.data(), act_code(a), b.data(), act_code(b), y.data(), act_code(y), n);
}
void add_bias(cudaStream_t s, Act x, const float* bias, int64_t rows, int64_t dim) {
  LAUNCH(add_bias_kernel, rows * dim, x.data(), act_code(x), bias, dim, rows * dim);
}
void activation(cudaStream_t s, Activation a, Act x, Act y, int64_t n) {
  LAUNCH(activation_kernel, n, static_cast<int>(a), x.data(), act_code(x), y.data(), act_code(y), n);
}
void swiglu(cudaStream_t s, Act gate, Act up, Act out, int64_t rows, int64_t dim) {
  LAUNCH(swiglu_kernel, rows * dim, gate.data(), act_code(gate), up.data(), act_code(up), out.data(), act_code(out),
         rows * dim);
}
void glu(cudaStream_t s, Activation a, Act gate, Act up, Act out, int64_t rows, int64_t dim) {
  LAUNCH(glu_kernel, rows * dim, static_cast<int>(a), gate.data(), act_code(gate), up.data(), act_code(up), out.data(),
         act_code(out), rows * dim);
}
void geglu(cudaStream_t s, Act x, Act y, int64_t rows, int64_t dim) {
  LAUNCH(geglu_kernel, rows * dim, x.data(), act_code(x), y.data(), act_code(y), dim, rows * dim);
}
void softmax(cudaStream_t s, Act x, int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return;
  softmax_kernel<<<static_cast<unsigned>(rows), kSoftmaxThreads, 0, s>>>(x.data(), act_code(x), n);
  CUDA_LAUNCHED();
}
void affine(cudaStream_t s, Act x, Act y, int64_t n, const Affine& a) {
  LAUNCH(affine_kernel, n, x.data(), act_code(x), y.data(), act_code(y), n, a, a.add != 0.0f, a.mul != 1.0f,
         a.div != 1.0f, a.lo != -INFINITY || a.hi != INFINITY);
}
void relu(cudaStream_t s, Act x, Act y, int64_t n) {
  LAUNCH(relu_kernel, n, x.data(), act_code(x), y.data(), act_code(y), n);
}
void tanh_clamp(cudaStream_t s, Act x, Act y, int64_t n, float limit) {
  LAUNCH(tanh_clamp_kernel, n, x.data(), act_code(x), y.data(), act_code(y), n, limit);
}
void copy(cudaStream_t s, Act x, Act y, int64_t n) {
  if (n <= 0) return;
  if (x.type() == y.type()) {
    CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), static_cast<size_t>(act_bytes(x.type(), n)),
                               cudaMemcpyDeviceToDevice, s));
    return;
  }
  LAUNCH(copy_kernel, n, x.data(), act_code(x), y.data(), act_code(y), n);
}
void relayout(cudaStream_t s, Act x, Layout from, Act y, Layout to, int64_t n, int64_t c, int64_t hw) {
  if (from == to) return copy(s, x, y, n * c * hw);
  const int64_t rows = from == Layout::NCHW ? c : hw, cols = from == Layout::NCHW ? hw : c;
  LAUNCH(transpose_kernel, n * c * hw, x.data(), act_code(x), y.data(), act_code(y), rows, cols, n * c * hw);
}
void copy_rows(cudaStream_t s, Act x, const int32_t* ids, Act y, int64_t rows, int64_t dim) {
  if (rows <= 0) return;
  copy_rows_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(x.data(), act_code(x), ids, y.data(), act_code(y), dim);
  CUDA_LAUNCHED();
}

}  // namespace atelier::kernels::cuda
