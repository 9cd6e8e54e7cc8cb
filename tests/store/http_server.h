// A tiny HTTP/1.1 file server for download tests, on 127.0.0.1 at a free
// port, so the tests run offline. It serves one body at any path, answers
// Range requests with 206 (unless told not to), and can drop the connection
// part-way through the first N responses, as a flaky network does.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <chrono>
#include <thread>
#include <vector>

namespace atelier::test {

class HttpServer {
 public:
  struct Options {
    int64_t drop_at = -1;  // close the connection once the body reaches this absolute offset ...
    int drops = 0;         // ... in this many responses
    bool honour_range = true;
    int64_t pause_at = -1;  // the first response stops this long at this absolute offset (a slow network) ...
    int pause_ms = 0;       // ... then goes on
  };

  HttpServer(std::string body, Options options) : body_(std::move(body)), options_(options) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 8);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~HttpServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::string url(const std::string& path = "/model.bin") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  // The Range header of every request so far ("" when it had none).
  std::vector<std::string> ranges() const {
    std::lock_guard lock(mu_);
    return ranges_;
  }

 private:
  void loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      serve(c);
      ::close(c);
    }
  }

  static std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return s;
  }

  void send_all(int c, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(c, p, n, MSG_NOSIGNAL);
      if (w <= 0) return;
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void serve(int c) {
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos) {
      const ssize_t r = ::recv(c, buf, sizeof buf, 0);
      if (r <= 0) return;
      req.append(buf, static_cast<size_t>(r));
    }
    std::string range;
    const std::string l = lower(req);
    if (const auto pos = l.find("\r\nrange:"); pos != std::string::npos) {
      const auto end = l.find("\r\n", pos + 2);
      range = req.substr(pos + 8, end - pos - 8);
      range.erase(0, range.find_first_not_of(' '));
    }
    {
      std::lock_guard lock(mu_);
      ranges_.push_back(range);
    }
    const int64_t total = static_cast<int64_t>(body_.size());
    int64_t start = 0;
    std::string head;
    if (!range.empty() && options_.honour_range && range.rfind("bytes=", 0) == 0) {
      start = std::stoll(range.substr(6));
      if (start >= total) {
        head = "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */" + std::to_string(total) +
               "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        send_all(c, head.data(), head.size());
        return;
      }
      head = "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes " + std::to_string(start) + "-" + std::to_string(total - 1) +
             "/" + std::to_string(total) + "\r\n";
    } else {
      head = "HTTP/1.1 200 OK\r\n";
    }
    head += "Content-Type: application/octet-stream\r\nContent-Length: " + std::to_string(total - start) +
            "\r\nConnection: close\r\n\r\n";
    send_all(c, head.data(), head.size());
    int64_t end = total;
    if (options_.drops > 0 && options_.drop_at > start && options_.drop_at < total) {
      --options_.drops;
      end = options_.drop_at;
    }
    if (options_.pause_ms > 0 && options_.pause_at > start && options_.pause_at < end) {
      send_all(c, body_.data() + start, static_cast<size_t>(options_.pause_at - start));
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.pause_ms));
      start = options_.pause_at;
      options_.pause_ms = 0;
    }
    send_all(c, body_.data() + start, static_cast<size_t>(end - start));
    ::shutdown(c, SHUT_RDWR);
  }

  std::string body_;
  Options options_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<std::string> ranges_;
};

}  // namespace atelier::test
