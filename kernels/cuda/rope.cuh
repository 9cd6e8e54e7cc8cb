// RoPE on the device: the angles of kernels::rope (normal / NeoX pairing,
// frequency factors, YaRN), computed in double per (row, pair) as the CPU
// does, then applied in FP32. Shared by norm_rope.cu and attention.cu.
#pragma once

#include <algorithm>
#include <cmath>

#include "common.cuh"

namespace atelier::kernels::cuda {

struct RopeArgs {
  int n_heads = 1, head_dim = 0, rot_dim = 0;
  double base = 10000, scale = 1;
  bool neox = false;
  const float* factors = nullptr;  // device, rot_dim / 2
  bool yarn = false;
  double ext = 0, mscale = 1, low = 0, high = 0;
};

inline RopeArgs rope_args(const RopeParams& p) {
  RopeArgs a;
  a.n_heads = static_cast<int>(p.n_heads);
  a.head_dim = static_cast<int>(p.head_dim);
  a.rot_dim = static_cast<int>(p.rot_dim);
  a.base = p.freq_base;
  a.scale = p.freq_scale;
  a.neox = p.neox;
  a.factors = p.freq_factors;
  if (p.yarn) {  // the ramp's ends and magnitude, as kernels::rope's rope_angles
    const RopeYarn& y = *p.yarn;
    const double pi = 3.14159265358979323846;
    auto dim_of = [&](double beta) {
      return double(p.rot_dim) * std::log(double(y.n_ctx_orig) / (2 * pi * beta)) / (2 * std::log(double(p.freq_base)));
    };
    a.yarn = true;
    a.ext = y.ext_factor;
    a.low = std::max(0.0, std::floor(dim_of(y.beta_fast)));
    a.high = std::min(double(p.rot_dim - 1), std::ceil(dim_of(y.beta_slow)));
    a.mscale = y.attn_factor * (y.ext_factor != 0.0f ? 1.0 + 0.1 * std::log(1.0 / p.freq_scale) : 1.0);
  }
  return a;
}

// cos and sin of pair i < rot_dim / 2 at `pos` into c[i], s[i] (shared),
// by the block's threads; the caller synchronises.
__device__ inline void rope_angles(const RopeArgs& a, int64_t pos, float* c, float* s) {
  for (int i = threadIdx.x; i < a.rot_dim / 2; i += blockDim.x) {
    const double f = pow(a.base, -2.0 * double(i) / double(a.rot_dim));
    if (a.yarn) {
      double theta_e = double(pos) * f;
      if (a.factors) theta_e /= double(a.factors[i]);
      const double ramp = 1.0 - fmin(fmax((double(i) - a.low) / fmax(0.001, a.high - a.low), 0.0), 1.0);
      const double mix = ramp * a.ext;
      const double theta = a.scale * theta_e * (1.0 - mix) + theta_e * mix;
      c[i] = static_cast<float>(cos(theta) * a.mscale);
      s[i] = static_cast<float>(sin(theta) * a.mscale);
    } else {
      double theta = double(pos) * a.scale * f;
      if (a.factors) theta /= double(a.factors[i]);
      c[i] = static_cast<float>(cos(theta));
      s[i] = static_cast<float>(sin(theta));
    }
  }
}

// Rotates the n_heads heads of one row starting at element `off` of x.
__device__ inline void rope_apply(void* x, int xt, int64_t off, const RopeArgs& a, const float* c, const float* s) {
  const int half = a.rot_dim / 2;
  for (int t = threadIdx.x; t < a.n_heads * half; t += blockDim.x) {
    const int h = t / half, i = t % half;
    const int i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
    const int64_t b = off + int64_t{h} * a.head_dim;
    const float x0 = ld(x, xt, b + i0), x1 = ld(x, xt, b + i1);
    st(x, xt, b + i0, x0 * c[i] - x1 * s[i]);
    st(x, xt, b + i1, x0 * s[i] + x1 * c[i]);
  }
}

}  // namespace atelier::kernels::cuda
