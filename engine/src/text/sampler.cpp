#include "text/sampler.h"

#include <atelier/kernels.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <cmath>
#include <random>
#include <unordered_map>

namespace atelier::text {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Sampler::Sampler(const SamplingParams& params) : p_(params) {
  seed_ = params.seed;
  if (seed_ == SamplingParams::kRandomSeed) {
    std::random_device rd;
    seed_ = (static_cast<uint64_t>(rd()) << 32 | rd()) ^
            static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    seed_ &= 0x7fffffffffffffffull;  // never collides with kRandomSeed; fits JSON integers that tools parse
  }
  uint64_t x = seed_;
  for (auto& s : s_) s = splitmix64(x);
}

namespace {
// xoshiro256**, one draw in [0, 1) from state s.
double next_uniform(uint64_t* s) {
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return static_cast<double>(result >> 11) * 0x1.0p-53;
}
}  // namespace

double Sampler::uniform01() { return next_uniform(s_); }

kernels::SampleRow Sampler::device_row(std::vector<int32_t>& pairs) const {
  kernels::SampleRow r;
  r.temperature = p_.temperature;
  r.top_k = p_.top_k;
  r.top_p = p_.top_p;
  r.min_p = p_.min_p;
  r.repeat_penalty = p_.repeat_penalty;
  r.frequency_penalty = p_.frequency_penalty;
  r.presence_penalty = p_.presence_penalty;
  r.penalty_offset = static_cast<int32_t>(pairs.size() / 2);
  if (penalized()) {
    // Each token once with its count (the host's map, in id order here).
    std::vector<int32_t> ids(recent_.begin(), recent_.end());
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      pairs.push_back(ids[i]);
      pairs.push_back(static_cast<int32_t>(j - i));
      ++r.penalty_count;
      i = j;
    }
  }
  if (p_.temperature > 0.0f) {
    uint64_t s[4] = {s_[0], s_[1], s_[2], s_[3]};  // the next draw, without moving this stream
    r.r = next_uniform(s);
  }
  return r;
}

void Sampler::take_draw() {
  if (p_.temperature > 0.0f) uniform01();
}

void Sampler::accept(int32_t token) {
  if (p_.repeat_last_n <= 0) return;
  recent_.push_back(token);
  while (static_cast<int>(recent_.size()) > p_.repeat_last_n) recent_.pop_front();
}

int32_t Sampler::sample(float* logits, int n_vocab) {
  // Penalties (llama.cpp's llama_sampler_penalties).
  if (penalized()) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : recent_) ++counts[t];
    for (const auto& [id, c] : counts) {
      if (id < 0 || id >= n_vocab) continue;
      float& l = logits[id];
      if (p_.repeat_penalty != 1.0f) l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
      l -= static_cast<float>(c) * p_.frequency_penalty + (c > 0 ? p_.presence_penalty : 0.0f);
    }
  }
  if (p_.temperature <= 0.0f) {
    // Greedy: first maximum wins, as in llama.cpp.
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  const size_t k = p_.top_k > 0 ? static_cast<size_t>(p_.top_k) : 0;
  cand_.clear();
  if (k > 0 && k * 8 < static_cast<size_t>(n_vocab)) {
    // Only logits at or above a running bound can be among the top k: the
    // bound is the k-th largest of what was kept so far, so every token of
    // the true top k (ties included) is kept, and a vocabulary of 32k-150k
    // is reduced to a few times k before the exact selection below.
    // The scan goes a chunk at a time through kernels::indices_at_least
    // (SIMD compares), the bound tightened between chunks.
    constexpr int32_t kChunk = 256;
    hits_.resize(kChunk);
    float bound = -std::numeric_limits<float>::infinity();
    for (int32_t off = 0; off < n_vocab; off += kChunk) {
      const int32_t len = std::min(kChunk, n_vocab - off);
      const int64_t found = kernels::indices_at_least(logits + off, len, bound, hits_.data());
      for (int64_t j = 0; j < found; ++j) {
        const int32_t i = off + hits_[static_cast<size_t>(j)];
        cand_.push_back({i, logits[i], 0.0f});
      }
      if (cand_.size() >= 4 * k) {
        std::nth_element(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k - 1), cand_.end(), by_logit);
        bound = cand_[k - 1].logit;
        cand_.erase(std::remove_if(cand_.begin() + static_cast<std::ptrdiff_t>(k), cand_.end(),
                                   [bound](const Candidate& c) { return c.logit < bound; }),
                    cand_.end());
      }
    }
  } else {
    cand_.resize(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) cand_[static_cast<size_t>(i)] = {i, logits[i], 0.0f};
  }
  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    // Select the top k in linear time, then order only those: the same k
    // tokens in the same order as a partial sort (ties go to the lower id),
    // several times faster on 32k-150k vocabularies.
    std::nth_element(cand_.begin(), cand_.begin() + (p_.top_k - 1), cand_.end(), by_logit);
    std::sort(cand_.begin(), cand_.begin() + p_.top_k, by_logit);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(n);
  auto softmax = [&] {
    double sum = 0;
    const float mx = cand_[0].logit;
    for (auto& c : cand_) {
      c.p = std::exp(c.logit - mx);
      sum += c.p;
    }
    for (auto& c : cand_) c.p = static_cast<float>(c.p / sum);
  };
  softmax();
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = cand_.size();
    for (size_t i = 0; i < cand_.size(); ++i) {
      cum += cand_[i].p;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
  }
  if (p_.min_p > 0.0f) {
    const float threshold = cand_[0].p * p_.min_p;
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].p >= threshold) ++keep;
    cand_.resize(keep);
  }
  for (auto& c : cand_) c.logit /= p_.temperature;
  softmax();
  const double r = uniform01();
  double cum = 0;
  for (const auto& c : cand_) {
    cum += c.p;
    if (r < cum) return c.id;
  }
  return cand_.back().id;
}

}  // namespace atelier::text
