#include "text/json_constraint.h"

#include <atelier/json_input.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <set>

namespace atelier::text {

using nlohmann::json;

struct SchemaNode {
  enum Kind { Any, Object, Array, String, Number, Integer, Boolean, Null, Literals } kind = Any;
  std::vector<std::string> names;                       // Object: declared properties, in order
  std::vector<std::shared_ptr<SchemaNode>> props;       // their schemas
  std::vector<bool> required;
  std::shared_ptr<SchemaNode> additional;               // Object: schema of other keys; null: none allowed
  std::shared_ptr<SchemaNode> items;                    // Array
  std::vector<std::string> literals;                    // Literals: the JSON texts allowed (enum, const)
};

namespace {

std::shared_ptr<SchemaNode> any_node() {
  static auto node = std::make_shared<SchemaNode>();
  return node;
}

// DEPTH: schemas around this one. compile_node, min_value_bytes and the
// nodes' destructors recurse once per level, so the nesting is bounded here
// and not only by the parse (kMaxJsonDepth).
std::shared_ptr<SchemaNode> compile_node(const json& s, const std::string& where, int depth) {
  if (depth >= JsonMatcher::kMaxSchemaDepth)
    throw std::invalid_argument("the schema nests more than " + std::to_string(JsonMatcher::kMaxSchemaDepth) +
                                " levels deep (properties, items, additionalProperties), the limit; flatten it (at " +
                                where.substr(0, 200) + (where.size() > 200 ? "..." : "") + ")");
  auto n = std::make_shared<SchemaNode>();
  if (s.is_boolean() && s.get<bool>()) return any_node();
  if (!s.is_object()) throw std::invalid_argument(where + " must be a schema object");
  static const std::set<std::string> ignored = {"title", "description", "$schema", "$id", "default", "examples",
                                                "strict", "name", "$comment"};
  static const std::set<std::string> known = {"type", "properties", "required", "additionalProperties", "items", "enum", "const"};
  for (const auto& [key, value] : s.items())
    if (!known.count(key) && !ignored.count(key))
      throw std::invalid_argument("the schema keyword '" + key + "' at " + where +
                                  " is not supported (supported: type, properties, required, additionalProperties, items, enum, const)");
  if (s.contains("enum") || s.contains("const")) {
    n->kind = SchemaNode::Literals;
    const json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
    if (!values.is_array() || values.empty()) throw std::invalid_argument(where + ".enum must be a non-empty list");
    for (const auto& v : values) n->literals.push_back(v.dump());
    return n;
  }
  if (!s.contains("type")) {
    if (s.contains("properties")) n->kind = SchemaNode::Object;
    else return any_node();
  } else {
    if (!s["type"].is_string()) throw std::invalid_argument(where + ".type must be one type name (lists are not supported)");
    const std::string t = s["type"];
    if (t == "object") n->kind = SchemaNode::Object;
    else if (t == "array") n->kind = SchemaNode::Array;
    else if (t == "string") n->kind = SchemaNode::String;
    else if (t == "number") n->kind = SchemaNode::Number;
    else if (t == "integer") n->kind = SchemaNode::Integer;
    else if (t == "boolean") n->kind = SchemaNode::Boolean;
    else if (t == "null") n->kind = SchemaNode::Null;
    else throw std::invalid_argument(where + ".type '" + t + "' is not a JSON Schema type");
  }
  if (n->kind == SchemaNode::Object) {
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) throw std::invalid_argument(where + ".properties must be an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        n->names.push_back(name);
        n->props.push_back(compile_node(sub, where + ".properties." + name, depth + 1));
        n->required.push_back(false);
      }
    }
    if (s.contains("required")) {
      if (!s["required"].is_array()) throw std::invalid_argument(where + ".required must be a list of names");
      for (const auto& r : s["required"]) {
        auto it = r.is_string() ? std::find(n->names.begin(), n->names.end(), r.get<std::string>()) : n->names.end();
        if (it == n->names.end())
          throw std::invalid_argument(where + ".required names '" + r.dump() + "', which is not among its properties");
        n->required[static_cast<size_t>(it - n->names.begin())] = true;
      }
    }
    // Declared properties only, unless the schema gives additionalProperties (true or a schema) or declares none.
    const json add = s.value("additionalProperties", json(n->names.empty()));
    if (add.is_boolean()) n->additional = add.get<bool>() ? any_node() : nullptr;
    else n->additional = compile_node(add, where + ".additionalProperties", depth + 1);
  }
  if (n->kind == SchemaNode::Array) n->items = s.contains("items") ? compile_node(s["items"], where + ".items", depth + 1) : any_node();
  return n;
}

bool is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

}  // namespace

Result<JsonMatcher> JsonMatcher::compile(std::string_view schema_json) {
  auto s = parse_json(schema_json, "the JSON schema");
  if (!s.ok()) return s.status();
  try {
    JsonMatcher m;
    const auto& v = s.value();
    if (v.is_object() && v.contains("anyOf")) {
      const auto& alts = v["anyOf"];
      if (!alts.is_array() || alts.empty()) throw std::invalid_argument("schema.anyOf must be a non-empty list of schemas");
      for (const auto& [key, value] : v.items())
        if (key != "anyOf" && key != "title" && key != "description")
          throw std::invalid_argument("a schema with anyOf may hold only anyOf (and title, description), not '" + key + "'");
      for (size_t i = 0; i < alts.size(); ++i) {
        if (alts[i].is_object() && alts[i].contains("anyOf"))
          throw std::invalid_argument("schema.anyOf[" + std::to_string(i) + "]: anyOf is supported at the top level only");
        JsonMatcher alt;
        alt.root_ = compile_node(alts[i], "schema.anyOf[" + std::to_string(i) + "]", 1);
        m.alternatives_.push_back(std::move(alt));
      }
      return m;
    }
    m.root_ = compile_node(v, "schema", 0);
    return m;
  } catch (const std::invalid_argument& e) {
    return Status::error(StatusCode::InvalidArgument, e.what());
  }
}

bool JsonMatcher::accepts(std::string_view bytes, int budget) const {
  if (!alternatives_.empty())
    return std::any_of(alternatives_.begin(), alternatives_.end(), [&](const JsonMatcher& a) { return a.accepts(bytes, budget); });
  JsonMatcher copy = *this;
  return copy.feed(bytes) && (budget < 0 || copy.close_bytes() <= budget);
}

bool JsonMatcher::feed(std::string_view bytes) {
  if (!alternatives_.empty()) {
    std::vector<JsonMatcher> alive;
    for (const JsonMatcher& a : alternatives_) {
      JsonMatcher copy = a;
      if (copy.feed(bytes)) alive.push_back(std::move(copy));
    }
    if (alive.empty()) return false;
    alternatives_ = std::move(alive);
    return true;
  }
  JsonMatcher copy = *this;
  for (char c : bytes)
    if (!copy.feed_byte(static_cast<unsigned char>(c))) return false;
  *this = std::move(copy);
  return true;
}

namespace {

const SchemaNode* literal_node(const char* word) {
  static std::vector<std::shared_ptr<SchemaNode>> nodes = [] {
    std::vector<std::shared_ptr<SchemaNode>> v;
    for (const char* w : {"true", "false", "null"}) {
      auto n = std::make_shared<SchemaNode>();
      n->kind = SchemaNode::Literals;
      n->literals = {w};
      v.push_back(n);
    }
    return v;
  }();
  for (const auto& n : nodes)
    if (n->literals[0] == word) return n.get();
  return nullptr;
}

// Whether T is the start of a JSON number (an integer when INTEGER).
bool number_prefix(const std::string& t, bool integer) {
  size_t i = 0;
  if (i < t.size() && t[i] == '-') ++i;
  if (i == t.size()) return true;
  if (t[i] == '0') ++i;
  else if (is_digit(static_cast<unsigned char>(t[i]))) while (i < t.size() && is_digit(static_cast<unsigned char>(t[i]))) ++i;
  else return false;
  if (i == t.size()) return true;
  if (t[i] == '.' && !integer) {
    ++i;
    if (i == t.size()) return true;
    if (!is_digit(static_cast<unsigned char>(t[i]))) return false;
    while (i < t.size() && is_digit(static_cast<unsigned char>(t[i]))) ++i;
    if (i == t.size()) return true;
  }
  if ((t[i] == 'e' || t[i] == 'E') && !integer) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    const size_t digits = i;
    while (i < t.size() && is_digit(static_cast<unsigned char>(t[i]))) ++i;
    return i == t.size() && i - digits <= 2;  // two exponent digits: within a double's range, as parsers expect
  }
  return false;
}

bool number_whole(const std::string& t) { return !t.empty() && is_digit(static_cast<unsigned char>(t.back())); }

bool literal_whole(const SchemaNode* n, const std::string& t) {
  return std::find(n->literals.begin(), n->literals.end(), t) != n->literals.end();
}

bool literal_prefix(const SchemaNode* n, const std::string& t) {
  return std::any_of(n->literals.begin(), n->literals.end(), [&](const std::string& l) { return l.compare(0, t.size(), t) == 0; });
}

bool keys_free(const SchemaNode* n) { return n->kind == SchemaNode::Any || n->additional != nullptr; }

}  // namespace

namespace {

int min_value_bytes(const SchemaNode* n);

// The required properties not yet given: "name":value each, with commas (LEADING_COMMA: one before the first too).
int required_bytes(const SchemaNode* n, const std::vector<bool>& seen, bool leading_comma) {
  int total = 0, count = 0;
  for (size_t i = 0; i < n->names.size(); ++i)
    if (n->required[i] && (seen.empty() || !seen[i])) {
      total += static_cast<int>(n->names[i].size()) + 3 + min_value_bytes(n->props[i].get());
      ++count;
    }
  if (count) total += count - 1 + (leading_comma ? 1 : 0);
  return total;
}

int min_value_bytes(const SchemaNode* n) {
  switch (n->kind) {
    case SchemaNode::Object: return 2 + required_bytes(n, {}, false);
    case SchemaNode::Array:
    case SchemaNode::String: return 2;
    case SchemaNode::Boolean: return 4;
    case SchemaNode::Null: return 4;
    case SchemaNode::Literals: {
      size_t best = SIZE_MAX;
      for (const auto& l : n->literals) best = std::min(best, l.size());
      return static_cast<int>(best);
    }
    default: return 1;  // Any ("0"), Number, Integer
  }
}

const SchemaNode* value_node(const JsonFrame& f) {
  if (f.node->kind == SchemaNode::Any) return f.node;
  return f.prop >= 0 ? f.node->props[static_cast<size_t>(f.prop)].get() : f.node->additional.get();
}

}  // namespace

int JsonMatcher::close_bytes() const {
  if (!alternatives_.empty()) {
    int best = INT32_MAX;
    for (const JsonMatcher& a : alternatives_) best = std::min(best, a.close_bytes());
    return best;
  }
  if (done_) return 0;
  if (stack_.empty()) return min_value_bytes(root_.get());
  int total = 0;
  for (size_t i = stack_.size(); i-- > 0;) {
    const Frame& f = stack_[i];
    const bool inner = i + 1 < stack_.size();
    switch (f.kind) {
      case Frame::Str: total += 1 + (f.escape ? 1 : 0); break;
      case Frame::Num: total += number_whole(f.text) ? 0 : 1; break;
      case Frame::Lit: {
        size_t best = SIZE_MAX;
        for (const auto& l : f.node->literals)
          if (l.compare(0, f.text.size(), f.text) == 0) best = std::min(best, l.size() - f.text.size());
        total += static_cast<int>(best == SIZE_MAX ? 0 : best);
        break;
      }
      case Frame::ObjKey: {
        // Finish this key as the cheapest name it can still become (its colon, its value, the required rest, '}').
        int best = INT32_MAX / 4;
        if (keys_free(f.node)) {
          const SchemaNode* v = f.node->kind == SchemaNode::Any ? f.node : f.node->additional.get();
          best = 1 + 1 + min_value_bytes(v) + required_bytes(f.node, f.seen, true) + 1;
        }
        for (size_t k = 0; k < f.node->names.size(); ++k)
          if (!f.seen[k] && f.node->names[k].compare(0, f.text.size(), f.text) == 0) {
            std::vector<bool> seen = f.seen;
            seen[k] = true;
            const int cost = static_cast<int>(f.node->names[k].size() - f.text.size()) + 1 + 1 +
                             min_value_bytes(f.node->props[k].get()) + required_bytes(f.node, seen, true) + 1;
            best = std::min(best, cost);
          }
        total += (f.escape ? 1 : 0) + best;
        break;
      }
      case Frame::ObjColon: total += 1 + min_value_bytes(value_node(f)) + required_bytes(f.node, f.seen, true) + 1; break;
      case Frame::ObjNext:
        if (f.count == -1 && !inner) total += min_value_bytes(value_node(f));
        total += required_bytes(f.node, f.seen, true) + 1;
        break;
      case Frame::ObjKeyOrEnd: {
        int rest = required_bytes(f.node, f.seen, false);
        if (f.after_comma && rest == 0) rest = keys_free(f.node) ? 4 : INT32_MAX / 4;  // "":0, or the cheapest property
        if (f.after_comma && !keys_free(f.node) && required_bytes(f.node, f.seen, false) == 0)
          for (size_t k = 0; k < f.node->names.size(); ++k)
            if (!f.seen[k]) rest = std::min(rest, static_cast<int>(f.node->names[k].size()) + 3 + min_value_bytes(f.node->props[k].get()));
        total += rest + 1;
        break;
      }
      case Frame::ArrValueOrEnd: total += 1; break;
      case Frame::ArrValue: total += (inner ? 0 : min_value_bytes(f.node->kind == SchemaNode::Any ? f.node : f.node->items.get())) + 1; break;
      case Frame::ArrNext: total += 1; break;
    }
  }
  return total;
}

bool JsonMatcher::complete() const {
  if (!alternatives_.empty())
    return std::any_of(alternatives_.begin(), alternatives_.end(), [](const JsonMatcher& a) { return a.complete(); });
  if (done_) return true;
  if (stack_.size() != 1) return false;
  const Frame& f = stack_[0];
  return (f.kind == Frame::Num && number_whole(f.text)) || (f.kind == Frame::Lit && literal_whole(f.node, f.text));
}

// Starts a value for NODE with byte C (whitespace already skipped).
bool JsonMatcher::feed_value_start(const SchemaNode* node, unsigned char c) {
  using K = SchemaNode::Kind;
  const K k = node->kind;
  Frame f{};
  f.node = node;
  const std::string first(1, static_cast<char>(c));
  if (k == K::Literals) {
    if (!literal_prefix(node, first)) return false;
    f.kind = Frame::Lit;
    f.text = first;
  } else if (c == '{' && (k == K::Object || k == K::Any)) {
    f.kind = Frame::ObjKeyOrEnd;
    f.seen.assign(node->names.size(), false);
  } else if (c == '[' && (k == K::Array || k == K::Any)) {
    f.kind = Frame::ArrValueOrEnd;
  } else if (c == '"' && (k == K::String || k == K::Any)) {
    f.kind = Frame::Str;
  } else if ((is_digit(c) || c == '-') && (k == K::Number || k == K::Integer || k == K::Any)) {
    f.kind = Frame::Num;
    f.text = first;
  } else if ((c == 't' || c == 'f') && (k == K::Boolean || k == K::Any)) {
    f.kind = Frame::Lit;
    f.node = literal_node(c == 't' ? "true" : "false");
    f.text = first;
  } else if (c == 'n' && (k == K::Null || k == K::Any)) {
    f.kind = Frame::Lit;
    f.node = literal_node("null");
    f.text = first;
  } else {
    return false;
  }
  stack_.push_back(std::move(f));
  return true;
}

bool JsonMatcher::feed_byte(unsigned char c) {
  if (done_) return false;
  // A finished value hands the rest to its parent.
  auto value_done = [&] {
    stack_.pop_back();
    if (stack_.empty()) {
      done_ = true;
      return;
    }
    Frame& p = stack_.back();
    if (p.kind == Frame::ObjNext) return;  // (the object's value frame was ObjNext-in-waiting)
    if (p.kind == Frame::ArrValueOrEnd || p.kind == Frame::ArrValue) {
      p.kind = Frame::ArrNext;
      ++p.count;
    }
  };
  if (stack_.empty()) {
    if (is_ws(c)) return ++whitespace_ <= 1;
    whitespace_ = 0;
    return feed_value_start(root_.get(), c);
  }
  Frame& f = stack_.back();
  switch (f.kind) {
    case Frame::Str:
    case Frame::ObjKey: {
      if (f.escape) {
        if (std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) == std::string_view::npos) return false;
        f.escape = false;
        f.text += '\\';
        f.text += static_cast<char>(c);
        return true;
      }
      if (c == '\\') {
        if (f.kind == Frame::ObjKey && !keys_free(f.node)) return false;  // declared names are matched plainly
        f.escape = true;
        return static_cast<int>(f.text.size()) + 2 <= kMaxStringBytes;
      }
      if (c < 0x20) return false;
      if (c == '"') {
        if (f.kind == Frame::Str) {
          value_done();
          return true;
        }
        int prop = -1;
        for (size_t i = 0; i < f.node->names.size(); ++i)
          if (!f.seen[i] && f.node->names[i] == f.text) prop = static_cast<int>(i);
        if (prop < 0 && (!keys_free(f.node) ||
                         std::find(f.node->names.begin(), f.node->names.end(), f.text) != f.node->names.end()))
          return false;  // not a property it may have (or one already given)
        f.prop = prop;
        if (prop >= 0) f.seen[static_cast<size_t>(prop)] = true;
        f.kind = Frame::ObjColon;
        return true;
      }
      std::string t = f.text + static_cast<char>(c);
      if (static_cast<int>(t.size()) > kMaxStringBytes) return false;
      if (f.kind == Frame::ObjKey && !keys_free(f.node)) {
        bool ok = false;
        for (size_t i = 0; i < f.node->names.size(); ++i)
          if (!f.seen[i] && f.node->names[i].compare(0, t.size(), t) == 0) ok = true;
        if (!ok) return false;
      }
      f.text = std::move(t);
      return true;
    }
    case Frame::Num: {
      const bool integer = f.node->kind == SchemaNode::Integer;
      std::string t = f.text + static_cast<char>(c);
      if (static_cast<int>(t.size()) <= kMaxNumberChars && number_prefix(t, integer)) {
        f.text = std::move(t);
        return true;
      }
      if (!number_whole(f.text)) return false;
      value_done();
      return feed_byte(c);
    }
    case Frame::Lit: {
      std::string t = f.text + static_cast<char>(c);
      if (literal_prefix(f.node, t)) {
        f.text = std::move(t);
        // Whole, and no longer literal goes on from here: the value is done.
        if (literal_whole(f.node, f.text) &&
            std::none_of(f.node->literals.begin(), f.node->literals.end(),
                         [&](const std::string& l) { return l.size() > f.text.size() && l.compare(0, f.text.size(), f.text) == 0; }))
          value_done();
        return true;
      }
      if (!literal_whole(f.node, f.text)) return false;
      value_done();
      return feed_byte(c);
    }
    default: break;
  }
  if (is_ws(c)) return ++whitespace_ <= 1;
  whitespace_ = 0;
  auto required_done = [&] {
    for (size_t i = 0; i < f.seen.size(); ++i)
      if (f.node->required[i] && !f.seen[i]) return false;
    return true;
  };
  auto more_keys = [&] {
    return keys_free(f.node) || std::find(f.seen.begin(), f.seen.end(), false) != f.seen.end();
  };
  switch (f.kind) {
    case Frame::ObjKeyOrEnd:
      if (c == '}' && !f.after_comma && required_done()) {
        value_done();
        return true;
      }
      if (c == '"' && more_keys()) {
        f.kind = Frame::ObjKey;
        f.text.clear();
        return true;
      }
      return false;
    case Frame::ObjColon:
      if (c != ':') return false;
      f.kind = Frame::ObjNext;  // the value frame goes above; when it is done this frame expects ',' or '}'
      f.count = -1;             // -1: the value has not started yet
      return true;
    case Frame::ObjNext:
      if (f.count == -1) {
        const SchemaNode* v = f.node->kind == SchemaNode::Any ? f.node
                              : f.prop >= 0                   ? f.node->props[static_cast<size_t>(f.prop)].get()
                                                              : f.node->additional.get();
        f.count = 0;
        if (!feed_value_start(v, c)) {
          f.count = -1;
          return false;
        }
        return true;
      }
      if (c == ',' && more_keys()) {
        f.kind = Frame::ObjKeyOrEnd;
        f.after_comma = true;
        return true;
      }
      if (c == '}' && required_done()) {
        value_done();
        return true;
      }
      return false;
    case Frame::ArrValueOrEnd:
    case Frame::ArrValue: {
      if (c == ']' && f.kind == Frame::ArrValueOrEnd) {
        value_done();
        return true;
      }
      const SchemaNode* item = f.node->kind == SchemaNode::Any ? f.node : f.node->items.get();
      return feed_value_start(item, c);
    }
    case Frame::ArrNext:
      if (c == ',' && f.count < kMaxItems) {
        f.kind = Frame::ArrValue;
        return true;
      }
      if (c == ']') {
        value_done();
        return true;
      }
      return false;
    default:
      return false;
  }
}

}  // namespace atelier::text
