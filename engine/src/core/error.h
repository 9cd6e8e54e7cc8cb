// The engine's internal exception. Thrown inside the engine, caught at the
// API boundary (guarded() in text_model_impl.h, store_call() in store_api.cpp)
// and turned into a Status with the same message and the code it was thrown
// with: the throw site knows what went wrong, so nothing downstream guesses
// the kind from the message.
//
//   throw Error(msg)                     InvalidModel (a file is damaged or inconsistent)
//   throw Error(StatusCode::X, msg)      any kind
//   throw NotFoundError(msg)             no such file, model, version
//   throw InvalidArgumentError(msg)      a bad name, reference, option value
//   throw IoError(msg)                   disk or system failure (open, write, sync, lock)
//   throw DiskFullError(msg)             a write found the disk full (ENOSPC, SQLITE_FULL)
//   throw UnsupportedError(msg)          a valid input we do not implement
#pragma once

#include <atelier/status.h>

#include <cerrno>
#include <stdexcept>
#include <string>

namespace atelier {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : Error(StatusCode::InvalidModel, message) {}
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const noexcept { return code_; }

 private:
  StatusCode code_;
};

// A valid input that uses something not implemented (an architecture, a type).
class UnsupportedError : public Error {
 public:
  explicit UnsupportedError(const std::string& message) : Error(StatusCode::Unsupported, message) {}
};

// A file, model, version or entry that does not exist.
class NotFoundError : public Error {
 public:
  explicit NotFoundError(const std::string& message) : Error(StatusCode::NotFound, message) {}
};

// A bad value from the caller (a name, a reference, a role, an option).
class InvalidArgumentError : public Error {
 public:
  explicit InvalidArgumentError(const std::string& message) : Error(StatusCode::InvalidArgument, message) {}
};

// The disk or the system failed (open, read, write, sync, rename, lock).
class IoError : public Error {
 public:
  explicit IoError(const std::string& message) : Error(StatusCode::Io, message) {}

 protected:
  IoError(StatusCode code, const std::string& message) : Error(code, message) {}
};

// A write that found the disk full: a Status of its own (DiskFull, the
// server's 507), so callers can tell "free some space" from other I/O errors.
class DiskFullError : public IoError {
 public:
  explicit DiskFullError(const std::string& message) : IoError(StatusCode::DiskFull, message) {}
};

// A database file that is itself damaged (truncated, overwritten): the
// message names the command that rebuilds it (`atelier queue repair`, ...).
class DamagedError : public IoError {
 public:
  explicit DamagedError(const std::string& message) : IoError(message) {}
};

// The kind of a failed open(2)/stat(2): a missing path is NotFound, anything
// else (permissions, too many files) Io.
inline StatusCode errno_code(int err) { return err == ENOENT || err == ENOTDIR ? StatusCode::NotFound : StatusCode::Io; }

}  // namespace atelier
