// OpenAI's routes: GET /v1/models, POST /v1/chat/completions, POST
// /v1/completions, with server-sent events laid out as the openai SDKs parse
// them (role delta first, one finish chunk per choice, the usage chunk when
// asked, then [DONE]).
#include <atelier/chat.h>
#include <atelier/store.h>

#include <map>
#include <mutex>

#include "server/context.h"
#include "server/text_jobs.h"

namespace atelier::server {

namespace {

struct Common {
  int n = 1;
  bool stream = false;
  bool include_usage = false;
};

Common common_fields(const json& body, const ApiServerOptions& o) {
  Common c;
  if (auto v = opt_int(body, "n", 1, o.max_choices)) c.n = static_cast<int>(*v);
  if (auto v = opt_bool(body, "stream")) c.stream = *v;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_field("stream_options", "must be an object");
    if (auto v = opt_bool(*it, "include_usage")) c.include_usage = *v;
  }
  return c;
}

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

// Streams RUN's events as chunks made by MAKE_CHUNK(choice, text, finish) ("" finish: none yet).
void stream_run(httplib::Response& res, std::shared_ptr<TextRun> run, ClientWatch watch, json head, Common common,
                std::function<std::vector<json>(const TextChoice*, const std::string&, const std::string&)> make_chunks,
                std::function<std::vector<json>()> first_chunks, int prompts) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [run, watch, head, common, make_chunks, first_chunks, prompts](size_t, httplib::DataSink& sink) {
        bool alive = true;
        auto send = [&](const std::string& s) { return alive = alive && sink.write(s.data(), s.size()); };
        auto with_head = [&](json chunk) {
          json out = head;
          out.update(chunk);
          if (common.include_usage) out["usage"] = nullptr;
          return out;
        };
        for (auto& c : first_chunks()) send(sse(with_head(c)));
        auto send_all = [&](const std::vector<json>& chunks) {
          for (const json& c : chunks) send(sse(with_head(c)));
          return alive;
        };
        run->follow([&](TextChoice& c, const std::string& text) { return send_all(make_chunks(&c, text, "")); },
                    [&](TextChoice& c) { return send_all(make_chunks(&c, "", c.finish_reason)); },
                    [&] { return alive && !watch.gone(); });
        if (!alive || watch.gone()) return false;  // the releaser cancels the jobs
        if (const ApiError* e = run->error()) {
          send(sse(error_body(e->status, e->what(), e->param, e->type, e->code)));
        } else if (common.include_usage) {
          json last = head;
          last["choices"] = json::array();
          last["usage"] = run->usage(prompts);
          send(sse(last));
        }
        send("data: [DONE]\n\n");
        sink.done();
        return true;
      },
      [run](bool) { run->cancel(); });
}

std::string message_text(const json& msg, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw bad_field(where, "must be a string or a list of content parts");
  std::string text;
  for (const auto& part : *it) {
    if (part.is_string()) { text += part.get<std::string>(); continue; }
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw bad_field(where, "parts must be objects with a 'type'");
    if (part["type"] != "text")
      throw ApiError(400, "'" + where + "' holds a '" + part["type"].get<std::string>() +
                              "' part; this server reads text parts only", where, "invalid_request_error", "unsupported");
    if (!part.contains("text") || !part["text"].is_string()) throw bad_field(where, "text parts need a string 'text'");
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

std::vector<ChatMessage> chat_messages(const json& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw ApiError(400, "'messages' is required", "messages", "invalid_request_error", "missing_field");
  if (!it->is_array() || it->empty()) throw bad_field("messages", "must be a non-empty list of {role, content} objects");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    if (!m.is_object()) throw bad_field("messages[" + std::to_string(i) + "]", "must be an object");
    auto role = opt_string(m, "role");
    if (!role) throw bad_field("messages[" + std::to_string(i) + "].role", "is required");
    out.push_back({*role, message_text(m, i), ""});
  }
  return out;
}

namespace {

using ojson = nlohmann::ordered_json;

// What a chat request asks of the answer's shape: tools, tool choice, reasoning.
struct ChatShape {
  ojson messages = ojson::array();  // as the template sees them (key order kept)
  ojson tools;                      // null: none offered
  std::vector<ToolSpec> specs;
  std::string choice = "auto";      // auto, none, required, or a tool's name
  bool parallel = true;
  bool split_reasoning = true;      // reasoning_format other than "none"
  ojson template_kwargs;            // chat_template_kwargs (null: none)
};

// OpenAI's messages as the template reads them: content flattened to text,
// an assistant's tool_calls with their arguments as objects (templates write
// them with tojson), tool_call_id, name and reasoning_content passed on.
ojson template_messages(const ojson& list) {
  ojson out = ojson::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const ojson& m = list[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    ojson t = ojson::object();
    t["role"] = m["role"];
    t["content"] = message_text(json::parse(m.dump()), i);
    if (auto it = m.find("tool_calls"); it != m.end() && !it->is_null()) {
      if (!it->is_array()) throw bad_field(where + ".tool_calls", "must be a list of {id, type, function: {name, arguments}}");
      ojson calls = ojson::array();
      for (size_t k = 0; k < it->size(); ++k) {
        ojson c = (*it)[k];
        const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object() || !c["function"].contains("name") ||
            !c["function"]["name"].is_string())
          throw bad_field(cw, "must be an object with function: {name, arguments}");
        ojson& f = c["function"];
        if (f.contains("arguments") && f["arguments"].is_string()) {
          ojson args = ojson::parse(f["arguments"].get<std::string>(), nullptr, false);
          if (args.is_discarded()) throw bad_field(cw + ".function.arguments", "must be a JSON object's text");
          f["arguments"] = std::move(args);
        }
        calls.push_back(std::move(c));
      }
      t["tool_calls"] = std::move(calls);
    }
    for (const char* key : {"tool_call_id", "name", "reasoning_content"})
      if (auto it = m.find(key); it != m.end() && it->is_string()) t[key] = *it;
    out.push_back(std::move(t));
  }
  return out;
}

ChatShape chat_shape(const httplib::Request& req, const json& body) {
  chat_messages(body);  // the checks and their messages
  ChatShape shape;
  const ojson o = ojson::parse(req.body);  // again, in key order: templates print tools and arguments as given
  shape.messages = template_messages(o["messages"]);
  if (auto it = o.find("tools"); it != o.end() && !it->is_null()) {
    if (!it->is_array()) throw bad_field("tools", "must be a list of {type: \"function\", function: {name, description, parameters}}");
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& t = (*it)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
        throw bad_field(where, "must be {type: \"function\", function: {name, description, parameters}}");
      const ojson& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
        throw bad_field(where + ".function.name", "must be a non-empty string");
      ToolSpec spec{f["name"].get<std::string>(), ""};
      if (f.contains("parameters") && !f["parameters"].is_null()) {
        if (!f["parameters"].is_object()) throw bad_field(where + ".function.parameters", "must be a JSON schema object");
        spec.parameters = f["parameters"].dump();
      }
      shape.specs.push_back(std::move(spec));
    }
    if (!shape.specs.empty()) shape.tools = *it;
  }
  if (auto it = o.find("tool_choice"); it != o.end() && !it->is_null()) {
    if (it->is_string()) {
      shape.choice = it->get<std::string>();
      if (shape.choice != "auto" && shape.choice != "none" && shape.choice != "required")
        throw bad_field("tool_choice", "must be auto, none, required or {type: \"function\", function: {name}}");
    } else if (it->is_object() && it->contains("function") && (*it)["function"].is_object() &&
               (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
      shape.choice = (*it)["function"]["name"].get<std::string>();
      if (std::none_of(shape.specs.begin(), shape.specs.end(), [&](const ToolSpec& t) { return t.name == shape.choice; }))
        throw bad_field("tool_choice", "names '" + shape.choice + "', which is not one of the request's tools");
    } else {
      throw bad_field("tool_choice", "must be auto, none, required or {type: \"function\", function: {name}}");
    }
    if (shape.choice != "auto" && shape.choice != "none" && shape.specs.empty())
      throw bad_field("tool_choice", "asks for a tool call, but the request offers no tools");
  }
  if (auto v = opt_bool(body, "parallel_tool_calls")) shape.parallel = *v;
  if (auto v = opt_string(body, "reasoning_format")) {  // llama-server's: none keeps reasoning in the content
    if (*v != "none" && *v != "deepseek" && *v != "deepseek-legacy" && *v != "auto")
      throw bad_field("reasoning_format", "must be none, auto, deepseek or deepseek-legacy");
    shape.split_reasoning = *v != "none";
  }
  if (auto it = o.find("chat_template_kwargs"); it != o.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_field("chat_template_kwargs", "must be an object of template variables");
    shape.template_kwargs = *it;
  }
  return shape;
}

// The prompt as the model's chat template (or the plain fallback) renders it,
// with the tool plan applied to R; OUT: how the answer is taken apart.
std::string chat_prompt(const ModelEntry& m, const ChatShape& shape, TextRequest& r, ChatSyntax* syntax, ChatOutputOptions* out) {
  ChatTemplateOptions o;
  const bool tools = !shape.specs.empty() && shape.choice != "none";
  if (tools) o.tools_json = shape.tools.dump();
  if (!shape.template_kwargs.is_null()) o.variables_json = shape.template_kwargs.dump();
  auto prompt = format_chat_prompt(m.info, shape.messages.dump(), o);
  if (!prompt.ok()) throw ApiError(400, prompt.status().message, "messages", "invalid_request_error", "template_error");
  if (m.info.chat_template.empty()) {
    r.stop.push_back("\nUser:");  // the plain format's next turn
  } else if (!m.info.bos_token.empty() && prompt.value().rfind(m.info.bos_token, 0) == 0) {
    r.add_bos = false;  // the template wrote BOS itself
  }
  *syntax = detect_chat_syntax(m.info.chat_template);
  out->split_reasoning = shape.split_reasoning;
  out->starts_in_reasoning = prompt_opens_reasoning(*syntax, prompt.value());
  out->tools = tools && syntax->tools != ToolFormat::None;
  if (tools && syntax->tools == ToolFormat::None && shape.choice != "auto")
    throw ApiError(400, "tool_choice '" + shape.choice + "' needs a model whose chat template writes tool calls (Hermes/Qwen, Llama 3.x, Mistral, gpt-oss); this model's has none",
                   "tool_choice", "invalid_request_error", "unsupported");
  if (out->tools) {
    ToolPlan plan = plan_tool_calls(syntax->tools, shape.specs, shape.choice);
    if (!plan.json_schema.empty() && !r.json_schema.empty())
      throw ApiError(400, "response_format and tools cannot both constrain the answer; drop one", "response_format",
                     "invalid_request_error", "unsupported");
    r.json_schema = plan.json_schema;
    r.json_trigger = plan.json_schema.empty() ? "" : plan.json_trigger;
    out->prefill = plan.prompt_suffix;
    return prompt.value() + plan.prompt_suffix;
  }
  return prompt.value();
}

// One choice's answer taken apart as it streams.
struct ChoiceParse {
  ChatOutputParser parser;
  int calls = 0;
};

// OpenAI's tool_calls entries for CALLS of choice JOB (ids unique per job and call).
json tool_calls_json(JobId job, const std::vector<ToolCall>& calls, int first_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const int index = first_index + static_cast<int>(i);
    const std::string id = calls[i].id.empty() ? "call_" + std::to_string(job) + "_" + std::to_string(index) : calls[i].id;
    out.push_back({{"index", index}, {"id", id}, {"type", "function"},
                   {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  }
  return out;
}

// Keeps the calls a choice may still make (one in all without parallel_tool_calls).
void limit_calls(ChatDelta& d, int made, bool parallel) {
  if (!parallel) d.calls.resize(static_cast<size_t>(std::max(0, std::min<int>(static_cast<int>(d.calls.size()), 1 - made))));
}

void models_route(Context& ctx, httplib::Response& res) {
  json data = json::array();
  auto store = Store::open(ctx.options.store_dir, false);
  if (store.ok()) {
    auto models = store.value()->list();
    if (models.ok())
      for (const StoreModel& m : models.value()) {
        if (m.versions.empty()) continue;
        const StoreVersion* v = &m.versions.back();
        for (const auto& x : m.versions)
          if (x.number == m.default_version) v = &x;
        data.push_back({{"id", m.name}, {"object", "model"}, {"created", v->created_ms / 1000}, {"owned_by", "atelier"},
                        {"kind", m.kind}, {"version", v->number}, {"digest", "sha256:" + v->digest}});
      }
  }
  const std::string& def = ctx.options.default_model;
  if (!def.empty() && std::none_of(data.begin(), data.end(), [&](const json& d) { return d["id"] == def; }))
    data.push_back({{"id", def}, {"object", "model"}, {"created", 0}, {"owned_by", "atelier"}});
  send_json(res, {{"object", "list"}, {"data", data}});
}

}  // namespace

void add_openai_routes(httplib::Server& http, Context& ctx) {
  http.Get("/v1/models", guarded(ctx, [&ctx](const httplib::Request&, httplib::Response& res) { models_route(ctx, res); }));
  http.Get("/models", guarded(ctx, [&ctx](const httplib::Request&, httplib::Response& res) { models_route(ctx, res); }));

  auto chat = [&ctx](const httplib::Request& req, httplib::Response& res) {
    json body = parse_body(req);
    Common common = common_fields(body, ctx.options);
    ChatShape shape = chat_shape(req, body);
    ModelEntry m = ctx.model(opt_string(body, "model").value_or(""));
    TextRequest base = text_request_from(body, m, ctx.options, true);
    ChatSyntax syntax;
    ChatOutputOptions parse_options;
    base.prompt = chat_prompt(m, shape, base, &syntax, &parse_options);
    std::shared_ptr<Vocabulary> vocab = base.logprobs ? ctx.vocabulary(m) : nullptr;
    base.interactive = common.stream;
    std::vector<TextRequest> requests(common.n, base);
    for (int i = 0; i < common.n; ++i)  // choice i: seed + i, so a seeded n > 1 is reproducible and not n copies
      if (base.sampling.seed != SamplingParams::kRandomSeed) requests[i].sampling.seed = base.sampling.seed + i;
    ClientWatch watch(req);
    auto run = std::make_shared<TextRun>(ctx, std::move(requests));
    const std::string id = "chatcmpl-" + std::to_string(run->choices()[0].job);
    const std::string model_name = opt_string(body, "model").value_or(m.resolved.display);
    const int64_t created = unix_seconds();
    json head = {{"id", id}, {"created", created}, {"model", model_name}, {"system_fingerprint", m.fingerprint}};
    const bool parallel = shape.parallel;
    if (common.stream) {
      head["object"] = "chat.completion.chunk";
      const int n = common.n;
      // Followed on the stream's one thread: no lock needed, but the provider is copied, so shared.
      auto parses = std::make_shared<std::vector<ChoiceParse>>();
      ChatOutputOptions streamed = parse_options;
      streamed.stream_calls = true;
      for (int i = 0; i < n; ++i) parses->push_back({ChatOutputParser(syntax, streamed), 0});
      stream_run(
          res, run, watch, head, common,
          [vocab, parses, parallel](const TextChoice* c, const std::string& text, const std::string& finish) {
            ChoiceParse& p = (*parses)[static_cast<size_t>(c->index)];
            ChatDelta d = finish.empty() ? p.parser.push(text) : p.parser.finish();
            limit_calls(d, p.calls, parallel);
            std::vector<json> chunks;
            auto chunk = [&](json delta, json fin, json lp) {
              chunks.push_back({{"choices", json::array({{{"index", c->index}, {"delta", std::move(delta)}, {"logprobs", std::move(lp)},
                                                          {"finish_reason", std::move(fin)}}})}});
            };
            if (!d.reasoning.empty() || !d.content.empty()) {
              json delta = json::object();
              if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
              if (!d.content.empty()) delta["content"] = d.content;
              chunk(delta, nullptr, nullptr);
            }
            // Each call as the openai SDK accumulates it: index, id and name first, then its
            // arguments in fragments as the model writes them (llama-server's and OpenAI's layout).
            for (const ToolCallPiece& piece : d.call_pieces) {
              if (!parallel && piece.index > 0) continue;
              json call = {{"index", piece.index}};
              if (!piece.name.empty()) {
                call["id"] = piece.id.empty() ? "call_" + std::to_string(c->job) + "_" + std::to_string(piece.index) : piece.id;
                call["type"] = "function";
                call["function"] = {{"name", piece.name}, {"arguments", ""}};
              } else {
                call["function"] = {{"arguments", piece.arguments}};
              }
              chunk({{"tool_calls", json::array({call})}}, nullptr, nullptr);
            }
            p.calls += static_cast<int>(d.calls.size());
            if (!finish.empty()) {
              // Token events carry no logprobs: a choice's come whole with its finish chunk.
              json lp = vocab ? chat_logprobs(c->result.logprobs, *vocab) : json(nullptr);
              chunk(json::object(), p.calls > 0 ? "tool_calls" : finish, lp);
            }
            return chunks;
          },
          [n] {
            std::vector<json> first;
            for (int i = 0; i < n; ++i)
              first.push_back({{"choices", json::array({{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                         {"logprobs", nullptr}, {"finish_reason", nullptr}}})}});
            return first;
          },
          1);
      return;
    }
    run->follow([](TextChoice&, const std::string&) { return true; }, [](TextChoice&) { return true; },
                [&] { return !watch.gone(); });
    if (const ApiError* e = run->error()) throw *e;
    json choices = json::array();
    for (const auto& c : run->choices()) {
      ChatOutputParser parser(syntax, parse_options);
      ChatDelta d = parser.push(c.streamed);
      ChatDelta rest = parser.finish();
      d.reasoning += rest.reasoning;
      d.content += rest.content;
      for (auto& call : rest.calls) d.calls.push_back(std::move(call));
      limit_calls(d, 0, parallel);
      json message = {{"role", "assistant"}, {"content", d.content.empty() && !d.calls.empty() ? json(nullptr) : json(d.content)},
                      {"refusal", nullptr}};
      if (!d.reasoning.empty()) message["reasoning_content"] = d.reasoning;
      if (!d.calls.empty()) {
        message["tool_calls"] = tool_calls_json(c.job, d.calls, 0);
        for (auto& call : message["tool_calls"]) call.erase("index");  // streamed deltas carry it, messages do not
      }
      choices.push_back({{"index", c.index}, {"message", message},
                         {"logprobs", vocab ? chat_logprobs(c.result.logprobs, *vocab) : json(nullptr)},
                         {"finish_reason", d.calls.empty() ? c.finish_reason : "tool_calls"}});
    }
    head["object"] = "chat.completion";
    head["choices"] = choices;
    head["usage"] = run->usage(1);
    send_json(res, head);
  };
  http.Post("/v1/chat/completions", guarded(ctx, chat));
  http.Post("/chat/completions", guarded(ctx, chat));

  auto completions = [&ctx](const httplib::Request& req, httplib::Response& res) {
    json body = parse_body(req);
    Common common = common_fields(body, ctx.options);
    if (auto it = body.find("prompt"); it == body.end() || it->is_null())
      throw ApiError(400, "'prompt' is required", "prompt", "invalid_request_error", "missing_field");
    std::vector<std::string> prompts = string_or_list(body, "prompt");
    if (prompts.empty()) throw bad_field("prompt", "must hold at least one prompt");
    const bool echo = opt_bool(body, "echo").value_or(false);
    ModelEntry m = ctx.model(opt_string(body, "model").value_or(""));
    TextRequest base = text_request_from(body, m, ctx.options, false);
    base.interactive = common.stream;
    std::shared_ptr<Vocabulary> vocab = base.logprobs ? ctx.vocabulary(m) : nullptr;
    std::vector<TextRequest> requests;
    for (const auto& p : prompts)
      for (int i = 0; i < common.n; ++i) {
        TextRequest r = base;
        r.prompt = p;
        if (base.sampling.seed != SamplingParams::kRandomSeed) r.sampling.seed = base.sampling.seed + i;
        requests.push_back(r);
      }
    if (static_cast<int>(requests.size()) > ctx.options.max_choices)
      throw bad_field("n", "times the number of prompts must be at most " + std::to_string(ctx.options.max_choices));
    ClientWatch watch(req);
    auto run = std::make_shared<TextRun>(ctx, std::move(requests));
    json head = {{"id", "cmpl-" + std::to_string(run->choices()[0].job)}, {"created", unix_seconds()},
                 {"model", opt_string(body, "model").value_or(m.resolved.display)}, {"system_fingerprint", m.fingerprint}};
    const int n_prompts = static_cast<int>(prompts.size());
    if (common.stream) {
      head["object"] = "text_completion";
      auto shared_run = run;
      stream_run(
          res, run, watch, head, common,
          [vocab, echo](const TextChoice* c, const std::string& text, const std::string& finish) {
            json lp = vocab && !finish.empty() ? completion_logprobs(c->result.logprobs, *vocab, echo ? c->prompt.size() : 0)
                                               : json(nullptr);
            return std::vector<json>{{{"choices", json::array({{{"index", c->index}, {"text", text}, {"logprobs", lp},
                                                  {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}}})}}};
          },
          [echo, shared_run] {
            std::vector<json> first;
            if (echo)
              for (const auto& c : shared_run->choices())
                first.push_back({{"choices", json::array({{{"index", c.index}, {"text", c.prompt}, {"logprobs", nullptr},
                                                           {"finish_reason", nullptr}}})}});
            return first;
          },
          n_prompts);
      return;
    }
    run->follow([](TextChoice&, const std::string&) { return true; }, [](TextChoice&) { return true; },
                [&] { return !watch.gone(); });
    if (const ApiError* e = run->error()) throw *e;
    json choices = json::array();
    for (const auto& c : run->choices())
      choices.push_back({{"index", c.index}, {"text", echo ? c.prompt + c.streamed : c.streamed},
                         {"logprobs", vocab ? completion_logprobs(c.result.logprobs, *vocab, echo ? c.prompt.size() : 0) : json(nullptr)},
                         {"finish_reason", c.finish_reason}});
    head["object"] = "text_completion";
    head["choices"] = choices;
    head["usage"] = run->usage(n_prompts);
    send_json(res, head);
  };
  http.Post("/v1/completions", guarded(ctx, completions));
  http.Post("/completions", guarded(ctx, completions));
}

}  // namespace atelier::server
