// Token sampling in llama.cpp's order: repetition/frequency/presence
// penalties over the last N tokens, top-k, top-p, min-p, temperature, then a
// seeded draw. Temperature <= 0 is greedy. The random stream is our own
// (SplitMix64-seeded xoshiro256**), so a seed gives the same tokens on every
// platform and standard library.
#pragma once

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

 private:
  double uniform01();  // [0, 1)

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
