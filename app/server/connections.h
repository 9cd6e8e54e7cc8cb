// The server's connections: who reads a request's head, how long it may
// take, how large a body may be, how many connections stay open, and whether
// a client is still there. cpp-httplib 0.11 keeps its parser and routing; what
// it does around them falls short here: a connection holds a worker thread
// from its first byte to its last (so slow or idle clients starve /health), a
// chunked body has no size limit, a body without a length is read until the
// client closes, and a client that half-closes is taken for gone. HttpServer
// takes over the sockets (process_and_close_socket) and feeds httplib's
// process_request through its own Stream. Internal to app/server.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "server/api_server.h"

namespace atelier::server {

struct Connection;
class ConnectionPool;

// What the connection layer enforces (from ApiServerOptions).
struct ConnectionLimits {
  int max_connections = 256;      // open at once; see ApiServerOptions::max_connections
  int header_timeout_s = 10;      // a request's head: from its first byte to its blank line
  int body_timeout_s = 60;        // a request's body: from the end of its head to its last byte
  int idle_timeout_s = 5;         // a connection waiting for its next request
  int write_timeout_s = 30;       // a client that stops reading its response
  int64_t max_body_bytes = 32 << 20;  // Content-Length, or the sum of a chunked body's chunk sizes
};

class HttpServer : public httplib::Server {
 public:
  HttpServer();
  ~HttpServer() override;
  // Before the first request: the limits, and the httplib settings and
  // handlers (100-continue, post-routing) the connection layer relies on.
  void set_limits(const ConnectionLimits& limits);
  // listen_after_bind with the accept backlog raised (httplib listens with 5,
  // which drops connections in a burst of new ones).
  bool serve_after_bind();
  // One client's raw bytes (one or more pipelined requests) through the same
  // framing checks and process_request, without a socket; the response bytes.
  std::string handle_raw(const std::string& bytes);

 private:
  bool process_and_close_socket(socket_t sock) override;  // hands the socket to the pool
  ConnectionLimits limits_;
  std::shared_ptr<ConnectionPool> pool_;  // while listening
};

// Why the request on this thread was refused by its framing before any route
// ran (a body over the limit, a bad or missing framing, a body too slow or cut
// short, a head that did not parse and so was answered STATUS): the status,
// words and code for the error handler. nullopt when it was not.
struct FramingError {
  int status = 400;
  std::string message;
  std::string code;
};
std::optional<FramingError> framing_error(int status);

}  // namespace atelier::server
