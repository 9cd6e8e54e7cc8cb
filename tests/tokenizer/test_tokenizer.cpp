// Tokenizers against llama.cpp's vocabulary test vectors and the stories260K
// fixtures (../shared/fixtures, see its README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace {

using atelier::tok::Tokenizer;
using atelier::tok::TokenType;

const std::string kFixtures = ATELIER_FIXTURES_DIR;
const std::string kVocabDir = kFixtures + "/vocab/";
const std::string kTextDir = kFixtures + "/text/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> parse_ids(const std::string& line) {
  std::istringstream iss(line);
  std::vector<int32_t> ids;
  int64_t v;
  while (iss >> v) ids.push_back(static_cast<int32_t>(v));
  return ids;
}

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

// As llama.cpp's test-tokenizer-0: the .inp strings are separated by
// "\n__ggml_vocab_test__\n" (the piece after the last separator is not a test);
// line i of the .out holds the ids of string i.
std::vector<std::string> read_test_strings(const std::string& path) {
  const std::string inp = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t start = 0;
  for (size_t end = inp.find(sep); end != std::string::npos; end = inp.find(sep, start)) {
    texts.push_back(inp.substr(start, end - start));
    start = end + sep.size();
  }
  return texts;
}

std::vector<VocabCase> read_cases(const std::string& stem) {
  const std::vector<std::string> texts = read_test_strings(stem + ".inp");
  std::ifstream out(stem + ".out");
  std::vector<VocabCase> cases;
  std::string line;
  for (const auto& t : texts) {
    if (!std::getline(out, line)) throw std::runtime_error(stem + ".out has fewer lines than .inp has strings");
    cases.push_back({t, parse_ids(line)});
  }
  return cases;
}

std::string escaped(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out + "\"";
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < ids.size(); ++i) s << (i ? " " : "") << ids[i];
  s << ']';
  return s.str();
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path) {
  auto file = atelier::formats::GgufFile::open(path);
  return Tokenizer::from_gguf(*file);
}

struct VocabParam {
  std::string name;    // ggml-vocab-NAME.gguf.inp/.out
  std::string source;  // file the vocabulary is read from
  std::string model;   // expected model_name()
};

void PrintTo(const VocabParam& p, std::ostream* os) { *os << p.name; }

std::string param_name(const testing::TestParamInfo<VocabParam>& info) {
  std::string s = info.param.name;
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

class VocabVectors : public testing::TestWithParam<VocabParam> {};

TEST_P(VocabVectors, EveryStringTokenizesAsLlamaCpp) {
  const VocabParam& p = GetParam();
  const std::string stem = kVocabDir + "ggml-vocab-" + p.name + ".gguf";
  const auto cases = read_cases(stem);
  ASSERT_GT(cases.size(), 30u);
  std::unique_ptr<Tokenizer> tok = p.source.size() > 5 && p.source.substr(p.source.size() - 5) == ".json"
                                       ? Tokenizer::from_hf_json(p.source)
                                       : load_gguf_tokenizer(p.source);
  EXPECT_EQ(tok->model_name(), p.model);
  size_t passed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto got = tok->encode(cases[i].text, /*add_bos=*/false, /*parse_special=*/false);
    if (got == cases[i].ids) {
      ++passed;
    } else {
      ADD_FAILURE() << p.name << " string " << i << " " << escaped(cases[i].text) << "\n  expected "
                    << ids_str(cases[i].ids) << "\n  got      " << ids_str(got);
    }
  }
  std::printf("[   INFO   ] %s: %zu/%zu strings pass\n", p.name.c_str(), passed, cases.size());
  RecordProperty("passed", static_cast<int>(passed));
  RecordProperty("total", static_cast<int>(cases.size()));
}

INSTANTIATE_TEST_SUITE_P(
    LlamaCpp, VocabVectors,
    testing::Values(VocabParam{"llama-spm", kVocabDir + "ggml-vocab-llama-spm.gguf", "llama"},
                    VocabParam{"phi-3", kVocabDir + "ggml-vocab-phi-3.gguf", "llama"},
                    VocabParam{"gpt-2", kVocabDir + "ggml-vocab-gpt-2.gguf", "gpt2"},
                    VocabParam{"deepseek-coder", kVocabDir + "ggml-vocab-deepseek-coder.gguf", "gpt2"},
                    VocabParam{"deepseek-llm", kVocabDir + "ggml-vocab-deepseek-llm.gguf", "gpt2"},
                    VocabParam{"falcon", kVocabDir + "ggml-vocab-falcon.gguf", "gpt2"},
                    VocabParam{"mpt", kVocabDir + "ggml-vocab-mpt.gguf", "gpt2"},
                    VocabParam{"starcoder", kVocabDir + "ggml-vocab-starcoder.gguf", "gpt2"},
                    VocabParam{"refact", kVocabDir + "ggml-vocab-refact.gguf", "gpt2"},
                    VocabParam{"bert-bge", kVocabDir + "ggml-vocab-bert-bge.gguf", "bert"},
                    VocabParam{"llama-bpe", kVocabDir + "llama3-tokenizer.json", "gpt2"}),
    param_name);

// ---- llama.cpp's vectors on compact vocabularies (tests/tokenizer/fixtures) ----
//
// qwen2 and gpt-4o: llama.cpp's expected ids (the .out files, which its
// convert_hf_to_gguf_update.py wrote with the models' Hugging Face tokenizers)
// for its test strings, on the part of the real vocabulary those strings can
// reach (fixtures/README.md says where each comes from and how it was cut).
// The vocabulary is written as a GGUF that names the pre-tokenizer, so the
// strings go through tokenizer.ggml.pre as a real model file's would.

const std::string kCompactDir = std::string(ATELIER_TESTS_DIR) + "/tokenizer/fixtures/";

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

struct CompactGguf {
  std::string path;
  std::map<int32_t, int32_t> dense_id;  // original id -> id in the written file
  std::vector<int32_t> original_id;     // the other way
};

// Writes fixtures/NAME.vocab as a GGUF vocabulary (ids renumbered densely, in
// order). Byte-level BPE files (make_compact_vocab.py): `pre`, `t` tokens, `m`
// merges. SentencePiece files (make_spm_vocab.py): `model llama`, `s` tokens
// with scores, `u` runs of <unusedN>, special ids and add_* flags.
// drop_unused: leave out the `u` runs (a vocabulary with few special tokens).
CompactGguf write_compact_gguf(const std::string& name, bool drop_unused = false) {
  std::ifstream in(kCompactDir + name + ".vocab");
  if (!in) throw std::runtime_error("cannot open " + kCompactDir + name + ".vocab");
  CompactGguf out;
  std::string model = "gpt2", pre, line;
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> types;
  std::vector<float> scores;
  std::map<std::string, int64_t> keys;  // bos, eos, unk, pad (original ids), add_* flags
  const auto add_token = [&](int32_t id, int32_t type, float score, std::string text) {
    out.dense_id[id] = static_cast<int32_t>(tokens.size());
    out.original_id.push_back(id);
    tokens.push_back(std::move(text));
    types.push_back(type);
    scores.push_back(score);
  };
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string kind;
    f >> kind;
    if (kind.empty() || kind[0] == '#') continue;
    if (kind == "pre") {
      f >> pre;
    } else if (kind == "model") {
      f >> model;
    } else if (kind == "t" || kind == "s") {
      int32_t id = 0, type = 0;
      float score = 0.0f;
      std::string hex;
      f >> id >> type;
      if (kind == "s") f >> score;
      f >> hex;
      add_token(id, type, score, unhex(hex));
    } else if (kind == "u") {
      if (drop_unused) continue;
      int32_t id = 0, first = 0, count = 0, type = 0;
      f >> id >> first >> count >> type;
      for (int32_t i = 0; i < count; ++i) add_token(id + i, type, -1000.0f, "<unused" + std::to_string(first + i) + ">");
    } else if (kind == "m") {
      std::string l, r;
      f >> l >> r;
      merges.push_back(unhex(l) + " " + unhex(r));
    } else {
      f >> keys[kind];
    }
  }
  atelier::formats::GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", model);
  if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  if (model == "gpt2") w.set_string_array("tokenizer.ggml.merges", merges);
  if (model == "llama") w.set_f32_array("tokenizer.ggml.scores", scores);
  for (const auto& [key, gguf_key] : std::map<std::string, std::string>{{"bos", "tokenizer.ggml.bos_token_id"},
                                                                        {"eos", "tokenizer.ggml.eos_token_id"},
                                                                        {"unk", "tokenizer.ggml.unknown_token_id"},
                                                                        {"pad", "tokenizer.ggml.padding_token_id"}})
    if (keys.count(key)) w.set_u32(gguf_key, static_cast<uint32_t>(out.dense_id.at(static_cast<int32_t>(keys[key]))));
  for (const char* key : {"add_bos", "add_eos"})
    if (keys.count(key)) w.set_bool(std::string("tokenizer.ggml.") + key + "_token", keys[key] != 0);
  if (keys.count("add_space_prefix")) w.set_bool("tokenizer.ggml.add_space_prefix", keys["add_space_prefix"] != 0);
  out.path = (std::filesystem::temp_directory_path() /
              ("atelier-tok-compact-" + name + (drop_unused ? "-few" : "") + "-" + std::to_string(::getpid()) + ".gguf"))
                 .string();
  w.write(out.path);
  return out;
}

class CompactVocabVectors : public testing::TestWithParam<const char*> {};

TEST_P(CompactVocabVectors, EveryStringTokenizesAsLlamaCppsVectors) {
  const std::string name = GetParam();
  const CompactGguf vocab = write_compact_gguf(name);
  auto tok = load_gguf_tokenizer(vocab.path);
  std::filesystem::remove(vocab.path);
  // Every ggml-vocab-*.gguf.inp in llama.cpp's models/ is the same file (sha256 ef7a25a2...).
  auto cases = read_cases(kVocabDir + "ggml-vocab-gpt-2.gguf");
  std::ifstream out(kCompactDir + name + ".out");
  std::string line;
  for (auto& c : cases) {
    ASSERT_TRUE(std::getline(out, line)) << name << ".out has fewer lines than the .inp has strings";
    c.ids.clear();
    for (int32_t id : parse_ids(line)) {
      const auto it = vocab.dense_id.find(id);
      ASSERT_NE(it, vocab.dense_id.end()) << "expected id " << id << " is not in the compact vocabulary";
      c.ids.push_back(it->second);
    }
  }
  ASSERT_EQ(cases.size(), 46u);
  size_t passed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto got = tok->encode(cases[i].text, /*add_bos=*/false, /*parse_special=*/false);
    if (got == cases[i].ids) {
      ++passed;
      EXPECT_EQ(tok->decode(got), cases[i].text) << name << " string " << i;
    } else {
      std::vector<int32_t> got_original;
      for (int32_t id : got) got_original.push_back(vocab.original_id.at(static_cast<size_t>(id)));
      std::vector<int32_t> want_original;
      for (int32_t id : cases[i].ids) want_original.push_back(vocab.original_id.at(static_cast<size_t>(id)));
      ADD_FAILURE() << name << " string " << i << " " << escaped(cases[i].text) << "\n  expected "
                    << ids_str(want_original) << "\n  got      " << ids_str(got_original);
    }
  }
  std::printf("[   INFO   ] %s: %zu/%zu strings pass\n", name.c_str(), passed, cases.size());
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, CompactVocabVectors, testing::Values("qwen2", "gpt-4o"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "gpt-4o" ? std::string("gpt_4o") : std::string(info.param);
                         });

// ---- Gemma 3: SentencePiece without a space prefix, ~6,400 added tokens ----
//
// fixtures/gemma3.vocab is Gemma 3's vocabulary as llama.cpp's converter writes
// it (types, user-defined space runs as spaces, scores in the order of the
// SentencePiece scores: make_spm_vocab.py says why), cut to the test strings
// but with every added token. gemma3.out: the ids Hugging Face's tokenizer.json
// gives (transformers.js, fixtures/README.md) for llama.cpp's 46 strings, then
// fixtures/gemma3.inp (turn markers, code with tabs and newline runs, HTML,
// CJK, emoji, runs longer than the longest run token, byte fallback).

struct Gemma3 : testing::Test {
  static void SetUpTestSuite() {
    vocab = new CompactGguf(write_compact_gguf("gemma3"));
    tok = load_gguf_tokenizer(vocab->path).release();
    std::filesystem::remove(vocab->path);
  }
  static void TearDownTestSuite() {
    delete tok;
    delete vocab;
  }
  static int32_t id(int32_t original) { return vocab->dense_id.at(original); }
  static std::vector<int32_t> originals(const std::vector<int32_t>& ids) {
    std::vector<int32_t> out;
    for (int32_t i : ids) out.push_back(vocab->original_id.at(static_cast<size_t>(i)));
    return out;
  }
  static std::vector<std::string> strings() {
    auto texts = read_test_strings(kVocabDir + "ggml-vocab-gpt-2.gguf.inp");
    for (auto& t : read_test_strings(kCompactDir + "gemma3.inp")) texts.push_back(t);
    return texts;
  }
  static inline CompactGguf* vocab = nullptr;
  static inline Tokenizer* tok = nullptr;
};

TEST_F(Gemma3, EveryStringTokenizesAsTheModelsTokenizerJson) {
  const auto texts = strings();
  std::ifstream out(kCompactDir + "gemma3.out");
  ASSERT_EQ(texts.size(), 46u + 19u);
  size_t passed = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string line;
    ASSERT_TRUE(std::getline(out, line)) << "gemma3.out has fewer lines than there are strings";
    const auto want = parse_ids(line);
    const auto got = originals(tok->encode(texts[i], /*add_bos=*/false, /*parse_special=*/true));
    if (got != want) {
      ADD_FAILURE() << "string " << i << " " << escaped(texts[i]) << "\n  expected " << ids_str(want) << "\n  got      "
                    << ids_str(got);
      continue;
    }
    ++passed;
    // Without control tokens (which stream as ""), the pieces give the text back.
    const bool has_control = std::any_of(got.begin(), got.end(), [](int32_t o) {
      return tok->token_type(id(o)) == TokenType::Control;
    });
    if (!has_control) {
      EXPECT_EQ(tok->decode(tok->encode(texts[i], false, true)), texts[i]) << "string " << i;
    }
  }
  std::printf("[   INFO   ] gemma3: %zu/%zu strings pass\n", passed, texts.size());
}

TEST_F(Gemma3, NoSpacePrefixBosAndEndOfTurn) {
  EXPECT_EQ(tok->model_name(), "llama");
  // "Hello" is the piece without U+2581: no space is put before the text.
  const auto hello = originals(tok->encode("Hello", true, true));
  ASSERT_EQ(hello.size(), 2u);
  EXPECT_EQ(hello[0], 2);  // <bos>
  EXPECT_EQ(tok->token_text(id(hello[1])), "Hello");
  EXPECT_EQ(originals(tok->encode("<start_of_turn>user\n", false, true)), (std::vector<int32_t>{105, 2364, 107}));
  EXPECT_TRUE(tok->is_eog(id(106)));  // <end_of_turn>
  EXPECT_TRUE(tok->is_eog(id(1)));    // <eos>
  EXPECT_EQ(tok->token_to_piece(id(106)), "");
  // User-defined runs of spaces stream as spaces, newline runs as newlines.
  EXPECT_EQ(tok->token_to_piece(id(140)), "    ");
  EXPECT_EQ(tok->token_to_piece(id(109)), "\n\n\n");
  EXPECT_EQ(tok->token_to_piece(id(255969)), "\t\t");
}

TEST_F(Gemma3, ControlTokensAreTextUnlessParsedUserDefinedOnesAlwaysCut) {
  // Without parse_special, <start_of_turn> (control) is plain text, while the
  // user-defined newline and <b> are still cut out, as llama.cpp does.
  const auto plain = originals(tok->encode("<start_of_turn>\n<b>", false, false));
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 105), 0);
  ASSERT_GE(plain.size(), 3u);
  EXPECT_EQ(plain[plain.size() - 2], 107);
  EXPECT_EQ(plain.back(), 200);
  EXPECT_EQ(tok->decode(tok->encode("<start_of_turn>\n<b>", false, false)), "<start_of_turn>\n<b>");
}

// A long chat prompt through the whole special set (6,414 control and
// user-defined tokens) against the same vocabulary without the 6,242 <unusedN>:
// llama.cpp's partition tries each special text in turn over every fragment,
// so its time grows with the set; here only the texts the prompt holds are
// tried, and the two take about as long. (A ratio, not a time: CI runs this
// under sanitizers on shared cores.)
TEST_F(Gemma3, LongPromptTimeDoesNotGrowWithTheSpecialSet) {
  const CompactGguf few_vocab = write_compact_gguf("gemma3", /*drop_unused=*/true);
  auto few = load_gguf_tokenizer(few_vocab.path);
  std::filesystem::remove(few_vocab.path);
  ASSERT_EQ(tok->n_vocab() - few->n_vocab(), 6242);
  std::string prompt;
  const auto texts = strings();
  while (prompt.size() < 200000)
    for (const auto& t : texts)
      prompt += "<start_of_turn>user\n" + t + "<end_of_turn>\n<start_of_turn>model\n" + t + "<end_of_turn>\n";
  const auto best_ms = [&](const Tokenizer& t, std::vector<int32_t>& ids) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      ids = t.encode(prompt, true, true);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  std::vector<int32_t> ids, few_ids;
  const double all_ms = best_ms(*tok, ids);
  const double few_ms = best_ms(*few, few_ids);
  std::printf("[   INFO   ] gemma3: %zu bytes -> %zu tokens in %.1f ms (%.1f ms without the <unusedN>)\n", prompt.size(),
              ids.size(), all_ms, few_ms);
  EXPECT_LT(all_ms, 2.0 * few_ms + 5.0);
  EXPECT_EQ(tok->decode(tok->encode(prompt, false, false)), prompt);
}

// llama.cpp's tokenizer_st_partition as it reads (llama-vocab.cpp): each
// special text, longest first, cut out of every raw fragment left to right;
// a token marked rstrip also takes the whitespace after it. Not leftmost-longest:
// with "bcd" and "ab", "abcd" gives "a" [bcd], not [ab] "cd".
std::vector<std::pair<int32_t, std::string>> reference_partition(
    const std::string& text, const std::vector<std::pair<std::string, int32_t>>& longest_first, bool rstrip) {
  std::vector<std::pair<int32_t, std::string>> frags{{-1, text}};
  for (const auto& [special, id] : longest_first) {
    std::vector<std::pair<int32_t, std::string>> next;
    for (const auto& [fid, raw] : frags) {
      if (fid >= 0) {
        next.push_back({fid, raw});
        continue;
      }
      std::string rest = raw;
      for (size_t pos; (pos = rest.find(special)) != std::string::npos;) {
        if (pos > 0) next.push_back({-1, rest.substr(0, pos)});
        next.push_back({id, special});
        rest = rest.substr(pos + special.size());
        if (rstrip)
          while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest[0]))) rest.erase(0, 1);
      }
      if (!rest.empty()) next.push_back({-1, rest});
    }
    frags = std::move(next);
  }
  return frags;
}

TEST(SpecialTokens, PartitionIsLlamaCppsOnRandomOverlappingSets) {
  // A SentencePiece vocabulary of single characters plus random special texts
  // over the same alphabet: a raw fragment then encodes character by
  // character, so the ids show the partition exactly. With the name "phi3",
  // llama.cpp (and the tokenizer) mark every special token rstrip.
  std::mt19937 rng(36);
  const std::string alphabet = "abc ";
  for (int round = 0; round < 24; ++round) {
    const bool phi3 = round % 2 == 1;
    std::vector<std::string> texts{"<unk>", "a", "b", "c", "\xE2\x96\x81"};
    std::vector<int32_t> types{2, 1, 1, 1, 1};
    std::vector<std::pair<std::string, int32_t>> specials;
    if (round == 0) {  // where leftmost-longest differs: "abcd" is "a" [bcd]
      texts.insert(texts.end(), {"bcd", "ab"});
      types.insert(types.end(), {4, 4});
      specials = {{"bcd", 5}, {"ab", 6}};
    }
    while (round > 0 && specials.size() < 10) {
      std::string t;
      for (size_t n = 2 + rng() % 4; t.size() < n;) t += alphabet[rng() % alphabet.size()];
      if (std::find(texts.begin(), texts.end(), t) != texts.end()) continue;
      specials.push_back({t, static_cast<int32_t>(texts.size())});
      texts.push_back(t);
      types.push_back(rng() % 2 ? 3 : 4);  // control or user-defined
    }
    std::stable_sort(specials.begin(), specials.end(),
                     [](const auto& l, const auto& r) { return l.first.size() > r.first.size(); });
    atelier::formats::GgufWriter w;
    w.set_string("general.architecture", "llama");
    if (phi3) w.set_string("general.name", "phi3");
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", texts);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_bool("tokenizer.ggml.add_space_prefix", false);
    const auto path = (std::filesystem::temp_directory_path() /
                       ("atelier-tok-partition-" + std::to_string(::getpid()) + ".gguf"))
                          .string();
    w.write(path);
    auto tok = load_gguf_tokenizer(path);
    std::filesystem::remove(path);
    if (round == 0) {
      EXPECT_EQ(tok->encode("abcd", false, true), (std::vector<int32_t>{1, 5}));
    }
    for (int i = 0; i < 100; ++i) {
      std::string text;
      for (size_t n = rng() % 40; text.size() < n;) text += alphabet[rng() % alphabet.size()];
      std::vector<int32_t> want;
      for (const auto& [id, piece] : reference_partition(text, specials, phi3)) {
        if (id >= 0) {
          want.push_back(id);
          continue;
        }
        for (char c : piece) want.push_back(c == ' ' ? 4 : 1 + (c - 'a'));
      }
      ASSERT_EQ(tok->encode(text, false, true), want) << "round " << round << " " << escaped(text);
    }
  }
}

// ---- stories260K: GGUF vocabulary, llama2.c tok512.bin, golden ids ----

std::vector<int32_t> golden_ids() { return parse_ids(read_file(kTextDir + "golden-once-upon-a-time-greedy.ids")); }

TEST(Stories260K, GgufEncodesThePromptLikeTheGolden) {
  auto tok = load_gguf_tokenizer(kTextDir + "stories260K.gguf");
  EXPECT_EQ(tok->model_name(), "llama");
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  const auto ids = tok->encode("Once upon a time", /*add_bos=*/true, /*parse_special=*/false);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  const auto golden = golden_ids();
  ASSERT_GE(golden.size(), 5u);
  EXPECT_EQ(ids, std::vector<int32_t>(golden.begin(), golden.begin() + 5));
  EXPECT_EQ(tok->encode("Once upon a time", false, false), (std::vector<int32_t>{403, 407, 261, 378}));
}

TEST(Stories260K, DecodeRoundTripsAndMatchesTheGoldenText) {
  auto tok = load_gguf_tokenizer(kTextDir + "stories260K.gguf");
  const std::string prompt = "Once upon a time";
  EXPECT_EQ(tok->decode(tok->encode(prompt, true, false)), prompt);
  EXPECT_EQ(tok->decode(tok->encode(prompt, false, false)), prompt);
  std::string golden_txt = read_file(kTextDir + "golden-once-upon-a-time-greedy.txt");
  ASSERT_FALSE(golden_txt.empty());
  ASSERT_EQ(golden_txt.back(), '\n');
  golden_txt.pop_back();
  EXPECT_EQ(tok->decode(golden_ids()), golden_txt);
  // streamed pieces: BOS gives nothing, U+2581 becomes a space, byte tokens their byte
  EXPECT_EQ(tok->token_to_piece(1), "");
  EXPECT_EQ(tok->token_to_piece(403), " Once");
  EXPECT_EQ(tok->token_to_piece(3 + '\n'), "\n");
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_FALSE(tok->is_eog(403));
  for (const std::string s : {"Hello world", "  two  spaces", "line\nbreak\ttab", "caf\xC3\xA9 \xE2\x9C\x85 \xF0\x9F\xA6\x99",
                              "Tom and Lily were best friends."})
    EXPECT_EQ(tok->decode(tok->encode(s, true, false)), s) << escaped(s);
}

TEST(Stories260K, Llama2cTokenizerEncodesLikeTheGguf) {
  auto gguf = load_gguf_tokenizer(kTextDir + "stories260K.gguf");
  const auto vocab = atelier::formats::load_llama2c_tokenizer(kTextDir + "tok512.bin", 512);
  auto bin = Tokenizer::from_llama2c(vocab);
  ASSERT_EQ(bin->n_vocab(), gguf->n_vocab());
  for (int32_t id = 0; id < gguf->n_vocab(); ++id) {
    EXPECT_EQ(bin->token_text(id), gguf->token_text(id)) << "token " << id;
    EXPECT_EQ(bin->token_type(id), gguf->token_type(id)) << "token " << id;
  }
  EXPECT_EQ(bin->encode("Once upon a time", true, false), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  std::string golden_txt = read_file(kTextDir + "golden-once-upon-a-time-greedy.txt");
  const auto cases = read_cases(kVocabDir + "ggml-vocab-llama-spm.gguf");
  std::vector<std::string> texts = {golden_txt, "Lily's mom said: \"No!\"", "  leading", "trailing  ", ""};
  for (const auto& c : cases) texts.push_back(c.text);
  for (const auto& t : texts) {
    EXPECT_EQ(bin->encode(t, true, false), gguf->encode(t, true, false)) << escaped(t);
    EXPECT_EQ(bin->decode(bin->encode(t, true, false)), gguf->decode(gguf->encode(t, true, false))) << escaped(t);
  }
  EXPECT_EQ(bin->decode(golden_ids()), golden_txt.substr(0, golden_txt.size() - 1));
}

// ---- special tokens, BOS/EOS, EOG ----

TEST(SpecialTokens, Llama3JsonParsesSpecialsOnlyWhenAsked) {
  auto tok = Tokenizer::from_hf_json(kVocabDir + "llama3-tokenizer.json");
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_TRUE(tok->is_eog(128009));  // <|eot_id|>
  EXPECT_TRUE(tok->is_eog(128001));  // <|end_of_text|>
  EXPECT_FALSE(tok->is_eog(128000));
  EXPECT_EQ(tok->token_type(128009), TokenType::Control);

  const std::string text = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
  const auto special = tok->encode(text, true, true);
  ASSERT_GE(special.size(), 4u);
  EXPECT_EQ(special[0], 128000);
  EXPECT_EQ(special[1], 128006);
  EXPECT_EQ(special.back(), 128009);
  const auto plain = tok->encode(text, false, false);
  for (auto id : plain) EXPECT_LT(id, 128000) << "special token parsed although parse_special is false";
  // pieces: control tokens give "", normal ones their bytes
  EXPECT_EQ(tok->token_to_piece(128009), "");
  EXPECT_EQ(tok->decode(tok->encode("Hello, world! \xE2\x9C\x85", false, false)), "Hello, world! \xE2\x9C\x85");
}

TEST(SpecialTokens, GgufBpeAddsNoBosUnlessTheModelDoes) {
  auto gpt2 = load_gguf_tokenizer(kVocabDir + "ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(gpt2->encode("Hello", true, false), gpt2->encode("Hello", false, false));
  EXPECT_TRUE(gpt2->is_eog(50256));
  EXPECT_EQ(gpt2->encode("a<|endoftext|>b", false, true).at(1), 50256);
  auto coder = load_gguf_tokenizer(kVocabDir + "ggml-vocab-deepseek-coder.gguf");  // add_bos_token = true
  const auto ids = coder->encode("Hello", true, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 32013);
  EXPECT_TRUE(coder->is_eog(32014));
  EXPECT_EQ(coder->decode(coder->encode("F\xC3\xBChrer", false, false)), "F\xC3\xBChrer");
}

TEST(SpecialTokens, WordPieceAddsClsAndSep) {
  auto bert = load_gguf_tokenizer(kVocabDir + "ggml-vocab-bert-bge.gguf");
  const auto plain = bert->encode("Hello world", false, false);
  auto with = bert->encode("Hello world", true, false);
  ASSERT_EQ(with.size(), plain.size() + 2);
  EXPECT_EQ(with.front(), 101);
  EXPECT_EQ(with.back(), 102);
  EXPECT_EQ(bert->encode("[CLS]", false, true), (std::vector<int32_t>{101}));
  EXPECT_EQ(bert->decode(plain), " hello world");
}

TEST(SpecialTokens, Phi3StripsSpaceAfterUserDefinedEos) {
  // llama.cpp marks phi-3's special tokens rstrip; </s> is user-defined, so it is
  // cut out even without parse_special, and the spaces after it are dropped.
  auto phi = load_gguf_tokenizer(kVocabDir + "ggml-vocab-phi-3.gguf");
  const auto ids = phi->encode("Hi</s>   there", false, false);
  EXPECT_EQ(ids, [&] {
    auto a = phi->encode("Hi", false, false);
    a.push_back(2);
    auto b = phi->encode("there", false, false);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }());
  EXPECT_TRUE(phi->is_eog(32000));  // <|endoftext|>
  EXPECT_TRUE(phi->is_eog(32007));  // <|end|>
}

// ---- robustness: malformed and long input ----

std::string random_utf8(std::mt19937& rng, size_t n_cpts) {
  static const uint32_t kPool[] = {' ', ' ', '\n', '\t', 'a', 'Z', '3', '\'', '!', '.', 0xA0, 0xE9, 0x85, 0x3A9, 0x4E2D,
                                   0x1F999, 0x2003, 0x0301, 0xFF01, 0x3000, 0xAC00, 0x10400};
  std::string s;
  for (size_t i = 0; i < n_cpts; ++i) {
    const uint32_t c = rng() % 3 ? kPool[rng() % std::size(kPool)] : 0x20 + rng() % 0x5F;
    if (c < 0x80) s += static_cast<char>(c);
    else if (c < 0x800) s += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    else if (c < 0x10000)
      s += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
            static_cast<char>(0x80 | (c & 0x3F))};
    else
      s += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
            static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
  }
  return s;
}

TEST(Robustness, MalformedBytesLongInputAndRoundTrips) {
  std::mt19937 rng(1234);
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm", "falcon", "bert-bge"}) {
    auto tok = load_gguf_tokenizer(kVocabDir + "ggml-vocab-" + name + ".gguf");
    for (int i = 0; i < 20; ++i) {
      std::string bytes(static_cast<size_t>(rng() % 64), '\0');
      for (auto& c : bytes) c = static_cast<char>(rng());
      for (bool special : {false, true}) {
        const auto ids = tok->encode(bytes, true, special);
        for (auto id : ids) ASSERT_TRUE(id >= 0 && id < tok->n_vocab()) << name;
        (void)tok->decode(ids);
      }
    }
    const bool round_trips = std::string(name) != "bert-bge";
    for (int i = 0; i < 20 && round_trips; ++i) {
      const std::string text = random_utf8(rng, 1 + rng() % 80);
      EXPECT_EQ(tok->decode(tok->encode(text, false, false)), text) << name << " " << escaped(text);
    }
    // long input: one fragment of 200k characters
    std::string longtext(100000, ' ');
    longtext += std::string(100000, 'a');
    EXPECT_FALSE(tok->encode(longtext, false, false).empty()) << name;
  }
}

// ---- errors ----

std::string write_vocab_gguf(const std::string& model, const std::string& pre) {
  atelier::formats::GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", model);
  if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "\xC4\xA0"});
  w.set_string_array("tokenizer.ggml.merges", {"a b"});
  const auto path = (std::filesystem::temp_directory_path() /
                     ("atelier-tok-" + model + "-" + pre + "-" + std::to_string(::getpid()) + ".gguf"))
                        .string();
  w.write(path);
  return path;
}

TEST(Errors, UnknownPreTokenizerListsTheSupportedOnes) {
  const auto path = write_vocab_gguf("gpt2", "no-such-pre");
  try {
    load_gguf_tokenizer(path);
    ADD_FAILURE() << "no error for an unknown pre-tokenizer";
  } catch (const atelier::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no-such-pre"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const char* name : {"llama3", "gpt-2", "deepseek-coder", "deepseek-llm", "phi-2", "qwen2", "starcoder",
                             "falcon", "mpt", "refact", "default"})
      EXPECT_NE(msg.find(name), std::string::npos) << name << " missing in: " << msg;
  }
  std::filesystem::remove(path);
}

// GPT-2's byte-to-symbol map (bytes_to_unicode in openai/gpt-2's encoder.py:
// printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100
// upwards in byte order), written out here so the expected words below do not
// pass through the tokenizer's own table.
std::string gpt2_symbols(const std::string& raw) {
  const auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  std::string out;
  for (unsigned char c : raw) {
    int cp = c;
    if (!printable(c)) {
      cp = 256;
      for (int b = 0; b < c; ++b) cp += !printable(b);
    }
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// Strings where the pre-tokenizers differ: contractions (upper case too),
// digit runs, punctuation and symbols, white-space runs (trailing, tabs, CR LF,
// U+0085), non-ASCII letters, CJK, kana, Hangul and emoji, camel case,
// chameleon's sentinels, bloom's separators, slashes.
const char* const kPreTokenizerTexts[] = {
    "I'll pay 12345 dollars, they're DON'T we've",
    "1234567 89 0.5 3,000",
    "Hello, world!!! (ok?) $5+3<=8 ^~| `code`",
    "a  b\t\tc \n\n  d   ",
    "caf\xC3\xA9 na\xC3\xAFve \xC3\x91\x61nd\xC3\xBA \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82",
    "\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xF0\x9F\xA6\x99\xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99",
    "HelloWorld CamelCASE ABCdef",
    "<sentinel:12> IMGIMGABZ x",
    "Hi\xE2\x80\xA6 done\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x81ok\xE0\xA5\xA4 end\xDB\x94 \xD8\x8C",
    "line1\r\nline2\n \xC2\x85x",
    "  a/b/c\n",
};

struct PreTokenizerSplits {
  std::vector<const char*> names;
  std::vector<std::vector<std::string>> words;  // kPreTokenizerTexts[i] splits into words[i]
};

// Expected splits, NOT the tokenizer's output: llama.cpp's regexes for each
// name (src/llama-vocab.cpp at 00ad355e: the tokenizer.ggml.pre name table and
// llm_tokenizer_bpe's regex_exprs) applied with Python's `regex` module
// (2026.5.9) as llama.cpp's unicode_regex_split chains them: each regex splits
// every piece the previous one left into its matches and the stretches
// between them. Names that share a line share llama.cpp's regexes. gpt-4o:
// tiktoken's own o200k pattern (as in gpt-oss's tokenizer.json), which the
// tokenizer runs instead of llama.cpp's approximation of it (bpe.cpp says why).
const std::vector<PreTokenizerSplits>& pre_tokenizer_splits() {
  static const std::vector<PreTokenizerSplits> table = {
    {{"default"},
     {
      {"I", "'", "ll", " pay", " ", "123", "45", " dollars", ",", " they", "'", "re", " DON", "'", "T", " we", "'", "ve"},
      {"123", "456", "7", " ", "89", " ", "0", ".", "5", " ", "3", ",", "000"},
      {"Hello", ",", " world", "!!!", " ", "(", "ok", "?)", " ", "$", "5", "+", "3", "<=", "8", " ", "^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\t", "c", " \n\n ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<", "sentinel", ":", "12", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " ", "\xD8\x8C"},
      {"line", "1", "\r", "\n", "line", "2", "\n ", "\xC2\x85", "x"},
      {" ", " a", "/", "b", "/", "c", "\n"},
     }},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "chatglm-bpe"},
     {
      {"I", "'ll", " pay", " ", "123", "45", " dollars", ",", " they", "'re", " DON", "'T", " we", "'ve"},
      {"123", "456", "7", " ", "89", " ", "0", ".", "5", " ", "3", ",", "000"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\tc", " \n\n", " ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<sentinel", ":", "12", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r\n", "line", "2", "\n", " ", "\xC2\x85x"},
      {" ", " a", "/b", "/c", "\n"},
     }},
    {{"deepseek-llm"},
     {
      {"I", "'", "ll", " pay", " ", "12345", " dollars", ",", " they", "'", "re", " DON", "'", "T", " we", "'", "ve"},
      {"1234567", " ", "89", " ", "0", ".", "5", " ", "3", ",", "000"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\tc", " ", "\n", "\n", " ", " d", "   "},
      {"caf", "\xC3\xA9", " na", "\xC3\xAF", "ve", " \xC3\x91", "and", "\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80 ", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<", "sentinel", ":", "12", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94 \xD8\x8C"},
      {"line", "1", "\r", "\n", "line", "2", "\n", " ", "\xC2\x85x"},
      {" ", " a", "/", "b", "/", "c", "\n"},
     }},
    {{"deepseek-v3"},
     {
      {"I", "'ll", " pay", " ", "123", "45", " dollars", ",", " they", "'re", " DON", "'T", " we", "'ve"},
      {"123", "456", "7", " ", "89", " ", "0", ".", "5", " ", "3", ",", "000"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\tc", " \n\n", " ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88", "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " ", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<sentinel", ":", "12", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r\n", "line", "2", "\n", " ", "\xC2\x85x"},
      {" ", " a", "/b", "/c", "\n"},
     }},
    {{"deepseek-coder"},
     {
      {"I", "'", "ll", " pay", " ", "1", "2", "3", "4", "5", " dollars", ",", " they", "'", "re", " DON", "'", "T", " we", "'", "ve"},
      {"1", "2", "3", "4", "5", "6", "7", " ", "8", "9", " ", "0", ".", "5", " ", "3", ",", "0", "0", "0"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~| `", "code", "`"},
      {"a", " ", " b", "\t", "\tc", " ", "\n", "\n", " ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " ", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<", "sentinel", ":", "1", "2", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r", "\n", "line", "2", "\n", " ", "\xC2\x85x"},
      {" ", " a", "/", "b", "/", "c", "\n"},
     }},
    {{"falcon"},
     {
      {"I", "'", "ll", " pay", " ", "123", "45", " dollars", ",", " they", "'", "re", " DON", "'", "T", " we", "'", "ve"},
      {"123", "456", "7", " 89", " 0", ".", "5", " 3", ",", "000"},
      {"Hello", ",", " world", "!!!", " ", "(", "ok", "?)", " ", "$", "5", "+", "3", "<=", "8", " ", "^~|", " ", "`", "code", "`"},
      {"a", " ", " b", "\t", "\t", "c", " \n\n ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<", "sentinel", ":", "12", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " ", "\xD8\x8C"},
      {"line", "1", "\r", "\n", "line", "2", "\n ", "\xC2\x85", "x"},
      {" ", " a", "/", "b", "/", "c", "\n"},
     }},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
     {
      {"I", "'ll", " pay", " ", "1", "2", "3", "4", "5", " dollars", ",", " they", "'re", " DON", "'", "T", " we", "'ve"},
      {"1", "2", "3", "4", "5", "6", "7", " ", "8", "9", " ", "0", ".", "5", " ", "3", ",", "0", "0", "0"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\t", "c", " \n\n ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<", "sentinel", ":", "1", "2", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r", "\n", "line", "2", "\n ", "\xC2\x85", "x"},
      {" ", " a", "/", "b", "/", "c", "\n"},
     }},
    {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe"},
     {
      {"I", "'ll", " pay", " 12345", " dollars", ",", " they", "'re", " DON", "'", "T", " we", "'ve"},
      {"1234567", " 89", " 0", ".", "5", " 3", ",", "000"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\t", "c", " \n\n ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<", "sentinel", ":", "12", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r", "\n", "line", "2", "\n ", "\xC2\x85", "x"},
      {" ", " a", "/", "b", "/", "c", "\n"},
     }},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"},
     {
      {"I", "'ll", " pay", " ", "1", "2", "3", "4", "5", " dollars", ",", " they", "'re", " DON", "'T", " we", "'ve"},
      {"1", "2", "3", "4", "5", "6", "7", " ", "8", "9", " ", "0", ".", "5", " ", "3", ",", "0", "0", "0"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\tc", " \n\n", " ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<sentinel", ":", "1", "2", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r\n", "line", "2", "\n", " ", "\xC2\x85x"},
      {" ", " a", "/b", "/c", "\n"},
     }},
    {{"gpt-4o", "llama4"},
     {
      {"I'll", " pay", " ", "123", "45", " dollars", ",", " they're", " DON'T", " we've"},
      {"123", "456", "7", " ", "89", " ", "0", ".", "5", " ", "3", ",", "000"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\tc", " \n\n", " ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91" "and\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"Hello", "World", " Camel", "CASE", " ABCdef"},
      {"<sentinel", ":", "12", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r\n", "line", "2", "\n", " ", "\xC2\x85x"},
      {" ", " a", "/b", "/c", "\n"},
     }},
    {{"qwen35"},
     {
      {"I", "'ll", " pay", " ", "1", "2", "3", "4", "5", " dollars", ",", " they", "'re", " DON", "'T", " we", "'ve"},
      {"1", "2", "3", "4", "5", "6", "7", " ", "8", "9", " ", "0", ".", "5", " ", "3", ",", "0", "0", "0"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\tc", " \n\n", " ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91" "and\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<sentinel", ":", "1", "2", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r\n", "line", "2", "\n", " ", "\xC2\x85x"},
      {" ", " a", "/b", "/c", "\n"},
     }},
    {{"poro-chat", "bloom", "gpt3-finnish"},
     {
      {"I'll", " pay", " 12345", " dollars", ",", " they're", " DON'T", " we've"},
      {"1234567", " 89", " 0", ".", "5", " 3", ",", "000"},
      {"Hello", ",", " world", "!!! (", "ok", "?)", " $5+3<=8", " ^~", "|", " `code`"},
      {"a", " ", " b", "\t\t", "c", " \n\n ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<sentinel:12>", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94 \xD8\x8C"},
      {"line1", "\r\n", "line2", "\n \xC2\x85", "x"},
      {" ", " a/b/c", "\n"},
     }},
    {{"viking"},
     {
      {"I'll", " pay", " ", "1", "2", "3", "4", "5", " dollars", ",", " they're", " DON'T", " we've"},
      {"1", "2", "3", "4", "5", "6", "7", " ", "8", "9", " ", "0", ".", "5", " ", "3", ",", "0", "0", "0"},
      {"Hello", ",", " world", "!!! (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~", "|", " `code`"},
      {"a", " ", " b", "\t\t", "c", " \n\n ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<sentinel:", "1", "2", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94 \xD8\x8C"},
      {"line", "1", "\r\n", "line", "2", "\n \xC2\x85", "x"},
      {" ", " a/b/c", "\n"},
     }},
    {{"tekken"},
     {
      {"I", "'ll", " pay", " ", "1", "2", "3", "4", "5", " dollars", ",", " they", "'re", " DON", "'T", " we", "'ve"},
      {"1", "2", "3", "4", "5", "6", "7", " ", "8", "9", " ", "0", ".", "5", " ", "3", ",", "0", "0", "0"},
      {"Hello", ",", " world", "!!!", " (", "ok", "?)", " $", "5", "+", "3", "<=", "8", " ^~|", " `", "code", "`"},
      {"a", " ", " b", "\t", "\tc", " \n\n", " ", " d", "   "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"Hello", "World", " Camel", "CASE", " ABCdef"},
      {"<sentinel", ":", "1", "2", ">", " IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " \xD8\x8C"},
      {"line", "1", "\r\n", "line", "2", "\n", " ", "\xC2\x85x"},
      {" ", " a", "/b", "/c", "\n"},
     }},
    {{"chameleon"},
     {
      {"I", "'", "ll", " pay", " ", "1", "2", "3", "4", "5", " dollars", ",", " they", "'", "re", " DON", "'", "T", " we", "'", "ve"},
      {"1", "2", "3", "4", "5", "6", "7", " ", "8", "9", " ", "0", ".", "5", " ", "3", ",", "0", "0", "0"},
      {"Hello", ",", " world", "!", "!", "!", " ", "(", "ok", "?", ")", " ", "$", "5", "+", "3", "<", "=", "8", " ", "^", "~", "|", " ", "`", "code", "`"},
      {"a", "  ", "b", "\t", "\t", "c", " ", "\n", "\n", "  ", "d", "  ", " "},
      {"caf\xC3\xA9", " na\xC3\xAFve", " \xC3\x91\x61nd\xC3\xBA", " \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82"},
      {"\xE4\xB8\xAD\xE6\x96\x87\xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", " \xF0\x9F\xA6\x99\xF0\x9F\x98\x80", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99"},
      {"HelloWorld", " CamelCASE", " ABCdef"},
      {"<", "sentinel", ":", "1", "2", ">", " ", "IMGIMGABZ", " x"},
      {"Hi", "\xE2\x80\xA6", " done", "\xE3\x80\x82", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xE4\xB8\x96\xE7\x95\x8C", "\xE3\x80\x81", "ok", "\xE0\xA5\xA4", " end", "\xDB\x94", " ", "\xD8\x8C"},
      {"line", "1", "\r", "\n", "line", "2", "\n", " ", "\xC2\x85", "x"},
      {"  ", "a", "/", "b", "/", "c", "\n"},
     }},
  };
  return table;
}

TEST(PreTokenizers, EveryNamedPreTokenizerSplitsAsLlamaCppsRegexes) {
  // each name llama.cpp accepts (tokenizer.ggml.pre), with a 4-token vocabulary
  size_t names = 0;
  for (const auto& group : pre_tokenizer_splits()) {
    ASSERT_EQ(group.words.size(), std::size(kPreTokenizerTexts));
    for (const char* pre : group.names) {
      ++names;
      const auto path = write_vocab_gguf("gpt2", pre);
      try {
        auto tok = load_gguf_tokenizer(path);
        EXPECT_EQ(tok->encode("ab ab", false, false), (std::vector<int32_t>{2, 3, 2})) << pre;
        const auto* bpe = dynamic_cast<const atelier::tok::BpeTokenizer*>(tok.get());
        ASSERT_NE(bpe, nullptr) << pre;
        for (size_t i = 0; i < group.words.size(); ++i) {
          std::vector<std::string> want;
          for (const auto& w : group.words[i]) want.push_back(gpt2_symbols(w));
          EXPECT_EQ(bpe->pre_tokenize(kPreTokenizerTexts[i]), want) << pre << " on " << escaped(kPreTokenizerTexts[i]);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << pre << ": " << e.what();
      }
      std::filesystem::remove(path);
    }
  }
  EXPECT_EQ(names, 45u);  // every name the table of llama.cpp's above lists
}

// Where the new pre-tokenizers differ from their neighbours: combining marks
// (qwen35 and o200k keep them in the word, qwen2 does not), non-ASCII
// capitals and contractions inside camel case (o200k), digit groups. Expected
// splits made as the table above (qwen2, qwen35: llama.cpp's regexes; gpt-4o:
// tiktoken's pattern), with Python's `regex`.
const char* const kMarkAndCaseTexts[] = {
    "cafe\xCC\x81 nai\xCC\x88ve \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 \xE0\xA4\xA6\xE0\xA5\x81\xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xAF\xE0\xA4\xBE",
    "foo\xC3\x84" "bar na\xC3\xAFveTest HelloWorld's DON'T I'M \xC3\x89" "COLE \xC3\xA9" "cole's",
    "x=12345678;\n\ty/=3 // AI\r\n\r\n",
};

const std::vector<PreTokenizerSplits>& mark_and_case_splits() {
  static const std::vector<PreTokenizerSplits> table = {
    {{"qwen2"},
     {
      {"cafe", "\xCC\x81", " nai", "\xCC\x88ve", " \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8", "\xE0\xA5\x8D\xE0\xA4\xA4", "\xE0\xA5\x87", " \xE0\xA4\xA6", "\xE0\xA5\x81\xE0\xA4\xA8", "\xE0\xA4\xBF\xE0\xA4\xAF", "\xE0\xA4\xBE"},
      {"foo\xC3\x84" "bar", " na\xC3\xAFveTest", " HelloWorld", "'s", " DON", "'T", " I", "'M", " \xC3\x89" "COLE", " \xC3\xA9" "cole", "'s"},
      {"x", "=", "1", "2", "3", "4", "5", "6", "7", "8", ";\n", "\ty", "/=", "3", " //", " AI", "\r\n\r\n"},
     }},
    {{"qwen35"},
     {
      {"cafe\xCC\x81", " nai\xCC\x88ve", " \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87", " \xE0\xA4\xA6\xE0\xA5\x81\xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xAF\xE0\xA4\xBE"},
      {"foo\xC3\x84" "bar", " na\xC3\xAFveTest", " HelloWorld", "'s", " DON", "'T", " I", "'M", " \xC3\x89" "COLE", " \xC3\xA9" "cole", "'s"},
      {"x", "=", "1", "2", "3", "4", "5", "6", "7", "8", ";\n", "\ty", "/=", "3", " //", " AI", "\r\n\r\n"},
     }},
    {{"gpt-4o"},
     {
      {"cafe\xCC\x81", " nai\xCC\x88ve", " \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87", " \xE0\xA4\xA6\xE0\xA5\x81\xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xAF\xE0\xA4\xBE"},
      {"foo", "\xC3\x84" "bar", " na\xC3\xAFve", "Test", " Hello", "World's", " DON'T", " I'M", " \xC3\x89" "COLE", " \xC3\xA9" "cole's"},
      {"x", "=", "123", "456", "78", ";\n", "\ty", "/=", "3", " //", " AI", "\r\n\r\n"},
     }},
  };
  return table;
}

TEST(PreTokenizers, Qwen35AndO200kKeepMarksAndSplitCamelCase) {
  for (const auto& group : mark_and_case_splits()) {
    ASSERT_EQ(group.words.size(), std::size(kMarkAndCaseTexts));
    const auto path = write_vocab_gguf("gpt2", group.names[0]);
    auto tok = load_gguf_tokenizer(path);
    std::filesystem::remove(path);
    const auto* bpe = dynamic_cast<const atelier::tok::BpeTokenizer*>(tok.get());
    ASSERT_NE(bpe, nullptr);
    for (size_t i = 0; i < group.words.size(); ++i) {
      std::vector<std::string> want;
      for (const auto& w : group.words[i]) want.push_back(gpt2_symbols(w));
      EXPECT_EQ(bpe->pre_tokenize(kMarkAndCaseTexts[i]), want) << group.names[0] << " on " << escaped(kMarkAndCaseTexts[i]);
    }
  }
}

TEST(PreTokenizers, O200kOnLongRunsIsLinear) {
  // A regex that backtracks per letter, or keeps a JIT frame per letter, fails
  // or takes seconds here; 200k characters in one fragment must not.
  const auto path = write_vocab_gguf("gpt2", "gpt-4o");
  auto tok = load_gguf_tokenizer(path);
  std::filesystem::remove(path);
  const auto* bpe = dynamic_cast<const atelier::tok::BpeTokenizer*>(tok.get());
  ASSERT_NE(bpe, nullptr);
  std::string khmer;
  for (int i = 0; i < 20000; ++i) khmer += "\xE1\x9E\x80\xE1\x9F\x8B";  // KA + a combining mark
  EXPECT_EQ(bpe->pre_tokenize(std::string(200000, 'A')).size(), 1u);
  EXPECT_EQ(bpe->pre_tokenize(std::string(200000, 'a')).size(), 1u);
  EXPECT_EQ(bpe->pre_tokenize("x" + std::string(200000, 'A')).size(), 2u);  // "x", then the capitals
  EXPECT_EQ(bpe->pre_tokenize(khmer).size(), 1u);
}

TEST(Errors, UnsupportedModelAndBadJson) {
  const auto path = write_vocab_gguf("t5", "");
  EXPECT_THROW(load_gguf_tokenizer(path), atelier::Error);
  std::filesystem::remove(path);
  EXPECT_THROW(Tokenizer::from_hf_json(kFixtures + "/no-such-tokenizer.json"), atelier::Error);
  EXPECT_THROW(Tokenizer::from_hf_json(kVocabDir + "ggml-vocab-gpt-2.gguf.inp"), atelier::Error);
}

TEST(Errors, TinyGgufBpeMergesAndPieces) {
  const auto path = write_vocab_gguf("gpt2", "gpt-2");
  auto tok = load_gguf_tokenizer(path);
  EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{2}));
  EXPECT_EQ(tok->encode("ba b", false, false), (std::vector<int32_t>{1, 0, 3, 1}));  // " b" has no merge
  EXPECT_EQ(tok->token_to_piece(3), " ");
  EXPECT_THROW(tok->token_to_piece(4), atelier::Error);
  std::filesystem::remove(path);
}

}  // namespace
