// The JSON form of TextRequest and ImageRequest (job database, `atelier batch` files).
#include <atelier/requests.h>
#include <atelier/json_input.h>

#include <nlohmann/json.hpp>

#include <climits>
#include <cmath>
#include <limits>
#include <set>
#include <type_traits>

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
  if (!r.json_schema.empty()) j["json_schema"] = r.json_schema;  // written only when set: older readers keep working
  if (!r.json_trigger.empty()) j["json_trigger"] = r.json_trigger;
  if (r.logprobs) j["logprobs"] = true;
  if (r.top_logprobs) j["top_logprobs"] = r.top_logprobs;
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

std::string shown(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

template <class T>
void read(const json& j, const char* key, T& out) {
  if (!j.contains(key)) return;
  const json& v = j.at(key);
  const std::string name = std::string("key '") + key + "'";
  // Numbers are range-checked before they are converted: a double cast to an
  // int outside its range is undefined behaviour (it read as -2147483648).
  if constexpr (std::is_same_v<T, uint64_t>) {
    if (v.is_number_unsigned()) out = v.get<uint64_t>();
    else if (v.is_number_integer() && v.get<int64_t>() >= 0) out = static_cast<uint64_t>(v.get<int64_t>());
    else if (v.is_number())
      throw std::invalid_argument(name + " must be a whole number between 0 and 18446744073709551614, got " + shown(v));
    else throw std::invalid_argument(name + " has the wrong type (" + std::string(v.type_name()) + "; want a whole number)");
  } else if constexpr (std::is_same_v<T, int>) {
    if (!v.is_number()) throw std::invalid_argument(name + " has the wrong type (" + std::string(v.type_name()) + "; want a whole number)");
    const double d = v.get<double>();
    const bool whole = v.is_number_integer() || (std::isfinite(d) && std::floor(d) == d);
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t{INT_MAX}
                                             : (v.is_number_integer() ? v.get<int64_t>() >= INT_MIN && v.get<int64_t>() <= INT_MAX
                                                                      : d >= INT_MIN && d <= INT_MAX);
    if (!whole || !fits)
      throw std::invalid_argument(name + " must be a whole number between -2147483648 and 2147483647, got " + shown(v));
    out = v.is_number_integer() ? static_cast<int>(v.get<int64_t>()) : static_cast<int>(d);
  } else if constexpr (std::is_same_v<T, float>) {
    if (!v.is_number()) throw std::invalid_argument(name + " has the wrong type (" + std::string(v.type_name()) + "; want a number)");
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
      throw std::invalid_argument(name + " is out of range: " + shown(v));
    out = static_cast<float>(d);
  } else {
    try {
      out = v.get<T>();
    } catch (const json::exception&) {
      throw std::invalid_argument(name + " has the wrong type (" + v.type_name() + ")");
    }
  }
}

// The line or body as JSON, nested at most kMaxJsonDepth deep (json_input.h).
json parse_request(std::string_view text) {
  auto j = parse_json(text, "the request");
  if (!j.ok()) throw std::invalid_argument(j.status().message);
  return std::move(j.value());
}

void check_kind(const json& j, const char* want) {
  if (!j.contains("kind")) return;
  const json& k = j["kind"];
  if (k == want) return;
  if (k.is_string() && (k == "text" || k == "image"))
    throw std::invalid_argument(std::string("not a ") + want + " request (kind is " + shown(k) + ")");
  throw std::invalid_argument("unknown kind " + shown(k) + ": use \"text\" (the default) or \"image\"");
}
}  // namespace

Result<TextRequest> request_from_json(std::string_view text) {
  try {
    const json j = parse_request(text);
    if (!j.is_object()) throw std::invalid_argument("a request must be a JSON object");
    check_kind(j, "text");
    check_keys(j, {"kind", "model", "prompt", "max_new_tokens", "stop", "add_bos", "parse_special", "ignore_eos", "json_schema", "json_trigger", "logprobs", "top_logprobs", "priority", "interactive", "sampling"}, "");
    if (!j.contains("model") || !j.contains("prompt")) throw std::invalid_argument("a request needs 'model' and 'prompt'");
    TextRequest r;
    read(j, "model", r.model);
    read(j, "prompt", r.prompt);
    read(j, "max_new_tokens", r.max_new_tokens);
    read(j, "stop", r.stop);
    read(j, "add_bos", r.add_bos);
    read(j, "parse_special", r.parse_special);
    read(j, "ignore_eos", r.ignore_eos);
    read(j, "json_schema", r.json_schema);
    read(j, "json_trigger", r.json_trigger);
    read(j, "logprobs", r.logprobs);
    read(j, "top_logprobs", r.top_logprobs);
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
  } catch (const json::exception& e) {  // a value of an unexpected shape that read() did not foresee
    return Status::error(StatusCode::InvalidArgument, std::string("the request: ") + e.what());
  } catch (const std::invalid_argument& e) {
    return Status::error(StatusCode::InvalidArgument, e.what());
  }
}

std::string image_request_to_json(const ImageRequest& r) {
  json j = {{"kind", "image"},
            {"model", r.model},
            {"prompt", r.prompt},
            {"negative_prompt", r.negative_prompt},
            {"width", r.width},
            {"height", r.height},
            {"steps", r.steps},
            {"cfg_scale", r.cfg_scale},
            {"sampler", r.sampler},
            {"scheduler", r.scheduler},
            {"rng", r.rng},
            {"batch_count", r.batch_count},
            {"batch_size", r.batch_size},
            {"init_image", r.init_image},
            {"strength", r.strength},
            {"mask", r.mask},
            {"tokenizer", r.tokenizer},
            {"preview_decoder", r.preview_decoder},
            {"prediction", r.prediction},
            {"output", r.output},
            {"priority", r.priority},
            {"interactive", r.interactive}};
  if (r.seed != SamplingParams::kRandomSeed) j["seed"] = r.seed;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool is_image_request_json(std::string_view text) {
  const auto parsed = parse_json(text, "the request");
  if (!parsed.ok()) return false;
  const json& j = parsed.value();
  return j.is_object() && j.contains("kind") && j["kind"] == "image";
}

Result<ImageRequest> image_request_from_json(std::string_view text) {
  try {
    const json j = parse_request(text);
    if (!j.is_object()) throw std::invalid_argument("a request must be a JSON object");
    check_kind(j, "image");
    check_keys(j, {"kind", "model", "prompt", "negative_prompt", "width", "height", "steps", "cfg_scale", "sampler",
                   "scheduler", "seed", "rng", "batch_count", "batch_size", "init_image", "strength", "mask", "tokenizer",
                   "preview_decoder", "prediction", "output", "priority", "interactive"}, " of an image request");
    if (!j.contains("model") || !j.contains("prompt")) throw std::invalid_argument("a request needs 'model' and 'prompt'");
    ImageRequest r;
    read(j, "model", r.model);
    read(j, "prompt", r.prompt);
    read(j, "negative_prompt", r.negative_prompt);
    read(j, "width", r.width);
    read(j, "height", r.height);
    read(j, "steps", r.steps);
    read(j, "cfg_scale", r.cfg_scale);
    read(j, "sampler", r.sampler);
    read(j, "scheduler", r.scheduler);
    read(j, "seed", r.seed);
    read(j, "rng", r.rng);
    read(j, "batch_count", r.batch_count);
    read(j, "batch_size", r.batch_size);
    read(j, "init_image", r.init_image);
    read(j, "strength", r.strength);
    read(j, "mask", r.mask);
    read(j, "tokenizer", r.tokenizer);
    read(j, "preview_decoder", r.preview_decoder);
    read(j, "prediction", r.prediction);
    read(j, "output", r.output);
    read(j, "priority", r.priority);
    read(j, "interactive", r.interactive);
    return r;
  } catch (const json::exception& e) {  // a value of an unexpected shape that read() did not foresee
    return Status::error(StatusCode::InvalidArgument, std::string("the request: ") + e.what());
  } catch (const std::invalid_argument& e) {
    return Status::error(StatusCode::InvalidArgument, e.what());
  }
}

}  // namespace atelier
