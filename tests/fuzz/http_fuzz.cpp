// libFuzzer: one client's raw bytes through the local API server as `atelier
// serve` runs it (ApiServer::handle_raw: the connection layer's framing of
// pipelined requests (Content-Length, chunked bodies summed against the body
// limit, no length, 100-continue), cpp-httplib's request parser, Host, CORS,
// Bearer/Basic auth, Content-Type, the routes and their body parsing, the
// error bodies), over a real engine on an empty store in a per-process
// folder. Requests that name a model end at its lookup (404); jobs that
// /v1/jobs accepts fail at admission, so no events stream waits. What comes
// out must be whole HTTP/1.1 responses, each framed by its Content-Length or
// chunked encoding.
#include <atelier/engine.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
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
// Whether OUT is a sequence of whole HTTP/1.1 responses, each framed by its
// Content-Length or chunked body (a 1xx has none). handle_raw stops writing at
// 1 MiB, as to a client that stopped reading: the last response may be cut there.
bool well_framed(const std::string& out) {
  const bool may_be_cut = out.size() >= (1u << 20) - (64u << 10);
  size_t pos = 0;
  while (pos < out.size()) {
    if (out.compare(pos, 9, "HTTP/1.1 ") != 0) return false;
    const size_t head_end = out.find("\r\n\r\n", pos);
    if (head_end == std::string::npos) return may_be_cut;
    const std::string head = out.substr(pos, head_end - pos);
    const int status = std::atoi(head.c_str() + 9);
    pos = head_end + 4;
    if (status >= 100 && status < 200) continue;
    if (const size_t cl = head.find("\r\nContent-Length: "); cl != std::string::npos) {
      const size_t n = std::strtoull(head.c_str() + cl + 18, nullptr, 10);
      auto response_at = [&](size_t at) { return at == out.size() || (at < out.size() && out.compare(at, 9, "HTTP/1.1 ") == 0); };
      if (!response_at(pos + n) && response_at(pos)) continue;  // the answer to HEAD: the length without the body
      pos += n;
    } else if (head.find("\r\nTransfer-Encoding: chunked") != std::string::npos) {
      for (;;) {
        const size_t line_end = out.find("\r\n", pos);
        if (line_end == std::string::npos) return may_be_cut;
        const size_t n = std::strtoull(out.c_str() + pos, nullptr, 16);
        pos = line_end + 2 + n + 2;
        if (n == 0) break;
        if (pos > out.size()) return may_be_cut;
      }
    } else {
      return false;  // no framing: the client could not tell where the next response starts
    }
    if (pos > out.size()) return may_be_cut;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string response = served().server->handle_raw(std::string(reinterpret_cast<const char*>(data), size));
  // Whatever came in, what goes out is whole HTTP responses (or nothing, for bytes that are no request).
  if (!well_framed(response)) __builtin_trap();
  return 0;
}
