// Image-model ops: conv2d, group/layer norm, activations, GEGLU, nearest
// upsampling, blocked attention, timestep embedding; each with its plain
// reference.
//
// conv2d runs as im2col over tiles of output pixels into the existing f32
// matmul (its AVX-512/AVX2 tiles, f16/bf16 weights widened in registers),
// rather than through oneDNN: no new dependency, the matmul's batch invariance
// carries over (a pixel's result depends only on its own patch row), and the
// weights stay in the file's precision. oneDNN's blocked direct convolution
// would be faster for the large UNet layers; it can come in behind the same
// entry point if profiling says so.
#include <atelier/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "image_ops_internal.h"
#include "simd.h"

namespace atelier::kernels {

using cpu::active_simd;
using cpu::Simd;
using cpu::run_parallel;

namespace {

bool use_avx2() { return active_simd() != Simd::scalar; }


std::vector<float> weights_f32(DType t, const void* w, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(t, static_cast<const uint8_t*>(w) + r * row_bytes, out.data() + r * cols, cols);
  return out;
}

double act_ref(Activation a, double x) {
  switch (a) {
    case Activation::silu: return x / (1.0 + std::exp(-x));
    case Activation::gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::quick_gelu: return x / (1.0 + std::exp(-1.702 * x));
  }
  return x;
}

float silu_f(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

// ---- conv2d -----------------------------------------------------------------

bool Conv2dShape::valid() const {
  return n > 0 && c_in > 0 && h > 0 && w > 0 && c_out > 0 && kh > 0 && kw > 0 && stride_h > 0 && stride_w > 0 &&
         pad_h >= 0 && pad_w >= 0 && h + 2 * pad_h >= kh && w + 2 * pad_w >= kw;
}

void conv2d_ref(const Conv2dShape& s, const float* x, DType w_type, const void* weight, const float* bias, float* y) {
  if (!s.valid()) return;
  const int64_t K = s.c_in * s.kh * s.kw, oh = s.out_h(), ow = s.out_w();
  const std::vector<float> w = weights_f32(w_type, weight, s.c_out, K);
  for (int64_t b = 0; b < s.n; ++b)
    for (int64_t co = 0; co < s.c_out; ++co)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double acc = bias ? bias[co] : 0.0;
          for (int64_t ci = 0; ci < s.c_in; ++ci)
            for (int64_t ky = 0; ky < s.kh; ++ky)
              for (int64_t kx = 0; kx < s.kw; ++kx) {
                const int64_t iy = oy * s.stride_h - s.pad_h + ky, ix = ox * s.stride_w - s.pad_w + kx;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                acc += double(w[(co * s.c_in + ci) * s.kh * s.kw + ky * s.kw + kx]) *
                       x[((b * s.c_in + ci) * s.h + iy) * s.w + ix];
              }
          y[((b * s.c_out + co) * oh + oy) * ow + ox] = static_cast<float>(acc);
        }
}

void conv2d(const Conv2dShape& s, const float* x, DType w_type, const void* weight, const float* bias, float* y,
            Executor* ex) {
  if (!s.valid()) return;
  if (w_type == DType::F32 || w_type == DType::F16 || w_type == DType::BF16) {
    if (active_simd() == Simd::avx512) return cpu::avx512::conv2d(s, x, w_type, weight, bias, y, ex);
    if (active_simd() == Simd::avx2) return cpu::avx2::conv2d(s, x, w_type, weight, bias, y, ex);
  }
  const int64_t K = s.c_in * s.kh * s.kw, oh = s.out_h(), ow = s.out_w(), P = oh * ow;
  // 64 output pixels per tile: their patches (64 x K floats) stay in L2 while
  // the matmul streams the weights past them.
  constexpr int64_t kTile = 64;
  const int64_t tiles_per_image = (P + kTile - 1) / kTile;
  const WeightView wv{w_type, weight, s.c_out, K, dtype_row_bytes(w_type, K)};
  const bool pointwise = s.kh == 1 && s.kw == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
  run_parallel(ex, s.n * tiles_per_image, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> patches, out;
    patches.resize(static_cast<size_t>(kTile * K));
    out.resize(static_cast<size_t>(kTile * s.c_out));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles_per_image, p0 = (t % tiles_per_image) * kTile, np = std::min(kTile, P - p0);
      const float* xb = x + b * s.c_in * s.h * s.w;
      if (pointwise) {
        for (int64_t ci = 0; ci < s.c_in; ++ci) {
          const float* src = xb + ci * s.h * s.w + p0;
          for (int64_t p = 0; p < np; ++p) patches[p * K + ci] = src[p];
        }
      } else {
        for (int64_t p = 0; p < np; ++p) {
          const int64_t oy = (p0 + p) / ow, ox = (p0 + p) % ow;
          float* row = patches.data() + p * K;
          for (int64_t ci = 0; ci < s.c_in; ++ci)
            for (int64_t ky = 0; ky < s.kh; ++ky) {
              const int64_t iy = oy * s.stride_h - s.pad_h + ky;
              float* dst = row + (ci * s.kh + ky) * s.kw;
              if (iy < 0 || iy >= s.h) {
                std::fill(dst, dst + s.kw, 0.0f);
                continue;
              }
              const float* src = xb + (ci * s.h + iy) * s.w;
              for (int64_t kx = 0; kx < s.kw; ++kx) {
                const int64_t ix = ox * s.stride_w - s.pad_w + kx;
                dst[kx] = ix >= 0 && ix < s.w ? src[ix] : 0.0f;
              }
            }
        }
      }
      matmul(wv, patches.data(), out.data(), np, nullptr);
      float* yb = y + b * s.c_out * P + p0;
      for (int64_t co = 0; co < s.c_out; ++co) {
        const float bv = bias ? bias[co] : 0.0f;
        float* dst = yb + co * P;
        for (int64_t p = 0; p < np; ++p) dst[p] = out[p * s.c_out + co] + bv;
      }
    }
  });
}

// ---- group norm ---------------------------------------------------------------

void group_norm_ref(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t groups, const float* gamma,
                    const float* beta, float eps, bool silu) {
  if (groups <= 0 || c % groups) return;
  const int64_t cg = c / groups, count = cg * hw;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t off = (b * c + g * cg) * hw;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < count; ++i) mean += x[off + i];
      mean /= double(count);
      for (int64_t i = 0; i < count; ++i) var += (x[off + i] - mean) * (x[off + i] - mean);
      var /= double(count);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t ch = g * cg; ch < (g + 1) * cg; ++ch)
        for (int64_t i = 0; i < hw; ++i) {
          const int64_t k = (b * c + ch) * hw + i;
          double v = (x[k] - mean) * inv * (gamma ? gamma[ch] : 1.0) + (beta ? beta[ch] : 0.0);
          if (silu) v = act_ref(Activation::silu, v);
          y[k] = static_cast<float>(v);
        }
    }
}

namespace {
// Mean and inverse standard deviation of count floats: two passes (the
// variance of values far from zero keeps its precision), float lanes summed
// per 8, combined in double.
void moments(const float* x, int64_t count, float eps, float* mean_out, float* inv_out) {
  double sum = 0;
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    float lane = 0;
    for (int j = 0; j < 8; ++j) lane += x[i + j];
    sum += lane;
  }
  for (; i < count; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / double(count));
  double ss = 0;
  for (i = 0; i + 8 <= count; i += 8) {
    float lane = 0;
    for (int j = 0; j < 8; ++j) lane += (x[i + j] - mean) * (x[i + j] - mean);
    ss += lane;
  }
  for (; i < count; ++i) ss += double(x[i] - mean) * (x[i] - mean);
  *mean_out = mean;
  *inv_out = static_cast<float>(1.0 / std::sqrt(ss / double(count) + eps));
}
}  // namespace

void group_norm(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t groups, const float* gamma,
                const float* beta, float eps, bool silu, Executor* ex) {
  if (groups <= 0 || c % groups) return;
  const int64_t cg = c / groups;
  run_parallel(ex, n * groups, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / groups, g = u % groups, off = (b * c + g * cg) * hw;
      float mean, inv;
      moments(x + off, cg * hw, eps, &mean, &inv);
      for (int64_t ch = g * cg; ch < (g + 1) * cg; ++ch) {
        const float scale = inv * (gamma ? gamma[ch] : 1.0f);
        const float shift = (beta ? beta[ch] : 0.0f) - mean * scale;
        const float* src = x + (b * c + ch) * hw;
        float* dst = y + (b * c + ch) * hw;
        for (int64_t i = 0; i < hw; ++i) dst[i] = src[i] * scale + shift;
        if (silu) {
          if (use_avx2())
            cpu::avx2::activation(Activation::silu, dst, dst, hw);
          else
            for (int64_t i = 0; i < hw; ++i) dst[i] = silu_f(dst[i]);
        }
      }
    }
  });
}

// ---- layer norm ---------------------------------------------------------------

void layer_norm_ref(const float* x, float* y, int64_t rows, int64_t dim, const float* gamma, const float* beta,
                    float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < dim; ++i) mean += xr[i];
    mean /= double(dim);
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(dim);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] = static_cast<float>((xr[i] - mean) * inv * (gamma ? gamma[i] : 1.0) + (beta ? beta[i] : 0.0));
  }
}

void layer_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* gamma, const float* beta, float eps,
                Executor* ex) {
  // Rows are short (768..1280): a thread takes 16 at a time.
  constexpr int64_t kRows = 16;
  run_parallel(ex, (rows + kRows - 1) / kRows, [&](int64_t u0, int64_t u1) {
    for (int64_t r = u0 * kRows; r < std::min(rows, u1 * kRows); ++r) {
      float mean, inv;
      moments(x + r * dim, dim, eps, &mean, &inv);
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] - mean) * inv * (gamma ? gamma[i] : 1.0f) + (beta ? beta[i] : 0.0f);
    }
  });
}

// ---- activations, GEGLU, upsampling ---------------------------------------------

void activation_ref(Activation a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(act_ref(a, x[i]));
}

namespace {
// The scalar level's activations in f32.
float act_f(Activation a, float v) {
  switch (a) {
    case Activation::silu: return silu_f(v);
    case Activation::gelu: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    case Activation::gelu_tanh: return 0.5f * v * (1.0f + std::tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case Activation::quick_gelu: return v / (1.0f + std::exp(-1.702f * v));
  }
  return v;
}
}  // namespace

void activation(Activation a, const float* x, float* y, int64_t n, Executor* ex) {
  constexpr int64_t kChunk = 16384;
  run_parallel(ex, (n + kChunk - 1) / kChunk, [&](int64_t u0, int64_t u1) {
    const int64_t b = u0 * kChunk, e = std::min(n, u1 * kChunk);
    if (use_avx2()) return cpu::avx2::activation(a, x + b, y + b, e - b);
    for (int64_t i = b; i < e; ++i) y[i] = act_f(a, x[i]);
  });
}

void glu_ref(Activation a, const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(act_ref(a, gate[i]) * up[i]);
}

void glu(Activation a, const float* gate, const float* up, float* out, int64_t n) {
  if (use_avx2()) return cpu::avx2::glu_row(a, gate, up, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = act_f(a, gate[i]) * up[i];
}

void geglu_ref(const float* x, float* y, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] = static_cast<float>(x[r * 2 * dim + i] * act_ref(Activation::gelu, x[r * 2 * dim + dim + i]));
}

void geglu(const float* x, float* y, int64_t rows, int64_t dim, Executor* ex) {
  run_parallel(ex, rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* v = x + r * 2 * dim;
      const float* g = v + dim;
      float* out = y + r * dim;
      if (use_avx2()) {
        cpu::avx2::geglu_row(v, g, out, dim);
      } else {
        for (int64_t i = 0; i < dim; ++i) out[i] = v[i] * 0.5f * g[i] * (1.0f + std::erf(g[i] * 0.70710678118654752f));
      }
    }
  });
}

void upsample_nearest2x_ref(const float* x, float* y, int64_t planes, int64_t h, int64_t w) {
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oy = 0; oy < 2 * h; ++oy)
      for (int64_t ox = 0; ox < 2 * w; ++ox) y[(p * 2 * h + oy) * 2 * w + ox] = x[(p * h + oy / 2) * w + ox / 2];
}

void upsample_nearest2x(const float* x, float* y, int64_t planes, int64_t h, int64_t w, Executor* ex) {
  run_parallel(ex, planes * h, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {  // one input row -> two output rows
      const float* src = x + r * w;
      float* dst = y + r * 4 * w;
      for (int64_t i = 0; i < w; ++i) dst[2 * i] = dst[2 * i + 1] = src[i];
      std::memcpy(dst + 2 * w, dst, static_cast<size_t>(2 * w) * sizeof(float));
    }
  });
}

// ---- attention ------------------------------------------------------------------

void attention_ref(const AttentionShape& s, const float* q, const float* k, const float* v, float* out) {
  const int64_t D = s.head_dim, stride = s.heads * D;
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(D));
  std::vector<double> p(static_cast<size_t>(s.lk));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.lq; ++i) {
        const float* qi = q + (b * s.lq + i) * stride + h * D;
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.lk; ++j) {
          const float* kj = k + (b * s.lk + j) * stride + h * D;
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += double(qi[c]) * kj[c];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < s.lk; ++j) sum += p[j] = std::exp(p[j] - mx);
        float* oi = out + (b * s.lq + i) * stride + h * D;
        for (int64_t c = 0; c < D; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < s.lk; ++j) acc += p[j] * v[(b * s.lk + j) * stride + h * D + c];
          oi[c] = static_cast<float>(acc / sum);
        }
      }
}

void attention(const AttentionShape& s, const float* q, const float* k, const float* v, float* out, Executor* ex) {
  if (s.batch <= 0 || s.heads <= 0 || s.lq <= 0 || s.lk <= 0 || s.head_dim <= 0) return;
  if (active_simd() == Simd::avx512) return cpu::avx512::attention(s, q, k, v, out, ex);
  if (active_simd() == Simd::avx2) return cpu::avx2::attention(s, q, k, v, out, ex);
  const int64_t D = s.head_dim, stride = s.heads * D;
  const float scale = s.scale > 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(D));
  // Query blocks of 64 rows against key blocks of 512: the block's scores
  // (128 KiB) stay in L2. Both products go through the f32 matmul: scores =
  // Q_blk K_blk^T with K's rows read in place (WeightView stride), and
  // P V through V transposed once per head (its rows become the weights).
  constexpr int64_t kQ = 64, kK = 512;
  const int64_t q_blocks = (s.lq + kQ - 1) / kQ, bh = s.batch * s.heads;

  std::vector<float> vt(static_cast<size_t>(bh * D * s.lk));  // [b][h][d][lk]
  run_parallel(ex, bh, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / s.heads, h = u % s.heads;
      float* dst = vt.data() + u * D * s.lk;
      for (int64_t j = 0; j < s.lk; ++j) {
        const float* src = v + (b * s.lk + j) * stride + h * D;
        for (int64_t c = 0; c < D; ++c) dst[c * s.lk + j] = src[c];
      }
    }
  });

  run_parallel(ex, bh * q_blocks, [&](int64_t u0, int64_t u1) {
    thread_local std::vector<float> qb, sc, pv, acc, mx, den;
    qb.resize(static_cast<size_t>(kQ * D));
    sc.resize(static_cast<size_t>(kQ * kK));
    pv.resize(static_cast<size_t>(kQ * D));
    acc.resize(static_cast<size_t>(kQ * D));
    mx.resize(kQ);
    den.resize(kQ);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t head = u / q_blocks, i0 = (u % q_blocks) * kQ, nq = std::min(kQ, s.lq - i0);
      const int64_t b = head / s.heads, h = head % s.heads;
      for (int64_t i = 0; i < nq; ++i) {
        const float* src = q + (b * s.lq + i0 + i) * stride + h * D;
        for (int64_t c = 0; c < D; ++c) qb[i * D + c] = src[c] * scale;
      }
      std::fill(acc.begin(), acc.begin() + nq * D, 0.0f);
      std::fill(mx.begin(), mx.begin() + nq, -INFINITY);
      std::fill(den.begin(), den.begin() + nq, 0.0f);
      for (int64_t j0 = 0; j0 < s.lk; j0 += kK) {
        const int64_t nk = std::min(kK, s.lk - j0);
        const WeightView kv{DType::F32, k + (b * s.lk + j0) * stride + h * D, nk, D,
                            static_cast<int64_t>(stride * sizeof(float))};
        matmul(kv, qb.data(), sc.data(), nq, nullptr);  // sc: [nq][nk]
        for (int64_t i = 0; i < nq; ++i) {
          float* row = sc.data() + i * nk;
          float m = mx[i];
          for (int64_t j = 0; j < nk; ++j) m = std::max(m, row[j]);
          const float corr = std::exp(mx[i] - m);  // 0 on the first block (mx = -inf)
          float sum;
          if (use_avx2()) {
            sum = cpu::avx2::exp_shift_sum(row, nk, m);
          } else {
            sum = 0;
            for (int64_t j = 0; j < nk; ++j) sum += row[j] = std::exp(row[j] - m);
          }
          den[i] = den[i] * corr + sum;
          mx[i] = m;
          if (corr != 1.0f)
            for (int64_t c = 0; c < D; ++c) acc[i * D + c] *= corr;
        }
        const WeightView vv{DType::F32, vt.data() + head * D * s.lk + j0, D, nk,
                            static_cast<int64_t>(s.lk * sizeof(float))};
        matmul(vv, sc.data(), pv.data(), nq, nullptr);  // pv: [nq][D]
        for (int64_t i = 0; i < nq * D; ++i) acc[i] += pv[i];
      }
      for (int64_t i = 0; i < nq; ++i) {
        float* dst = out + (b * s.lq + i0 + i) * stride + h * D;
        const float inv = 1.0f / den[i];
        for (int64_t c = 0; c < D; ++c) dst[c] = acc[i * D + c] * inv;
      }
    }
  });
}

// ---- timestep embedding -----------------------------------------------------------

void timestep_embedding(const float* t, int64_t n_t, int64_t dim, float* out, bool flip_sin_to_cos,
                        float downscale_freq_shift, float max_period) {
  const int64_t half = dim / 2;
  for (int64_t r = 0; r < n_t; ++r) {
    float* o = out + r * dim;
    for (int64_t i = 0; i < half; ++i) {
      // The same f32 steps as torch: exponent, exp, product.
      const float exponent = -std::log(max_period) * static_cast<float>(i) / (static_cast<float>(half) - downscale_freq_shift);
      const float arg = t[r] * std::exp(exponent);
      const float c = std::cos(arg), sn = std::sin(arg);
      o[i] = flip_sin_to_cos ? c : sn;
      o[half + i] = flip_sin_to_cos ? sn : c;
    }
    if (dim % 2) o[dim - 1] = 0.0f;
  }
}

}  // namespace atelier::kernels
