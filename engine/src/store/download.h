// Resumable HTTP(S) downloads with libcurl, for `atelier models pull`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/error.h"

namespace atelier::store {

// The server could not be reached at all (no network, DNS failure, refused
// connection): retrying at once will not help, a mirror folder will.
class NetworkError : public Error {
 public:
  explicit NetworkError(const std::string& message) : Error(StatusCode::Io, message) {}
};

struct DownloadOptions {
  int retries = 3;            // extra attempts after a transfer that broke off
  int retry_delay_ms = 1000;  // before the first retry, doubled for each further one
  long connect_timeout_s = 20;
  long stall_timeout_s = 60;  // abort a transfer that moved no byte for this long
  // done and total count the whole file (bytes already in PART included); total 0 = unknown.
  std::function<void(int64_t done, int64_t total, double bytes_per_s)> progress;
  // Polled while bytes arrive; true pauses: the transfer stops at once with
  // Cancelled, PART keeping (and synced) what arrived, for the next call to resume.
  std::function<bool()> should_stop;
};

// Downloads URL into PART. When PART already holds bytes (an earlier attempt
// or process that broke off) the transfer resumes with an HTTP Range request;
// a server that ignores ranges makes it start over. PART is locked (flock)
// while this runs, so two pulls never write one file; it is fsynced at the
// end. EXPECTED_SIZE > 0: PART holding that many bytes is taken as complete.
// Returns the bytes received in this call. Throws NetworkError (unreachable)
// or Error (HTTP error, disk, still incomplete after every retry); PART keeps
// what arrived, for the next attempt.
int64_t download(const std::string& url, const std::string& part, int64_t expected_size, const DownloadOptions& options);

}  // namespace atelier::store
