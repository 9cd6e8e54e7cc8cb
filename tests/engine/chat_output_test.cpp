// atelier/chat.h: reasoning and tool calls taken out of answers written as
// the models' documentation shows them, whole and split at every byte (a
// marker cut across stream pieces), and malformed calls handed back as content.
#include <atelier/chat.h>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using namespace atelier;

namespace {

struct Parsed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

void add(Parsed& p, ChatDelta d) {
  p.reasoning += d.reasoning;
  p.content += d.content;
  for (auto& c : d.calls) p.calls.push_back(std::move(c));
}

// TEXT pushed in pieces of STEP bytes (0: whole).
Parsed parse(ChatSyntax syntax, ChatOutputOptions options, const std::string& text, size_t step = 0) {
  ChatOutputParser parser(syntax, options);
  Parsed p;
  if (step == 0) add(p, parser.push(text));
  else
    for (size_t i = 0; i < text.size(); i += step) add(p, parser.push(text.substr(i, step)));
  add(p, parser.finish());
  return p;
}

// Every split of TEXT gives what the whole does.
void expect_split_invariant(ChatSyntax syntax, ChatOutputOptions options, const std::string& text) {
  const Parsed whole = parse(syntax, options, text);
  for (size_t step = 1; step <= 7; ++step) {
    const Parsed p = parse(syntax, options, text, step);
    EXPECT_EQ(p.reasoning, whole.reasoning) << "step " << step;
    EXPECT_EQ(p.content, whole.content) << "step " << step;
    ASSERT_EQ(p.calls.size(), whole.calls.size()) << "step " << step;
    for (size_t i = 0; i < p.calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(p.calls[i].arguments, whole.calls[i].arguments);
    }
  }
}

ChatSyntax think() {
  ChatSyntax s;
  s.think_tags = true;
  return s;
}

nlohmann::json args(const ToolCall& c) { return nlohmann::json::parse(c.arguments); }

}  // namespace

TEST(ChatSyntax, DetectedFromTheTemplatesMarkers) {
  EXPECT_EQ(detect_chat_syntax("{{ '<tool_call>' }}{{ '<think>' }}").tools, ToolFormat::Hermes);
  EXPECT_TRUE(detect_chat_syntax("{{ '<tool_call>' }}{{ '</think>' }}").think_tags);
  EXPECT_EQ(detect_chat_syntax("{{ '[TOOL_CALLS]' }}").tools, ToolFormat::Mistral);
  EXPECT_EQ(detect_chat_syntax("<|start_header_id|>{% if tools %}{{ '<|python_tag|>' }}{% endif %}").tools, ToolFormat::Llama3);
  const ChatSyntax oss = detect_chat_syntax("<|start|>assistant<|channel|>final<|message|>");
  EXPECT_TRUE(oss.harmony);
  EXPECT_EQ(oss.tools, ToolFormat::GptOss);
  const ChatSyntax plain = detect_chat_syntax("{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(plain.tools, ToolFormat::None);
  EXPECT_FALSE(plain.think_tags);
  EXPECT_TRUE(prompt_opens_reasoning(think(), "<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(think(), "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

// Qwen3's documented answer: "<think>\n...\n</think>\n\n" then the answer.
TEST(ChatOutput, ThinkBlockIsReasoningAndTheRestContent) {
  const std::string text = "<think>\nThe user greets me. I should answer briefly.\n</think>\n\nHello! How can I help?";
  const Parsed p = parse(think(), {}, text);
  EXPECT_EQ(p.reasoning, "The user greets me. I should answer briefly.");
  EXPECT_EQ(p.content, "Hello! How can I help?");
  expect_split_invariant(think(), {}, text);
}

// DeepSeek-R1's template opens the block in the prompt: the answer starts inside it.
TEST(ChatOutput, AnswerStartingInsideAnOpenedBlock) {
  ChatOutputOptions o;
  o.starts_in_reasoning = true;
  const std::string text = "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is 4.";
  const Parsed p = parse(think(), o, text);
  EXPECT_EQ(p.reasoning, "Okay, 2 + 2 is 4.");
  EXPECT_EQ(p.content, "The answer is 4.");
  expect_split_invariant(think(), o, text);
  // Cut off while thinking: all of it is reasoning.
  const Parsed cut = parse(think(), o, "Okay, let me think about");
  EXPECT_EQ(cut.reasoning, "Okay, let me think about");
  EXPECT_EQ(cut.content, "");
}

TEST(ChatOutput, ReasoningFormatNoneLeavesItInline) {
  ChatOutputOptions o;
  o.split_reasoning = false;
  const std::string text = "<think>\nhmm\n</think>\n\nHi";
  const Parsed p = parse(think(), o, text);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, text);
}

TEST(ChatOutput, ThinkTagLaterInTheAnswerIsContent) {
  const Parsed p = parse(think(), {}, "Use <think> tags like this.");
  EXPECT_EQ(p.content, "Use <think> tags like this.");
  EXPECT_EQ(p.reasoning, "");
}

// Qwen's documented function-calling output (Hermes style), two calls.
TEST(ChatOutput, HermesCallsWithReasoning) {
  ChatSyntax s = think();
  s.tools = ToolFormat::Hermes;
  ChatOutputOptions o;
  o.tools = true;
  const std::string text =
      "<think>\nI need the temperatures.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}}\n</tool_call>";
  const Parsed p = parse(s, o, text);
  EXPECT_EQ(p.reasoning, "I need the temperatures.");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_current_temperature");
  EXPECT_EQ(args(p.calls[0])["location"], "San Francisco, CA, USA");
  EXPECT_EQ(p.calls[1].name, "get_temperature_date");
  EXPECT_EQ(args(p.calls[1])["date"], "2024-10-01");
  expect_split_invariant(s, o, text);
}

TEST(ChatOutput, MalformedCallsComeBackAsContent) {
  ChatSyntax s;
  s.tools = ToolFormat::Hermes;
  ChatOutputOptions o;
  o.tools = true;
  for (const std::string bad : {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>",  // unbalanced
                                "<tool_call>\nnot json at all\n</tool_call>",
                                "<tool_call>\n{\"arguments\": {}}\n</tool_call>",  // no name
                                "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": "}) {  // cut off
    const Parsed p = parse(s, o, "Sure. " + bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
    EXPECT_EQ(p.content, "Sure. " + bad);
    expect_split_invariant(s, o, "Sure. " + bad);
  }
}

TEST(ChatOutput, CallsAreContentWhenTheRequestOfferedNoTools) {
  ChatSyntax s;
  s.tools = ToolFormat::Hermes;
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  EXPECT_EQ(parse(s, {}, text).content, text);
}

// A forced call: the prompt already holds its opening (ChatOutputOptions::prefill).
TEST(ChatOutput, PrefilledCallOpening) {
  ChatSyntax s;
  s.tools = ToolFormat::Hermes;
  ChatOutputOptions o;
  o.tools = true;
  o.prefill = "<tool_call>\n";
  const Parsed p = parse(s, o, "{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(args(p.calls[0])["x"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(p.content, "");
}

// Llama 3.1's documented JSON tool call: the whole answer is the call.
TEST(ChatOutput, Llama3JsonCall) {
  ChatSyntax s;
  s.tools = ToolFormat::Llama3;
  ChatOutputOptions o;
  o.tools = true;
  const std::string text = "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}";
  const Parsed p = parse(s, o, text);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_current_conditions");
  EXPECT_EQ(args(p.calls[0])["unit"], "Fahrenheit");
  expect_split_invariant(s, o, text);
  const Parsed tagged = parse(s, o, "<|python_tag|>" + text);
  ASSERT_EQ(tagged.calls.size(), 1u);
  // Plain text, and JSON that is no call, stay content.
  EXPECT_EQ(parse(s, o, "The weather is nice.").content, "The weather is nice.");
  EXPECT_EQ(parse(s, o, "{\"answer\": 42}").content, "{\"answer\": 42}");
}

// Mistral's documented [TOOL_CALLS] list (ids of nine characters).
TEST(ChatOutput, MistralCallList) {
  ChatSyntax s;
  s.tools = ToolFormat::Mistral;
  ChatOutputOptions o;
  o.tools = true;
  const std::string text =
      "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", \"format\": \"celsius\"}, \"id\": \"a5c3b1d2e\"},"
      " {\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Lyon, France\", \"format\": \"celsius\"}}]";
  const Parsed p = parse(s, o, text);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].id, "a5c3b1d2e");
  EXPECT_EQ(args(p.calls[1])["location"], "Lyon, France");
  EXPECT_EQ(p.content, "");
  expect_split_invariant(s, o, text);
}

// gpt-oss's harmony format, as OpenAI's harmony guide shows it.
TEST(ChatOutput, GptOssChannels) {
  const ChatSyntax s = detect_chat_syntax("<|channel|>");
  ChatOutputOptions o;
  o.tools = true;
  const std::string answer =
      "<|channel|>analysis<|message|>User asks a simple question.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>";
  const Parsed a = parse(s, o, answer);
  EXPECT_EQ(a.reasoning, "User asks a simple question.");
  EXPECT_EQ(a.content, "2 + 2 = 4.");
  expect_split_invariant(s, o, answer);

  const std::string call =
      "<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>";
  const Parsed c = parse(s, o, call);
  EXPECT_EQ(c.reasoning, "Need to use function get_weather.");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].name, "get_weather");
  EXPECT_EQ(args(c.calls[0])["location"], "San Francisco");
  expect_split_invariant(s, o, call);

  // Malformed arguments: content, no call, no crash.
  const Parsed bad = parse(s, o, "<|channel|>commentary to=functions.get_weather json<|message|>{\"location\":<|call|>");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "{\"location\":");
}

TEST(ToolPlan, ForcedAndLazyConstraints) {
  const std::vector<ToolSpec> tools = {{"get_weather", R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"},
                                       {"odd", R"({"type":"object","properties":{"n":{"type":"integer","minimum":0}}})"}};
  const ToolPlan automatic = plan_tool_calls(ToolFormat::Hermes, tools, "auto");
  EXPECT_EQ(automatic.json_trigger, "<tool_call>");
  EXPECT_EQ(automatic.prompt_suffix, "");
  const auto schema = nlohmann::json::parse(automatic.json_schema);
  ASSERT_EQ(schema["anyOf"].size(), 2u);
  EXPECT_EQ(schema["anyOf"][0]["properties"]["name"]["const"], "get_weather");
  EXPECT_EQ(automatic.relaxed, std::vector<std::string>{"odd"});  // 'minimum' is outside the constraint's subset

  const ToolPlan named = plan_tool_calls(ToolFormat::Hermes, tools, "get_weather");
  EXPECT_EQ(named.prompt_suffix, "<tool_call>\n");
  EXPECT_EQ(named.json_trigger, "");
  EXPECT_EQ(nlohmann::json::parse(named.json_schema)["properties"]["name"]["const"], "get_weather");

  EXPECT_TRUE(plan_tool_calls(ToolFormat::Hermes, tools, "none").json_schema.empty());
  const ToolPlan oss = plan_tool_calls(ToolFormat::GptOss, tools, "get_weather");
  EXPECT_EQ(oss.prompt_suffix, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
}

// stream_calls: each call's name as soon as it is written, then its arguments
// in fragments as they are written, as OpenAI's streamed tool_calls deltas.
namespace {

struct Streamed {
  std::vector<ToolCallPiece> pieces;
  std::vector<ToolCall> calls;
  std::string content;
  int pushes_before_first_call_end = -1;  // the push after which the first call ended
};

Streamed stream(ChatSyntax syntax, ChatOutputOptions options, const std::string& text, size_t step) {
  options.stream_calls = true;
  ChatOutputParser parser(syntax, options);
  Streamed s;
  int pushes = 0;
  auto take = [&](ChatDelta d) {
    for (auto& p : d.call_pieces) s.pieces.push_back(std::move(p));
    s.content += d.content;
    if (!d.calls.empty() && s.calls.empty()) s.pushes_before_first_call_end = pushes;
    for (auto& c : d.calls) s.calls.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += step, ++pushes) take(parser.push(text.substr(i, step)));
  take(parser.finish());
  return s;
}

// The pieces of call INDEX: its name (the first piece's), its arguments joined, and how many argument fragments.
struct Assembled {
  std::string name, id, arguments;
  int fragments = 0;
  bool name_first = true;
};
Assembled assemble(const Streamed& s, int index) {
  Assembled a;
  bool started = false;
  for (const auto& p : s.pieces) {
    if (p.index != index) continue;
    if (!p.name.empty()) {
      a.name_first = a.name_first && !started;
      a.name = p.name;
      a.id = p.id;
      started = true;
    } else {
      a.name_first = a.name_first && started;
      a.arguments += p.arguments;
      ++a.fragments;
    }
  }
  return a;
}

}  // namespace

TEST(ChatOutput, StreamedCallArgumentsComeInFragments) {
  ChatSyntax hermes = think();
  hermes.tools = ToolFormat::Hermes;
  ChatOutputOptions o;
  o.tools = true;
  const std::string args0 = "{\"location\": \"San Francisco, CA, USA\", \"unit\": \"celsius\"}";
  const std::string args1 = "{\"location\": \"Lyon\", \"nested\": {\"a\": [1, 2, {\"b\": \"}\"}]}}";
  const std::string text = "<think>\nhm\n</think>\n\nchecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args0 +
                           "}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": " + args1 + "}\n</tool_call>";
  for (size_t step : {1, 3, 8, 1000}) {
    const Streamed s = stream(hermes, o, text, step);
    ASSERT_EQ(s.calls.size(), 2u) << step;
    const Assembled a = assemble(s, 0), b = assemble(s, 1);
    EXPECT_EQ(a.name, "get_weather");
    EXPECT_TRUE(a.name_first && b.name_first);
    EXPECT_EQ(a.arguments, args0) << step;  // the text as written, whole
    EXPECT_EQ(b.name, "get_time");
    EXPECT_EQ(b.arguments, args1) << step;
    EXPECT_EQ(s.calls[0].arguments, args0);  // the whole call agrees with its pieces
    EXPECT_EQ(s.content, "checking.\n");
    if (step == 1) {
      EXPECT_GT(a.fragments, 20) << "one fragment per byte pushed, not the call at its end";
      // The first call's arguments started before the call ended.
      EXPECT_GT(a.fragments, 1);
    }
  }
  // The call's name goes out before its arguments are whole: after the push that completes the name.
  const std::string head = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"loc";
  ChatOutputOptions so = o;
  so.stream_calls = true;
  ChatOutputParser parser(hermes, so);
  ChatDelta d = parser.push(head);
  ASSERT_EQ(d.call_pieces.size(), 2u);
  EXPECT_EQ(d.call_pieces[0].name, "get_weather");
  EXPECT_EQ(d.call_pieces[1].arguments, "{\"loc");
  EXPECT_TRUE(d.calls.empty());

  // Mistral: a list of calls, the model's ids; Llama 3: one object with "parameters".
  ChatSyntax mistral;
  mistral.tools = ToolFormat::Mistral;
  const std::string list = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abcdefghi\"}, {\"id\": \"zyxwvutsr\", \"name\": \"b\", \"arguments\": {\"y\": [2]}}]";
  for (size_t step : {1, 5, 1000}) {
    const Streamed m = stream(mistral, o, list, step);
    ASSERT_EQ(m.calls.size(), 2u);
    EXPECT_EQ(assemble(m, 0).arguments, "{\"x\": 1}");
    EXPECT_EQ(assemble(m, 1).arguments, "{\"y\": [2]}");
    EXPECT_EQ(assemble(m, 1).id, "zyxwvutsr");  // written before the name: known at the call's start
    EXPECT_EQ(m.calls[0].id, "abcdefghi");
  }
  ChatSyntax llama;
  llama.tools = ToolFormat::Llama3;
  const Streamed l = stream(llama, o, "{\"name\": \"f\", \"parameters\": {\"q\": \"x y\"}}", 2);
  ASSERT_EQ(l.calls.size(), 1u);
  EXPECT_EQ(assemble(l, 0).arguments, "{\"q\": \"x y\"}");
  EXPECT_GT(assemble(l, 0).fragments, 3);

  // gpt-oss: the header names the tool, the body is the arguments.
  const ChatSyntax harmony = detect_chat_syntax("<|channel|>");
  const std::string call = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                           "to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>";
  const Streamed g = stream(harmony, o, call, 2);
  ASSERT_EQ(g.calls.size(), 1u);
  EXPECT_EQ(assemble(g, 0).name, "get_weather");
  EXPECT_EQ(assemble(g, 0).arguments, "{\"location\":\"San Francisco\"}");
  EXPECT_GT(assemble(g, 0).fragments, 5);

  // gpt-oss with a forced call: the prefill names the tool; its start comes with the first piece.
  ChatOutputOptions forced = o;
  forced.stream_calls = true;
  forced.prefill = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
  ChatOutputParser fp(harmony, forced);
  ChatDelta first = fp.push("{\"lo");
  ASSERT_EQ(first.call_pieces.size(), 2u);
  EXPECT_EQ(first.call_pieces[0].name, "get_weather");
  EXPECT_EQ(first.call_pieces[1].arguments, "{\"lo");
}

// gpt-oss through a SentencePiece vocabulary (a synthetic model's): each
// control token is followed by a word marker, so the text has a space after
// every marker. The channel is still read, and no body starts with the space.
TEST(ChatOutput, GptOssChannelsWithSpacesAfterMarkers) {
  const ChatSyntax s = detect_chat_syntax("<|channel|>");
  ChatOutputOptions o;
  o.tools = true;
  const std::string answer =
      "<|channel|> analysis<|message|> the user asks.<|end|><|start|> assistant<|channel|> final<|message|> it is mild.";
  const Parsed a = parse(s, o, answer);
  EXPECT_EQ(a.reasoning, "the user asks.");
  EXPECT_EQ(a.content, "it is mild.");
  expect_split_invariant(s, o, answer);
}
