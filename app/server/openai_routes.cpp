// OpenAI's routes: GET /v1/models, POST /v1/chat/completions, POST
// /v1/completions, with server-sent events laid out as the openai SDKs parse
// them (role delta first, one finish chunk per choice, the usage chunk when
// asked, then [DONE]).
#include <atelier/store.h>

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
                std::function<json(const TextChoice*, const std::string&, const std::string&)> make_chunk,
                std::function<std::vector<json>()> first_chunks, int prompts) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [run, watch, head, common, make_chunk, first_chunks, prompts](size_t, httplib::DataSink& sink) {
        bool alive = true;
        auto send = [&](const std::string& s) { return alive = alive && sink.write(s.data(), s.size()); };
        auto with_head = [&](json chunk) {
          json out = head;
          out.update(chunk);
          if (common.include_usage) out["usage"] = nullptr;
          return out;
        };
        for (auto& c : first_chunks()) send(sse(with_head(c)));
        run->follow([&](TextChoice& c, const std::string& text) { return send(sse(with_head(make_chunk(&c, text, "")))); },
                    [&](TextChoice& c) { return send(sse(with_head(make_chunk(&c, "", c.finish_reason)))); },
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
    out.push_back({*role, message_text(m, i)});
  }
  return out;
}

namespace {

// The prompt text as the model's chat template (or the plain fallback) renders it.
std::string chat_prompt(const ModelEntry& m, const std::vector<ChatMessage>& messages, TextRequest& r) {
  auto prompt = format_chat_prompt(m.info, messages, true);
  if (!prompt.ok()) throw ApiError(400, prompt.status().message, "messages", "invalid_request_error", "template_error");
  if (m.info.chat_template.empty()) {
    r.stop.push_back("\nUser:");  // the plain format's next turn
  } else if (!m.info.bos_token.empty() && prompt.value().rfind(m.info.bos_token, 0) == 0) {
    r.add_bos = false;  // the template wrote BOS itself
  }
  return prompt.value();
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
    auto messages = chat_messages(body);
    ModelEntry m = ctx.model(opt_string(body, "model").value_or(""));
    TextRequest base = text_request_from(body, m, ctx.options, true);
    base.prompt = chat_prompt(m, messages, base);
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
    if (common.stream) {
      head["object"] = "chat.completion.chunk";
      const int n = common.n;
      stream_run(
          res, run, watch, head, common,
          [vocab](const TextChoice* c, const std::string& text, const std::string& finish) {
            json delta = json::object();
            if (!text.empty()) delta["content"] = text;
            // Token events carry no logprobs: a choice's come whole with its finish chunk.
            json lp = vocab && !finish.empty() ? chat_logprobs(c->result.logprobs, *vocab) : json(nullptr);
            return json{{"choices", json::array({{{"index", c->index}, {"delta", delta}, {"logprobs", lp},
                                                  {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}}})}};
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
    for (const auto& c : run->choices())
      choices.push_back({{"index", c.index}, {"message", {{"role", "assistant"}, {"content", c.streamed}, {"refusal", nullptr}}},
                         {"logprobs", vocab ? chat_logprobs(c.result.logprobs, *vocab) : json(nullptr)},
                         {"finish_reason", c.finish_reason}});
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
            return json{{"choices", json::array({{{"index", c->index}, {"text", text}, {"logprobs", lp},
                                                  {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}}})}};
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
