// libFuzzer: one raw HTTP request through the local API server as
// `atelier serve` runs it (ApiServer::handle_raw: cpp-httplib's request
// parser, the body limit, Host, CORS, Bearer/Basic auth, Content-Type, the routes and their body
// parsing, the error bodies), over a real engine on an empty store in a
// per-process folder. Requests that name a model end at its lookup (404);
// jobs that /v1/jobs accepts fail at admission, so no events stream waits.
#include <atelier/engine.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "server/api_server.h"

namespace {
struct Served {
  std::unique_ptr<atelier::Engine> engine;
  std::unique_ptr<atelier::server::ApiServer> server;
};

Served& served() {
  static Served s = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("atelier-http-fuzz-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    atelier::EngineConfig c;
    c.data_dir = (dir / "data").string();
    c.store_dir = (dir / "store").string();
    c.threads = 1;
    Served out;
    auto e = atelier::Engine::open(c);
    if (!e.ok()) __builtin_trap();
    out.engine = std::move(e.value());
    atelier::server::ApiServerOptions o;
    o.store_dir = c.store_dir;
    o.api_key = "fuzz-key";  // the seeds send it (Bearer and Basic); others get the 401 path
    o.cors_origins = {"http://client.example"};
    o.allowed_hosts = {"h"};  // the seeds' Host: localhost and h (others get the 403 path)
    o.max_body_bytes = 1 << 16;
    out.server = std::make_unique<atelier::server::ApiServer>(*out.engine, o);
    return out;
  }();
  return s;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string response = served().server->handle_raw(std::string(reinterpret_cast<const char*>(data), size));
  // Whatever came in, what goes out is an HTTP response (or nothing, for bytes that are no request).
  if (!response.empty() && response.rfind("HTTP/1.1 ", 0) != 0) __builtin_trap();
  return 0;
}
