// Backend::sample on the device (sample.cuh): kernels::sample_ref's rules
// with one block of 1024 threads per row and no sort of the vocabulary.
//
// Every selection is a descent over order-preserving 32-bit keys of the
// logits (radix select, 8 bits a pass, 4 passes): a histogram of 256 bins
// of weights among the elements whose key matches the prefix chosen so far,
// scanned from the top bin, finds the key v where a running total from the
// largest logit reaches a target. Weights are integers (counts, or
// probabilities in fixed point, p * 2^52, truncated), so the shared-memory
// atomics add in any order and give the same bits: the result never
// depends on scheduling. Among tokens with the key v (equal logits, equal
// probabilities) the lower ids come first, as in the reference's order:
// the n-th of them is found by a scan over contiguous chunks in id order.
//   - top-k: counts, target k: the k-th largest key, ties to the lower ids
//     (exactly k kept);
//   - top-p: probabilities of the candidates (softmax with expf and a double
//     sum in a fixed tree), target top_p: the smallest prefix of the
//     reference's order whose sum reaches it;
//   - min-p: a threshold, p >= p_max * min_p;
//   - the draw: the kept tokens' probabilities at temperature, target r:
//     the first prefix whose sum exceeds r (the inverse CDF in the
//     reference's order); past the total, the last kept token.
// The fixed-point sums are exact for every probability above 2^-29, the
// reference's double cumulative sums of floats too, so the two differ only
// where expf's last bit or the softmax sum's order moves a sum across
// top_p or r, or a probability across the min-p threshold.
#include "sample.cuh"

namespace atelier::kernels::cuda {

namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;
constexpr double kFixedOne = 4503599627370496.0;  // 2^52
using u64 = unsigned long long;

struct Shared {
  u64 hist[256];
  double dpart[kWarps];
  float fpart[kWarps];
  int ipart[kWarps], ioff[kWarps];
  int choice, nth;
  u64 above, at;
  double dres;
};

// Larger logits, larger keys; -0 and +0 one key (they compare equal).
__device__ __forceinline__ uint32_t key_of(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u << 1) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ u64 fixed(float p) { return static_cast<u64>(static_cast<double>(p) * kFixedOne); }

// A block's double sum by a fixed tree (warp shuffles down, then the warps in order).
__device__ double block_sum_d(double v, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (lane == 0) sh.dpart[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < kWarps; ++w) s += sh.dpart[w];
    sh.dres = s;
  }
  __syncthreads();
  const double r = sh.dres;
  __syncthreads();
  return r;
}
__device__ int block_sum_i(int v, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (lane == 0) sh.ipart[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int w = 0; w < kWarps; ++w) s += sh.ipart[w];
    sh.nth = s;
  }
  __syncthreads();
  const int r = sh.nth;
  __syncthreads();
  return r;
}

// The first maximum of l (the lowest id among equal maxima), as greedy picks it.
__device__ int first_max(const float* l, int n, Shared& sh) {
  int best = -1;
  float bv = 0;
  for (int i = threadIdx.x; i < n; i += kThreads)
    if (best < 0 || l[i] > bv) best = i, bv = l[i];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int ob = __shfl_xor_sync(0xffffffffu, best, o);
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) best = ob, bv = ov;
  }
  if (lane == 0) sh.ipart[warp] = best, sh.fpart[warp] = bv;
  __syncthreads();
  if (threadIdx.x == 0) {
    int b = -1;
    float v = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int ob = sh.ipart[w];
      const float ov = sh.fpart[w];
      if (ob >= 0 && (b < 0 || ov > v || (ov == v && ob < b))) b = ob, v = ov;
    }
    sh.nth = b < 0 ? 0 : b;
  }
  __syncthreads();
  const int r = sh.nth;
  __syncthreads();
  return r;
}

struct Pick {
  bool found;
  uint32_t key;  // the key where the running total reaches the target
  u64 above;     // the weight of the keys above it
  u64 at;        // the weight of the key itself
};

// Among i with in(i), weights w(i): the largest key v with
// W(key > v) < target <= W(key >= v); found false when W(all) < target.
template <class In, class W>
__device__ Pick descend(const float* l, int n, const In& in, const W& w, u64 target, Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  u64 above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      if (!in(i)) continue;
      const uint32_t k = key_of(l[i]);
      if ((k & mask) != prefix) continue;
      const u64 wi = w(i);
      if (wi) atomicAdd(&sh.hist[(k >> shift) & 255u], wi);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      u64 acc = above;
      int pick = -1;
      for (int b = 255; b >= 0; --b) {
        if (sh.hist[b] > 0 && acc + sh.hist[b] >= target) {
          pick = b;
          break;
        }
        acc += sh.hist[b];
      }
      sh.choice = pick;
      sh.above = acc;
      sh.at = pick >= 0 ? sh.hist[pick] : 0;
    }
    __syncthreads();
    const int pick = sh.choice;
    const u64 acc = sh.above, at = sh.at;
    __syncthreads();
    if (pick < 0) return {false, 0, acc, 0};
    prefix |= static_cast<uint32_t>(pick) << shift;
    mask |= 255u << shift;
    above = acc;
    if (shift == 0) return {true, prefix, above, at};
  }
  return {false, 0, 0, 0};
}

// The m-th (from 1) id in ascending order with pred(id): each thread counts
// a contiguous chunk, an exclusive scan over the threads, and the thread
// whose chunk holds it walks there. -1 when there are fewer than m.
template <class P>
__device__ int nth_id(int n, const P& pred, u64 m, Shared& sh) {
  const int chunk = (n + kThreads - 1) / kThreads;
  const int b = min(n, static_cast<int>(threadIdx.x) * chunk), e = min(n, b + chunk);
  int cnt = 0;
  for (int i = b; i < e; ++i) cnt += pred(i) ? 1 : 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inc = cnt;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += v;
  }
  if (lane == 31) sh.ipart[warp] = inc;
  if (threadIdx.x == 0) sh.nth = -1;
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int w = 0; w < kWarps; ++w) sh.ioff[w] = s, s += sh.ipart[w];
  }
  __syncthreads();
  const u64 before = static_cast<u64>(sh.ioff[warp] + inc - cnt);
  if (cnt > 0 && m > before && m <= before + static_cast<u64>(cnt)) {
    u64 left = m - before;
    for (int i = b; i < e; ++i)
      if (pred(i) && --left == 0) {
        sh.nth = i;
        break;
      }
  }
  __syncthreads();
  const int r = sh.nth;
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(float* logits, int n, const SampleRow* params,
                                                          const int32_t* pen, int32_t* out) {
  __shared__ Shared sh;
  const SampleRow p = params[blockIdx.x];
  if (p.skip) {
    if (threadIdx.x == 0) out[blockIdx.x] = -1;
    return;
  }
  float* l = logits + static_cast<int64_t>(blockIdx.x) * n;
  // Penalties: the pairs name distinct tokens; rounded as the host rounds
  // (no contraction into FMAs).
  if (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (int j = threadIdx.x; j < p.penalty_count; j += kThreads) {
      const int32_t id = pen[2 * (p.penalty_offset + j)], c = pen[2 * (p.penalty_offset + j) + 1];
      if (id < 0 || id >= n) continue;
      float x = l[id];
      if (p.repeat_penalty != 1.0f) x = x > 0 ? __fdiv_rn(x, p.repeat_penalty) : __fmul_rn(x, p.repeat_penalty);
      x = __fsub_rn(x, __fadd_rn(__fmul_rn(static_cast<float>(c), p.frequency_penalty), c > 0 ? p.presence_penalty : 0.0f));
      l[id] = x;
    }
    __syncthreads();
  }
  const int first = first_max(l, n, sh);
  if (p.temperature <= 0.0f) {
    if (threadIdx.x == 0) out[blockIdx.x] = first;
    return;
  }
  const float mx = l[first];
  // Top-k: the candidates are keys above kk, and the lowest ids up to tie_k at kk.
  uint32_t kk = 0;
  int tie_k = n;
  if (p.top_k > 0 && p.top_k < n) {
    const Pick k = descend(
        l, n, [](int) { return true; }, [](int) { return u64{1}; }, static_cast<u64>(p.top_k), sh);
    kk = k.key;
    tie_k = nth_id(n, [&](int i) { return key_of(l[i]) == kk; }, static_cast<u64>(p.top_k) - k.above, sh);
  }
  auto cand = [&](int i) {
    const uint32_t k = key_of(l[i]);
    return k > kk || (k == kk && i <= tie_k);
  };
  double s = 0;
  for (int i = threadIdx.x; i < n; i += kThreads)
    if (cand(i)) s += expf(__fsub_rn(l[i], mx));
  const double sum1 = block_sum_d(s, sh);
  auto p1 = [&](int i) { return static_cast<float>(static_cast<double>(expf(__fsub_rn(l[i], mx))) / sum1); };
  // Top-p: keys above kp, and the lowest ids up to tie_p at kp.
  uint32_t kp = 0;
  int tie_p = n;
  if (p.top_p < 1.0f) {
    u64 target = static_cast<u64>(ceil(static_cast<double>(p.top_p) * kFixedOne));
    if (p.top_p <= 0.0f || target == 0) target = 1;
    const Pick c = descend(l, n, cand, [&](int i) { return fixed(p1(i)); }, target, sh);
    if (c.found) {
      kp = c.key;
      // Equal keys carry equal weights: how many of them the total needs.
      auto at_key = [&](int i) { return cand(i) && key_of(l[i]) == kp; };
      const u64 w_one = fixed(p1(nth_id(n, at_key, 1, sh)));
      const u64 m = w_one > 0 ? (target - c.above + w_one - 1) / w_one : 1;
      tie_p = nth_id(n, at_key, m, sh);
      if (tie_p < 0) tie_p = n;  // rounding: all of them
    }
  }
  const float thr = p.min_p > 0.0f ? __fmul_rn(static_cast<float>(1.0 / sum1), p.min_p) : 0.0f;
  auto kept = [&](int i) {
    if (!cand(i)) return false;
    const uint32_t k = key_of(l[i]);
    if (!(k > kp || (k == kp && i <= tie_p))) return false;
    return p.min_p <= 0.0f || i == first || p1(i) >= thr;
  };
  // Temperature, the second softmax over the kept tokens, then the draw.
  const float t = p.temperature, mx2 = __fdiv_rn(mx, t);
  auto e2 = [&](int i) { return expf(__fsub_rn(__fdiv_rn(l[i], t), mx2)); };
  s = 0;
  for (int i = threadIdx.x; i < n; i += kThreads)
    if (kept(i)) s += e2(i);
  const double sum2 = block_sum_d(s, sh);
  auto w2 = [&](int i) { return fixed(static_cast<float>(static_cast<double>(e2(i)) / sum2)); };
  const u64 target = static_cast<u64>(p.r * kFixedOne) + 1;
  const Pick d = descend(l, n, kept, w2, target, sh);
  int id;
  if (d.found) {
    const uint32_t kd = d.key;
    auto at_key = [&](int i) { return kept(i) && key_of(l[i]) == kd; };
    const u64 w_one = w2(nth_id(n, at_key, 1, sh));
    const u64 m = w_one > 0 ? (target - d.above + w_one - 1) / w_one : 1;
    id = nth_id(n, at_key, m, sh);
    if (id < 0) {  // rounding asked for more than there are: the last of them
      const int ties = block_sum_i([&] {
        int c = 0;
        for (int i = threadIdx.x; i < n; i += kThreads) c += at_key(i) ? 1 : 0;
        return c;
      }(), sh);
      id = nth_id(n, at_key, static_cast<u64>(ties), sh);
    }
  } else {
    // Past the total (rounding): the last kept token, the smallest key's highest id.
    const int n_kept = block_sum_i([&] {
      int c = 0;
      for (int i = threadIdx.x; i < n; i += kThreads) c += kept(i) ? 1 : 0;
      return c;
    }(), sh);
    const Pick last = descend(l, n, kept, [](int) { return u64{1}; }, static_cast<u64>(n_kept), sh);
    const uint32_t kl = last.key;
    id = nth_id(n, [&](int i) { return kept(i) && key_of(l[i]) == kl; }, last.at, sh);
  }
  if (threadIdx.x == 0) out[blockIdx.x] = id < 0 ? first : id;
}

}  // namespace

void sample(cudaStream_t s, Act logits, int64_t rows, int n_vocab, const SampleRow* params, const int32_t* penalty_tokens,
            int32_t* out_ids) {
  if (rows <= 0) return;
  if (logits.type() != DType::F32) throw std::logic_error("CUDA backend: sample takes F32 logits");
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(static_cast<float*>(logits.data()), n_vocab, params,
                                                                  penalty_tokens, out_ids);
  CUDA_LAUNCHED();
}

}  // namespace atelier::kernels::cuda
