#include "text/generation.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>

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
  if (!request.json_schema.empty()) {
    auto m = JsonMatcher::compile(request.json_schema);  // validated at submission
    if (m.ok()) {
      if (request.json_trigger.empty()) json_ = std::move(m.value());
      else json_fresh_ = std::move(m.value());
      pieces_.resize(logits_.size());
      for (size_t i = 0; i < pieces_.size(); ++i)
        if (!tokenizer.is_eog(static_cast<int32_t>(i))) pieces_[i] = tokenizer.token_to_piece(static_cast<int32_t>(i));
    }
  }
  // Tests only (see generation.h): deterministic answers from a synthetic
  // model, read per generation so one server can be given several in turn.
  if (const char* path = std::getenv("ATELIER_TEST_FORCED_OUTPUT"); path && *path) {
    std::ifstream f(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!text.empty()) forced_ = tokenizer.encode(text, false, true);
    // SentencePiece vocabularies put a word marker before the first word: not part of the text.
    std::string decoded;
    for (int32_t t : forced_) decoded += tokenizer.token_to_piece(t);
    size_t extra = decoded.size() > text.size() && decoded.compare(decoded.size() - text.size(), text.size(), text) == 0
                       ? decoded.size() - text.size() : 0;
    while (extra > 0 && !forced_.empty()) {
      const size_t n = tokenizer.token_to_piece(forced_.front()).size();
      if (n > extra) break;
      extra -= n;
      forced_.erase(forced_.begin());
    }
    // They put one after each special token too: where that marker has no token of
    // its own it comes as byte tokens (U+2581's bytes) that are not in the text either.
    std::vector<int32_t> kept;
    size_t at = 0;
    for (int32_t t : forced_) {
      const std::string piece = tokenizer.token_to_piece(t);
      if (text.compare(at, piece.size(), piece) == 0) at += piece.size();
      else if (tokenizer.token_type(t) == tok::TokenType::Byte) continue;
      else if (!piece.empty() && piece[0] == ' ' && text.compare(at, piece.size() - 1, piece, 1) == 0) at += piece.size() - 1;
      else at += piece.size();
      kept.push_back(t);
    }
    forced_ = std::move(kept);
  }
}

bool Generation::allowed(int32_t id) const {
  const std::string& p = pieces_[static_cast<size_t>(id)];
  // End of sequence and empty pieces never (the value ends it); and the value
  // must still close within the tokens left after this one (one byte each).
  const int left = request_.max_new_tokens - static_cast<int>(new_ids_.size()) - 1;
  return !p.empty() && json_->accepts(p, left);
}

int32_t Generation::sample() {
  const int n = static_cast<int>(logits_.size());
  if (request_.logprobs || request_.top_logprobs > 0) {
    float mx = -std::numeric_limits<float>::infinity();
    for (float l : logits_) mx = std::max(mx, l);
    double sum = 0;
    for (float l : logits_) sum += std::exp(static_cast<double>(l - mx));
    log_sum_exp_ = mx + std::log(sum);
    raw_ = logits_;
    top_.clear();
    if (request_.top_logprobs > 0) {
      std::vector<int32_t> idx(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
      const auto k = static_cast<std::ptrdiff_t>(std::min(request_.top_logprobs, n));
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return raw_[static_cast<size_t>(a)] > raw_[static_cast<size_t>(b)] || (raw_[static_cast<size_t>(a)] == raw_[static_cast<size_t>(b)] && a < b);
      });
      for (std::ptrdiff_t i = 0; i < k; ++i)
        top_.push_back({idx[static_cast<size_t>(i)], static_cast<float>(raw_[static_cast<size_t>(idx[static_cast<size_t>(i)])] - log_sum_exp_)});
    }
  }
  if (!forced_.empty()) {
    // The forced token (or, past the text, end of sequence) well above every other.
    const size_t at = new_ids_.size();
    int32_t want = at < forced_.size() ? forced_[at] : -1;
    if (want < 0)
      for (int32_t t = 0; t < n; ++t)
        if (tokenizer_.is_eog(t)) { want = t; break; }
    if (want >= 0 && want < n) {
      float mx = -std::numeric_limits<float>::infinity();
      for (float l : logits_) mx = std::max(mx, l);
      logits_[static_cast<size_t>(want)] = mx + 1000.0f;
    }
  }
  if (!json_) return sampler_.sample(logits_.data(), n);
  std::vector<float> original = logits_;
  const int32_t id = sampler_.sample(logits_.data(), n);
  if (allowed(id)) return id;
  logits_ = std::move(original);
  for (int32_t t = 0; t < n; ++t)
    if (!allowed(t)) logits_[static_cast<size_t>(t)] = -std::numeric_limits<float>::infinity();
  return sampler_.sample(logits_.data(), n);
}

TokenEvent Generation::accept(int32_t id) {
  sampler_.accept(id);
  if (json_) {
    json_->feed(pieces_[static_cast<size_t>(id)]);
    if (json_fresh_ && json_->complete()) {  // the value is whole: free text again until the next trigger
      json_.reset();
      since_value_.clear();
    }
  } else if (json_fresh_) {
    since_value_ += pieces_[static_cast<size_t>(id)];
    if (const size_t at = since_value_.find(request_.json_trigger); at != std::string::npos) {
      json_ = *json_fresh_;
      // The token may carry the value's first bytes after the trigger.
      const std::string rest = since_value_.substr(at + request_.json_trigger.size());
      if (!rest.empty()) json_->feed(rest);  // unchanged when they are not (whitespace runs, say)
      since_value_.clear();
    } else if (since_value_.size() > 4 * request_.json_trigger.size() + 64) {
      since_value_.erase(0, since_value_.size() - request_.json_trigger.size());
    }
  }
  if (request_.logprobs || request_.top_logprobs > 0)
    logprobs_.push_back({id, raw_.empty() ? 0.0f : static_cast<float>(raw_[static_cast<size_t>(id)] - log_sum_exp_), top_});
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
  if (stream_.stopped() || (json_ && !json_fresh_ && json_->complete())) return "stop";
  if (cancelled) return "cancelled";
  if (static_cast<int>(new_ids_.size()) >= request_.max_new_tokens) return "length";
  if (n_tokens() >= max_tokens_) return "context";
  return nullptr;
}

}  // namespace atelier::text
