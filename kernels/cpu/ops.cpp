// Element-wise ops: scalar references, scalar fallbacks, and the dispatch to
// the AVX2 variants (used at the avx512 level too: these ops are memory-bound),
// except the attention's runs of rows, which have AVX-512 variants.
#include <atelier/kernels.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops_internal.h"
#include "simd.h"

namespace atelier::kernels {

using cpu::active_simd;
using cpu::Simd;

namespace {
bool use_avx2() { return active_simd() != Simd::scalar; }
bool use_avx512() { return active_simd() == Simd::avx512; }
}  // namespace

// ---- references -------------------------------------------------------------

void rms_norm_ref(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double sum = 0;  // as GGML does, in double
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = weight ? x[i] * scale * weight[i] : x[i] * scale;
}

void softmax_ref(float* x, int64_t n) {
  if (n <= 0) return;
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
  if (max == -INFINITY) max = 0;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu_ref(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

namespace {
// theta_i = pos * freq_scale * base^(-2i/rot_dim) / factor_i, in double so
// long contexts keep their phase.
void rope_angles(int64_t rot_dim, int64_t pos, float freq_base, float freq_scale, const float* factors, float* c,
                 float* s, const RopeYarn* yarn) {
  if (yarn) {
    // The ramp's ends: where a pair turns beta times over the original context.
    const double pi = 3.14159265358979323846;
    auto dim_of = [&](double beta) {
      return double(rot_dim) * std::log(double(yarn->n_ctx_orig) / (2 * pi * beta)) / (2 * std::log(double(freq_base)));
    };
    const double low = std::max(0.0, std::floor(dim_of(yarn->beta_fast)));
    const double high = std::min(double(rot_dim - 1), std::ceil(dim_of(yarn->beta_slow)));
    // The magnitude correction comes with the extrapolation mix, as ggml's
    // rope_yarn applies it: none when ext_factor is 0.
    const double mscale =
        yarn->attn_factor * (yarn->ext_factor != 0.0f ? 1.0 + 0.1 * std::log(1.0 / freq_scale) : 1.0);
    for (int64_t i = 0; i < rot_dim / 2; ++i) {
      double theta_e = double(pos) * std::pow(double(freq_base), -2.0 * double(i) / double(rot_dim));
      if (factors) theta_e /= double(factors[i]);
      const double ramp = 1.0 - std::clamp((double(i) - low) / std::max(0.001, high - low), 0.0, 1.0);
      const double mix = ramp * yarn->ext_factor;
      const double theta = freq_scale * theta_e * (1.0 - mix) + theta_e * mix;
      c[i] = static_cast<float>(std::cos(theta) * mscale);
      s[i] = static_cast<float>(std::sin(theta) * mscale);
    }
    return;
  }
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    double theta = double(pos) * freq_scale * std::pow(double(freq_base), -2.0 * double(i) / double(rot_dim));
    if (factors) theta /= double(factors[i]);
    c[i] = static_cast<float>(std::cos(theta));
    s[i] = static_cast<float>(std::sin(theta));
  }
}

void rope_apply(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, bool neox, const float* c,
                const float* s) {
  const int64_t half = rot_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
      const float x0 = v[i0], x1 = v[i1];
      v[i0] = x0 * c[i] - x1 * s[i];
      v[i1] = x0 * s[i] + x1 * c[i];
    }
  }
}
}  // namespace

void rope_ref(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, int64_t pos, float freq_base,
              float freq_scale, bool neox, const float* freq_factors, const RopeYarn* yarn) {
  for (int64_t h = 0; h < n_heads; ++h) {  // angles recomputed per head: the plain form
    std::vector<float> c(rot_dim / 2), s(rot_dim / 2);
    rope_angles(rot_dim, pos, freq_base, freq_scale, freq_factors, c.data(), s.data(), yarn);
    rope_apply(x + h * head_dim, 1, head_dim, rot_dim, neox, c.data(), s.data());
  }
}

// ---- dispatched -------------------------------------------------------------

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  if (use_avx2()) return cpu::avx2::rms_norm(x, weight, y, n, eps);
  rms_norm_ref(x, weight, y, n, eps);
}

void softmax(float* x, int64_t n) {
  if (use_avx2()) return cpu::avx2::softmax(x, n);
  softmax_ref(x, n);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  if (use_avx2()) return cpu::avx2::swiglu(gate, up, out, n);
  swiglu_ref(gate, up, out, n);
}

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, int64_t pos, float freq_base,
          float freq_scale, bool neox, const float* freq_factors, const RopeYarn* yarn) {
  // One table of angles for all heads, and kept for the next calls at the
  // same position (a forward pass ropes Q and K of every layer at each row's
  // position: 2 x layers tables per row otherwise, ~1.5 % of a batched step).
  // The key holds the factors' values, not their address.
  struct Table {
    int64_t pos = -1, rot_dim = 0;
    float base = 0, scale = 0;
    bool has_factors = false, has_yarn = false;
    RopeYarn yarn;
    std::vector<float> factors, cs;
  };
  thread_local Table cache[8];
  Table& t = cache[pos & 7];
  const size_t half = static_cast<size_t>(rot_dim / 2);
  const bool hit = t.pos == pos && t.rot_dim == rot_dim && t.base == freq_base && t.scale == freq_scale &&
                   t.has_factors == (freq_factors != nullptr) &&
                   (!freq_factors || std::equal(t.factors.begin(), t.factors.end(), freq_factors)) &&
                   t.has_yarn == (yarn != nullptr) && (!yarn || t.yarn == *yarn);
  if (!hit) {
    t.pos = pos;
    t.rot_dim = rot_dim;
    t.base = freq_base;
    t.scale = freq_scale;
    t.has_factors = freq_factors != nullptr;
    t.factors.assign(freq_factors, freq_factors ? freq_factors + half : freq_factors);
    t.has_yarn = yarn != nullptr;
    if (yarn) t.yarn = *yarn;
    t.cs.resize(2 * half);
    rope_angles(rot_dim, pos, freq_base, freq_scale, freq_factors, t.cs.data(), t.cs.data() + half, yarn);
  }
  rope_apply(x, n_heads, head_dim, rot_dim, neox, t.cs.data(), t.cs.data() + half);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  if (use_avx2()) return cpu::avx2::dot_f32(a, b, n);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  if (use_avx2()) return cpu::avx2::axpy_f32(a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

float dot_f16_f32(const uint16_t* a, const float* b, int64_t n) {
  if (use_avx2()) return cpu::avx2::dot_f16_f32(a, b, n);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += fp16_to_f32(a[i]) * b[i];
  return s;
}

void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) {
  if (use_avx2()) return cpu::avx2::axpy_f16(a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * fp16_to_f32(x[i]);
}

namespace {
// One head at a time through a one-head run-of-rows op (the scalar and AVX2
// levels): scores or sums of head h from KV head h / group.
template <class P, class Fn>
void dots_per_head(P rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q, float* scores,
                   int64_t scores_stride, Fn rows_dot) {
  for (int h = hs.h0; h < hs.h1; ++h)
    rows_dot(rows + (h / hs.group) * hs.head_dim, stride, n_rows, q + h * hs.head_dim, hs.head_dim,
             scores + (h - hs.h0) * scores_stride);
}
// The SIMD levels: a block of positions at a time, every head of the task
// within it, so that a long run's rows are read in order instead of one
// strided pass per head (at depth 8192, 12 passes over the whole V cache).
// Each element still sees one FMA per position in position order, as in one
// call per head: the result is that call's to the bit.
template <class P, class Fn>
void axpys_by_position_block(const float* a, int64_t a_stride, P rows, int64_t stride, int64_t n_rows,
                             const AttnHeads& hs, float* y, Fn rows_axpy) {
  constexpr int64_t kBlockRows = 16;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kBlockRows) {
    const int64_t m = std::min(kBlockRows, n_rows - r0);
    const int64_t next = std::min(kBlockRows, n_rows - r0 - m);
    for (int h = hs.h0; h < hs.h1; ++h) {
      const P head = rows + (h / hs.group) * hs.head_dim;
      // The next block's slice, a block's work ahead (the score dots
      // prefetch their own): one token's attention at depth 8192 over Q8_0
      // rows, Zen 3 avx2, 21.8 -> 17.9 ms; F16 within the noise.
      if (h == hs.h0 || h % hs.group == 0) cpu::prefetch_slices(head + (r0 + m) * stride, stride, next, hs.head_dim);
      rows_axpy(a + (h - hs.h0) * a_stride + r0, head + r0 * stride, stride, m, y + h * hs.head_dim, hs.head_dim);
    }
  }
}
// The queries form: per block of positions and head, up to kAttnQueries rows
// at once (rows_axpy: a level's *_rows_queries), each row's FMAs those of its
// own axpys_by_position_block.
template <class P, class Fn>
void axpys_queries_by_position_block(int nq, const float* const* a, const int64_t* a_stride, P rows, int64_t stride,
                                     int64_t n_rows, const AttnHeads& hs, float* const* y, Fn rows_axpy) {
  constexpr int64_t kBlockRows = 16;
  const float* ah[kAttnQueries];
  float* yh[kAttnQueries];
  for (int64_t r0 = 0; r0 < n_rows; r0 += kBlockRows) {
    const int64_t m = std::min(kBlockRows, n_rows - r0);
    for (int h = hs.h0; h < hs.h1; ++h) {
      for (int j = 0; j < nq; ++j) ah[j] = a[j] + (h - hs.h0) * a_stride[j] + r0, yh[j] = y[j] + h * hs.head_dim;
      rows_axpy(nq, ah, rows + r0 * stride + (h / hs.group) * hs.head_dim, stride, m, yh, hs.head_dim);
    }
  }
}
// Grouped at AVX2 (its tiles share each converted register among the rows);
// AVX-512 and the scalar level take the rows one by one (the grouped tile has
// no AVX-512 form yet).
template <class P, class One, class Many>
void axpy_heads_queries(int nq, const float* const* a, const int64_t* a_stride, P rows, int64_t stride, int64_t n_rows,
                        const AttnHeads& hs, float* const* y, One one, Many many) {
  const bool grouped = !use_avx512() && use_avx2();
  for (int j0 = 0; j0 < nq; j0 += kAttnQueries) {
    const int n = std::min(kAttnQueries, nq - j0);
    if (grouped && n > 1) axpys_queries_by_position_block(n, a + j0, a_stride + j0, rows, stride, n_rows, hs, y + j0, many);
    else
      for (int j = j0; j < j0 + n; ++j) one(a[j], a_stride[j], rows, stride, n_rows, hs, y[j]);
  }
}
template <class P, class Fn>
void axpys_per_head(const float* a, int64_t a_stride, P rows, int64_t stride, int64_t n_rows,
                    const AttnHeads& hs, float* y, Fn rows_axpy) {
  for (int h = hs.h0; h < hs.h1; ++h)
    rows_axpy(a + (h - hs.h0) * a_stride, rows + (h / hs.group) * hs.head_dim, stride, n_rows, y + h * hs.head_dim,
              hs.head_dim);
}

void dot_f32_rows_ref(const float* rows, int64_t stride, int64_t n_rows, const float* x, int64_t n, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* a = rows + r * stride;
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += a[i] * x[i];
    out[r] = s;
  }
}
void dot_f16_rows_ref(const uint16_t* rows, int64_t stride, int64_t n_rows, const float* x, int64_t n, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint16_t* a = rows + r * stride;
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += fp16_to_f32(a[i]) * x[i];
    out[r] = s;
  }
}
void axpy_f32_rows_ref(const float* a, const float* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] += a[r] * rows[r * stride + i];
}
void axpy_f16_rows_ref(const float* a, const uint16_t* rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] += a[r] * fp16_to_f32(rows[r * stride + i]);
}
// Value e of a Q8_0 run, dequantized as GGML does (fp16 scale times int8).
float q8_value(Q8Rows p) { return fp16_to_f32(cpu::q8_scale_bits(p)) * static_cast<float>(*cpu::q8_values(p)); }
void dot_q8_0_rows_ref(Q8Rows rows, int64_t stride, int64_t n_rows, const float* x, int64_t n, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const Q8Rows a = rows + r * stride;
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += q8_value(a + i) * x[i];
    out[r] = s;
  }
}
void axpy_q8_0_rows_ref(const float* a, Q8Rows rows, int64_t stride, int64_t n_rows, float* y, int64_t n) {
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] += a[r] * q8_value(rows + r * stride + i);
}
}  // namespace

void dot_q8_0_heads_ref(Q8Rows rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                        float* scores, int64_t scores_stride) {
  dots_per_head(rows, stride, n_rows, hs, q, scores, scores_stride, dot_q8_0_rows_ref);
}
void axpy_q8_0_heads_ref(const float* a, int64_t a_stride, Q8Rows rows, int64_t stride, int64_t n_rows,
                         const AttnHeads& hs, float* y) {
  axpys_per_head(a, a_stride, rows, stride, n_rows, hs, y, axpy_q8_0_rows_ref);
}
void dot_q8_0_heads(Q8Rows rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q, float* scores,
                    int64_t scores_stride) {
  if (use_avx512()) return cpu::avx512::dot_q8_0_heads(rows, stride, n_rows, hs, q, scores, scores_stride);
  if (use_avx2()) return cpu::avx2::dot_q8_0_heads(rows, stride, n_rows, hs, q, scores, scores_stride);
  dot_q8_0_heads_ref(rows, stride, n_rows, hs, q, scores, scores_stride);
}
void axpy_q8_0_heads(const float* a, int64_t a_stride, Q8Rows rows, int64_t stride, int64_t n_rows,
                     const AttnHeads& hs, float* y) {
  if (use_avx512()) return axpys_by_position_block(a, a_stride, rows, stride, n_rows, hs, y, cpu::avx512::axpy_q8_0_rows);
  if (use_avx2()) return axpys_by_position_block(a, a_stride, rows, stride, n_rows, hs, y, cpu::avx2::axpy_q8_0_rows);
  axpy_q8_0_heads_ref(a, a_stride, rows, stride, n_rows, hs, y);
}

void axpy_q8_0_heads_queries(int nq, const float* const* a, const int64_t* a_stride, Q8Rows rows, int64_t stride,
                             int64_t n_rows, const AttnHeads& hs, float* const* y) {
  axpy_heads_queries(nq, a, a_stride, rows, stride, n_rows, hs, y, axpy_q8_0_heads, cpu::avx2::axpy_q8_0_rows_queries);
}
void axpy_f32_heads_queries(int nq, const float* const* a, const int64_t* a_stride, const float* rows, int64_t stride,
                            int64_t n_rows, const AttnHeads& hs, float* const* y) {
  axpy_heads_queries(nq, a, a_stride, rows, stride, n_rows, hs, y, axpy_f32_heads, cpu::avx2::axpy_f32_rows_queries);
}
void axpy_f16_heads_queries(int nq, const float* const* a, const int64_t* a_stride, const uint16_t* rows,
                            int64_t stride, int64_t n_rows, const AttnHeads& hs, float* const* y) {
  axpy_heads_queries(nq, a, a_stride, rows, stride, n_rows, hs, y, axpy_f16_heads, cpu::avx2::axpy_f16_rows_queries);
}

void dot_f32_heads_ref(const float* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                       float* scores, int64_t scores_stride) {
  dots_per_head(rows, stride, n_rows, hs, q, scores, scores_stride, dot_f32_rows_ref);
}
void dot_f16_heads_ref(const uint16_t* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                       float* scores, int64_t scores_stride) {
  dots_per_head(rows, stride, n_rows, hs, q, scores, scores_stride, dot_f16_rows_ref);
}
void axpy_f32_heads_ref(const float* a, int64_t a_stride, const float* rows, int64_t stride, int64_t n_rows,
                        const AttnHeads& hs, float* y) {
  axpys_per_head(a, a_stride, rows, stride, n_rows, hs, y, axpy_f32_rows_ref);
}
void axpy_f16_heads_ref(const float* a, int64_t a_stride, const uint16_t* rows, int64_t stride, int64_t n_rows,
                        const AttnHeads& hs, float* y) {
  axpys_per_head(a, a_stride, rows, stride, n_rows, hs, y, axpy_f16_rows_ref);
}

void dot_f32_heads(const float* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                   float* scores, int64_t scores_stride) {
  if (use_avx512()) return cpu::avx512::dot_f32_heads(rows, stride, n_rows, hs, q, scores, scores_stride);
  if (use_avx2()) return cpu::avx2::dot_f32_heads(rows, stride, n_rows, hs, q, scores, scores_stride);
  dot_f32_heads_ref(rows, stride, n_rows, hs, q, scores, scores_stride);
}

void dot_f16_heads(const uint16_t* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, const float* q,
                   float* scores, int64_t scores_stride) {
  if (use_avx512()) return cpu::avx512::dot_f16_heads(rows, stride, n_rows, hs, q, scores, scores_stride);
  if (use_avx2()) return cpu::avx2::dot_f16_heads(rows, stride, n_rows, hs, q, scores, scores_stride);
  dot_f16_heads_ref(rows, stride, n_rows, hs, q, scores, scores_stride);
}

namespace {
// In groups of kAttnQueries through the level's several-query dots; the
// scalar level (and a lone query): one call per query.
template <class P, class Many, class One>
void heads_queries(P rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq, const float* const* q,
                   float* const* scores, const int64_t* scores_stride, Many avx512, Many avx2, One one) {
  for (int j0 = 0; j0 < nq; j0 += kAttnQueries) {
    const int m = std::min(kAttnQueries, nq - j0);
    if (m > 1 && use_avx512()) avx512(rows, stride, n_rows, hs, m, q + j0, scores + j0, scores_stride + j0);
    else if (m > 1 && use_avx2()) avx2(rows, stride, n_rows, hs, m, q + j0, scores + j0, scores_stride + j0);
    else
      for (int j = j0; j < j0 + m; ++j) one(rows, stride, n_rows, hs, q[j], scores[j], scores_stride[j]);
  }
}
}  // namespace

void dot_f32_heads_queries(const float* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                           const float* const* q, float* const* scores, const int64_t* scores_stride) {
  heads_queries(rows, stride, n_rows, hs, nq, q, scores, scores_stride, &cpu::avx512::dot_f32_heads_queries,
                &cpu::avx2::dot_f32_heads_queries, &dot_f32_heads);
}
void dot_f16_heads_queries(const uint16_t* rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                           const float* const* q, float* const* scores, const int64_t* scores_stride) {
  heads_queries(rows, stride, n_rows, hs, nq, q, scores, scores_stride, &cpu::avx512::dot_f16_heads_queries,
                &cpu::avx2::dot_f16_heads_queries, &dot_f16_heads);
}

void dot_q8_0_heads_queries(Q8Rows rows, int64_t stride, int64_t n_rows, const AttnHeads& hs, int nq,
                            const float* const* q, float* const* scores, const int64_t* scores_stride) {
  heads_queries(rows, stride, n_rows, hs, nq, q, scores, scores_stride, &cpu::avx512::dot_q8_0_heads_queries,
                &cpu::avx2::dot_q8_0_heads_queries, &dot_q8_0_heads);
}

void axpy_f32_heads(const float* a, int64_t a_stride, const float* rows, int64_t stride, int64_t n_rows,
                    const AttnHeads& hs, float* y) {
  if (use_avx512()) return axpys_by_position_block(a, a_stride, rows, stride, n_rows, hs, y, cpu::avx512::axpy_f32_rows);
  if (use_avx2()) return axpys_by_position_block(a, a_stride, rows, stride, n_rows, hs, y, cpu::avx2::axpy_f32_rows);
  axpy_f32_heads_ref(a, a_stride, rows, stride, n_rows, hs, y);
}

void axpy_f16_heads(const float* a, int64_t a_stride, const uint16_t* rows, int64_t stride, int64_t n_rows,
                    const AttnHeads& hs, float* y) {
  if (use_avx512()) return axpys_by_position_block(a, a_stride, rows, stride, n_rows, hs, y, cpu::avx512::axpy_f16_rows);
  if (use_avx2()) return axpys_by_position_block(a, a_stride, rows, stride, n_rows, hs, y, cpu::avx2::axpy_f16_rows);
  axpy_f16_heads_ref(a, a_stride, rows, stride, n_rows, hs, y);
}

int64_t indices_at_least_ref(const float* x, int64_t n, float bound, int32_t* idx) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] >= bound) idx[k++] = static_cast<int32_t>(i);
  return k;
}

int64_t indices_at_least(const float* x, int64_t n, float bound, int32_t* idx) {
  if (use_avx512()) return cpu::avx512::indices_at_least(x, n, bound, idx);
  if (use_avx2()) return cpu::avx2::indices_at_least(x, n, bound, idx);
  return indices_at_least_ref(x, n, bound, idx);
}

void f32_to_fp16_row(const float* x, uint16_t* y, int64_t n) {
  if (use_avx2()) return cpu::avx2::f32_to_fp16_row(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_fp16(x[i]);
}

void fp16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  if (use_avx2()) return cpu::avx2::fp16_to_f32_row(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_f32(x[i]);
}

}  // namespace atelier::kernels
