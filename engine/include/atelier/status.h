// atelier/status.h — status codes and results
//
// Pure C++20, no Qt. Nothing here throws: every fallible call returns a
// Status or a Result whose message says what was wrong and what to do.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace atelier {

// ---------------------------------------------------------------- status

enum class StatusCode {
  Ok = 0,
  InvalidArgument,  // a request value is out of range; nothing was done
  NotFound,         // a file or model does not exist
  InvalidModel,     // a model file is truncated, corrupt or inconsistent
  Unsupported,      // a valid file using something we do not implement (architecture, type)
  Io,               // reading or writing failed (disk full, permissions)
  Internal,         // a bug: please report it
  Cancelled,        // the caller cancelled the work (e.g. a progress callback said stop)
  DiskFull,         // the disk is full (ENOSPC, SQLITE_FULL): nothing was written; free some space and retry
};

// "ok", "invalid_argument", "not_found", "invalid_model", "unsupported", "io",
// "internal", "cancelled", "disk_full": what the job database records as a failed job's error_code.
std::string_view status_code_name(StatusCode code);

struct Status {
  StatusCode code = StatusCode::Ok;
  std::string message;
  bool ok() const { return code == StatusCode::Ok; }
  static Status error(StatusCode c, std::string m) { return {c, std::move(m)}; }
};

template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace atelier
