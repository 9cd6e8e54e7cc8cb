// A chat's prompt fitted to its context before it is submitted: the
// conversation rendered with the model's chat template, its tokens counted
// with the model's own tokenizer (the same encode the engine runs, so the
// count is exact), and, when it does not fit, the overflow policy applied:
//   truncate-middle  keeps the system prompt, the first exchange and the
//                    latest messages, dropping whole messages after the first
//                    exchange (and the first exchange too when that is not
//                    enough);
//   rolling-window   keeps the system prompt and the latest messages that fit;
//   stop-at-limit    drops nothing: a prompt that does not fit is refused,
//                    and the answer stops when the context is full.
// The answer gets max_new_tokens of room when the policy can make it
// (at most half the context), and never more than the context has left.
// No Qt: plain values, tested against a real tokenizer.
#pragma once

#include <atelier/models.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace atelier::ui {

enum class Overflow { TruncateMiddle, RollingWindow, StopAtLimit };
const char* overflow_name(Overflow o);  // "truncate-middle", "rolling-window", "stop-at-limit"
Overflow overflow_from_name(const std::string& name);  // TruncateMiddle for an unknown name

struct ChatFitInput {
  std::vector<ChatMessage> messages;  // the conversation before the answer (system message first when there is one)
  std::string answer_prefix;          // text the answer continues ("" for a new answer)
  int context_tokens = 0;             // the conversation's context size
  int max_new_tokens = 0;
  Overflow policy = Overflow::TruncateMiddle;
};

struct ChatFit {
  std::string prompt;
  bool add_bos = true;       // false when the template writes its own BOS
  int prompt_tokens = 0;     // exact: the tokenizer's count of PROMPT (BOS included)
  int max_new_tokens = 0;    // what is left of the context for the answer, at most the request's
  int dropped_messages = 0;  // left out by the policy
};

// Tokens of PROMPT as the engine counts them (add_bos as the request says).
using TokenCounter = std::function<Result<int>(const std::string& prompt, bool add_bos)>;

// InvalidArgument, with what to do, when the conversation cannot fit under the policy.
Result<ChatFit> fit_chat(const ModelInfo& model, const ChatFitInput& input, const TokenCounter& count);

// Bytes the KV cache holds per token of context (keys and values of every layer) at KV_TYPE; 0 when the header does not say.
int64_t kv_bytes_per_token(const ModelInfo& model, KvType kv_type);

}  // namespace atelier::ui
