// libFuzzer: every path a JSON input's nesting reaches. parse_json
// (atelier/json_input.h: the API bodies, batch lines, schemas, the job
// database's JSON) must refuse anything nested past kMaxJsonDepth while
// parsing, and what it accepts must dump (recursive) without overflowing;
// a JSON schema (text/json_constraint) must compile or be refused, never
// recurse without bound, and its matcher must take or refuse the input.
#include <atelier/json_input.h>
#include <atelier/requests.h>

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "text/json_constraint.h"

namespace {
// The nesting of V, walked without recursion (the property under test must not lean on it).
int depth_of(const nlohmann::json& v) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::json*, int>> todo = {{&v, 0}};
  while (!todo.empty()) {
    auto [j, d] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    for (const auto& child : *j) todo.push_back({&child, d + 1});
  }
  return deepest;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto j = atelier::parse_json(text, "input"); j.ok()) {
    if (depth_of(j.value()) > atelier::kMaxJsonDepth) __builtin_trap();
    (void)j->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (auto o = atelier::parse_json<nlohmann::ordered_json>(text, "input"); o.ok())
    (void)o->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (auto m = atelier::text::JsonMatcher::compile(text); m.ok()) {
    (void)m->close_bytes();
    auto copy = m.value();
    (void)copy.feed(text.substr(0, 4096));  // the schema's own text as candidate output
  }
  (void)atelier::request_from_json(text);
  (void)atelier::is_image_request_json(text);
  return 0;
}
