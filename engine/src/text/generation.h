// One sequence's text generation, shared by TextModel::generate (a batch of
// one, run to the end on the caller's thread) and the scheduler (many
// sequences per forward_batch step): the tokens so far (prompt, then
// generated), the sampler, the TextStream (stop strings, UTF-8 holdback) and
// the stop rules. The caller runs the forward pass into logits(); then
// sample(), ends_with_eos(id), accept(id) (the token event) and
// end_reason() decide what happens next, in this order:
//   eos (not accepted, not an event) > stop > cancelled > length > context.
#pragma once

#include <atelier/requests.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/json_constraint.h"
#include "text/sampler.h"
#include "text/text_stream.h"
#include "tokenizer/tokenizer.h"

namespace atelier::text {

class Generation {
 public:
  // PROMPT: the request's tokens. MAX_TOKENS: the most tokens (prompt and
  // generated) the sequence may hold before it ends with "context".
  Generation(const tok::Tokenizer& tokenizer, const TextRequest& request, std::vector<int32_t> prompt, int max_tokens);

  const std::vector<int32_t>& tokens() const { return tokens_; }  // prompt, then generated
  const int32_t* token_data() const { return tokens_.data(); }
  int n_tokens() const { return static_cast<int>(tokens_.size()); }
  int n_prompt() const { return n_prompt_; }
  const std::vector<int32_t>& new_ids() const { return new_ids_; }
  std::vector<int32_t> prompt_ids() const { return {tokens_.begin(), tokens_.begin() + n_prompt_}; }

  // Where the forward pass writes the next token's logits (n_vocab floats).
  float* logits() { return logits_.data(); }
  // Draws the next token from logits() (modified in place): with a
  // json_schema, only a token the schema's matcher accepts (the sampler's
  // pick when it fits, else a draw from the tokens that do) -- with a
  // json_trigger, only after the trigger and until the value is whole; with
  // logprobs, the model's distribution is read first.
  // Tests only: when the environment names a file in
  // ATELIER_TEST_FORCED_OUTPUT, its text (tokenized) is what the model
  // "prefers": each step's logits favour the next of its tokens, then end of
  // sequence. The schema's mask still applies on top, so a test sees the
  // constraint overrule a forced text that breaks it.
  int32_t sample();
  // Sampling on a device (kernels::Backend::sample): whether the next token
  // may be drawn there (only the Sampler's rules apply: no json_schema, no
  // logprobs, no forced test output), its parameters with the draw sample()
  // would take (penalty pairs appended to PAIRS), and the device's token
  // back: the draw is taken from the stream then, so a step that fails
  // leaves the stream where it was. The token then goes through
  // ends_with_eos / accept as a sampled one does.
  bool device_sampleable() const {
    return request_.json_schema.empty() && !request_.logprobs && request_.top_logprobs <= 0 && forced_.empty();
  }
  kernels::SampleRow device_row(std::vector<int32_t>& pairs) const { return sampler_.device_row(pairs); }
  int32_t device_sampled(int32_t id) {
    sampler_.take_draw();
    return id;
  }
  // ID ends the generation as end of generation ("eos"); it is then not accepted.
  bool ends_with_eos(int32_t id) const { return tokenizer_.is_eog(id) && !request_.ignore_eos; }
  // Appends ID: the sampler's history, the tokens, the stream. Returns its token event.
  TokenEvent accept(int32_t id);
  // After accept(): why the generation ends now ("stop", "cancelled" when
  // CANCELLED, "length", "context"), or nullptr when it goes on.
  const char* end_reason(bool cancelled = false) const;

  std::string text() const { return stream_.text(); }  // cut before a stop string
  const std::vector<TokenLogprob>& logprobs() const { return logprobs_; }  // one per accepted token (when asked)
  size_t released() const { return stream_.released(); }
  uint64_t seed() const { return sampler_.seed(); }

 private:
  const tok::Tokenizer& tokenizer_;
  const TextRequest& request_;
  std::vector<int32_t> tokens_, new_ids_;
  int n_prompt_ = 0, max_tokens_ = 0;
  Sampler sampler_;
  TextStream stream_;
  std::vector<float> logits_;
  std::optional<JsonMatcher> json_;     // the value being matched (active when set)
  std::optional<JsonMatcher> json_fresh_;  // with a json_trigger: a new matcher for each trigger
  std::string since_value_;              // with a json_trigger: new text since the last value (to find the trigger)
  std::vector<int32_t> forced_;          // ATELIER_TEST_FORCED_OUTPUT's tokens (tests only)
  std::vector<std::string> pieces_;  // every token's bytes (with json_)
  std::vector<float> raw_;           // logits before sampling (logprobs, or the masked redraw)
  double log_sum_exp_ = 0;
  std::vector<std::pair<int32_t, float>> top_;
  std::vector<TokenLogprob> logprobs_;
  bool allowed(int32_t id) const;
};

}  // namespace atelier::text
