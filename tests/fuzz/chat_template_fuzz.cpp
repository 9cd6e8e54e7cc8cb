// libFuzzer: the Jinja chat-template renderer on hostile templates, with the
// variables a chat model's template sees. Its bounds (output bytes, steps,
// depth) are lowered so that each run stays fast; crossing one is an error.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>"},
                 {"role": "assistant", "content": "Hello", "tool_calls": [{"name": "f", "arguments": {"x": 1}}]}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": [{"name": "f"}]})");
  atelier::text::JinjaOptions o;
  o.now_utc = 0;
  o.max_output_bytes = 1 << 16;
  o.max_steps = 100000;
  o.max_depth = 200;
  (void)atelier::text::render_jinja(std::string_view(reinterpret_cast<const char*>(data), size), vars, o);
  return 0;
}
