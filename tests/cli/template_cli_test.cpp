// atelier template render: the binary prints exactly what Python's Jinja2
// rendered for the fixture cases (no newline added), fails with the
// template's own message on raise_exception, and refuses bad usage.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cli/cli_util.h"

namespace fs = std::filesystem;
using atelier::test::run_atelier;
using atelier::test::slurp;

namespace {
const fs::path kChat = fs::path(ATELIER_FIXTURES_DIR) / "chat";

struct Case {
  std::string template_file, messages_file;
  nlohmann::json json;
};

Case write_case(const std::string& fixture, const std::string& id, const fs::path& dir) {
  const nlohmann::json all = nlohmann::json::parse(slurp(kChat / (fixture + ".cases.json")));
  for (const auto& c : all["cases"]) {
    if (c["id"] != id) continue;
    const fs::path messages = dir / (fixture + "-" + id + ".json");
    std::ofstream(messages) << c["messages"].dump();
    return {(kChat / all["template"].get<std::string>()).string(), messages.string(), c};
  }
  ADD_FAILURE() << "no case " << id << " in " << fixture;
  return {};
}

std::vector<std::string> args_for(const Case& c) {
  std::vector<std::string> a = {"template", "render", "--template", c.template_file, "--messages", c.messages_file};
  if (c.json.value("add_generation_prompt", false)) a.push_back("--add-generation-prompt");
  for (const auto& [k, v] : c.json["variables"].items()) a.push_back("--var=" + k + "=" + v.get<std::string>());
  return a;
}
}  // namespace

TEST(CliTemplate, RendersFixtureCasesByteForByte) {
  const fs::path dir = fs::temp_directory_path() / ("atelier_template_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const auto& [fixture, id] : std::vector<std::pair<std::string, std::string>>{
           {"meta-llama-Llama-3.1-8B-Instruct", "system-multi-turn"},
           {"Qwen-Qwen2.5-7B-Instruct", "unicode"},
           {"mistralai-Mistral-Nemo-Instruct-2407", "ends-with-assistant"}}) {
    const Case c = write_case(fixture, id, dir);
    const auto run = run_atelier(args_for(c), dir);
    ASSERT_EQ(run.code, 0) << fixture << " " << id << ": " << run.err;
    EXPECT_EQ(run.out, c.json["expected"].get<std::string>()) << fixture << " " << id;
  }
  fs::remove_all(dir);
}

TEST(CliTemplate, TemplateErrorExitsOneWithItsMessage) {
  const fs::path dir = fs::temp_directory_path() / ("atelier_template_err_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const Case c = write_case("google-gemma-2-2b-it", "system-multi-turn", dir);
  const auto run = run_atelier(args_for(c), dir);
  EXPECT_EQ(run.code, 1);
  EXPECT_TRUE(run.out.empty());
  EXPECT_NE(run.err.find(c.json["expected_error"].get<std::string>()), std::string::npos) << run.err;
  fs::remove_all(dir);
}

TEST(CliTemplate, BadUsageAndModelsWithoutTemplate) {
  const fs::path dir = fs::temp_directory_path() / ("atelier_template_use_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "m.json") << R"([{"role": "user", "content": "hi"}])";
  std::ofstream(dir / "bad.json") << R"({"role": "user"})";
  const std::string tmpl = (kChat / "google-gemma-2-2b-it.jinja").string();
  // Neither --template nor -m.
  EXPECT_EQ(run_atelier({"template", "render", "--messages", (dir / "m.json").string()}, dir).code, 2);
  // Messages that are not a list.
  auto bad = run_atelier({"template", "render", "--template", tmpl, "--messages", (dir / "bad.json").string()}, dir);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("JSON list"), std::string::npos) << bad.err;
  // A model without a chat template says so.
  auto none = run_atelier({"template", "render", "-m", (fs::path(ATELIER_FIXTURES_DIR) / "text/stories260K.gguf").string(), "--messages",
                           (dir / "m.json").string()},
                          dir);
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("no chat template"), std::string::npos) << none.err;
  // A malformed --var.
  EXPECT_EQ(run_atelier({"template", "render", "--template", tmpl, "--messages", (dir / "m.json").string(), "--var", "novalue"}, dir).code, 2);
  fs::remove_all(dir);
}
