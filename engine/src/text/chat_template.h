// Chat templates: a Jinja renderer with the settings of Hugging Face's
// apply_chat_template (trim_blocks and lstrip_blocks on, the loopcontrols
// extension, raise_exception(msg), strftime_now(fmt), tojson as Python's
// json.dumps), for the templates models publish (GGUF
// tokenizer.chat_template). Python's Jinja2 3.1 is the reference; what is
// implemented, and what is not, is listed at the top of chat_template.cpp.
// The public faces are render_chat_template and format_chat_prompt in
// atelier/engine.h.
#pragma once

#include <atelier/engine.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

namespace atelier::text {

struct JinjaOptions {
  // strftime_now's clock: this time (formatted as UTC) instead of the local time now. Tests fix it.
  std::optional<std::time_t> now_utc;
  // Bounds against hostile templates: crossing one is an error, never a crash.
  size_t max_output_bytes = size_t{32} << 20;  // the rendered text, and any one string it builds
  int64_t max_steps = 20'000'000;              // statements, expressions, loop iterations, items filtered
  int max_depth = 1000;                        // nested evaluation: blocks, expressions, macro calls
};

// Renders the template `source` with `variables` (a JSON object: name ->
// value; objects keep their key order, as Python dicts do). On a syntax
// error, a runtime error (undefined value used, type error, a bound crossed)
// or raise_exception(msg): InvalidArgument "chat template error at line N: ...".
Result<std::string> render_jinja(std::string_view source, const nlohmann::ordered_json& variables,
                                 const JinjaOptions& options = {});

}  // namespace atelier::text
