// The local HTTP API over one Engine: OpenAI-compatible routes (/v1/models,
// /v1/chat/completions, /v1/completions), llama-server's extras (/health,
// /tokenize, /detokenize, /apply-template, /props, /metrics), AUTOMATIC1111's
// /sdapi/v1/* and the native /v1/jobs. Every generation is an engine job, so
// it is batched with the others and shows in the queue. A library object so
// the command line (`atelier serve`) and the studio can both host it.
#pragma once

#include <atelier/engine.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace atelier::server {

struct ApiServerOptions {
  std::string host = "127.0.0.1";      // loopback unless told otherwise
  int port = 8080;                     // 0: any free port (see ApiServer::port)
  std::string api_key;                 // "": any bearer token (or none) is accepted
  std::vector<std::string> cors_origins;  // allowed Origin values; "*" allows any (never with credentials)
  // Host header names served besides the bound address (localhost, 127.0.0.1,
  // [::1], host): a request naming another host is refused (DNS rebinding).
  std::vector<std::string> allowed_hosts;
  std::string store_dir;               // the model store ("" = default_store_dir())
  // What a client may name by path. Models: store references, or files under
  // these folders (and the store's blobs); anything else is 403.
  std::vector<std::string> models_dirs;
  // /v1/jobs' "output" names a new file here, and its "init_image" and "mask"
  // a picture here, by name only ("" = none may be named).
  std::string output_dir;
  std::string default_model;           // used when a request names no model ("" = none)
  int64_t max_body_bytes = 32 << 20;   // larger request bodies get 413 (Content-Length, or a chunked body's sum)
  // Connections open at once. At the cap the one that has waited longest for
  // a request (idle, or still sending its head) is closed to make room, else
  // the one stalled longest on its client (a trickling body, an unread
  // answer); when every one is busy with a request, a new one gets 503.
  int max_connections = 256;
  int header_timeout_s = 10;           // a request head must arrive within this from its first byte (else 408)
  int body_timeout_s = 60;             // a request body must arrive within this from the end of its head (else 408)
  int max_tokens = 4096;               // per choice; a request asking more gets 400
  int max_choices = 16;                // n
  int max_image_pixels = 1024 * 1024;  // width x height per image
  int max_images = 16;                 // batch_size x n_iter
};

class ApiServer {
 public:
  // ENGINE must outlive the server.
  ApiServer(Engine& engine, ApiServerOptions options);
  ~ApiServer();  // stops
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds and serves on its own threads. InvalidArgument when the address
  // cannot be bound (in use, bad host).
  Status start();
  void stop();         // closes the listener; requests in flight end (their jobs cancelled, their clients told 503)
  int port() const;    // the bound port (after start)
  // One client's raw bytes (one or more pipelined HTTP/1.x requests) handled
  // without a socket, through everything start() installs (the connection
  // layer's framing checks and limits, CORS, auth, routes, error bodies); the
  // responses' bytes. For the HTTP fuzz target; not beside start().
  std::string handle_raw(const std::string& request);
  std::string address() const;  // "http://HOST:PORT"

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace atelier::server
