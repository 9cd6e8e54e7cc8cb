#include "store/download.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <type_traits>
#include <thread>

#include "core/dynamic_library.h"

namespace atelier::store {

namespace {

using Clock = std::chrono::steady_clock;

// libcurl is opened on the first download, not linked: a text or image run
// then never maps it and the TLS, Kerberos, LDAP and SSH libraries it brings
// (about 3 MB resident). libcurl.so.4 is the soname of every libcurl 7 and 8.
struct CurlApi {
  CURLcode (*global_init)(long flags);
  CURL* (*easy_init)();
  void (*easy_cleanup)(CURL*);
  void (*easy_reset)(CURL*);
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_perform)(CURL*);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  const char* (*easy_strerror)(CURLcode);
};

const CurlApi& curl_api() {
  static std::string error;
  static const CurlApi* api = []() -> const CurlApi* {
    std::string why;
    void* lib = open_system_library({"libcurl.so.4"}, &why);
    if (!lib) {
      error = "cannot load libcurl for downloads (" + why +
              "); install it (Debian: apt-get install libcurl4), or download the file yourself and use `atelier models import`";
      return nullptr;
    }
    static CurlApi a;
    const auto sym = [&](auto& fn, const char* name) {
      if (!bind_symbol(lib, fn, name) && error.empty()) error = std::string("the libcurl found lacks ") + name + "; install a current libcurl4";
    };
    sym(a.global_init, "curl_global_init");
    sym(a.easy_init, "curl_easy_init");
    sym(a.easy_cleanup, "curl_easy_cleanup");
    sym(a.easy_reset, "curl_easy_reset");
    sym(a.easy_setopt, "curl_easy_setopt");
    sym(a.easy_perform, "curl_easy_perform");
    sym(a.easy_getinfo, "curl_easy_getinfo");
    sym(a.easy_strerror, "curl_easy_strerror");
    if (!error.empty()) return nullptr;
    a.global_init(CURL_GLOBAL_DEFAULT);
    return &a;
  }();
  if (!api) throw IoError(error);
  return *api;
}

struct Transfer {
  int fd = -1;
  std::string part;
  int64_t start = 0;     // bytes in PART before this attempt
  int64_t received = 0;  // bytes written in this attempt
  int64_t expected = 0;
  std::string write_error;
  Clock::time_point t0, last_report;
  const DownloadOptions* options = nullptr;
};

size_t on_write(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  size_t off = 0;
  while (off < bytes) {
    const ssize_t w = ::write(t->fd, data + off, bytes - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      t->write_error = "cannot write " + t->part + ": " + std::strerror(errno) + " (is the disk full?)";
      return 0;  // makes curl stop with CURLE_WRITE_ERROR
    }
    off += static_cast<size_t>(w);
  }
  t->received += static_cast<int64_t>(bytes);
  return bytes;
}

int on_progress(void* user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->options->should_stop && t->options->should_stop()) return 1;  // libcurl aborts the transfer
  if (!t->options->progress) return 0;
  const auto now = Clock::now();
  // Ten reports a second are plenty for a progress bar.
  if (now - t->last_report < std::chrono::milliseconds(100)) return 0;
  t->last_report = now;
  const double s = std::chrono::duration<double>(now - t->t0).count();
  const int64_t total = dltotal > 0 ? t->start + static_cast<int64_t>(dltotal) : t->expected;
  t->options->progress(t->start + static_cast<int64_t>(dlnow), total, s > 0 ? static_cast<double>(dlnow) / s : 0);
  return 0;
}

int64_t file_size(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

// A URL without its query string (signed CDN addresses are long and private).
std::string short_url(const std::string& url) {
  const auto q = url.find('?');
  return q == std::string::npos ? url : url.substr(0, q);
}

}  // namespace

int64_t download(const std::string& url, const std::string& part, int64_t expected_size, const DownloadOptions& options) {
  const CurlApi& api = curl_api();
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot open the partial download " + part + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0)
    throw IoError("another process is downloading " + part + " right now; wait for it to finish");

  int64_t have = file_size(fd);
  if (expected_size > 0 && have > expected_size) {
    // Longer than the file can be: not a prefix of it.
    if (::ftruncate(fd, 0) != 0) throw IoError("cannot truncate " + part + ": " + std::strerror(errno));
    have = 0;
  }
  if (expected_size > 0 && have == expected_size) return 0;

  std::unique_ptr<CURL, void (*)(CURL*)> curl(api.easy_init(), api.easy_cleanup);
  if (!curl) throw IoError("cannot start libcurl");
  int64_t received_total = 0;
  int delay_ms = options.retry_delay_ms;
  bool restarted = false;
  std::string last_error;
  for (int attempt = 0; attempt <= options.retries; ++attempt) {
    if (attempt > 0 && delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      delay_ms *= 2;
    }
    Transfer t;
    t.fd = fd;
    t.part = part;
    t.start = file_size(fd);
    t.expected = expected_size;
    t.options = &options;
    t.t0 = t.last_report = Clock::now();
    char errbuf[CURL_ERROR_SIZE] = {};
    CURL* c = curl.get();
    api.easy_reset(c);
    api.easy_setopt(c, CURLOPT_URL, url.c_str());
    api.easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https,file");
    api.easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    api.easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);  // Hugging Face answers with a redirect to its CDN
    api.easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    api.easy_setopt(c, CURLOPT_USERAGENT, "atelier/0.1");
    api.easy_setopt(c, CURLOPT_NOSIGNAL, 1L);        // no SIGALRM in a threaded program
    api.easy_setopt(c, CURLOPT_FAILONERROR, 1L);     // an HTTP error page is not the file
    api.easy_setopt(c, CURLOPT_CONNECTTIMEOUT, options.connect_timeout_s);
    api.easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    api.easy_setopt(c, CURLOPT_LOW_SPEED_TIME, options.stall_timeout_s);
    api.easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    api.easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
    api.easy_setopt(c, CURLOPT_WRITEDATA, &t);
    api.easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    api.easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    api.easy_setopt(c, CURLOPT_XFERINFODATA, &t);
    if (t.start > 0) api.easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(t.start));  // Range: bytes=START-
    const CURLcode rc = api.easy_perform(c);
    received_total += t.received;
    long http = 0;
    api.easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    if (rc == CURLE_OK) {
      if (::fsync(fd) != 0) throw IoError("cannot sync " + part + ": " + std::strerror(errno) + " (is the disk full?)");
      if (options.progress) {
        const int64_t n = file_size(fd);
        options.progress(n, n, 0);
      }
      return received_total;
    }
    const std::string what = errbuf[0] ? std::string(errbuf) : std::string(api.easy_strerror(rc));
    last_error = what;
    switch (rc) {
      case CURLE_ABORTED_BY_CALLBACK:
        if (::fsync(fd) != 0) throw IoError("cannot sync " + part + ": " + std::strerror(errno) + " (is the disk full?)");
        throw Error(StatusCode::Cancelled, "paused with " + std::to_string(file_size(fd)) + " bytes kept in " + part +
                                               "; pull again to resume from there");
      case CURLE_COULDNT_RESOLVE_HOST:
      case CURLE_COULDNT_RESOLVE_PROXY:
      case CURLE_COULDNT_CONNECT:
        throw NetworkError("cannot reach " + short_url(url) + " (" + what + ")");
      case CURLE_WRITE_ERROR:
        throw IoError(t.write_error.empty() ? "cannot write " + part + ": " + what : t.write_error);
      case CURLE_RANGE_ERROR:
        // The server ignores ranges: start over from the first byte, once.
        if (restarted) throw IoError("download of " + short_url(url) + " cannot resume: " + what);
        restarted = true;
        if (::ftruncate(fd, 0) != 0) throw IoError("cannot truncate " + part + ": " + std::strerror(errno));
        --attempt;
        continue;
      case CURLE_HTTP_RETURNED_ERROR:
        if (http == 416 && !restarted) {  // range past the end: our partial file is not a prefix of this one
          restarted = true;
          if (::ftruncate(fd, 0) != 0) throw IoError("cannot truncate " + part + ": " + std::strerror(errno));
          --attempt;
          continue;
        }
        if (http != 408 && http != 429 && http < 500)
          throw IoError("download of " + short_url(url) + " failed: HTTP " + std::to_string(http) +
                      (http == 401 || http == 403 ? " (the model may need a licence accepted or a login on its site; "
                                                    "download it there and use `atelier models import`)"
                                                  : ""));
        break;  // a server error: retry
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_URL_MALFORMAT:
      case CURLE_FILE_COULDNT_READ_FILE:
      case CURLE_REMOTE_FILE_NOT_FOUND:
        throw IoError("download of " + short_url(url) + " failed: " + what);
      default:
        break;  // a broken transfer: retry, resuming where it stopped
    }
  }
  throw IoError("download of " + short_url(url) + " broke off after " + std::to_string(options.retries + 1) +
              " attempts with " + std::to_string(file_size(fd)) + " bytes kept in " + part + " (" + last_error +
              "); run the same command again to resume");
}

}  // namespace atelier::store
