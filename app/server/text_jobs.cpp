#include "server/text_jobs.h"

#include <algorithm>

namespace atelier::server {

TextRequest text_request_from(const json& body, const ModelEntry& model, const ApiServerOptions& options, bool chat) {
  if (model.resolved.kind == "image")
    throw ApiError(400, "'" + model.resolved.display + "' is an image model; use a text model (GET /v1/models)", "model",
                   "invalid_request_error", "wrong_model_kind");
  TextRequest r;
  r.model = model.resolved.in_store ? model.resolved.display : model.resolved.path;
  SamplingParams& s = r.sampling;
  if (auto v = opt_number(body, "temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = opt_number(body, "top_p", 0, 1)) s.top_p = static_cast<float>(*v);
  if (auto v = opt_int(body, "top_k", 0, 1 << 20)) s.top_k = static_cast<int>(*v);
  if (auto v = opt_number(body, "min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = opt_number(body, "frequency_penalty", -2, 2)) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = opt_number(body, "presence_penalty", -2, 2)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = opt_number(body, "repeat_penalty", 0, 10)) s.repeat_penalty = static_cast<float>(*v);
  if (auto v = opt_bool(body, "ignore_eos")) r.ignore_eos = *v;  // llama-server's extension (benchmarks)
  if (auto v = opt_int(body, "seed", INT64_MIN, INT64_MAX)) s.seed = *v == -1 ? SamplingParams::kRandomSeed : static_cast<uint64_t>(*v);

  const int n_ctx = default_context_tokens(model.info.n_ctx_train);
  const int64_t cap = std::min(options.max_tokens, n_ctx);
  std::optional<int64_t> max_tokens = opt_int(body, "max_completion_tokens", 1, options.max_tokens);
  if (!max_tokens) max_tokens = opt_int(body, "max_tokens", 1, options.max_tokens);
  r.max_new_tokens = static_cast<int>(max_tokens ? std::min(*max_tokens, cap) : cap);

  for (auto& stop : string_or_list(body, "stop"))
    if (!stop.empty()) r.stop.push_back(stop);

  if (chat) {
    if (auto v = opt_bool(body, "logprobs")) r.logprobs = *v;
    if (auto v = opt_int(body, "top_logprobs", 0, 20)) {
      r.top_logprobs = static_cast<int>(*v);
      if (*v > 0) r.logprobs = true;
    }
  } else if (auto v = opt_int(body, "logprobs", 0, 5)) {  // legacy completions: the number of alternatives
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(*v);
  }
  if (const auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      throw bad_field("response_format", "must be an object with a string 'type' (text, json_object, json_schema)");
    const std::string type = (*it)["type"];
    if (type == "json_object") {
      r.json_schema = R"({"type":"object"})";
    } else if (type == "json_schema") {
      const json& js = it->value("json_schema", json::object());
      if (!js.is_object()) throw bad_field("response_format.json_schema", "must be an object with a 'schema'");
      const json schema = js.value("schema", json::object({{"type", "object"}}));
      r.json_schema = schema.dump();
    } else if (type != "text") {
      throw bad_field("response_format", "type '" + type + "' is not one of text, json_object, json_schema");
    }
  }
  return r;
}

TextRun::TextRun(Context& ctx, std::vector<TextRequest> requests) : ctx_(ctx) {
  choices_.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = ctx_.events.submit([&] { return ctx_.engine.submit(requests[i]); }, queue_);
    if (!id.ok()) {
      cancel();
      const bool schema = id.status().message.rfind("json_schema:", 0) == 0;
      throw from_status(id.status(), schema ? "response_format" : "");
    }
    choices_[i].job = id.value();
    choices_[i].index = static_cast<int>(i);
    choices_[i].prompt = requests[i].prompt;
    by_job_[id.value()] = i;
  }
}

TextRun::~TextRun() {
  cancel();
  for (const auto& c : choices_)
    if (c.job) ctx_.events.unwatch(c.job);
}

void TextRun::cancel() {
  for (auto& c : choices_)
    if (c.job && !c.done) {
      ctx_.engine.cancel(c.job);
      c.done = true;
    }
}

static std::string finish_reason(const std::string& stop_reason) {
  return stop_reason == "length" || stop_reason == "context" ? "length" : "stop";
}

bool TextRun::follow(const std::function<bool(TextChoice&, const std::string&)>& on_text,
                     const std::function<bool(TextChoice&)>& on_finish, const std::function<bool()>& writable) {
  auto running = [&] { return std::any_of(choices_.begin(), choices_.end(), [](const TextChoice& c) { return !c.done; }); };
  Event ev;
  while (running()) {
    if (!writable()) {
      cancel();
      return false;
    }
    if (!queue_->pop(ev, 200)) continue;
    auto it = by_job_.find(ev.job);
    if (it == by_job_.end()) continue;
    TextChoice& c = choices_[it->second];
    if (c.done) continue;
    bool ok = true;
    switch (ev.type) {
      case EventType::Token:
        if (!ev.text.empty()) {
          c.streamed += ev.text;
          ok = on_text(c, ev.text);
        }
        break;
      case EventType::Completed: {
        c.result = ev.result;
        // What the engine held back (a possible stop string, a split UTF-8 sequence) and released at the end.
        if (c.result.text.size() > c.streamed.size() && c.result.text.compare(0, c.streamed.size(), c.streamed) == 0) {
          std::string rest = c.result.text.substr(c.streamed.size());
          c.streamed = c.result.text;
          ok = on_text(c, rest);
        }
        c.finish_reason = finish_reason(c.result.stats.stop_reason);
        c.done = true;
        ok = ok && on_finish(c);
        break;
      }
      case EventType::Failed:
        c.done = true;
        error_ = std::make_unique<ApiError>(from_status(Status::error(ev.code, "job " + std::to_string(ev.job) + " failed: " + ev.message)));
        cancel();
        return false;
      case EventType::Cancelled:
        c.done = true;
        error_ = std::make_unique<ApiError>(409, "job " + std::to_string(ev.job) + " was cancelled (from the queue)", "",
                                            "invalid_request_error", "cancelled");
        cancel();
        return false;
      default:
        break;
    }
    if (!ok) {
      cancel();
      return false;
    }
  }
  return true;
}

json chat_logprobs(const std::vector<TokenLogprob>& lps, const Vocabulary& vocab) {
  auto entry = [&](int32_t id, float lp) {
    const std::string piece = vocab.token_piece(id);
    std::vector<int> bytes;
    for (unsigned char ch : piece) bytes.push_back(ch);
    return json{{"token", piece}, {"logprob", lp}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const auto& t : lps) {
    json e = entry(t.id, t.logprob);
    e["top_logprobs"] = json::array();
    for (const auto& [id, lp] : t.top) e["top_logprobs"].push_back(entry(id, lp));
    content.push_back(e);
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs(const std::vector<TokenLogprob>& lps, const Vocabulary& vocab, size_t text_offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& t : lps) {
    const std::string piece = vocab.token_piece(t.id);
    tokens.push_back(piece);
    token_lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, lp] : t.top) top[vocab.token_piece(id)] = lp;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json TextRun::usage(int prompts) const {
  int64_t prompt = 0, completion = 0;
  const size_t per_prompt = prompts > 0 ? choices_.size() / prompts : choices_.size();
  for (size_t i = 0; i < choices_.size(); ++i) {
    completion += static_cast<int64_t>(choices_[i].result.ids.size());
    if (per_prompt && i % per_prompt == 0) prompt += choices_[i].result.stats.prompt_tokens;
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

}  // namespace atelier::server
