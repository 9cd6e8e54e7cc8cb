#include "text/logit_metrics.h"

#include <algorithm>
#include <cmath>

namespace atelier::text {

namespace {

// max and log(sum exp(x - max)).
void log_sum_exp(const float* x, int64_t n, double* max, double* lse) {
  double m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, static_cast<double>(x[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  *max = m;
  *lse = std::log(s);
}

}  // namespace

double log_prob(const float* logits, int64_t n_vocab, int32_t token) {
  double m, lse;
  log_sum_exp(logits, n_vocab, &m, &lse);
  return static_cast<double>(logits[token]) - m - lse;
}

double kl_divergence(const float* p_logits, const float* q_logits, int64_t n_vocab) {
  double pm, plse, qm, qlse;
  log_sum_exp(p_logits, n_vocab, &pm, &plse);
  log_sum_exp(q_logits, n_vocab, &qm, &qlse);
  double kl = 0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    const double lp = p_logits[i] - pm - plse, lq = q_logits[i] - qm - qlse;
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(0.0, kl);  // rounding can leave -1e-17 for equal rows
}

int32_t argmax(const float* logits, int64_t n_vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + n_vocab) - logits);
}

void LogitComparison::add(const float* reference, const float* candidate, int64_t n_vocab, int32_t next_token) {
  ++positions;
  nll_reference -= log_prob(reference, n_vocab, next_token);
  nll_candidate -= log_prob(candidate, n_vocab, next_token);
  const double kl = kl_divergence(reference, candidate, n_vocab);
  kl_sum += kl;
  kl_max = std::max(kl_max, kl);
  if (argmax(reference, n_vocab) == argmax(candidate, n_vocab)) ++top1_same;
}

double LogitComparison::perplexity_reference() const { return positions ? std::exp(nll_reference / positions) : 0.0; }
double LogitComparison::perplexity_candidate() const { return positions ? std::exp(nll_candidate / positions) : 0.0; }
double LogitComparison::mean_kl() const { return positions ? kl_sum / positions : 0.0; }
double LogitComparison::top1_agreement() const { return positions ? static_cast<double>(top1_same) / positions : 0.0; }

}  // namespace atelier::text
