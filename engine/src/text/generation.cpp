#include "text/generation.h"

namespace atelier::text {

Generation::Generation(const tok::Tokenizer& tokenizer, const TextRequest& request, std::vector<int32_t> prompt,
                       int max_tokens)
    : tokenizer_(tokenizer),
      request_(request),
      tokens_(std::move(prompt)),
      n_prompt_(static_cast<int>(tokens_.size())),
      max_tokens_(max_tokens),
      sampler_(request.sampling),
      stream_(request.stop),
      logits_(static_cast<size_t>(tokenizer.n_vocab())) {
  for (int32_t t : tokens_) sampler_.accept(t);
}

TokenEvent Generation::accept(int32_t id) {
  sampler_.accept(id);
  tokens_.push_back(id);
  new_ids_.push_back(id);
  TokenEvent ev;
  ev.index = static_cast<int>(new_ids_.size()) - 1;
  ev.id = id;
  ev.piece = tokenizer_.token_to_piece(id);
  ev.text = stream_.push(ev.piece);
  return ev;
}

const char* Generation::end_reason(bool cancelled) const {
  if (stream_.stopped()) return "stop";
  if (cancelled) return "cancelled";
  if (static_cast<int>(new_ids_.size()) >= request_.max_new_tokens) return "length";
  if (n_tokens() >= max_tokens_) return "context";
  return nullptr;
}

}  // namespace atelier::text
