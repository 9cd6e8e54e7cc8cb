// The JSON form of a TextRequest (job database, `atelier batch` files).
#include <atelier/engine.h>

#include <nlohmann/json.hpp>

#include <set>

namespace atelier {

using nlohmann::json;

std::string request_to_json(const TextRequest& r) {
  const SamplingParams& s = r.sampling;
  json j = {{"model", r.model},
            {"prompt", r.prompt},
            {"max_new_tokens", r.max_new_tokens},
            {"stop", r.stop},
            {"add_bos", r.add_bos},
            {"parse_special", r.parse_special},
            {"ignore_eos", r.ignore_eos},
            {"priority", r.priority},
            {"interactive", r.interactive},
            {"sampling",
             {{"temperature", s.temperature},
              {"top_k", s.top_k},
              {"top_p", s.top_p},
              {"min_p", s.min_p},
              {"repeat_penalty", s.repeat_penalty},
              {"repeat_last_n", s.repeat_last_n},
              {"frequency_penalty", s.frequency_penalty},
              {"presence_penalty", s.presence_penalty}}}};
  if (s.seed != SamplingParams::kRandomSeed) j["sampling"]["seed"] = s.seed;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {
void check_keys(const json& j, const std::set<std::string>& allowed, const std::string& where) {
  for (const auto& [key, value] : j.items()) {
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw std::invalid_argument("unknown key '" + key + "'" + where + " (allowed: " + list + ")");
    }
  }
}

template <class T>
void read(const json& j, const char* key, T& out) {
  if (!j.contains(key)) return;
  try {
    out = j.at(key).get<T>();
  } catch (const json::exception&) {
    throw std::invalid_argument(std::string("key '") + key + "' has the wrong type (" + j.at(key).type_name() + ")");
  }
}
}  // namespace

Result<TextRequest> request_from_json(std::string_view text) {
  try {
    const json j = json::parse(text);
    if (!j.is_object()) throw std::invalid_argument("a request must be a JSON object");
    check_keys(j, {"model", "prompt", "max_new_tokens", "stop", "add_bos", "parse_special", "ignore_eos", "priority", "interactive", "sampling"}, "");
    if (!j.contains("model") || !j.contains("prompt")) throw std::invalid_argument("a request needs 'model' and 'prompt'");
    TextRequest r;
    read(j, "model", r.model);
    read(j, "prompt", r.prompt);
    read(j, "max_new_tokens", r.max_new_tokens);
    read(j, "stop", r.stop);
    read(j, "add_bos", r.add_bos);
    read(j, "parse_special", r.parse_special);
    read(j, "ignore_eos", r.ignore_eos);
    read(j, "priority", r.priority);
    read(j, "interactive", r.interactive);
    if (j.contains("sampling")) {
      const json& s = j.at("sampling");
      if (!s.is_object()) throw std::invalid_argument("'sampling' must be an object");
      check_keys(s, {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "frequency_penalty",
                     "presence_penalty", "seed"}, " in sampling");
      SamplingParams& p = r.sampling;
      read(s, "temperature", p.temperature);
      read(s, "top_k", p.top_k);
      read(s, "top_p", p.top_p);
      read(s, "min_p", p.min_p);
      read(s, "repeat_penalty", p.repeat_penalty);
      read(s, "repeat_last_n", p.repeat_last_n);
      read(s, "frequency_penalty", p.frequency_penalty);
      read(s, "presence_penalty", p.presence_penalty);
      read(s, "seed", p.seed);
    }
    return r;
  } catch (const json::parse_error& e) {
    return Status::error(StatusCode::InvalidArgument, std::string("not valid JSON: ") + e.what());
  } catch (const std::invalid_argument& e) {
    return Status::error(StatusCode::InvalidArgument, e.what());
  }
}

}  // namespace atelier
