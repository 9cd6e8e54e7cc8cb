// Constrained decoding for structured output: a JSON Schema (a subset: type
// object/array/string/number/integer/boolean/null, properties, required,
// additionalProperties, items, enum, const; anyOf at the top level only, as
// the tool-call constraint's one alternative per tool) compiled into an incremental
// matcher over bytes. Generation keeps one matcher per sequence and draws
// only tokens whose bytes it accepts, so the text is always a prefix of a
// JSON value valid for the schema, and ends as soon as the value is complete.
// Strings hold at most kMaxStringBytes, arrays kMaxItems, numbers
// kMaxNumberChars, and at most one whitespace byte separates tokens; the
// token budget (close_bytes) makes the value end before max_new_tokens.
#pragma once

#include <atelier/status.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace atelier::text {

struct SchemaNode;

// One open construct. For Any values, the node is any_node() and objects and
// arrays nest Any values.
struct JsonFrame {
  enum Kind {
    ObjKeyOrEnd,   // after '{' or ',': a key ('"'), or '}' (only right after '{' or when complete)
    ObjKey,        // inside a key
    ObjColon,      // after a key
    ObjNext,       // after a value: ',' or '}'
    ArrValueOrEnd, // after '[': a value or ']'
    ArrNext,       // after a value: ',' or ']'
    ArrValue,      // after ',': a value
    Str,           // inside a string value
    Num,           // inside a number
    Lit,           // inside one of several literal texts
  } kind;
  const SchemaNode* node = nullptr;
  std::string text;                 // key or string bytes so far, or the literal/number prefix
  std::vector<bool> seen;           // object: declared properties used
  int count = 0;                    // array items
  int prop = -1;                    // object: the property whose value comes next (-1: additional)
  bool escape = false, after_comma = false;
};


class JsonMatcher {
 public:
  static constexpr int kMaxStringBytes = 128, kMaxItems = 16, kMaxNumberChars = 16;
  // Schemas inside schemas (properties, items, additionalProperties): more is refused.
  static constexpr int kMaxSchemaDepth = 32;

  // SCHEMA_JSON: a JSON Schema; InvalidArgument naming an unsupported keyword, a malformed
  // schema, or nesting past kMaxSchemaDepth schemas or kMaxJsonDepth JSON levels (atelier/json_input.h).
  static Result<JsonMatcher> compile(std::string_view schema_json);

  bool feed(std::string_view bytes);           // false (state unchanged) when BYTES cannot continue a valid value
  // feed on a copy; with BUDGET >= 0, also false when the value could then no
  // longer be closed within BUDGET more bytes (see close_bytes).
  bool accepts(std::string_view bytes, int budget = -1) const;
  bool complete() const;                       // the text so far is a whole valid value
  // The fewest bytes that make the text so far a whole valid value. Generation
  // keeps it within the tokens left (every vocabulary has one-byte tokens for
  // JSON's punctuation and digits), so a value always closes before max_new_tokens.
  int close_bytes() const;

 private:
  using Frame = JsonFrame;
  bool feed_byte(unsigned char c);
  bool feed_value_start(const SchemaNode* node, unsigned char c);
  std::shared_ptr<const SchemaNode> root_;     // shared: copies of a matcher are cheap
  // A top-level anyOf: the alternatives still alive (root_ unused). A byte is
  // accepted when one of them accepts it; those that refuse it drop out.
  std::vector<JsonMatcher> alternatives_;
  std::vector<Frame> stack_;
  bool done_ = false;
  int whitespace_ = 0;                         // consecutive whitespace bytes
};

}  // namespace atelier::text
