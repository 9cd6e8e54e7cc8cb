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
  int64_t max_body_bytes = 32 << 20;   // larger request bodies get 413
  int max_connections = 64;            // connections served at once; more wait for a free worker
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
  void stop();         // closes the listener; waits for requests in flight to end (their jobs are cancelled)
  int port() const;    // the bound port (after start)
  // One raw HTTP/1.x request handled without a socket, through everything
  // start() installs (limits, CORS, auth, routes, error bodies); the
  // response's bytes. For the HTTP fuzz target; not beside start().
  std::string handle_raw(const std::string& request);
  std::string address() const;  // "http://HOST:PORT"

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace atelier::server
