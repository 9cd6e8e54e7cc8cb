// Turns sampled token pieces into text that is safe to show: holds back a
// tail that may start a stop string or is an incomplete UTF-8 sequence, and
// cuts the text at the first stop string. Used through text::Generation, the one
// generation loop of TextModel::generate and the batching scheduler.
#pragma once

#include <string>
#include <vector>

namespace atelier::text {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends a token's bytes; returns the newly releasable text (may be empty).
  std::string push(const std::string& piece);
  bool stopped() const { return stop_at_ != std::string::npos; }
  // The result text: everything generated, cut before the stop string.
  std::string text() const { return stopped() ? all_.substr(0, stop_at_) : all_; }
  // Bytes handed out by push() so far.
  size_t released() const { return released_; }

 private:
  std::vector<std::string> stops_;
  std::string all_;
  size_t released_ = 0;
  size_t stop_at_ = std::string::npos;
};

}  // namespace atelier::text
