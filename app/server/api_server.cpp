// The server object: cpp-httplib's Server with auth, CORS, limits and the
// JSON error shape in front of the route files; the shared helpers of context.h.
#include "server/api_server.h"

#include <atelier/json_input.h>
#include <atelier/models.h>
#include <atelier/store.h>
#include <atelier/tools.h>

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "server/connections.h"
#include "server/context.h"

namespace atelier::server {

// ---------------------------------------------------------------- errors and fields

json error_body(int status, const std::string& message, const std::string& param, std::string type, std::string code) {
  if (type.empty()) {
    type = status == 401   ? "authentication_error"
           : status == 404 ? "not_found_error"
           : status == 503 ? "unavailable_error"
           : status >= 500 ? "server_error"
                           : "invalid_request_error";
  }
  json err = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}};
  return {{"error", err}};
}

ApiError bad_field(const std::string& field, const std::string& what) {
  return ApiError(400, "'" + field + "' " + what, field, "invalid_request_error", "invalid_value");
}

ApiError from_status(const Status& s, const std::string& param) {
  switch (s.code) {
    case StatusCode::InvalidArgument: return ApiError(400, s.message, param, "invalid_request_error", "invalid_value");
    case StatusCode::NotFound: return ApiError(404, s.message, param, "invalid_request_error", "model_not_found");
    case StatusCode::Unsupported: return ApiError(400, s.message, param, "invalid_request_error", "unsupported");
    case StatusCode::Cancelled: return ApiError(499, s.message, param, "invalid_request_error", "cancelled");
    // 507 Insufficient Storage (RFC 4918): the request needed a write the full disk refused.
    case StatusCode::DiskFull: return ApiError(507, s.message, param, "server_error", "disk_full");
    default: return ApiError(500, s.message, param, "server_error", std::string(status_code_name(s.code)));
  }
}

void send_json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

json parse_body(const httplib::Request& req) {
  auto parsed = parse_json(req.body, "the request body");  // nested at most kMaxJsonDepth deep
  if (!parsed.ok())
    throw ApiError(400, parsed.status().message + "; send a JSON object (Content-Type: application/json)", "",
                   "invalid_request_error", "invalid_json");
  json body = std::move(parsed.value());
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "invalid_request_error", "invalid_json");
  return body;
}

static const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> opt_number(const json& body, const char* name, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_field(name, "must be a number, not " + std::string(v->type_name()));
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw bad_field(name, "must be between " + json(lo).dump() + " and " + json(hi).dump() + ", not " + v->dump());
  return d;
}

std::optional<int64_t> opt_int(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  bool integral = v->is_number_integer() || (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                                             std::fabs(v->get<double>()) < 9e15);
  if (!integral) throw bad_field(name, "must be an integer, not " + (v->is_number() ? v->dump() : std::string(v->type_name())));
  int64_t i = v->is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX))
              : v->is_number_integer() ? v->get<int64_t>()
                                       : static_cast<int64_t>(v->get<double>());
  if (i < lo || i > hi)
    throw bad_field(name, "must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", not " + v->dump());
  return i;
}

std::optional<bool> opt_bool(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_field(name, "must be true or false, not " + std::string(v->type_name()));
  return v->get<bool>();
}

std::optional<std::string> opt_string(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_field(name, "must be a string, not " + std::string(v->type_name()));
  return v->get<std::string>();
}

std::vector<std::string> string_or_list(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) throw bad_field(name, "must be a string or a list of strings, not " + std::string(v->type_name()));
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string()) throw bad_field(name, "must be a string or a list of strings; it holds a " + std::string(e.type_name()));
    out.push_back(e.get<std::string>());
  }
  return out;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------- models

ModelEntry Context::model(const std::string& requested, const std::string& field) {
  // The default model is the operator's choice; a client's is checked against what the server shares.
  std::string ref = requested.empty() || requested == options.default_model ? options.default_model
                                                                               : shared_model_ref(*this, field, requested);
  if (ref.empty())
    throw ApiError(400, "'model' is required: name a model from GET /v1/models (or start the server with --model)", "model",
                   "invalid_request_error", "model_required");
  {
    std::lock_guard lock(mu);
    if (auto it = models.find(ref); it != models.end()) return it->second;
  }
  ResolveOptions ro;
  ro.check_digest = true;  // the fingerprint needs the digest; hashed once per file per process
  auto resolved = resolve_model(ref, options.store_dir, ro);
  if (!resolved.ok()) {
    if (resolved.status().code == StatusCode::NotFound)
      throw ApiError(404, "The model '" + ref + "' does not exist: " + resolved.status().message + " (GET /v1/models lists them)",
                     field, "invalid_request_error", "model_not_found");
    throw from_status(resolved.status(), field);
  }
  ModelEntry e;
  e.resolved = resolved.value();
  if (!e.resolved.in_store && e.resolved.format != "synthetic" && ref != options.default_model) {
    // A client's file that is no model is the request's fault (400), told now, not as a failed job (500).
    auto file = inspect_model_file(e.resolved.path);
    if (!file.ok() && file.status().code != StatusCode::Io)
      throw ApiError(400, "'" + field + "' names " + requested + ", which is " +
                              (file.status().code == StatusCode::InvalidModel ? "a model file that cannot load" : "not a model file") +
                              " (GGUF, llama2.c .bin, safetensors, PyTorch .pth/.ckpt)",
                     field, "invalid_request_error", "invalid_model_file");
  }
  if (e.resolved.kind != "image") {
    auto info = read_model_info(e.resolved.path, e.resolved.file("tokenizer"));
    if (info.ok()) e.info = info.value();
  }
  // OpenAI's system_fingerprint: what model and build answered.
  auto fingerprint = sha256_hex(e.resolved.digest + "|atelier 0.1.0");
  if (!fingerprint.ok()) throw from_status(fingerprint.status(), field);
  e.fingerprint = "fp_" + fingerprint.value().substr(0, 12);
  std::lock_guard lock(mu);
  models[ref] = e;
  return e;
}

std::shared_ptr<Vocabulary> Context::vocabulary(const ModelEntry& m) {
  std::string file = m.resolved.file("tokenizer");
  if (file.empty()) file = m.resolved.path;
  std::lock_guard lock(mu);
  if (auto it = vocabularies.find(file); it != vocabularies.end()) return it->second;
  auto v = Vocabulary::open(file);
  if (!v.ok()) throw ApiError(400, "'" + m.resolved.display + "' has no vocabulary: " + v.status().message, "model");
  vocabularies[file] = v.value();
  return v.value();
}

httplib::Server::Handler guarded(Context& ctx, std::function<void(const httplib::Request&, httplib::Response&)> fn) {
  return [&ctx, fn = std::move(fn)](const httplib::Request& req, httplib::Response& res) {
    ++ctx.requests;
    try {
      fn(req, res);
    } catch (const ApiError& e) {
      ++ctx.errors;
      send_json(res, error_body(e.status, e.what(), e.param, e.type, e.code), e.status);
    } catch (const std::exception& e) {
      ++ctx.errors;
      send_json(res, error_body(500, std::string("internal error: ") + e.what() + " (please report it)"), 500);
    }
  };
}

// ---------------------------------------------------------------- the server

std::string base64_encode(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string sse_line(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

std::string base64_decode(const std::string& in) {
  std::string out((in.size() / 4 + 1) * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return "";
  size_t pad = 0;
  for (size_t i = in.size(); i > 0 && in[i - 1] == '='; --i) ++pad;
  out.resize(static_cast<size_t>(n) - std::min<size_t>(pad, n));
  return out;
}

struct ApiServer::Impl {
  Impl(Engine& e, ApiServerOptions o) : ctx(e, std::move(o)) {}
  Context ctx;
  HttpServer http;
  bool installed = false;
  void install();
  std::thread thread, warm_up;
  int port = 0;

  // /health says 503 until the default model has answered one token.
  void warm_up_default_model() {
    try {
      ModelEntry m = ctx.model("");
      if (m.resolved.kind == "image") {
        ctx.ready = true;
        return;
      }
      TextRequest r;
      r.model = m.resolved.in_store ? m.resolved.display : m.resolved.path;
      r.prompt = "Hello";
      r.max_new_tokens = 1;
      r.interactive = true;
      auto id = ctx.engine.submit(r);
      while (id.ok() && !stopping) {
        auto j = ctx.engine.job(id.value());
        if (!j.ok() || j->state == JobState::Completed || j->state == JobState::Failed || j->state == JobState::Cancelled) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception&) {
      // A default model that does not resolve: requests naming it get the 404; health still turns ready.
    }
    ctx.ready = true;
  }
  std::atomic<bool> stopping{false};

  bool authorized(const httplib::Request& req) const {
    const std::string& key = ctx.options.api_key;
    if (key.empty()) return true;
    std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) return same_secret(key, auth.substr(7));
    if (auth.rfind("Basic ", 0) == 0) {
      std::string userpass = base64_decode(auth.substr(6));
      auto colon = userpass.find(':');
      return colon != std::string::npos && same_secret(key, userpass.substr(colon + 1));
    }
    return false;
  }

  // A listed origin is answered exactly, with credentials; "*" answers "*",
  // which browsers never pair with credentials; any other origin gets nothing.
  enum class Origin { None, Listed, Any, Other };
  Origin cors(const httplib::Request& req, httplib::Response& res) const {
    const std::string origin = req.get_header_value("Origin");
    if (origin.empty()) return Origin::None;
    const auto& list = ctx.options.cors_origins;
    if (std::find(list.begin(), list.end(), origin) != list.end()) {
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Allow-Credentials", "true");
      return Origin::Listed;
    }
    if (std::find(list.begin(), list.end(), "*") != list.end()) {
      res.set_header("Access-Control-Allow-Origin", "*");
      return Origin::Any;
    }
    res.set_header("Vary", "Origin");
    return Origin::Other;
  }

  // Before anything else: a request from a web page the user did not allow,
  // or one that reached us through another host name (DNS rebinding), is
  // answered here, so it can neither write nor read.
  bool refused_before_auth(const httplib::Request& req, httplib::Response& res) const {
    const std::string host = req.get_header_value("Host");
    if (host_allowed(ctx.options, port, host)) return false;
    send_json(res, error_body(403, "the Host header '" + host + "' does not name this server (" + ctx.options.host + ":" +
                                       std::to_string(port) + ", localhost, 127.0.0.1 or [::1]): use one of those, or start "
                                       "the server with --allow-host NAME to serve that name too",
                              "", "invalid_request_error", "host_not_allowed"), 403);
    return true;
  }
  bool refused_after_auth(const httplib::Request& req, httplib::Response& res, Origin origin) const {
    // A browser always sends Origin with a POST or DELETE; one from a page not allowed by --cors (nor this server's own) is refused.
    if (origin == Origin::Other && req.method != "GET" && req.method != "HEAD" &&
        req.get_header_value("Origin") != "http://" + req.get_header_value("Host")) {
      send_json(res, error_body(403, "requests from the web page at '" + req.get_header_value("Origin") +
                                         "' are refused: start the server with --cors ORIGIN to allow that page",
                                "", "invalid_request_error", "origin_not_allowed"), 403);
      return true;
    }
    // JSON routes take JSON only: a web page can send text/plain or a form without asking first; JSON it must ask for.
    if (!json_body_or_none(req)) {
      const std::string type = req.get_header_value("Content-Type");
      send_json(res, error_body(415, "the request body must be JSON sent with 'Content-Type: application/json' (it came as '" +
                                         (type.empty() ? std::string("no Content-Type") : type) + "')",
                                "", "invalid_request_error", "unsupported_media_type"), 415);
      return true;
    }
    return false;
  }
};

ApiServer::ApiServer(Engine& engine, ApiServerOptions options) : impl_(std::make_unique<Impl>(engine, std::move(options))) {}

ApiServer::~ApiServer() { stop(); }

// The limits, the pre-routing checks (CORS, auth), the error bodies and the routes.
void ApiServer::Impl::install() {
  if (installed) return;
  installed = true;
  Impl& m = *this;
  auto& http = m.http;
  const auto& o = m.ctx.options;
  ConnectionLimits limits;  // connections.h: heads and bodies read against these, idle connections evicted
  limits.max_connections = o.max_connections;
  limits.header_timeout_s = o.header_timeout_s;
  limits.body_timeout_s = o.body_timeout_s;
  limits.max_body_bytes = o.max_body_bytes;
  http.set_limits(limits);  // a stalled reader frees its worker after 30 s; its job is cancelled

  http.set_pre_routing_handler([&m](const httplib::Request& req, httplib::Response& res) {
    if (m.refused_before_auth(req, res)) {
      ++m.ctx.errors;
      return httplib::Server::HandlerResponse::Handled;
    }
    const Impl::Origin origin = m.cors(req, res);
    if (req.method == "OPTIONS") {  // CORS preflight: no auth, as browsers send none
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      res.set_header("Access-Control-Allow-Headers",
                     req.has_header("Access-Control-Request-Headers") ? req.get_header_value("Access-Control-Request-Headers")
                                                                      : "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path != "/health" && !m.authorized(req)) {
      ++m.ctx.errors;
      res.set_header("WWW-Authenticate", "Bearer, Basic realm=\"atelier\"");
      send_json(res,
                error_body(401, "Invalid API key: send 'Authorization: Bearer KEY' (or HTTP Basic with the key as password)",
                           "", "invalid_request_error", "invalid_api_key"),
                401);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (m.refused_after_auth(req, res, origin)) {
      ++m.ctx.errors;
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_error_handler([&m](const httplib::Request& req, httplib::Response& res) {
    if (auto e = framing_error(res.status)) {  // refused by the connection layer before any route ran
      send_json(res, error_body(e->status, e->message, "", "invalid_request_error", e->code), e->status);
      return;
    }
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_json(res, error_body(404, "no route " + req.method + " " + req.path + " (see app/server/README.md for the routes)",
                                "", "invalid_request_error", "unknown_route"), 404);
    else if (res.status == 413)
      send_json(res, error_body(413, "the request body is larger than the server's limit of " +
                                         std::to_string(m.ctx.options.max_body_bytes) + " bytes (--max-body-bytes)",
                                "", "invalid_request_error", "body_too_large"), 413);
    else
      send_json(res, error_body(res.status, "bad request (HTTP " + std::to_string(res.status) + ")"), res.status);
  });

  add_openai_routes(http, m.ctx);
  add_llama_routes(http, m.ctx);
  add_native_routes(http, m.ctx);
  add_sdapi_routes(http, m.ctx);
}

std::string ApiServer::handle_raw(const std::string& request) {
  impl_->install();
  impl_->ctx.ready = true;
  return impl_->http.handle_raw(request);
}

Status ApiServer::start() {
  Impl& m = *impl_;
  m.install();
  auto& http = m.http;
  const auto& o = m.ctx.options;
  if (o.port == 0) {
    m.port = http.bind_to_any_port(o.host);
    if (m.port <= 0) return Status::error(StatusCode::InvalidArgument, "cannot listen on " + o.host + ": check --host");
  } else {
    if (!http.bind_to_port(o.host, o.port))
      return Status::error(StatusCode::InvalidArgument, "cannot listen on " + o.host + ":" + std::to_string(o.port) +
                                                            " (in use, or a bad --host); pick another --port");
    m.port = o.port;
  }
  m.thread = std::thread([&http] { http.serve_after_bind(); });
  if (o.default_model.empty()) m.ctx.ready = true;
  else m.warm_up = std::thread([&m] { m.warm_up_default_model(); });
  return {};
}

void ApiServer::stop() {
  impl_->stopping = true;
  if (impl_->warm_up.joinable()) impl_->warm_up.join();
  if (!impl_->thread.joinable()) return;
  impl_->http.stop();
  impl_->thread.join();
}

int ApiServer::port() const { return impl_->port; }

std::string ApiServer::address() const {
  const std::string& h = impl_->ctx.options.host;
  return "http://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(impl_->port);
}

}  // namespace atelier::server
