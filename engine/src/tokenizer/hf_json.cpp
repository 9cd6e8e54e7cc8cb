// Hugging Face tokenizer.json with a byte-level BPE model (Llama 3, GPT-2,
// Qwen, ... style): vocab, merges ("a b" strings or ["a", "b"] pairs),
// added_tokens (special -> control, otherwise user-defined), and the
// pre-tokenizer regexes the file declares (Split with a Regex or String
// pattern, ByteLevel with use_regex, Digits).
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer_impl.h"

namespace atelier::tok {

namespace {

using nlohmann::json;

// GPT-2's pattern, as Hugging Face's ByteLevel pre-tokenizer applies it.
const char* const kByteLevelRegex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string quote_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

struct PreTokenizerInfo {
  std::vector<std::string> regexes;
  bool byte_level = false;
  bool add_prefix_space = false;
};

void read_pre_tokenizer(const json& p, const std::string& path, PreTokenizerInfo& info) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& sub : p.at("pretokenizers")) read_pre_tokenizer(sub, path, info);
  } else if (type == "Split") {
    const std::string behavior = p.value("behavior", "Isolated");
    if (behavior != "Isolated" || p.value("invert", false))
      throw Error(path + ": pre-tokenizer Split with behavior '" + behavior +
                  "'" + (p.value("invert", false) ? " and invert" : "") + " is not supported (only Isolated)");
    const json& pat = p.at("pattern");
    if (pat.contains("Regex"))
      info.regexes.push_back(pat.at("Regex").get<std::string>());
    else if (pat.contains("String"))
      info.regexes.push_back(quote_regex(pat.at("String").get<std::string>()));
    else
      throw Error(path + ": pre-tokenizer Split without a Regex or String pattern");
  } else if (type == "ByteLevel") {
    info.byte_level = true;
    info.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) info.regexes.push_back(kByteLevelRegex);
  } else if (type == "Digits") {
    info.regexes.push_back(p.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
  } else {
    throw Error(path + ": pre-tokenizer type '" + type +
                "' is not supported (supported: Sequence, Split, ByteLevel, Digits)");
  }
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(errno_code(errno), path + ": cannot open the tokenizer file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    // The position only: nlohmann's message quotes the bytes it read ("last read: ..."), and
    // this message reaches API clients, who must not read a file through it.
    throw Error(path + ": not a valid tokenizer.json: a JSON syntax error at byte " + std::to_string(e.byte));
  } catch (const json::exception& e) {
    throw Error(path + ": not a valid tokenizer.json: " + e.what());
  }
  try {
    const json& model = j.at("model");
    const std::string type = model.value("type", "");
    if (type != "BPE")
      throw Error(path + ": tokenizer.json model type '" + type + "' is not supported (only byte-level BPE)");
    if (j.contains("normalizer") && !j.at("normalizer").is_null())
      throw Error(path + ": tokenizer.json normalizer '" + j.at("normalizer").value("type", "?") +
                  "' is not supported");

    PreTokenizerInfo pre;
    read_pre_tokenizer(j.value("pre_tokenizer", json()), path, pre);
    const bool byte_level_decoder = j.contains("decoder") && j.at("decoder").is_object() &&
                                    j.at("decoder").value("type", "") == "ByteLevel";
    if (!pre.byte_level && !byte_level_decoder)
      throw Error(path + ": only byte-level BPE tokenizer.json files are supported (no ByteLevel pre-tokenizer)");

    VocabSpec spec;
    spec.source = path;
    spec.model = "gpt2";

    // ids may leave holes; they stay undefined tokens
    std::vector<std::pair<std::string, int64_t>> entries;
    int64_t max_id = -1;
    for (const auto& [text, id] : model.at("vocab").items()) {
      const int64_t v = id.get<int64_t>();
      if (v < 0 || v > 16 * 1024 * 1024) throw Error(path + ": token id " + std::to_string(v) + " is out of range");
      entries.emplace_back(text, v);
      max_id = std::max(max_id, v);
    }
    struct Added {
      std::string text;
      int64_t id;
      bool special, lstrip, rstrip;
    };
    std::vector<Added> added;
    for (const auto& a : j.value("added_tokens", json::array())) {
      Added t{a.at("content").get<std::string>(), a.at("id").get<int64_t>(), a.value("special", false),
              a.value("lstrip", false), a.value("rstrip", false)};
      if (t.id < 0 || t.id > 16 * 1024 * 1024)
        throw Error(path + ": added token id " + std::to_string(t.id) + " is out of range");
      max_id = std::max(max_id, t.id);
      added.push_back(std::move(t));
    }
    const size_t n = static_cast<size_t>(max_id + 1);
    spec.texts.assign(n, std::string());
    spec.types.assign(n, TokenType::Undefined);
    spec.strip.assign(n, 0);
    for (auto& [text, id] : entries) {
      spec.texts[static_cast<size_t>(id)] = text;
      spec.types[static_cast<size_t>(id)] = TokenType::Normal;
    }
    for (const Added& a : added) {
      const auto i = static_cast<size_t>(a.id);
      spec.texts[i] = a.text;
      spec.types[i] = a.special ? TokenType::Control : TokenType::UserDefined;
      spec.strip[i] = static_cast<uint8_t>((a.lstrip ? kLstrip : 0) | (a.rstrip ? kRstrip : 0));
    }

    for (const auto& m : model.value("merges", json::array())) {
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t pos = s.find(' ', 1);
        if (pos == std::string::npos) throw Error(path + ": merge '" + s + "' is not two symbols");
        spec.merges.emplace_back(s.substr(0, pos), s.substr(pos + 1));
      } else if (m.is_array() && m.size() == 2) {
        spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        throw Error(path + ": a merge is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
    spec.ignore_merges = model.value("ignore_merges", false);
    spec.regexes = pre.regexes;
    spec.hf_add_prefix_space = pre.add_prefix_space;

    const auto find = [&](std::initializer_list<const char*> names) -> int32_t {
      for (const char* name : names)
        for (size_t i = 0; i < n; ++i)
          if (spec.texts[i] == name) return static_cast<int32_t>(i);
      return -1;
    };
    // BOS: the first special token of a TemplateProcessing post-processor, else a known name.
    const auto template_bos = [&](const json& pp, auto&& self) -> int32_t {
      if (!pp.is_object()) return -1;
      if (pp.value("type", "") == "Sequence") {
        for (const auto& sub : pp.value("processors", json::array())) {
          const int32_t id = self(sub, self);
          if (id >= 0) return id;
        }
        return -1;
      }
      if (pp.value("type", "") != "TemplateProcessing") return -1;
      const json single = pp.value("single", json::array());
      if (single.empty() || !single[0].contains("SpecialToken")) return -1;
      const std::string name = single[0]["SpecialToken"].value("id", "");
      for (size_t i = 0; i < n; ++i)
        if (spec.texts[i] == name) return static_cast<int32_t>(i);
      return -1;
    };
    spec.bos = template_bos(j.value("post_processor", json()), template_bos);
    spec.add_bos = spec.bos >= 0;
    if (spec.bos < 0) {
      spec.bos = find({"<|begin_of_text|>", "<s>", "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                       "<|startoftext|>"});
      spec.add_bos = spec.bos >= 0 && spec.texts[static_cast<size_t>(spec.bos)] == "<|begin_of_text|>";  // Llama 3
    }
    spec.eos = find({"<|end_of_text|>", "<|endoftext|>", "</s>",
                     "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "<|im_end|>"});
    return make_tokenizer(std::move(spec));
  } catch (const json::exception& e) {
    throw Error(path + ": unexpected tokenizer.json layout: " + e.what());
  }
}

}  // namespace atelier::tok
