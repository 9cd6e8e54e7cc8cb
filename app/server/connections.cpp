// The server's connections (connections.h says what this takes over from
// cpp-httplib and why). One poller thread holds every connection that waits
// for a request head and reads heads without a worker; a connection whose head
// is complete goes to a worker thread (started on demand, at most one per open
// connection), which runs httplib's process_request over a RequestStream: the
// body's framing checked against the limits as the parser reads it.
#include "server/connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "server/context.h"

namespace atelier::server {

using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxHeadBytes = 64 << 10;   // a longer request head gets 431
constexpr size_t kRecvBytes = 16 << 10;
constexpr size_t kMaxChunkLine = 4096;       // a chunk-size line, extensions included
constexpr size_t kMaxRawOutput = 1 << 20;    // handle_raw: past this, writes fail as to a client that stopped reading
constexpr auto kLinger = std::chrono::seconds(1);
constexpr int kSliceMs = 200;                // waits look at the stop flag this often

int ms_until(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, kSliceMs));
}

std::string sockaddr_ip(const sockaddr_storage& a, int& port) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
    port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
    port = ntohs(in6.sin6_port);
  }
  return text;
}

std::string quoted(const std::string& value) {  // a header value in an error message: short, printable
  std::string out;
  for (char c : value.substr(0, 40)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return "'" + out + (value.size() > 40 ? "...'" : "'");
}

FramingError too_large(int64_t limit, const std::string& what) {
  return {413, what + " is larger than the server's limit of " + std::to_string(limit) + " bytes (--max-body-bytes)",
          "body_too_large"};
}

}  // namespace

// ---------------------------------------------------------------- one connection

struct Connection {
  Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() {
    if (fd >= 0) ::close(fd);
  }

  int fd = -1;                 // -1: the bytes are in memory (handle_raw)
  std::string in;              // received, not yet read by the parser (a head, a body, pipelined requests)
  size_t in_pos = 0;
  size_t scanned = 0;          // where head_complete's search for the blank line resumes (>= in_pos)
  std::string out;             // handle_raw's response bytes
  std::string remote_ip = "127.0.0.1", local_ip = "127.0.0.1";
  int remote_port = 0, local_port = 0;
  Clock::time_point waiting_since{};  // in the pool since
  Clock::time_point head_since{};     // the first byte of the request head now buffered
  bool pooled = false;                // in the pool's waiting list (the pool's mutex guards it)
  std::shared_ptr<const std::atomic<bool>> stopping;  // the server's stop flag (null in memory)
  std::atomic<bool> probed{false};
  // While a worker waits on this client (its body to arrive, or room to write
  // its answer): since when, in steady-clock nanoseconds (0: not waiting). The
  // pool closes the one waiting longest when it needs room (evicted).
  std::atomic<int64_t> blocked_since_ns{0};
  std::atomic<bool> evicted{false};
  std::atomic<bool> stop_cancelled{false};  // a handler was told gone() because the server is stopping

  size_t unread() const { return in.size() - in_pos; }
  void compact() {
    if (in_pos == in.size()) {
      in.clear();
      in_pos = scanned = 0;
    }
  }
  // A whole request head is buffered (up to its empty line, CR or not): a
  // worker can parse it without waiting. Empty lines before a request are
  // skipped (RFC 9112 2.2: some clients send a CRLF after a body).
  bool head_complete() {
    while (in.compare(in_pos, 2, "\r\n") == 0) in_pos += 2;
    const size_t from = std::max(in_pos, scanned >= in_pos + 2 ? scanned - 2 : 0);
    scanned = in.size();
    return in.find("\n\n", from) != std::string::npos || in.find("\n\r\n", from) != std::string::npos;
  }
  // The buffered head has a line that ends with a bare LF (httplib skips such
  // lines and would wait for more).
  bool head_has_bare_lf() const {
    const size_t end = std::min(in.find("\n\n", in_pos), in.find("\n\r\n", in_pos));
    for (size_t i = in_pos; i < end && i < in.size(); ++i)
      if (in[i] == '\n' && (i == in_pos || in[i - 1] != '\r')) return true;
    return end != std::string::npos && end < in.size() && in.compare(end, 2, "\n\n") == 0;
  }
  bool stopping_now() const { return stopping && stopping->load(); }

  // Whether the client is gone, for a handler waiting on its job. A FIN alone
  // does not say: the client may have closed, or only half-closed after its
  // request and still read. A closed socket answers any data with a reset
  // (RFC 1122 4.2.2.13), a half-closed one takes it; the probe is one urgent
  // (out-of-band) byte, which a receiver without SO_OOBINLINE (every usual
  // client) keeps aside, so the response stream is unchanged.
  bool gone() {
    if (stopping_now()) {  // the server is stopping: the handler ends and cancels its jobs
      stop_cancelled = true;
      return true;
    }
    if (fd < 0) return false;
    pollfd p{fd, static_cast<short>(POLLRDHUP), 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
    if (!(p.revents & POLLRDHUP) || probed.exchange(true)) return false;
    const char urgent = 0;
    if (::send(fd, &urgent, 1, MSG_OOB | MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return true;
    p.revents = 0;  // the reset of a closed peer comes back within a round trip
    return ::poll(&p, 1, 50) > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL));
  }
};

// An error answered by the connection layer itself (no request parsed): a
// whole response, best effort, and the connection is closed after it.
void send_error(const Connection& c, int status, const char* reason, const std::string& message, const std::string& code) {
  const std::string body = error_body(status, message, "", "invalid_request_error", code).dump();
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                               "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                               "\r\nConnection: close\r\n\r\n" + body;
  if (c.fd >= 0) (void)::send(c.fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Reads (and drops) what a client still sends for up to kLinger after the
// answer to a request whose body was not read, so that closing does not reset
// the connection before the client has read that answer.
void linger(const Connection& c) {
  if (c.fd < 0) return;
  ::shutdown(c.fd, SHUT_WR);
  const auto until = Clock::now() + kLinger;
  char buf[kRecvBytes];
  for (;;) {
    pollfd p{c.fd, POLLIN, 0};
    const int r = ::poll(&p, 1, ms_until(until));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (r == 0 && Clock::now() >= until)) return;
    if (r == 0) continue;
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
  }
}

// ---------------------------------------------------------------- a chunked body

// Follows a chunked body byte by byte as the parser reads it, one step ahead:
// a size line is checked (and the declared sizes summed against the limit)
// before the parser reads the chunk, and a byte that breaks the framing is
// refused before the parser sees it, so a body over the limit is never read
// and a malformed one never ends early as if it were whole.
class ChunkReader {
 public:
  explicit ChunkReader(int64_t max_bytes = 0) : max_(static_cast<uint64_t>(max_bytes)) {}
  bool done() const { return state_ == State::Done; }
  bool in_data() const { return state_ == State::Data; }
  uint64_t data_left() const { return left_; }
  void take(size_t n) {
    left_ -= n;
    if (left_ == 0) state_ = State::DataEnd;
  }
  // One byte outside a chunk's data; false when it breaks the framing or the limit (see error()).
  bool accept(char c) {
    switch (state_) {
      case State::Size: {
        if (line_.empty() && !std::isxdigit(static_cast<unsigned char>(c)))
          return fail(400, "a chunk of the chunked request body must start with its size in hexadecimal digits");
        if (line_.size() >= kMaxChunkLine) return fail(400, "a chunk-size line of the chunked request body is over 4096 bytes");
        line_ += c;
        if (c != '\n') return true;
        errno = 0;
        const uint64_t size = std::strtoull(line_.c_str(), nullptr, 16);
        if (errno == ERANGE || size > max_ - total_) {
          error_ = too_large(static_cast<int64_t>(max_), "the chunked request body");
          return false;
        }
        total_ += size;
        left_ = size;
        line_.clear();
        state_ = size > 0 ? State::Data : State::Last;
        return true;
      }
      case State::DataEnd:
      case State::Last: {
        if (c != (line_.empty() ? '\r' : '\n'))
          return fail(400, state_ == State::DataEnd
                               ? "a chunk of the chunked request body is longer than its size line says (its data must end with CRLF)"
                               : "the chunked request body must end with 0 CRLF CRLF (trailer fields are not supported)");
        line_ += c;
        if (c == '\n') {
          line_.clear();
          state_ = state_ == State::DataEnd ? State::Size : State::Done;
        }
        return true;
      }
      case State::Data:
      case State::Done: return true;
    }
    return true;
  }
  const FramingError& error() const { return error_; }

 private:
  bool fail(int status, std::string message) {
    error_ = {status, std::move(message), "bad_chunked_body"};
    return false;
  }
  enum class State { Size, Data, DataEnd, Last, Done } state_ = State::Size;
  std::string line_;
  uint64_t left_ = 0, total_ = 0, max_;
  FramingError error_;
};

// ---------------------------------------------------------------- one request's stream

namespace {

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

// Marks a connection as waiting on its client while in scope (see blocked_since_ns).
struct Blocked {
  explicit Blocked(Connection& c) : c(c) { c.blocked_since_ns = now_ns(); }
  ~Blocked() { c.blocked_since_ns = 0; }
  Connection& c;
};

FramingError evicted_error(const ConnectionLimits& limits) {
  return {503, "closed to make room for a new connection (--max-connections " + std::to_string(limits.max_connections) +
                   "): this one had waited longest on its client",
          "connection_evicted"};
}

// What httplib's parser reads a request from and writes its response to:
// the connection's buffered bytes, then the socket, within the head's or the
// body's deadline; the body held to what its framing declares and the limit.
class RequestStream final : public httplib::Stream {
 public:
  RequestStream(std::shared_ptr<Connection> c, const ConnectionLimits& limits)
      : c_(std::move(c)), limits_(limits), deadline_(c_->head_since + std::chrono::seconds(limits.header_timeout_s)) {}

  // httplib's setup_request: the head is parsed, the body not yet read. Picks
  // the body's framing; a refusal is answered before any route runs.
  void begin_body(httplib::Request& req) {
    deadline_ = Clock::now() + std::chrono::seconds(limits_.body_timeout_s);
    const size_t te_count = req.get_header_value_count("Transfer-Encoding");
    const size_t cl_count = req.get_header_value_count("Content-Length");
    if (te_count > 0) {
      const std::string te = req.get_header_value("Transfer-Encoding");
      if (te_count > 1 || strcasecmp(te.c_str(), "chunked") != 0)
        return refuse_now(req, {501, "Transfer-Encoding " + quoted(te) +
                                         " is not supported: send the body with Content-Length, or with Transfer-Encoding: chunked alone",
                                "unsupported_transfer_encoding"});
      if (cl_count > 0)
        return refuse_now(req, {400, "the request has both Content-Length and Transfer-Encoding: send one of them", "ambiguous_body_length"});
      mode_ = Mode::Chunked;
      chunks_ = ChunkReader(limits_.max_body_bytes);
      return;
    }
    if (cl_count > 0) {
      const std::string first = req.get_header_value("Content-Length");
      for (size_t i = 1; i < cl_count; ++i)
        if (req.get_header_value("Content-Length", i) != first)
          return refuse_now(req, {400, "the request has Content-Length headers that disagree: send one", "bad_content_length"});
      const bool digits = !first.empty() && first.size() <= 18 &&
                          std::all_of(first.begin(), first.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      if (!digits)
        return refuse_now(req, {400, "Content-Length must be a whole number of bytes, not " + quoted(first), "bad_content_length"});
      const uint64_t length = std::stoull(first);
      if (length > static_cast<uint64_t>(limits_.max_body_bytes))
        return refuse_now(req, too_large(limits_.max_body_bytes, "the request body (Content-Length " + first + ")"));
      mode_ = Mode::Length;
      left_ = length_ = length;
      return;
    }
    mode_ = Mode::None;  // neither header: no body (RFC 9112 6.3), not "until the client closes"
  }

  bool body_finished() const {
    switch (mode_) {
      case Mode::None: return true;
      case Mode::Length: return left_ == 0;
      case Mode::Chunked: return chunks_.done();
      default: return false;  // a head that did not parse, or a refused body
    }
  }
  bool body_begun() const { return mode_ != Mode::Head; }
  bool head_parsed() const { return mode_ != Mode::Head; }
  bool must_close() const { return error_.has_value() || !body_finished() || c_->stopping_now(); }
  const std::optional<FramingError>& error() const { return error_; }
  const std::shared_ptr<Connection>& connection() const { return c_; }

  bool is_readable() const override { return mode_ != Mode::Refused; }
  bool is_writable() const override {
    if (c_->fd < 0) return c_->out.size() < kMaxRawOutput;
    const auto until = Clock::now() + std::chrono::seconds(limits_.write_timeout_s);
    std::optional<Blocked> blocked;
    for (;;) {
      // A client that half-closed still reads: only an error or a hangup ends the response.
      pollfd p{c_->fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, blocked ? ms_until(until) : 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return false;
      if (r > 0) return !(p.revents & (POLLERR | POLLHUP | POLLNVAL)) && (p.revents & POLLOUT);
      if (Clock::now() >= until || c_->stopping_now() || c_->evicted) return false;
      if (!blocked) blocked.emplace(*c_);
    }
  }

  ssize_t read(char* ptr, size_t size) override {
    switch (mode_) {
      case Mode::Refused: return -1;
      case Mode::None: return 0;
      case Mode::Length:
        if (left_ == 0) return 0;
        size = static_cast<size_t>(std::min<uint64_t>(size, left_));
        break;
      case Mode::Chunked:
        if (chunks_.done()) return 0;
        size = chunks_.in_data() ? static_cast<size_t>(std::min<uint64_t>(size, chunks_.data_left())) : std::min<size_t>(size, 1);
        break;
      case Mode::Head: break;
    }
    const ssize_t got = fill();
    if (got == 0 && mode_ == Mode::Length) {
      refuse({400, "the connection ended " + std::to_string(left_) + " bytes before the end of the request body (Content-Length " +
                       std::to_string(length_) + ")", "incomplete_body"});
      return -1;
    }
    if (got == 0 && mode_ == Mode::Chunked) {
      refuse({400, "the connection ended inside the chunked request body (it ends with 0 CRLF CRLF)", "incomplete_body"});
      return -1;
    }
    if (got <= 0) return got;
    const size_t n = std::min(size, c_->unread());
    const char* p = c_->in.data() + c_->in_pos;
    if (mode_ == Mode::Chunked) {
      if (chunks_.in_data()) {
        chunks_.take(n);
      } else if (!chunks_.accept(*p)) {
        refuse(chunks_.error());
        return -1;
      }
    } else if (mode_ == Mode::Length) {
      left_ -= n;
    }
    std::memcpy(ptr, p, n);
    c_->in_pos += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (c_->fd < 0) {
      if (c_->out.size() + size > kMaxRawOutput) return -1;
      c_->out.append(ptr, size);
      return static_cast<ssize_t>(size);
    }
    if (!is_writable()) return -1;
    for (;;) {
      const ssize_t n = ::send(c_->fd, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_->remote_ip;
    port = c_->remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_->local_ip;
    port = c_->local_port;
  }
  socket_t socket() const override { return c_->fd >= 0 ? c_->fd : INVALID_SOCKET; }

 private:
  enum class Mode { Head, None, Length, Chunked, Refused };

  // Unread bytes buffered: 1 (there are some), 0 at the end of the client's
  // bytes, -1 on an error or the deadline (which refuses the request: 408).
  ssize_t fill() {
    if (c_->unread() > 0) return 1;
    if (c_->fd < 0) return 0;
    c_->compact();
    char buf[kRecvBytes];
    std::optional<Blocked> blocked;
    for (;;) {
      if (c_->stopping_now()) return -1;
      if (c_->evicted) {
        refuse(evicted_error(limits_));
        return -1;
      }
      if (Clock::now() >= deadline_) {
        if (mode_ == Mode::Head)
          refuse({408, "the request head did not arrive within " + std::to_string(limits_.header_timeout_s) + " s (--header-timeout)",
                  "request_timeout"});
        else
          refuse({408, "the request body did not arrive within " + std::to_string(limits_.body_timeout_s) + " s (--body-timeout)",
                  "request_timeout"});
        return -1;
      }
      pollfd p{c_->fd, POLLIN, 0};
      const int r = ::poll(&p, 1, blocked ? ms_until(deadline_) : 0);
      if (r < 0 && errno != EINTR) return -1;
      if (r == 0 && !blocked) blocked.emplace(*c_);
      if (r <= 0) continue;
      const ssize_t n = ::recv(c_->fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c_->in.append(buf, static_cast<size_t>(n));
        return 1;
      }
      if (n == 0 && c_->evicted) {  // the pool shut its reading side to wake this wait
        refuse(evicted_error(limits_));
        return -1;
      }
      if (n == 0) return 0;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    }
  }

  void refuse(FramingError e) {
    if (!error_) error_ = std::move(e);
    mode_ = Mode::Refused;
  }
  // Refused from the head alone: httplib answers a request that expects 100
  // Continue through its expect handler, before the routes and before the body
  // (which is never read), so the request is made to expect it.
  void refuse_now(httplib::Request& req, FramingError e) {
    refuse(std::move(e));
    req.headers.erase("Expect");
    req.headers.emplace("Expect", "100-continue");
  }

  std::shared_ptr<Connection> c_;
  const ConnectionLimits& limits_;
  Clock::time_point deadline_;
  Mode mode_ = Mode::Head;
  uint64_t left_ = 0, length_ = 0;
  ChunkReader chunks_;
  std::optional<FramingError> error_;
};

thread_local RequestStream* t_request = nullptr;  // the request this thread is handling

using Process = std::function<bool(httplib::Stream&, bool, bool&, const std::function<void(httplib::Request&)>&)>;

// Serves requests on C until it closes or waits for more bytes. True: it
// stays open, with no whole request head buffered (the pool waits for one).
bool serve_requests(const std::shared_ptr<Connection>& c, const ConnectionLimits& limits, const Process& process,
                    size_t max_requests) {
  for (size_t served = 1;; ++served) {
    if (c->head_has_bare_lf()) {
      const FramingError e{400, "each line of the request head must end with CRLF, not a bare LF", "bad_request_head"};
      if (c->fd >= 0) send_error(*c, e.status, "Bad Request", e.message, e.code);
      else c->out += "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      return false;
    }
    RequestStream stream(c, limits);
    bool closed = false;
    const bool last = served >= max_requests || c->stopping_now();
    t_request = &stream;
    const bool ok = process(stream, last, closed, [&stream](httplib::Request& req) { stream.begin_body(req); });
    t_request = nullptr;
    if (!ok || closed || last || stream.must_close()) {
      if (ok && stream.body_begun() && !stream.body_finished() && !c->evicted) linger(*c);
      return false;
    }
    if (c->fd < 0 && c->unread() == 0) return false;
    c->head_since = Clock::now();
    c->scanned = c->in_pos;  // the next head starts here
    if (c->fd >= 0 && !c->head_complete()) return true;
  }
}

}  // namespace

std::optional<FramingError> framing_error(int status) {
  if (!t_request) return std::nullopt;
  if (t_request->error()) return t_request->error();
  if (!t_request->head_parsed() && status == 400)
    return FramingError{400, "the request head could not be parsed: send 'METHOD /path HTTP/1.1', then 'Name: value' header lines, each ending with CRLF, then an empty line",
                        "bad_request_head"};
  if (!t_request->head_parsed() && status == 414)
    return FramingError{414, "the request line is over 8192 bytes", "uri_too_long"};
  if (!t_request->head_parsed() && status == 416)
    return FramingError{416, "the Range header is not valid: send 'bytes=FIRST-LAST' (or none)", "bad_range"};
  return std::nullopt;
}

ClientWatch::ClientWatch(const httplib::Request&) : conn_(t_request ? t_request->connection() : nullptr) {}

bool ClientWatch::gone() const { return conn_ && conn_->gone(); }

// ---------------------------------------------------------------- the pool

class ConnectionPool {
 public:
  ConnectionPool(const ConnectionLimits& limits, Process process, size_t max_requests)
      : limits_(limits), process_(std::move(process)), max_requests_(max_requests) {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
    poller_ = std::thread([this] { poll_loop(); });
  }
  ~ConnectionPool() {
    shutdown();
    for (int fd : wake_)
      if (fd >= 0) ::close(fd);
  }
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // A socket httplib accepted. At the cap the connection that has waited
  // longest for a request is closed to make room, else the one whose worker
  // has waited longest on its client (a body trickling in, an answer not
  // read); when every open connection is busy with a request, the new one is
  // answered 503.
  void adopt(int fd) {
    auto c = std::make_shared<Connection>();
    c->fd = fd;
    c->stopping = stopping_;
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) c->remote_ip = sockaddr_ip(a, c->remote_port);
    len = sizeof a;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) c->local_ip = sockaddr_ip(a, c->local_port);
    c->waiting_since = Clock::now();
    std::vector<std::shared_ptr<Connection>> evicted;
    bool busy = false;
    {
      std::lock_guard lock(mu_);
      if (*stopping_) return;
      const size_t cap = static_cast<size_t>(std::max(1, limits_.max_connections));
      if (waiting_.size() + active_.size() - evicting_ >= cap && !waiting_.empty()) {
        // The one waiting longest, but not one whose bytes are here and not
        // yet read (a new client about to send its request): one poll says which.
        std::vector<pollfd> fds;
        for (const auto& w : waiting_) fds.push_back(pollfd{w->fd, POLLIN, 0});
        const bool polled = ::poll(fds.data(), fds.size(), 0) >= 0;
        size_t victim = waiting_.size();
        for (size_t i = 0; i < waiting_.size(); ++i) {
          const bool pending = polled && (fds[i].revents & POLLIN) && waiting_[i]->unread() == 0;
          if (!pending && (victim == waiting_.size() || waiting_[i]->waiting_since < waiting_[victim]->waiting_since)) victim = i;
        }
        if (victim == waiting_.size())
          victim = static_cast<size_t>(std::min_element(waiting_.begin(), waiting_.end(), [](const auto& x, const auto& y) {
                                         return x->waiting_since < y->waiting_since;
                                       }) - waiting_.begin());
        waiting_[victim]->pooled = false;
        evicted.push_back(std::move(waiting_[victim]));
        waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(victim));
      }
      if (waiting_.size() + active_.size() - evicting_ >= cap) {
        Connection* slowest = nullptr;
        for (const auto& a : active_) {
          const int64_t since = a->blocked_since_ns;
          if (since != 0 && !a->evicted && (!slowest || since < slowest->blocked_since_ns)) slowest = a.get();
        }
        if (slowest) {
          slowest->evicted = true;  // its worker answers 503 (when it can) and closes it
          ++evicting_;
          ::shutdown(slowest->fd, SHUT_RD);
        }
      }
      busy = waiting_.size() + active_.size() - evicting_ >= cap;
      if (!busy) {
        c->pooled = true;
        waiting_.push_back(c);
      }
    }
    for (const auto& e : evicted) {
      if (e->unread() > 0)
        send_error(*e, 503, "Service Unavailable",
                   "closed to make room for a new connection (--max-connections " + std::to_string(limits_.max_connections) +
                       "): this one had not sent a whole request head",
                   "connection_evicted");
      ::shutdown(e->fd, SHUT_RDWR);  // closed when the poller lets go of it
    }
    if (busy)
      send_error(*c, 503, "Service Unavailable",
                 "all " + std::to_string(limits_.max_connections) +
                     " connections the server keeps open (--max-connections) are busy with requests; try again shortly",
                 "too_many_connections");
    wake();
  }

  void shutdown() {
    {
      std::lock_guard lock(mu_);
      if (*stopping_ && !poller_.joinable()) return;
      *stopping_ = true;
    }
    wake();
    work_cv_.notify_all();
    if (poller_.joinable()) poller_.join();
    for (auto& t : workers_)  // only the poller starts workers: the list is final
      if (t.joinable()) t.join();
    std::lock_guard lock(mu_);
    waiting_.clear();
    ready_.clear();
  }

 private:
  void wake() {
    const char b = 1;
    if (wake_[1] >= 0) (void)!::write(wake_[1], &b, 1);
  }

  enum class Outcome { Wait, Dispatch, Ended, Late, TooLarge };

  // Reads what a waiting connection has sent, without blocking (the mutex is held).
  static Outcome read_head(Connection& c) {
    char buf[kRecvBytes];
    for (;;) {
      if (c.unread() >= kMaxHeadBytes) return Outcome::TooLarge;
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c.compact();
        if (c.unread() == 0) c.head_since = Clock::now();
        c.in.append(buf, static_cast<size_t>(n));
        if (c.head_complete()) return Outcome::Dispatch;
        continue;
      }
      if (n == 0) return Outcome::Ended;  // the client ended without a whole request head
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? Outcome::Wait : Outcome::Ended;
    }
  }

  void poll_loop() {
    std::vector<pollfd> fds;
    std::vector<std::shared_ptr<Connection>> polled;
    for (;;) {
      int timeout_ms = kSliceMs;
      {
        std::lock_guard lock(mu_);
        if (*stopping_) break;
        polled = waiting_;
        for (const auto& c : polled) timeout_ms = std::min(timeout_ms, ms_until(deadline(*c)));
      }
      fds.assign(1, pollfd{wake_[0], POLLIN, 0});
      for (const auto& c : polled) fds.push_back(pollfd{c->fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (fds[0].revents) {
        char drain[64];
        while (::read(wake_[0], drain, sizeof drain) > 0) {
        }
      }
      std::vector<std::pair<std::shared_ptr<Connection>, Outcome>> ended;
      {
        std::lock_guard lock(mu_);
        const auto now = Clock::now();
        for (size_t i = 0; i < polled.size(); ++i) {
          auto& c = polled[i];
          if (!c->pooled) continue;  // evicted meanwhile
          Outcome o = fds[i + 1].revents ? read_head(*c) : Outcome::Wait;
          if (o == Outcome::Wait && now >= deadline(*c)) o = Outcome::Late;
          if (o == Outcome::Wait) continue;
          c->pooled = false;
          waiting_.erase(std::find(waiting_.begin(), waiting_.end(), c));
          if (o == Outcome::Dispatch) {
            active_.push_back(c);
            ready_.push_back(c);
            if (ready_.size() > idle_workers_) workers_.emplace_back([this] { work(); });
            work_cv_.notify_one();
          } else {
            ended.emplace_back(c, o);
          }
        }
      }
      for (const auto& [c, o] : ended) {
        if (o == Outcome::TooLarge)
          send_error(*c, 431, "Request Header Fields Too Large",
                     "the request head is over " + std::to_string(kMaxHeadBytes >> 10) + " KiB", "head_too_large");
        else if (c->unread() > 0 && o == Outcome::Late)  // a head begun and not finished in time
          send_error(*c, 408, "Request Timeout",
                     "the request head did not arrive within " + std::to_string(limits_.header_timeout_s) + " s (--header-timeout)",
                     "request_timeout");
        else if (c->unread() > 0)  // a half-closed client still reads
          send_error(*c, 400, "Bad Request", "the connection ended inside a request head (it ends with an empty line)",
                     "incomplete_head");
      }
      polled.clear();  // the last references of closed connections: their sockets close here
    }
  }

  // When a waiting connection is closed: its head's deadline once a byte of
  // it came, else the idle timeout.
  Clock::time_point deadline(const Connection& c) const {
    return c.unread() > 0 ? c.head_since + std::chrono::seconds(limits_.header_timeout_s)
                          : c.waiting_since + std::chrono::seconds(limits_.idle_timeout_s);
  }

  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_workers_;
      work_cv_.wait(lock, [&] { return *stopping_ || !ready_.empty(); });
      --idle_workers_;
      if (*stopping_) return;
      std::shared_ptr<Connection> c = std::move(ready_.front());
      ready_.pop_front();
      lock.unlock();
      const bool keep = serve_requests(c, limits_, process_, max_requests_);
      lock.lock();
      active_.erase(std::find(active_.begin(), active_.end(), c));
      if (c->evicted) --evicting_;
      if (keep && !*stopping_ && !c->evicted) {
        c->waiting_since = Clock::now();
        c->pooled = true;
        waiting_.push_back(std::move(c));
        wake();
      }
      c.reset();
    }
  }

  const ConnectionLimits limits_;
  const Process process_;
  const size_t max_requests_;
  const std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::vector<std::shared_ptr<Connection>> waiting_;  // for a request head (the poller's)
  std::deque<std::shared_ptr<Connection>> ready_;     // a whole head buffered, for a worker
  std::vector<std::shared_ptr<Connection>> active_;  // in ready_ or being served
  size_t evicting_ = 0;                               // of those, told to close to make room
  size_t idle_workers_ = 0;
  std::vector<std::thread> workers_;
  std::thread poller_;
  int wake_[2] = {-1, -1};
};

// ---------------------------------------------------------------- the server

namespace {
// httplib's accept loop hands each socket over as a task that calls
// process_and_close_socket, which only gives it to the pool: run it at once.
struct PoolQueue final : httplib::TaskQueue {
  explicit PoolQueue(std::shared_ptr<ConnectionPool> p) : pool(std::move(p)) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { pool->shutdown(); }
  std::shared_ptr<ConnectionPool> pool;
};
}  // namespace

HttpServer::HttpServer() {
  new_task_queue = [this] {
    pool_ = std::make_shared<ConnectionPool>(
        limits_,
        [this](httplib::Stream& s, bool close, bool& closed, const std::function<void(httplib::Request&)>& setup) {
          return process_request(s, close, closed, setup);
        },
        keep_alive_max_count_);
    return new PoolQueue(pool_);
  };
}

HttpServer::~HttpServer() = default;

void HttpServer::set_limits(const ConnectionLimits& limits) {
  limits_ = limits;
  set_payload_max_length(static_cast<size_t>(limits.max_body_bytes));
  set_keep_alive_timeout(limits.idle_timeout_s);  // the Keep-Alive header's figure; the pool enforces it
  set_keep_alive_max_count(100);
  set_write_timeout(limits.write_timeout_s);      // SO_SNDTIMEO: a send blocks no longer
  set_expect_100_continue_handler([](const httplib::Request&, httplib::Response& res) {
    if (auto e = framing_error(0)) return res.status = e->status;  // answered now; the body is never read
    return 100;
  });
  set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (!t_request) return;
    if (t_request->connection()->stop_cancelled && !res.content_provider_) {
      // What the handler made of its cancelled jobs is not the answer: say why they ended.
      const std::string body = error_body(503, "the server is stopping: this request's jobs were cancelled; send it again once it is back",
                                          "", "", "server_stopping")
                                   .dump();
      res.status = 503;
      res.body = body;
      res.headers.erase("Content-Type");
      res.headers.erase("Content-Length");
      res.set_header("Content-Type", "application/json");
      res.set_header("Content-Length", std::to_string(body.size()));
    }
    if (t_request->must_close()) {  // what is left of the request's bytes cannot be parsed as the next one (or the server stops)
      res.headers.erase("Keep-Alive");
      res.set_header("Connection", "close");
    }
  });
}

bool HttpServer::serve_after_bind() {
  if (const socket_t s = svr_sock_; s != INVALID_SOCKET) ::listen(s, SOMAXCONN);
  return listen_after_bind();
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  if (pool_) pool_->adopt(sock);
  else ::close(sock);
  return true;
}

std::string HttpServer::handle_raw(const std::string& bytes) {
  auto c = std::make_shared<Connection>();
  c->in = bytes;
  c->remote_port = 1;
  c->local_port = 2;
  serve_requests(
      c, limits_,
      [this](httplib::Stream& s, bool close, bool& closed, const std::function<void(httplib::Request&)>& setup) {
        return process_request(s, close, closed, setup);
      },
      keep_alive_max_count_);
  return std::move(c->out);
}

}  // namespace atelier::server
