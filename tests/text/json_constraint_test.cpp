// The structured-output matcher (text/json_constraint): what it accepts is
// checked against nlohmann's parser plus the schema's rules written out by
// hand, and its budget promise (close_bytes) by random walks that must always
// find a next byte and end in a valid value within the budget.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <set>
#include <string>

#include <atelier/json_input.h>

#include "text/json_constraint.h"

namespace atelier::text {
namespace {

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"},
  "mood":{"enum":["happy","sad"]},"xs":{"type":"array","items":{"type":"number"}},
  "pet":{"type":"object","properties":{"kind":{"type":"string"}},"required":["kind"],"additionalProperties":false}},
  "required":["name","age","mood"],"additionalProperties":false})";

// The schema's rules, by hand, on a parsed value.
bool valid_for_schema(const nlohmann::json& v) {
  if (!v.is_object()) return false;
  for (const char* key : {"name", "age", "mood"})
    if (!v.contains(key)) return false;
  for (const auto& [k, x] : v.items()) {
    if (k == "name" && !x.is_string()) return false;
    else if (k == "age" && !x.is_number_integer()) return false;
    else if (k == "ok" && !x.is_boolean()) return false;
    else if (k == "mood" && x != "happy" && x != "sad") return false;
    else if (k == "xs" && (!x.is_array() || std::any_of(x.begin(), x.end(), [](const auto& e) { return !e.is_number(); }))) return false;
    else if (k == "pet" && (!x.is_object() || x.size() != 1 || !x.contains("kind") || !x["kind"].is_string())) return false;
    else if (k != "name" && k != "age" && k != "ok" && k != "mood" && k != "xs" && k != "pet") return false;
  }
  return true;
}

bool matcher_takes(JsonMatcher m, const std::string& text) { return m.feed(text) && m.complete(); }

// nlohmann keeps the last of duplicate keys; the matcher refuses a key twice (RFC 8259: names should be unique).
bool has_duplicate_keys(const std::string& text) {
  std::vector<std::set<std::string>> open;
  bool dup = false;
  const auto parsed = nlohmann::json::parse(text, [&](int, nlohmann::json::parse_event_t e, nlohmann::json& v) {
    if (e == nlohmann::json::parse_event_t::object_start) open.emplace_back();
    else if (e == nlohmann::json::parse_event_t::object_end) open.pop_back();
    else if (e == nlohmann::json::parse_event_t::key && !open.back().insert(v.get<std::string>()).second) dup = true;
    return true;
  }, false);
  (void)parsed;
  return dup;
}

TEST(JsonConstraint, AcceptsExactlyTheValidDocuments) {
  auto m = JsonMatcher::compile(kSchema);
  ASSERT_TRUE(m.ok()) << m.status().message;
  const std::vector<std::string> docs = {
      R"({"name":"Lily","age":4,"mood":"happy"})",
      R"({ "age": -12, "mood": "sad", "name": "A \"quoted\" name" })",
      R"({"name":"x","age":0,"mood":"sad","ok":true,"xs":[1,2.5,-3e2],"pet":{"kind":"cat"}})",
      R"({"name":"x","age":0,"mood":"sad","xs":[]})",
      R"({"name":"x","age":1.5,"mood":"sad"})",         // age not an integer
      R"({"name":"x","age":1,"mood":"glad"})",          // not in the enum
      R"({"name":"x","age":1})",                         // mood missing
      R"({"name":"x","age":1,"mood":"sad","extra":1})",  // no additional properties
      R"({"name":"x","name":"y","age":1,"mood":"sad"})", // a key twice
      R"({"name":"x","age":1,"mood":"sad",})",           // trailing comma
      R"({"name":"x","age":01,"mood":"sad"})",           // leading zero
      R"({"name":"x","age":1,"mood":"sad","pet":{}})",   // pet.kind required
      R"({"name":"x","age":1,"mood":"sad","xs":["a"]})", // items are numbers
      R"({"name":"x","age":1,"mood":"sad","ok":nul})",
      R"([1,2])",
      R"("just a string")",
  };
  for (const auto& d : docs) {
    const auto parsed = nlohmann::json::parse(d, nullptr, false);
    const bool expected = !parsed.is_discarded() && valid_for_schema(parsed) && !has_duplicate_keys(d);
    EXPECT_EQ(matcher_takes(m.value(), d), expected) << d;
  }
}

TEST(JsonConstraint, EveryPrefixOfAValidDocumentIsAcceptedAndOnlyTheWholeIsComplete) {
  auto m = JsonMatcher::compile(kSchema);
  ASSERT_TRUE(m.ok());
  const std::string doc = R"({"name":"Lily","age":42,"mood":"happy","xs":[1.5,2],"pet":{"kind":"dog"}})";
  JsonMatcher walk = m.value();
  for (size_t i = 0; i < doc.size(); ++i) {
    EXPECT_FALSE(walk.complete()) << doc.substr(0, i);
    ASSERT_TRUE(walk.feed(doc.substr(i, 1))) << "refused byte " << i << " of " << doc;
  }
  EXPECT_TRUE(walk.complete());
  EXPECT_EQ(walk.close_bytes(), 0);
  EXPECT_FALSE(walk.feed(" "));  // nothing after the value
}

TEST(JsonConstraint, UnsupportedKeywordsAndBadSchemasAreRefusedByName) {
  auto pattern = JsonMatcher::compile(R"({"type":"string","pattern":"^a"})");
  ASSERT_FALSE(pattern.ok());
  EXPECT_NE(pattern.status().message.find("pattern"), std::string::npos);
  EXPECT_FALSE(JsonMatcher::compile("{not json").ok());
  auto required = JsonMatcher::compile(R"({"type":"object","properties":{"a":{}},"required":["b"]})");
  ASSERT_FALSE(required.ok());
  EXPECT_NE(required.status().message.find("b"), std::string::npos);
}

// Random walks over an alphabet with every byte JSON needs: with a budget of
// B bytes, some byte must always be allowed, and the walk must end in a value
// that parses and meets the schema within B bytes.
void random_walks(const char* schema, int budget, bool check_schema) {
  auto compiled = JsonMatcher::compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message;
  ASSERT_LE(compiled->close_bytes(), budget);
  const std::string alphabet = "{}[]\":, -.e0123456789abcdefghijklmnopqrstuvwxyzLtrue\\n";
  std::mt19937 rng(7);
  // Under ASan (about 50x slower here) fewer walks: the same paths, each checked for memory errors.
  const int walks = ATELIER_UNDER_ASAN ? 40 : 300;
  for (int walk = 0; walk < walks; ++walk) {
    JsonMatcher m = compiled.value();
    std::string text;
    while (!m.complete()) {
      const int left = budget - static_cast<int>(text.size()) - 1;
      std::vector<char> ok;
      for (char c : alphabet)
        if (m.accepts(std::string(1, c), left)) ok.push_back(c);
      ASSERT_FALSE(ok.empty()) << "stuck after " << text;
      const char c = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      ASSERT_TRUE(m.feed(std::string(1, c)));
      text += c;
    }
    ASSERT_LE(static_cast<int>(text.size()), budget) << text;
    const auto parsed = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << text;
    if (check_schema) {
      ASSERT_TRUE(valid_for_schema(parsed)) << text;
    }
  }
}

TEST(JsonConstraint, RandomWalksAlwaysCloseWithinTheBudget) {
  auto m = JsonMatcher::compile(kSchema);
  ASSERT_TRUE(m.ok());
  const int least = m->close_bytes();
  EXPECT_EQ(least, static_cast<int>(std::string(R"({"name":"","age":0,"mood":"sad"})").size()));
  for (int budget : {least, least + 5, 80, 200}) random_walks(kSchema, budget, true);
  for (int budget : {2, 10, 60}) random_walks(R"({"type":"object"})", budget, false);
}


// A schema of array items nested DEPTH deep: {"type":"array","items":{...{"type":"string"}...}}.
std::string items_schema(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += R"({"type":"array","items":)";
  s += R"({"type":"string"})";
  s += std::string(static_cast<size_t>(depth), '}');
  return s;
}

// Issue 31, item 2: a schema nested about 8,000 levels (200 KB) killed `serve`
// and `atelier batch` with SIGSEGV (compile_node recursed once per level).
// Now the parse stops at kMaxJsonDepth and says so.
TEST(JsonConstraintDepth, ASchemaNestedThousandsDeepIsAClearErrorNotACrash) {
  for (int depth : {8000, 100000}) {
    std::string deep;
    for (int i = 0; i < depth; ++i) deep += R"({"properties":{"a":)";
    deep += "{}" + std::string(static_cast<size_t>(2 * depth), '}');
    auto m = JsonMatcher::compile(deep);
    ASSERT_FALSE(m.ok()) << depth;
    EXPECT_EQ(m.status().code, StatusCode::InvalidArgument);
    EXPECT_NE(m.status().message.find("more than " + std::to_string(kMaxJsonDepth) + " levels deep"), std::string::npos)
        << m.status().message;
    // Arrays of arrays inside an enum (values the matcher dumps): the same.
    auto e = JsonMatcher::compile(R"({"enum":[)" + std::string(static_cast<size_t>(depth), '[') +
                                  std::string(static_cast<size_t>(depth), ']') + "]}");
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message.find("levels deep"), std::string::npos) << e.status().message;
  }
}

// compile_node has its own bound: schemas inside schemas stop at kMaxSchemaDepth
// even where the JSON is shallower than kMaxJsonDepth.
TEST(JsonConstraintDepth, SchemasNestAtMostTheSchemaLimit) {
  static_assert(JsonMatcher::kMaxSchemaDepth < kMaxJsonDepth);
  auto ok = JsonMatcher::compile(items_schema(JsonMatcher::kMaxSchemaDepth - 1));  // kMaxSchemaDepth schemas in all
  ASSERT_TRUE(ok.ok()) << ok.status().message;
  EXPECT_TRUE(matcher_takes(ok.value(), std::string(JsonMatcher::kMaxSchemaDepth - 1, '[') + R"("x")" +
                                            std::string(JsonMatcher::kMaxSchemaDepth - 1, ']')));
  auto deep = JsonMatcher::compile(items_schema(JsonMatcher::kMaxSchemaDepth));
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message.find("nests more than " + std::to_string(JsonMatcher::kMaxSchemaDepth) + " levels"),
            std::string::npos)
      << deep.status().message;
}

// parse_json (atelier/json_input.h), the one bounded parse every JSON input goes through.
TEST(JsonInput, NestingUpToTheLimitParsesAndOneLevelMoreIsRefused) {
  auto nest = [](int depth, char open, char close) {
    return std::string(static_cast<size_t>(depth), open) + std::string(static_cast<size_t>(depth), close);
  };
  auto at_limit = parse_json(nest(kMaxJsonDepth, '[', ']'), "the test");
  ASSERT_TRUE(at_limit.ok()) << at_limit.status().message;
  auto over = parse_json(nest(kMaxJsonDepth + 1, '[', ']'), "the test");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().message,
            "the test nests objects and arrays more than " + std::to_string(kMaxJsonDepth) +
                " levels deep, the limit for JSON input; flatten it");
  std::string objects;
  for (int i = 0; i < kMaxJsonDepth; ++i) objects += R"({"a":)";
  objects += "1";
  objects.append(kMaxJsonDepth, '}');
  EXPECT_TRUE(parse_json(objects, "x").ok());
  EXPECT_FALSE(parse_json("[" + objects + "]", "x").ok());
  // The rest of the contract: syntax errors, huge numbers, ordered_json.
  auto bad = parse_json("{\"a\":", "the body");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message.rfind("the body is not valid JSON: ", 0), 0u) << bad.status().message;
  auto huge = parse_json("[1e400]", "the body");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message.find("too large"), std::string::npos) << huge.status().message;
  auto ordered = parse_json<nlohmann::ordered_json>(R"({"b":1,"a":2})", "x");
  ASSERT_TRUE(ordered.ok());
  EXPECT_EQ(ordered->begin().key(), "b");
  // A deep value never gets built: 10 MB of '[' is refused at once.
  EXPECT_FALSE(parse_json(std::string(10 << 20, '['), "x").ok());
}

}  // namespace
}  // namespace atelier::text

// A tool-call constraint: one alternative per tool, the name fixing which arguments follow.
TEST(JsonConstraint, TopLevelAnyOfFollowsTheAlternativeTheBytesChoose) {
  auto m = atelier::text::JsonMatcher::compile(
      R"({"anyOf":[{"type":"object","properties":{"name":{"const":"a"},"arguments":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}},"required":["name","arguments"]},
                   {"type":"object","properties":{"name":{"const":"b"},"arguments":{"type":"object","properties":{"y":{"type":"string"}},"required":["y"]}},"required":["name","arguments"]}]})");
  ASSERT_TRUE(m.ok()) << m.status().message;
  auto take = [](atelier::text::JsonMatcher x, const std::string& s) { return x.feed(s) && x.complete(); };
  EXPECT_TRUE(take(m.value(), R"({"name":"a","arguments":{"x":1}})"));
  EXPECT_TRUE(take(m.value(), R"({"name":"b","arguments":{"y":"z"}})"));
  EXPECT_FALSE(m.value().accepts(R"({"name":"a","arguments":{"y")"));  // b's arguments under a's name
  EXPECT_FALSE(m.value().accepts(R"({"name":"c")"));
  EXPECT_FALSE(atelier::text::JsonMatcher::compile(R"({"anyOf":[{"anyOf":[{}]}]})").ok());  // nested: refused by name
  EXPECT_FALSE(atelier::text::JsonMatcher::compile(R"({"type":"object","properties":{"p":{"anyOf":[{}]}}})").ok());
}
