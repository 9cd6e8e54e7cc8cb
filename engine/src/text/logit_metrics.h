// Quality figures of a model against a text, from its logits: the
// log-probability of a token, the KL divergence between two next-token
// distributions, and the running totals that make perplexity, mean KL and
// top-1 agreement over a teacher-forced text. All in double: a 32000-way
// softmax summed in float loses the small probabilities KL is made of.
#pragma once

#include <cstdint>

namespace atelier::text {

// log softmax(logits)[token], in double (max-subtracted log-sum-exp).
double log_prob(const float* logits, int64_t n_vocab, int32_t token);

// KL(P || Q) = sum_i p_i (log p_i - log q_i) in nats, P = softmax(p_logits),
// Q = softmax(q_logits). >= 0; 0 when the rows are equal.
double kl_divergence(const float* p_logits, const float* q_logits, int64_t n_vocab);

// The first index of the largest logit.
int32_t argmax(const float* logits, int64_t n_vocab);

// Totals over the scored positions of a text: the reference model's row P
// and the candidate's row Q for the same position, and the token that came
// next in the text.
struct LogitComparison {
  int64_t positions = 0;
  double nll_reference = 0, nll_candidate = 0;  // sums of -log p(next token)
  double kl_sum = 0, kl_max = 0;
  int64_t top1_same = 0;

  void add(const float* reference, const float* candidate, int64_t n_vocab, int32_t next_token);
  double perplexity_reference() const;  // exp(mean NLL); 0 with no positions
  double perplexity_candidate() const;
  double mean_kl() const;
  double top1_agreement() const;        // fraction of positions whose argmax agrees
};

}  // namespace atelier::text
