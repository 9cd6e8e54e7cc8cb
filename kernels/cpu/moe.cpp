// Mixture-of-experts element-wise ops (routing, the weighted sum of the
// experts' outputs), gpt-oss's clamped SwiGLU and the softmax with an
// attention sink, each with its plain reference. These are small next to the
// experts' products (matmul_id, matmul.cpp): one scalar version serves every
// SIMD level, so the levels give the same bits.
#include <atelier/kernels.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace atelier::kernels {

// ---- gpt-oss SwiGLU ---------------------------------------------------------

void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
    out[i] = g / (1.0f + std::exp(alpha * -g)) * (u + 1.0f);
  }
}

void swiglu_oai_ref(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = std::min<double>(gate[i], limit), u = std::clamp<double>(up[i], -limit, limit);
    out[i] = static_cast<float>(g / (1.0 + std::exp(-double{alpha} * g)) * (u + 1.0));
  }
}

// ---- softmax with a sink ----------------------------------------------------

void softmax_sink(float* x, int64_t n, float sink) {
  if (n <= 0) return;
  float max = sink;
  for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
  double sum = 0;  // in double, as ggml's soft_max sums
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  sum += std::exp(sink - max);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void softmax_sink_ref(float* x, int64_t n, float sink) {
  double max = sink;
  for (int64_t i = 0; i < n; ++i) max = std::max<double>(max, x[i]);
  double sum = std::exp(double{sink} - max);
  std::vector<double> e(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) sum += (e[static_cast<size_t>(i)] = std::exp(double{x[i]} - max));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(e[static_cast<size_t>(i)] / sum);
}

// ---- routing ----------------------------------------------------------------

namespace {
constexpr float kMinWeightSum = 6.103515625e-5f;  // llama.cpp clamps the sum to F16's smallest normal

void finish_weights(const MoeRouting& r, float* w) {
  if (r.norm) {
    float sum = 0;
    for (int j = 0; j < r.k; ++j) sum += w[j];
    sum = std::max(sum, kMinWeightSum);
    for (int j = 0; j < r.k; ++j) w[j] /= sum;
  }
  if (r.scale != 0.0f && r.scale != 1.0f)
    for (int j = 0; j < r.k; ++j) w[j] *= r.scale;
}
}  // namespace

void moe_route(const float* logits, const MoeRouting& r, int32_t* ids, float* weights) {
  const int n = r.n_expert, k = std::min(r.k, r.n_expert);
  if (n <= 0 || k <= 0) return;
  thread_local std::vector<float> p;
  p.assign(logits, logits + n);
  if (r.gating == MoeGating::softmax) {
    float max = -INFINITY;
    for (float v : p) max = std::fmax(max, v);
    double sum = 0;
    for (float& v : p) sum += (v = std::exp(v - max));
    const float inv = static_cast<float>(1.0 / sum);
    for (float& v : p) v *= inv;
  } else if (r.gating == MoeGating::sigmoid) {
    for (float& v : p) v = 1.0f / (1.0f + std::exp(-v));
  }
  // Selection: k passes over n values (k and n are small: 8 of 128 at most
  // in today's models), the largest first, the lower index among equals.
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < n; ++e) {
      bool taken = false;
      for (int t = 0; t < j; ++t) taken |= ids[t] == e;
      if (!taken && (best < 0 || p[static_cast<size_t>(e)] > p[static_cast<size_t>(best)])) best = e;
    }
    ids[j] = best;
    weights[j] = p[static_cast<size_t>(best)];
  }
  if (r.gating == MoeGating::softmax_weights) {
    float max = -INFINITY;
    for (int j = 0; j < k; ++j) max = std::fmax(max, weights[j]);
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += (weights[j] = std::exp(weights[j] - max));
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < k; ++j) weights[j] *= inv;
  }
  finish_weights(r, weights);
}

void moe_route_ref(const float* logits, const MoeRouting& r, int32_t* ids, float* weights) {
  const int n = r.n_expert, k = std::min(r.k, r.n_expert);
  if (n <= 0 || k <= 0) return;
  std::vector<double> p(logits, logits + n);
  if (r.gating == MoeGating::softmax) {
    const double max = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += (v = std::exp(v - max));
    for (double& v : p) v /= sum;
  } else if (r.gating == MoeGating::sigmoid) {
    for (double& v : p) v = 1.0 / (1.0 + std::exp(-v));
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
  std::vector<double> w(static_cast<size_t>(k));
  for (int j = 0; j < k; ++j) ids[j] = order[static_cast<size_t>(j)], w[static_cast<size_t>(j)] = p[static_cast<size_t>(order[static_cast<size_t>(j)])];
  if (r.gating == MoeGating::softmax_weights) {
    const double max = w[0];
    double sum = 0;
    for (double& v : w) sum += (v = std::exp(v - max));
    for (double& v : w) v /= sum;
  }
  if (r.norm) {
    double sum = 0;
    for (double v : w) sum += v;
    sum = std::max<double>(sum, kMinWeightSum);
    for (double& v : w) v /= sum;
  }
  for (int j = 0; j < k; ++j)
    weights[j] = static_cast<float>(r.scale != 0.0f && r.scale != 1.0f ? w[static_cast<size_t>(j)] * r.scale : w[static_cast<size_t>(j)]);
}

// ---- the experts' weighted sum ------------------------------------------------

void moe_combine(const float* y, const float* weights, float* out, int64_t rows, int k, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * dim;
    const float* yr = y + r * k * dim;
    const float* w = weights + r * k;
    for (int64_t c = 0; c < dim; ++c) o[c] = w[0] * yr[c];
    for (int j = 1; j < k; ++j) {
      const float wj = w[j];
      const float* yj = yr + j * dim;
      for (int64_t c = 0; c < dim; ++c) {
        const float prod = wj * yj[c];  // rounded before the add, as ggml's mul then add
        o[c] = o[c] + prod;
      }
    }
  }
}

void moe_combine_ref(const float* y, const float* weights, float* out, int64_t rows, int k, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) {
      double acc = 0;
      for (int j = 0; j < k; ++j) acc += double{weights[r * k + j]} * y[(r * k + j) * dim + c];
      out[r * dim + c] = static_cast<float>(acc);
    }
}

}  // namespace atelier::kernels
