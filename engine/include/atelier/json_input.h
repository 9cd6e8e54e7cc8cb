// atelier/json_input.h — reading JSON that comes from outside (API bodies,
// batch lines, JSON schemas, the job database's stored requests and results)
// with a nesting limit enforced while it is parsed
//
// Header-only (nlohmann-json), so the engine, the CLI and the server share one
// definition. nlohmann's parser is iterative, but dump(), its comparisons and
// anything that walks a value (a schema compiler) recurse once per level: a
// value nested 100,000 deep overflows the stack there. parse_json stops at the
// first level past the limit, so such a value is never built.
#pragma once

#include <atelier/status.h>

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace atelier {

// The deepest nesting of objects and arrays any JSON input may have (a bare
// value is depth 0, {} or [] depth 1). Requests nest a handful of levels;
// serde_json's default recursion limit is 128, OpenAI's structured outputs
// allow 10 levels of schema.
inline constexpr int kMaxJsonDepth = 64;

// TEXT as one JSON value. InvalidArgument, nothing built, when TEXT nests
// deeper than MAX_DEPTH ("WHAT nests objects and arrays more than 64 levels
// deep, the limit for JSON input; ..."), is not valid JSON ("WHAT is not valid
// JSON: ...") or holds a number beyond a double's range ("... too large ...").
// WHAT names the input for the message ("the request body", "the JSON schema").
// Json: nlohmann::json or nlohmann::ordered_json.
template <class Json = nlohmann::json>
Result<Json> parse_json(std::string_view text, std::string_view what, int max_depth = kMaxJsonDepth) {
  struct TooDeep {};
  using Event = typename Json::parse_event_t;
  try {
    // DEPTH is the number of containers around the one that starts: the
    // callback throws before anything deeper is read (returning false would
    // only discard the value and read on).
    Json value = Json::parse(text, [max_depth](int depth, Event event, Json&) {
      if ((event == Event::object_start || event == Event::array_start) && depth >= max_depth) throw TooDeep{};
      return true;
    });
    return value;
  } catch (const TooDeep&) {
    return Status::error(StatusCode::InvalidArgument,
                         std::string(what) + " nests objects and arrays more than " + std::to_string(max_depth) +
                             " levels deep, the limit for JSON input; flatten it");
  } catch (const typename Json::exception& e) {
    // nlohmann throws out_of_range 406 (not parse_error) for a number such as 1e400.
    if (e.id == 406)
      return Status::error(StatusCode::InvalidArgument,
                           std::string(what) + ": a number is too large (beyond a double's range): " + e.what());
    return Status::error(StatusCode::InvalidArgument, std::string(what) + " is not valid JSON: " + e.what());
  }
}

}  // namespace atelier
