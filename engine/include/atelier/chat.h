// atelier/chat.h — a chat model's answer taken apart: its reasoning (a
// <think> block, gpt-oss's analysis channel), its content and its tool calls
// (each in the model's own format), as llama-server's reasoning_format
// "deepseek" and its tool-call parsers do; and the constraint that keeps a
// tool call's arguments valid for the tool's JSON schema.
//
// Pure C++20, no Qt. Nothing here throws: a malformed call is handed back as
// content, never an error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace atelier {

// How a model writes tool calls (read from its chat template, as llama.cpp's
// common/chat.cpp detects it):
//   Hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen 2.5/3, Hermes)
//   Llama3   {"name": ..., "parameters": {...}} as the whole answer, or after <|python_tag|>
//   Mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
//   GptOss   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
enum class ToolFormat { None, Hermes, Llama3, Mistral, GptOss };
const char* tool_format_name(ToolFormat f);  // "none", "hermes", "llama3", "mistral", "gpt-oss"

struct ChatSyntax {
  ToolFormat tools = ToolFormat::None;
  bool think_tags = false;  // <think>...</think> (Qwen3, DeepSeek-R1)
  bool harmony = false;     // gpt-oss's channels: analysis is reasoning, final is content
};
// From a chat template's text ("" = the plain format: no tools, no thinking).
ChatSyntax detect_chat_syntax(std::string_view template_text);
// Whether a rendered prompt opens the reasoning block itself (it ends with
// "<think>" and whitespace), so that the answer starts inside it.
bool prompt_opens_reasoning(const ChatSyntax& syntax, std::string_view prompt);

struct ToolCall {
  std::string id;         // the model's own when it writes one (Mistral), else ""
  std::string name;
  std::string arguments;  // a JSON object's text
};

// A piece of a call as it streams (ChatOutputOptions::stream_calls): the
// call's first piece has its name (and the model's id if it wrote one first),
// the others only a fragment of its arguments' text, as OpenAI's streamed
// delta.tool_calls[i] carry them. A call's fragments, joined, are its
// ToolCall::arguments.
struct ToolCallPiece {
  int index = 0;  // the call's number in the answer, from 0
  std::string id, name, arguments;
};

// What a piece of the answer added to each part.
struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCall> calls;              // calls that ended in this piece, whole
  std::vector<ToolCallPiece> call_pieces;   // with stream_calls: the calls' pieces as they come
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty() && call_pieces.empty(); }
};

struct ChatOutputOptions {
  bool split_reasoning = true;       // false: reasoning stays in the content, markers and all
  bool starts_in_reasoning = false;  // the prompt opened the block (prompt_opens_reasoning)
  bool tools = false;                // the request offered tools: parse calls
  std::string prefill;               // the answer's start that the prompt already holds (a forced call's opening)
  // Hand out each call's name as soon as it is written and its arguments as
  // they are written (call_pieces), as the arguments' text the model wrote.
  // A call whose name has streamed stays a call: if its end turns out
  // malformed, its arguments are the text as written (false: a malformed
  // call is content). With a tool's JSON schema constraining the arguments
  // (plan_tool_calls) they are always whole JSON.
  bool stream_calls = false;
};

// Incremental: push() each piece of new text as it streams, then finish()
// once. A marker split across pieces is held back until it is whole; a tool
// call is handed out whole once it ends (its closing marker, or the end of
// the answer). A call that does not parse (not JSON, no name) comes back as
// content, its text unchanged. Concatenating every delta's parts gives the
// whole answer's reasoning, content and calls.
class ChatOutputParser {
 public:
  ChatOutputParser(ChatSyntax syntax, ChatOutputOptions options);
  ChatDelta push(std::string_view text);
  ChatDelta finish();

 private:
  enum class State { Start, Content, Reasoning, Call, HarmonyHeader, HarmonyBody } state_;
  ChatSyntax syntax_;
  ChatOutputOptions options_;
  std::string pending_;       // text not yet handed out (a possible marker's start, a call's body)
  std::string harmony_head_;  // gpt-oss: the current message's header (channel, recipient)
  std::string call_open_;     // the marker that opened the current call
  bool content_started_ = false, reasoning_started_ = false;
  bool body_start_ = false;  // gpt-oss: at a message body's start (its leading whitespace is dropped)
  int calls_made_ = 0;
  ChatDelta carry_;  // what the prefill made, handed out with the first piece  // calls handed out (or started, streaming)
  // stream_calls: the calls of the current call marker's body that have
  // started streaming, and how many bytes of each one's arguments went out.
  struct Streamed { std::string id, name, arguments; };
  std::vector<Streamed> streaming_;
  void run(ChatDelta& out, bool final);
  void stream_call(ChatDelta& out, std::string_view body);
  void emit_whole(ChatDelta& out, ToolCall call);
  void close_call(ChatDelta& out, const std::string& body, bool final);
  void harmony(ChatDelta& out, bool final);
};

// A tool as a request offers it: its name and its parameters' JSON schema ("" = any object).
struct ToolSpec {
  std::string name;
  std::string parameters;
};

// How a request's tool choice shapes generation in FORMAT:
//   prompt_suffix  appended to the prompt (a forced call's opening; the parser's prefill)
//   json_schema    the call's JSON constrained ("" = none), one anyOf alternative per tool
//   json_trigger   where the constraint starts ("" = at once)
// CHOICE: "auto", "none", "required", or a tool's name. Parameter schemas the
// constraint cannot express (keywords outside its subset) are constrained as
// any object instead; `relaxed` names those tools.
struct ToolPlan {
  std::string prompt_suffix, json_schema, json_trigger;
  std::vector<std::string> relaxed;
};
ToolPlan plan_tool_calls(ToolFormat format, const std::vector<ToolSpec>& tools, const std::string& choice);

}  // namespace atelier
