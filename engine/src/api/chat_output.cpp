// atelier/chat.h: the answer's reasoning, content and tool calls, parsed as it
// streams; the tool-call constraint's plan.
#include <atelier/chat.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "text/json_constraint.h"

namespace atelier {

using nlohmann::ordered_json;

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]", kPythonTag = "<|python_tag|>";
constexpr std::string_view kChannel = "<|channel|>", kMessage = "<|message|>";
constexpr std::string_view kHarmonyEnds[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>", "<|channel|>"};

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view lstrip(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

// The length of the longest end of TEXT that is a proper start of MARKER
// (held back: the rest of the marker may come with the next piece).
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// Where the first whole JSON value of TEXT (after whitespace) ends, or npos
// when it does not end there (unbalanced brackets, an open string).
size_t json_value_end(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && is_space(text[i])) ++i;
  if (i == text.size() || (text[i] != '{' && text[i] != '[')) return std::string_view::npos;
  int depth = 0;
  bool in_string = false, escape = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

std::string arguments_text(const ordered_json& args) {
  if (args.is_string()) return args.get<std::string>();  // some models write the object as a string
  return args.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// One call object: {"name": ..., "arguments" | "parameters": {...}} (and Mistral's "id").
bool call_from(const ordered_json& j, ToolCall* out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) return false;
  out->name = j["name"].get<std::string>();
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  if (!key) return false;
  const ordered_json& a = j[key];
  if (!a.is_object() && !a.is_string()) return false;
  out->arguments = arguments_text(a);
  if (j.contains("id") && j["id"].is_string()) out->id = j["id"].get<std::string>();
  return true;
}

// The calls of one JSON value (an object, or a list of them), and what follows it.
bool parse_calls(std::string_view body, std::vector<ToolCall>* calls, std::string* rest) {
  const size_t end = json_value_end(body);
  if (end == std::string_view::npos) return false;
  const auto j = ordered_json::parse(body.substr(0, end), nullptr, false);
  if (j.is_discarded()) return false;
  std::vector<ToolCall> found;
  if (j.is_array()) {
    if (j.empty()) return false;
    for (const auto& e : j) {
      ToolCall c;
      if (!call_from(e, &c)) return false;
      found.push_back(std::move(c));
    }
  } else {
    ToolCall c;
    if (!call_from(j, &c)) return false;
    found.push_back(std::move(c));
  }
  *calls = std::move(found);
  *rest = std::string(body.substr(end));
  return true;
}

// Where the JSON string that opens at TEXT[i] ends (after its closing quote), or npos.
size_t string_end(std::string_view t, size_t i) {
  for (size_t k = i + 1; k < t.size(); ++k) {
    if (t[k] == '\\') ++k;
    else if (t[k] == '"') return k + 1;
  }
  return std::string_view::npos;
}

// Where the JSON value that starts at TEXT[i] ends, or npos while it may go on.
size_t value_end(std::string_view t, size_t i) {
  if (i >= t.size()) return std::string_view::npos;
  if (t[i] == '"') return string_end(t, i);
  if (t[i] == '{' || t[i] == '[') {
    const size_t e = json_value_end(t.substr(i));
    return e == std::string_view::npos ? e : i + e;
  }
  size_t k = i;  // a number or a literal: ends where a separator starts
  while (k < t.size() && !is_space(t[k]) && t[k] != ',' && t[k] != '}' && t[k] != ']') ++k;
  return k == t.size() ? std::string_view::npos : k;
}

// What is known so far of one call object, {"name": ..., "arguments": {...}},
// from text that may stop anywhere in it.
struct CallScan {
  std::string id, name;
  size_t args_begin = std::string_view::npos, args_end = std::string_view::npos;  // npos end: still open
  bool args_object = false;
};

// Scans the object that opens at TEXT[i]; returns where it ends, or npos
// (not whole yet, or not a call object: BAD then).
size_t scan_call_object(std::string_view t, size_t i, CallScan* c, bool* bad) {
  const size_t npos = std::string_view::npos;
  size_t k = i + 1;
  auto skip = [&] { while (k < t.size() && is_space(t[k])) ++k; };
  for (;;) {
    skip();
    if (k >= t.size()) return npos;
    if (t[k] == '}') return k + 1;
    if (t[k] == ',') { ++k; continue; }
    if (t[k] != '"') { *bad = true; return npos; }
    const size_t key_end = string_end(t, k);
    if (key_end == npos) return npos;
    const auto key = ordered_json::parse(t.substr(k, key_end - k), nullptr, false);
    if (!key.is_string()) { *bad = true; return npos; }
    k = key_end;
    skip();
    if (k >= t.size()) return npos;
    if (t[k] != ':') { *bad = true; return npos; }
    ++k;
    skip();
    if (k >= t.size()) return npos;
    const std::string name = key.get<std::string>();
    const bool args = (name == "arguments" || name == "parameters") && c->args_begin == npos;
    if (args) {
      c->args_begin = k;
      c->args_object = t[k] == '{';
    }
    const size_t end = value_end(t, k);
    if (end == npos) return npos;
    if (args) c->args_end = end;
    if ((name == "name" || name == "id") && t[k] == '"') {
      const auto v = ordered_json::parse(t.substr(k, end - k), nullptr, false);
      if (v.is_string()) (name == "name" ? c->name : c->id) = v.get<std::string>();
    }
    k = end;
  }
}

// The call objects of a call's body so far: one object, or a list of them (Mistral).
std::vector<CallScan> scan_calls(std::string_view t) {
  std::vector<CallScan> out;
  size_t k = 0;
  while (k < t.size() && is_space(t[k])) ++k;
  if (k >= t.size()) return out;
  const bool list = t[k] == '[';
  if (list) ++k;
  for (;;) {
    while (k < t.size() && (is_space(t[k]) || (list && t[k] == ','))) ++k;
    if (k >= t.size() || t[k] != '{') return out;
    CallScan c;
    bool bad = false;
    const size_t end = scan_call_object(t, k, &c, &bad);
    if (bad) return out;
    out.push_back(std::move(c));
    if (end == std::string_view::npos || !list) return out;
    k = end;
  }
}

}  // namespace

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::Hermes: return "hermes";
    case ToolFormat::Llama3: return "llama3";
    case ToolFormat::Mistral: return "mistral";
    case ToolFormat::GptOss: return "gpt-oss";
    case ToolFormat::None: break;
  }
  return "none";
}

ChatSyntax detect_chat_syntax(std::string_view t) {
  ChatSyntax s;
  auto has = [&](std::string_view x) { return t.find(x) != std::string_view::npos; };
  if (has("<|channel|>")) {
    s.harmony = true;
    s.tools = ToolFormat::GptOss;
    return s;
  }
  s.think_tags = has("<think>") || has("</think>");
  if (has("<tool_call>")) s.tools = ToolFormat::Hermes;
  else if (has("[TOOL_CALLS]")) s.tools = ToolFormat::Mistral;
  else if (has("<|start_header_id|>") && (has("<|python_tag|>") || has("\"parameters\"") || has("tools")))
    s.tools = ToolFormat::Llama3;
  return s;
}

bool prompt_opens_reasoning(const ChatSyntax& syntax, std::string_view prompt) {
  if (!syntax.think_tags) return false;
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.size() >= kThinkOpen.size() && prompt.substr(prompt.size() - kThinkOpen.size()) == kThinkOpen;
}

ChatOutputParser::ChatOutputParser(ChatSyntax syntax, ChatOutputOptions options)
    : state_(State::Start), syntax_(syntax), options_(std::move(options)) {
  if (syntax_.harmony) state_ = State::HarmonyHeader;
  else if (options_.starts_in_reasoning && options_.split_reasoning) state_ = State::Reasoning;
  if (!options_.prefill.empty()) {
    // The prefill is the prompt's: it only moves the state (into a call). A
    // streamed call's start it made (gpt-oss's header names the tool) goes out
    // with the first piece.
    pending_ = options_.prefill;
    run(carry_, false);
    carry_.content.clear();
    carry_.reasoning.clear();
  }
}

ChatDelta ChatOutputParser::push(std::string_view text) {
  ChatDelta out = std::move(carry_);
  carry_ = ChatDelta{};
  pending_.append(text);
  run(out, false);
  return out;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta out = std::move(carry_);
  carry_ = ChatDelta{};
  run(out, true);
  return out;
}

void ChatOutputParser::emit_whole(ChatDelta& out, ToolCall call) {
  if (options_.stream_calls) {
    out.call_pieces.push_back({calls_made_, call.id, call.name, ""});
    out.call_pieces.push_back({calls_made_, "", "", call.arguments});
  }
  ++calls_made_;
  out.calls.push_back(std::move(call));
}

// stream_calls: the pieces of BODY's calls (a call marker's body so far) not yet handed out.
void ChatOutputParser::stream_call(ChatDelta& out, std::string_view body) {
  const std::vector<CallScan> scans = scan_calls(body);
  for (size_t k = 0; k < scans.size(); ++k) {
    const CallScan& s = scans[k];
    // In order, and only object arguments (a string's text is not the arguments' text).
    if (s.name.empty() || s.args_begin == std::string_view::npos || !s.args_object) return;
    const int index = calls_made_ + static_cast<int>(k);
    if (k >= streaming_.size()) {
      streaming_.push_back({s.id, s.name, ""});
      out.call_pieces.push_back({index, s.id, s.name, ""});
    }
    const size_t end = s.args_end == std::string_view::npos ? body.size() : s.args_end;
    Streamed& st = streaming_[k];
    const std::string_view args = body.substr(s.args_begin, end - s.args_begin);
    if (args.size() > st.arguments.size()) {
      const std::string piece(args.substr(st.arguments.size()));
      st.arguments += piece;
      out.call_pieces.push_back({index, "", "", piece});
    }
  }
}

void ChatOutputParser::close_call(ChatDelta& out, const std::string& body, bool closed) {
  if (options_.stream_calls) stream_call(out, body);
  std::vector<ToolCall> calls;
  std::string rest;
  const bool ok = parse_calls(body, &calls, &rest) && lstrip(rest).empty();
  if (!streaming_.empty()) {
    // Calls already under way stay calls, their arguments as streamed.
    const size_t n = streaming_.size();
    for (size_t i = 0; i < n; ++i) {
      Streamed& s = streaming_[i];
      if (s.id.empty() && ok && i < calls.size()) s.id = calls[i].id;  // an id written after the arguments
      out.calls.push_back({std::move(s.id), std::move(s.name), std::move(s.arguments)});
    }
    streaming_.clear();
    calls_made_ += static_cast<int>(n);
    if (ok)
      for (size_t i = n; i < calls.size(); ++i) emit_whole(out, std::move(calls[i]));
    return;
  }
  if (ok) {
    for (auto& c : calls) emit_whole(out, std::move(c));
    return;
  }
  // Malformed: the text as the model wrote it.
  out.content += call_open_ + body;
  if (closed && call_open_ == kHermesOpen) out.content += kHermesClose;
}

void ChatOutputParser::run(ChatDelta& out, bool final) {
  const bool tools = options_.tools && syntax_.tools != ToolFormat::None;
  for (;;) {
    switch (state_) {
      case State::Start: {
        // Only whitespace so far: a reasoning block may open here, and a
        // Llama 3 call is an answer that is one JSON object.
        const std::string_view s = lstrip(pending_);
        if (syntax_.think_tags && options_.split_reasoning && !content_started_) {
          if (s.substr(0, kThinkOpen.size()) == kThinkOpen) {
            pending_ = std::string(s.substr(kThinkOpen.size()));
            state_ = State::Reasoning;
            continue;
          }
          if (!final && kThinkOpen.substr(0, s.size()) == s) return;  // "" or a start of "<think>"
        }
        if (tools && syntax_.tools == ToolFormat::Llama3 && !s.empty() && s.front() == '{') {
          call_open_.clear();
          pending_ = std::string(s);
          state_ = State::Call;
          continue;
        }
        if (s.empty() && !final) return;
        if (content_started_) pending_ = std::string(s);  // after reasoning or a call: no leading whitespace
        content_started_ = true;
        state_ = State::Content;
        continue;
      }
      case State::Content: {
        size_t at = std::string::npos, hold = 0;
        std::string_view marker;
        if (tools) {
          const std::string_view m = syntax_.tools == ToolFormat::Hermes    ? kHermesOpen
                                     : syntax_.tools == ToolFormat::Mistral ? kMistralOpen
                                                                             : kPythonTag;
          at = pending_.find(m);
          marker = m;
          hold = partial_marker(pending_, m);
        }
        if (at != std::string::npos) {
          out.content += pending_.substr(0, at);
          pending_.erase(0, at + marker.size());
          call_open_ = std::string(marker);
          state_ = State::Call;
          continue;
        }
        if (final) hold = 0;
        out.content += pending_.substr(0, pending_.size() - hold);
        pending_.erase(0, pending_.size() - hold);
        return;
      }
      case State::Reasoning: {
        // Stripped as llama.cpp strips it: no leading or trailing whitespace
        // (trailing whitespace is held back until something follows it).
        if (!reasoning_started_) {
          const std::string_view s = lstrip(pending_);
          if (s.size() != pending_.size()) pending_ = std::string(s);
          reasoning_started_ = !pending_.empty();
        }
        const size_t at = pending_.find(kThinkClose);
        if (at != std::string::npos) {
          std::string r = pending_.substr(0, at);
          while (!r.empty() && is_space(r.back())) r.pop_back();
          out.reasoning += r;
          pending_.erase(0, at + kThinkClose.size());
          content_started_ = true;  // no second block; what follows is the answer
          state_ = State::Start;
          continue;
        }
        // Unclosed so far: hand out all but a possible "</think>" start and
        // trailing whitespace (which may yet end the block).
        size_t end = pending_.size() - (final ? 0 : partial_marker(pending_, kThinkClose));
        while (end > 0 && is_space(pending_[end - 1])) --end;
        out.reasoning += pending_.substr(0, end);
        pending_.erase(0, end);
        if (final) pending_.clear();
        return;
      }
      case State::Call: {
        if (call_open_ == kHermesOpen) {
          const size_t at = pending_.find(kHermesClose);
          if (at != std::string::npos) {
            const std::string body = pending_.substr(0, at);
            pending_.erase(0, at + kHermesClose.size());
            close_call(out, body, true);
            state_ = State::Start;  // whitespace between calls is not content
            content_started_ = true;
            continue;
          }
        } else if (!final && (call_open_.empty() || call_open_ == kMistralOpen)) {
          // A JSON value that ends the call: handed out as soon as it is whole.
          const size_t end = json_value_end(pending_);
          std::vector<ToolCall> calls;
          std::string rest;
          if (end != std::string::npos && parse_calls(pending_.substr(0, end), &calls, &rest)) {
            const std::string body = pending_.substr(0, end);
            pending_.erase(0, end);
            close_call(out, body, true);
            state_ = State::Start;
            content_started_ = true;
            continue;
          }
        }
        if (!final) {
          if (options_.stream_calls) stream_call(out, pending_);
          return;
        }
        const std::string body = std::move(pending_);
        pending_.clear();
        close_call(out, body, false);
        state_ = State::Content;
        return;
      }
      case State::HarmonyHeader:
      case State::HarmonyBody:
        harmony(out, final);
        return;
    }
  }
}

// gpt-oss: messages of a header (<|start|>assistant to=... <|channel|>NAME ...)
// and a body after <|message|>, ended by <|end|>, <|call|> or <|return|>.
void ChatOutputParser::harmony(ChatDelta& out, bool final) {
  for (;;) {
    if (state_ == State::HarmonyHeader) {
      const size_t at = pending_.find(kMessage);
      if (at == std::string::npos) {
        if (!final) return;
        // No message header at all: a model that wrote plain text.
        const std::string rest = harmony_head_ + pending_;
        if (rest.find(kChannel) == std::string::npos) out.content += rest;
        pending_.clear();
        harmony_head_.clear();
        return;
      }
      harmony_head_ += pending_.substr(0, at);
      pending_.erase(0, at + kMessage.size());
      state_ = State::HarmonyBody;
      body_start_ = true;
      continue;
    }
    // A body's leading whitespace is not part of it (a SentencePiece vocabulary
    // puts a word marker after each control token).
    if (body_start_) {
      size_t k = 0;
      while (k < pending_.size() && is_space(pending_[k])) ++k;
      pending_.erase(0, k);
      if (pending_.empty() && !final) return;
      body_start_ = false;
    }
    // The body's channel and recipient, from the header.
    const std::string& h = harmony_head_;
    std::string channel;
    if (const size_t c = h.find(kChannel); c != std::string::npos) {
      size_t i = c + kChannel.size();
      while (i < h.size() && is_space(h[i])) ++i;
      while (i < h.size() && !is_space(h[i]) && h[i] != '<') channel += h[i++];
    }
    std::string recipient;
    if (const size_t t = h.find("to="); t != std::string::npos) {
      size_t i = t + 3;
      while (i < h.size() && !is_space(h[i]) && h[i] != '<') recipient += h[i++];
    }
    const bool call = options_.tools && recipient.rfind("functions.", 0) == 0;
    size_t at = std::string::npos, hold = 0;
    std::string_view marker;
    for (std::string_view m : kHarmonyEnds) {
      const size_t p = pending_.find(m);
      if (p < at) at = p, marker = m;
      hold = std::max(hold, partial_marker(pending_, m));
    }
    const bool ends = at != std::string::npos || final;
    const size_t n = at != std::string::npos ? at : final ? pending_.size() : pending_.size() - hold;
    if (call && options_.stream_calls) {
      // The name is in the header, the body is the arguments: both go out as they come.
      const std::string name = recipient.substr(10);
      if (streaming_.empty()) {
        streaming_.push_back({"", name, ""});
        out.call_pieces.push_back({calls_made_, "", name, ""});
      }
      if (n > 0) {
        streaming_[0].arguments += pending_.substr(0, n);
        out.call_pieces.push_back({calls_made_, "", "", pending_.substr(0, n)});
      }
      if (ends) {
        out.calls.push_back({"", name, std::move(streaming_[0].arguments)});
        streaming_.clear();
        ++calls_made_;
      }
    } else if (call) {
      if (!ends) return;  // a call is handed out whole
      const std::string body = pending_.substr(0, n);
      const auto args = ordered_json::parse(body, nullptr, false);
      if (!args.is_discarded() && (args.is_object() || args.is_string())) {
        emit_whole(out, {"", recipient.substr(10), arguments_text(args)});
      } else {
        out.content += body;  // malformed arguments: the text as written
      }
    } else if (channel == "analysis" && options_.split_reasoning) {
      out.reasoning += pending_.substr(0, n);
    } else {
      out.content += pending_.substr(0, n);
    }
    pending_.erase(0, n);
    if (at == std::string::npos) {
      if (final) pending_.clear();
      return;
    }
    // <|start|> and <|channel|> begin the next header; the others only end this message.
    if (marker != "<|start|>" && marker != kChannel) pending_.erase(0, marker.size());
    harmony_head_.clear();
    state_ = State::HarmonyHeader;
  }
}

ToolPlan plan_tool_calls(ToolFormat format, const std::vector<ToolSpec>& tools, const std::string& choice) {
  ToolPlan plan;
  if (format == ToolFormat::None || tools.empty() || choice == "none") return plan;
  const bool forced = choice != "auto";
  const bool named = forced && choice != "required";
  auto params = [&](const ToolSpec& t) {
    ordered_json p = ordered_json::parse(t.parameters.empty() ? std::string(R"({"type":"object"})") : t.parameters, nullptr, false);
    if (p.is_discarded() || !text::JsonMatcher::compile(p.dump()).ok()) {
      plan.relaxed.push_back(t.name);
      p = {{"type", "object"}};
    }
    return p;
  };
  // One call object per tool: its name fixed, its arguments the tool's schema.
  auto alternative = [&](const ToolSpec& t, const char* args_key) {
    return ordered_json{{"type", "object"},
                        {"properties", {{"name", {{"const", t.name}}}, {args_key, params(t)}}},
                        {"required", {"name", args_key}},
                        {"additionalProperties", false}};
  };
  std::vector<const ToolSpec*> chosen;
  for (const auto& t : tools)
    if (!named || t.name == choice) chosen.push_back(&t);
  if (chosen.empty()) return plan;  // the caller checks the name
  auto any_of = [&](const char* args_key) {
    if (chosen.size() == 1) return alternative(*chosen[0], args_key);
    ordered_json alts = ordered_json::array();
    for (const ToolSpec* t : chosen) alts.push_back(alternative(*t, args_key));
    return ordered_json{{"anyOf", alts}};
  };
  switch (format) {
    case ToolFormat::Hermes:
      plan.json_schema = any_of("arguments").dump();
      if (forced) plan.prompt_suffix = "<tool_call>\n";
      else plan.json_trigger = std::string(kHermesOpen);
      break;
    case ToolFormat::Llama3:
      // Free text and a call both start at the answer's first byte: only a forced call is constrained.
      if (forced) plan.json_schema = any_of("parameters").dump();
      break;
    case ToolFormat::Mistral: {
      // A list of calls; anyOf inside it is beyond the constraint, so with several tools
      // the names are constrained and the arguments are any object.
      ordered_json item;
      if (chosen.size() == 1) {
        item = alternative(*chosen[0], "arguments");
      } else {
        ordered_json names = ordered_json::array();
        for (const ToolSpec* t : chosen) names.push_back(t->name);
        item = {{"type", "object"},
                {"properties", {{"name", {{"enum", names}}}, {"arguments", {{"type", "object"}}}}},
                {"required", {"name", "arguments"}},
                {"additionalProperties", false}};
      }
      plan.json_schema = ordered_json{{"type", "array"}, {"items", item}}.dump();
      if (forced) plan.prompt_suffix = std::string(kMistralOpen);
      else plan.json_trigger = std::string(kMistralOpen);
      break;
    }
    case ToolFormat::GptOss: {
      // The arguments alone follow the header; the name is in the header.
      if (chosen.size() == 1 && forced) {
        plan.prompt_suffix = "<|channel|>commentary to=functions." + chosen[0]->name + " <|constrain|>json<|message|>";
        plan.json_schema = params(*chosen[0]).dump();
      } else {
        ordered_json alts = ordered_json::array();
        for (const ToolSpec* t : chosen) alts.push_back(params(*t));
        plan.json_schema = (alts.size() == 1 ? alts[0] : ordered_json{{"anyOf", alts}}).dump();
        plan.json_trigger = "json<|message|>";
        if (forced) plan.prompt_suffix = "<|channel|>commentary to=functions.";
      }
      break;
    }
    case ToolFormat::None:
      break;
  }
  return plan;
}

}  // namespace atelier
