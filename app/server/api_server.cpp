// The server object: cpp-httplib's Server with auth, CORS, limits and the
// JSON error shape in front of the route files; the shared helpers of context.h.
#include "server/api_server.h"

#include <atelier/models.h>
#include <atelier/store.h>

#include <openssl/evp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

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
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded())
    throw ApiError(400, "the request body is not valid JSON; send a JSON object (Content-Type: application/json)", "",
                   "invalid_request_error", "invalid_json");
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

// ---------------------------------------------------------------- the client's connection

static int socket_port(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

ClientWatch::ClientWatch(const httplib::Request& req) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = std::atoi(entry.path().filename().c_str());
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (socket_port(local) == req.local_port && socket_port(peer) == req.remote_port) {
      fd_ = fd;
      break;
    }
  }
}

bool ClientWatch::gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, static_cast<short>(POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// ---------------------------------------------------------------- models

ModelEntry Context::model(const std::string& requested) {
  std::string ref = requested.empty() ? options.default_model : requested;
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
                     "model", "invalid_request_error", "model_not_found");
    throw from_status(resolved.status(), "model");
  }
  ModelEntry e;
  e.resolved = resolved.value();
  if (e.resolved.kind != "image") {
    auto info = read_model_info(e.resolved.path, e.resolved.file("tokenizer"));
    if (info.ok()) e.info = info.value();
  }
  // OpenAI's system_fingerprint: what model and build answered.
  auto fingerprint = sha256_hex(e.resolved.digest + "|atelier 0.1.0");
  if (!fingerprint.ok()) throw from_status(fingerprint.status(), "model");
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

namespace {
// The server with its request processing reachable from handle_raw.
struct HttpServer : httplib::Server {
  using httplib::Server::process_request;
};

// One request's bytes in, the response's bytes out (handle_raw): no socket.
// Writes stop being accepted past kMaxOut, as a client that stops reading.
class MemoryStream final : public httplib::Stream {
 public:
  explicit MemoryStream(const std::string& in) : in_(in) {}
  bool is_readable() const override { return pos_ < in_.size(); }
  bool is_writable() const override { return out.size() < kMaxOut; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    out.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 1;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 2;
  }
  socket_t socket() const override { return INVALID_SOCKET; }
  std::string out;

 private:
  static constexpr size_t kMaxOut = 1 << 20;
  const std::string& in_;
  size_t pos_ = 0;
};
}  // namespace

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
    if (auth.rfind("Bearer ", 0) == 0) return auth.substr(7) == key;
    if (auth.rfind("Basic ", 0) == 0) {
      std::string userpass = base64_decode(auth.substr(6));
      auto colon = userpass.find(':');
      return colon != std::string::npos && userpass.substr(colon + 1) == key;
    }
    return false;
  }

  void cors(const httplib::Request& req, httplib::Response& res) const {
    std::string origin = req.get_header_value("Origin");
    if (origin.empty()) return;
    for (const auto& allowed : ctx.options.cors_origins) {
      if (allowed == "*" || allowed == origin) {
        res.set_header("Access-Control-Allow-Origin", origin);
        res.set_header("Vary", "Origin");
        res.set_header("Access-Control-Allow-Credentials", "true");
        return;
      }
    }
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
  const int workers = std::max(1, o.max_connections);
  http.new_task_queue = [workers] { return new httplib::ThreadPool(static_cast<size_t>(workers)); };
  http.set_payload_max_length(static_cast<size_t>(o.max_body_bytes));
  http.set_keep_alive_timeout(5);
  http.set_read_timeout(30);
  http.set_write_timeout(30);  // a stalled reader frees its worker; its job is cancelled

  http.set_pre_routing_handler([&m](const httplib::Request& req, httplib::Response& res) {
    m.cors(req, res);
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
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_error_handler([&m](const httplib::Request& req, httplib::Response& res) {
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
  MemoryStream strm(request);
  bool closed = false;
  impl_->http.process_request(strm, true, closed, nullptr);
  return std::move(strm.out);
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
  m.thread = std::thread([&http] { http.listen_after_bind(); });
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
