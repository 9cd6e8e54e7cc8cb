// The engine's internal exception. Thrown inside the engine, caught at the
// API boundary (src/api.cpp) and turned into a Status with the same message.
#pragma once

#include <stdexcept>
#include <string>

namespace atelier {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A valid input that uses something not implemented (an architecture, a type).
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

}  // namespace atelier
