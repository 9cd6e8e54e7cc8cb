// One HTTP request's text jobs (n choices, maybe several prompts): built from
// OpenAI's sampling fields, submitted so their events reach this request,
// followed to the end (cancelled when the client leaves), and turned into
// OpenAI's responses and stream chunks. Shared by chat and completions.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/context.h"

namespace atelier::server {

// The request fields both routes share (sampling, stop, seed, max_tokens):
// applied onto a TextRequest for MODEL. Wrong types or values: 400 naming the field.
// CHAT: logprobs is a bool and top_logprobs a count (chat); else logprobs is the count (legacy completions).
TextRequest text_request_from(const json& body, const ModelEntry& model, const ApiServerOptions& options, bool chat);

// OpenAI's logprobs objects: chat's {"content": [{token, logprob, bytes, top_logprobs}]},
// completions' {tokens, token_logprobs, top_logprobs, text_offset}.
json chat_logprobs(const std::vector<TokenLogprob>& logprobs, const Vocabulary& vocab);
json completion_logprobs(const std::vector<TokenLogprob>& logprobs, const Vocabulary& vocab, size_t text_offset);

struct TextChoice {
  JobId job = 0;
  int index = 0;
  std::string prompt;    // for usage and echo
  std::string streamed;  // text already handed to the client
  TextResult result;
  std::string finish_reason;  // "" while running; "stop", "length"
  bool done = false;
};

class TextRun {
 public:
  TextRun(Context& ctx, std::vector<TextRequest> requests);  // submits them all (ApiError when one is refused)
  ~TextRun();                                                // cancels what is still running

  // Follows the jobs until all end. ON_TEXT(choice, new_text) for every piece
  // of text, ON_FINISH(choice) once per choice. WRITABLE says whether the
  // client is still there (checked between events); false cancels the jobs and
  // ends the wait, as does a failed or cancelled job (then error() says why).
  bool follow(const std::function<bool(TextChoice&, const std::string&)>& on_text,
              const std::function<bool(TextChoice&)>& on_finish, const std::function<bool()>& writable);
  void cancel();

  std::vector<TextChoice>& choices() { return choices_; }
  const ApiError* error() const { return error_.get(); }
  json usage(int prompts) const;  // prompt tokens counted once per distinct prompt

 private:
  Context& ctx_;
  std::shared_ptr<EventQueue> queue_ = std::make_shared<EventQueue>();
  std::vector<TextChoice> choices_;
  std::map<JobId, size_t> by_job_;
  std::unique_ptr<ApiError> error_;
};

}  // namespace atelier::server
