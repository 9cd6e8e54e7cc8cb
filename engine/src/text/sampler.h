// Token sampling in llama.cpp's order: repetition/frequency/presence
// penalties over the last N tokens, top-k, top-p, min-p, temperature, then a
// seeded draw. Temperature <= 0 is greedy. The random stream is our own
// (SplitMix64-seeded xoshiro256**), so a seed gives the same tokens on every
// platform and standard library.
#pragma once

#include <atelier/backend.h>
#include <atelier/requests.h>

#include <cstdint>
#include <deque>
#include <vector>

namespace atelier::text {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Records a token for the penalties (prompt tokens included, as llama.cpp does).
  void accept(int32_t token);
  // Picks the next token from n_vocab logits (modified in place).
  int32_t sample(float* logits, int n_vocab);
  uint64_t seed() const { return seed_; }
  // For a device's sampling (kernels::Backend::sample): the parameters, the
  // (token, count) pairs of the penalty window appended to PAIRS (none when
  // no penalty applies), and the draw sample() would take next (none when
  // greedy); the stream moves only at take_draw(), once the token came
  // back, so a step that fails leaves it where the host path would.
  kernels::SampleRow device_row(std::vector<int32_t>& pairs) const;
  void take_draw();

 private:
  double uniform01();  // [0, 1)
  bool penalized() const {
    return !recent_.empty() && (p_.repeat_penalty != 1.0f || p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f);
  }

  SamplingParams p_;
  uint64_t seed_;
  uint64_t s_[4];
  std::deque<int32_t> recent_;
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  std::vector<Candidate> cand_;
  std::vector<int32_t> hits_;  // one chunk's candidate indices
};

}  // namespace atelier::text
