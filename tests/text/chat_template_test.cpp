// Chat templates: every case of the fixtures (real model templates rendered by
// Python's Jinja2 with HF apply_chat_template settings) and further cases
// (tests/text/chat_template_cases.json, rendered by render_jinja_cases.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "text/chat_template.h"

namespace fs = std::filesystem;
using atelier::text::JinjaOptions;
using atelier::text::render_jinja;
using ojson = nlohmann::ordered_json;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

JinjaOptions fixed_clock() {
  JinjaOptions o;
  o.now_utc = 1796126400;  // 2026-12-01 12:00:00 UTC: the fixtures' strftime_now date
  return o;
}

// Checks every case of one cases file; returns (passed, total).
std::pair<int, int> check_cases(const fs::path& file, const fs::path& template_dir) {
  ojson doc = ojson::parse(slurp(file));
  std::string file_tpl;
  if (doc.contains("template")) file_tpl = slurp(template_dir / doc["template"].get<std::string>());
  int passed = 0, total = 0;
  for (const auto& c : doc["cases"]) {
    ++total;
    std::string tpl = c.contains("template_text") ? c["template_text"].get<std::string>() : file_tpl;
    ojson vars = ojson::object();
    if (c.contains("messages")) vars["messages"] = c["messages"];
    if (c.contains("add_generation_prompt")) vars["add_generation_prompt"] = c["add_generation_prompt"];
    if (c.contains("variables"))
      for (const auto& [k, v] : c["variables"].items()) vars[k] = v;
    auto r = render_jinja(tpl, vars, fixed_clock());
    std::string id = file.filename().string() + ":" + c.value("id", std::to_string(total));
    if (c.contains("expected")) {
      EXPECT_TRUE(r.ok()) << id << ": " << r.status().message;
      if (r.ok()) {
        EXPECT_EQ(r.value(), c["expected"].get<std::string>()) << id;
        if (r.value() == c["expected"].get<std::string>()) ++passed;
      }
    } else {
      std::string want = c["expected_error"].get<std::string>();
      EXPECT_FALSE(r.ok()) << id << " rendered: " << (r.ok() ? r.value() : "");
      if (!r.ok()) {
        EXPECT_EQ(r.status().code, atelier::StatusCode::InvalidArgument) << id;
        EXPECT_NE(r.status().message.find(want), std::string::npos) << id << ": " << r.status().message;
        EXPECT_EQ(r.status().message.rfind("chat template error at line ", 0), 0u) << id;
        if (r.status().message.find(want) != std::string::npos) ++passed;
      }
    }
  }
  return {passed, total};
}

}  // namespace

TEST(ChatTemplate, Fixtures) {
  fs::path dir = fs::path(ATELIER_FIXTURES_DIR) / "chat";
  if (!fs::exists(dir)) dir = "/work/shared/fixtures/chat";
  ASSERT_TRUE(fs::exists(dir)) << dir;
  int passed = 0, total = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.size() < 11 || name.substr(name.size() - 11) != ".cases.json") continue;
    auto [p, t] = check_cases(e.path(), dir);
    passed += p;
    total += t;
  }
  std::cout << "fixture cases passing: " << passed << " / " << total << "\n";
  EXPECT_GT(total, 0);
  EXPECT_EQ(passed, total);
}

TEST(ChatTemplate, FurtherCases) {
  // From the source tree, not __FILE__ (relative under ccache's base_dir).
  fs::path file = fs::path(ATELIER_TESTS_DIR) / "text" / "chat_template_cases.json";
  ASSERT_TRUE(fs::exists(file)) << file;
  auto [p, t] = check_cases(file, file.parent_path());
  std::cout << "further cases passing: " << p << " / " << t << "\n";
  EXPECT_GT(t, 0);
  EXPECT_EQ(p, t);
}

TEST(ChatTemplate, Bounds) {
  JinjaOptions o;
  auto r = render_jinja("{% for i in range(100000000) %}x{% endfor %}", ojson::object(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message.find("chat template error at line 1"), std::string::npos);

  std::string deep(100000, '(');
  r = render_jinja("{{ " + deep + "1 }}", ojson::object(), o);
  ASSERT_FALSE(r.ok());

  std::string chain = "{{ 1";
  for (int i = 0; i < 300000; ++i) chain += " ~ 1";
  r = render_jinja(chain + " }}", ojson::object(), o);
  ASSERT_FALSE(r.ok());

  std::string nest;
  for (int i = 0; i < 5000; ++i) nest += "{% if true %}";
  r = render_jinja(nest, ojson::object(), o);
  ASSERT_FALSE(r.ok());

  o.max_output_bytes = 1000;
  r = render_jinja("{{ 'x' * 100000 }}", ojson::object(), o);
  ASSERT_FALSE(r.ok());
  r = render_jinja("{% for i in range(2000) %}ab{% endfor %}", ojson::object(), o);
  ASSERT_FALSE(r.ok());

  o = JinjaOptions{};
  o.max_steps = 1000;
  r = render_jinja("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", ojson::object(), o);
  ASSERT_FALSE(r.ok());

  r = render_jinja("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", ojson::object(), JinjaOptions{});
  ASSERT_FALSE(r.ok());

  r = render_jinja("line1\n{{ x + 1 }}", ojson::object(), JinjaOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message.find("chat template error at line 2"), std::string::npos) << r.status().message;

  for (const char* bad : {"{% if %}", "{{", "{% for %}", "{{ 1 + }}", "{% endif %}", "{{ 'abc }}", "{% set %}",
                          "{% macro %}", "{{ a[ }}", "{{ {1: }}", "{% for x in y %}"}) {
    r = render_jinja(bad, ojson::object(), JinjaOptions{});
    EXPECT_FALSE(r.ok()) << bad;
  }
}

// HF's `generation` block (an extension plain Jinja2 lacks): its body renders.
TEST(ChatTemplate, GenerationBlock) {
  auto r = render_jinja("a{% generation %}{{ x }}{% endgeneration %}\nb", ojson{{"x", 1}}, JinjaOptions{});
  ASSERT_TRUE(r.ok()) << r.status().message;
  EXPECT_EQ(r.value(), "a1b");
}

// The chat templates of today's open models (tests/text/templates: Qwen3,
// Gemma 3, Phi-4, Phi-4-mini, Mistral Small 3.2, gpt-oss, Llama 3.1/3.2) with
// tools offered, tool calls, tool results and reasoning kept apart, rendered by
// Python's Jinja2 (templates/render_template_cases.py).
TEST(ChatTemplate, RealTemplates) {
  const fs::path dir = fs::path(ATELIER_TESTS_DIR) / "text" / "templates";
  int passed = 0, total = 0, files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 11 || name.substr(name.size() - 11) != ".cases.json") continue;
    ++files;
    auto [p, t] = check_cases(e.path(), dir);
    passed += p;
    total += t;
  }
  std::cout << "real template cases passing: " << passed << " / " << total << " in " << files << " templates\n";
  EXPECT_GE(files, 9);
  EXPECT_EQ(passed, total);
}
