#include "write/context_fit.h"

#include <algorithm>

namespace atelier::ui {

const char* overflow_name(Overflow o) {
  switch (o) {
    case Overflow::RollingWindow: return "rolling-window";
    case Overflow::StopAtLimit: return "stop-at-limit";
    default: return "truncate-middle";
  }
}

Overflow overflow_from_name(const std::string& name) {
  if (name == "rolling-window") return Overflow::RollingWindow;
  if (name == "stop-at-limit") return Overflow::StopAtLimit;
  return Overflow::TruncateMiddle;
}

int64_t kv_bytes_per_token(const ModelInfo& m, KvType kv_type) {
  if (m.n_layers <= 0 || m.n_heads <= 0 || m.n_embd <= 0) return 0;
  const int64_t kv_heads = m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
  const int64_t values = 2 * int64_t{m.n_layers} * kv_heads * (m.n_embd / m.n_heads);  // keys and values
  return kv_type_bytes(kv_type, values);  // q8_0: 34 bytes per 32 values, fp8 (MXFP8) 33
}

namespace {

struct Rendered {
  std::string prompt;
  bool add_bos = true;
};

Result<Rendered> render(const ModelInfo& model, const std::vector<ChatMessage>& messages, const std::string& prefix) {
  auto text = format_chat_prompt(model, messages, /*add_generation_prompt=*/true);
  if (!text.ok()) return text.status();
  Rendered r;
  // The plain format's "Assistant:" wants a space before an answer typed without one.
  const bool space = model.chat_template.empty() && !prefix.empty() && prefix.front() != ' ' && prefix.front() != '\n';
  r.prompt = text.value() + (space ? " " : "") + prefix;
  // A template writes its own BOS; the engine must not add a second one.
  if (!model.bos_token.empty() && r.prompt.rfind(model.bos_token, 0) == 0) r.add_bos = false;
  return r;
}

Status too_long(int tokens, int context, Overflow policy) {
  const std::string counts = std::to_string(tokens) + " tokens but its context holds " + std::to_string(context);
  if (policy == Overflow::StopAtLimit)
    return Status::error(StatusCode::InvalidArgument,
                         "this conversation has " + counts +
                             ": raise its context size, choose the truncate-middle or rolling-window overflow policy, or start a new conversation");
  return Status::error(StatusCode::InvalidArgument, "even with the earlier messages left out, the prompt has " + counts +
                                                        ": raise the context size or shorten the message");
}

}  // namespace

Result<ChatFit> fit_chat(const ModelInfo& model, const ChatFitInput& in, const TokenCounter& count) {
  const int context = std::max(1, in.context_tokens);
  const int reserve = std::clamp(in.max_new_tokens, 1, std::max(1, context / 2));
  std::vector<ChatMessage> kept = in.messages;
  auto measure = [&](ChatFit& fit) -> Status {
    auto r = render(model, kept, in.answer_prefix);
    if (!r.ok()) return r.status();
    auto n = count(r->prompt, r->add_bos);
    if (!n.ok()) return n.status();
    fit.prompt = std::move(r->prompt);
    fit.add_bos = r->add_bos;
    fit.prompt_tokens = n.value();
    return Status{};
  };
  ChatFit fit;
  if (Status s = measure(fit); !s.ok()) return s;
  if (in.policy != Overflow::StopAtLimit) {
    // Messages that may go, oldest first: never the system prompt or the message being answered;
    // truncate-middle keeps the first exchange too.
    const size_t first = !kept.empty() && kept.front().role == "system" ? 1 : 0;
    auto droppable_from = [&]() -> size_t {
      if (in.policy == Overflow::RollingWindow) return first;
      size_t head = first + 1;  // the first message, and the answer to it
      if (head < kept.size() && kept[head].role == "assistant") ++head;
      return head;
    };
    while (fit.prompt_tokens + reserve > context) {
      size_t from = droppable_from();
      // Truncate-middle with no middle left: the first exchange goes too, rather than no answer at all.
      if (from + 1 >= kept.size()) from = first;
      if (kept.size() < 2 || from + 1 >= kept.size()) break;  // only the system prompt and the message being answered are left
      // Drop a user message together with the answer to it, so roles still alternate for the template.
      size_t n = 1;
      if (kept[from].role == "user" && from + 1 < kept.size() - 1 && kept[from + 1].role == "assistant") n = 2;
      kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(from), kept.begin() + static_cast<std::ptrdiff_t>(from + n));
      fit.dropped_messages += static_cast<int>(n);
      if (Status s = measure(fit); !s.ok()) return s;
    }
  }
  if (fit.prompt_tokens >= context) return too_long(fit.prompt_tokens, context, in.policy);
  fit.max_new_tokens = std::max(1, std::min(in.max_new_tokens, context - fit.prompt_tokens));
  return fit;
}

}  // namespace atelier::ui
