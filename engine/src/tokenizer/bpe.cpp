// Byte-level BPE ("gpt2"), as llama.cpp's llm_tokenizer_bpe: the text is split
// by the pre-tokenizer regexes that tokenizer.ggml.pre names (each regex splits
// the pieces the previous one left, keeping unmatched stretches as pieces of
// their own, like llama.cpp's unicode_regex_split), every piece is mapped to
// GPT-2's byte symbols and merged by merge rank, lowest first.
//
// The regexes run on PCRE2 (UTF + UCP, JIT), so \p{L}, \p{N}, \p{P} are the
// Unicode classes. \s is widened by U+0085, which llama.cpp counts as white
// space; `$` matches only at the end of a piece (PCRE2_DOLLAR_ENDONLY), as in
// std::regex, which llama.cpp uses.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace atelier::tok {

namespace {

const char* const kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen 3.5: as kQwen2, with combining marks (\p{M}) kept in words.
const char* const kQwen35 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// o200k (GPT-4o, gpt-oss, Phi-4-mini, Llama 4): tiktoken's own pattern, which
// PCRE2 runs as it is. llama.cpp runs an approximation ("(?=[\p{L}])([^a-z])"
// for the upper-case classes) that splits combining marks off their letters
// and a non-ASCII capital off a word: on Khmer text it gives other tokens
// than tiktoken and the model's tokenizer.json (see tests/tokenizer).
const char* const kGpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const char* const kBloom = " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+";
const char* const kTekken =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+"
    "((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreTokenizer {
  std::vector<const char*> names;
  std::vector<std::string> regexes;
};

const std::vector<PreTokenizer>& pre_tokenizers() {
  static const std::vector<PreTokenizer> table = {
      {{"default"},
       {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "chatglm-bpe"}, {kLlama3}},
      {{"deepseek-llm"},
       {"[\r\n]",
        "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
        "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+", "\\s+$", "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}+"}},
      {{"deepseek-v3"},
       {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
        "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
      {{"deepseek-coder"}, {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}"}},
      {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {"\\p{N}", kGpt2}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es",
        "jina-v2-de", "jina-v2-code", "roberta-bpe"},
       {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2}},
      {{"qwen35"}, {kQwen35}},
      {{"gpt-4o", "llama4"}, {kGpt4o}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kBloom}},
      {{"viking"}, {kBloom, "\\p{N}"}},
      {{"tekken"}, {kTekken}},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]", kGpt2}},
  };
  return table;
}

// \s -> [\s\x{85}] (llama.cpp's white space includes U+0085; PCRE2's \s does not).
std::string widen_whitespace(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      if (d == 's')
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      else if (d == 'S' && !in_class)
        out += "[^\\s\\x{85}]";
      else
        out += {c, d};
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state (the compiled patterns are shared).
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  if (!state.data || !state.context) throw Error("tokenizer: out of memory for regex matching");
  return state;
}

}  // namespace

struct BpeTokenizer::Regex {
  std::string source;
  pcre2_code* code = nullptr;

  Regex(const std::string& pattern, const std::string& origin) : source(pattern) {
    const std::string p = widen_whitespace(pattern);
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_offset, nullptr);
    if (!code)
      throw Error(origin + ": pre-tokenizer regex /" + pattern + "/ does not compile: " + pcre2_message(err) +
                  " (at offset " + std::to_string(err_offset) + ")");
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Splits subject[begin, end) into matches and the stretches between them.
  void split(const std::string& subject, size_t begin, size_t end, std::vector<std::pair<size_t, size_t>>& out) const {
    MatchState& st = match_state();
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data() + begin);
    const size_t len = end - begin;
    size_t pos = 0, last = 0;
    while (pos < len) {
      const int rc = pcre2_match(code, s, len, pos, PCRE2_NO_UTF_CHECK, st.data, st.context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) throw Error("tokenizer: pre-tokenizer regex failed: " + pcre2_message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
      const size_t ms = ov[0], me = ov[1];
      if (me <= ms) {  // empty match: step over one character
        pos = ms + 1;
        while (pos < len && (subject[begin + pos] & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (ms > last) out.emplace_back(begin + last, begin + ms);
      out.emplace_back(begin + ms, begin + me);
      last = pos = me;
    }
    if (last < len) out.emplace_back(begin + last, end);
  }
};

std::vector<std::string> BpeTokenizer::pre_tokenizer_regexes(const std::string& pre, const std::string& source) {
  const std::string name = pre.empty() ? "default" : pre;  // llama.cpp warns and uses default
  std::string supported;
  for (const auto& p : pre_tokenizers()) {
    for (const char* n : p.names) {
      if (name == n) return p.regexes;
      supported += supported.empty() ? "" : ", ";
      supported += n;
    }
  }
  throw UnsupportedError(source + ": pre-tokenizer '" + pre + "' (tokenizer.ggml.pre) is not supported; supported: " + supported);
}

BpeTokenizer::BpeTokenizer(VocabSpec& spec) {
  init_vocab(spec);
  const std::vector<std::string> patterns =
      spec.regexes ? *spec.regexes : pre_tokenizer_regexes(spec.pre, spec.source);
  for (const auto& p : patterns) regexes_.push_back(std::make_unique<Regex>(p, spec.source));
  ranks_.reserve(spec.merges.size());
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const auto& [l, r] = spec.merges[i];
    ranks_.emplace(std::to_string(l.size()) + ":" + l + r, static_cast<int>(i));  // the first (lowest) rank wins
  }
  ignore_merges_ = spec.ignore_merges;
  prefix_space_ = spec.hf_add_prefix_space;
}

BpeTokenizer::~BpeTokenizer() = default;

int BpeTokenizer::rank(std::string_view left, std::string_view right) const {
  std::string key = std::to_string(left.size());
  key += ':';
  key += left;
  key += right;
  const auto it = ranks_.find(key);
  return it == ranks_.end() ? -1 : it->second;
}

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view text) const {
  // Code points as llama.cpp reads them (malformed bytes become U+FFFD), re-encoded.
  std::string subject;
  subject.reserve(text.size() + 4);
  if (prefix_space_ && !text.empty() && text[0] != ' ') subject += ' ';
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cpt = unicode::next_cpt(text, pos);
    if (cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) cpt = 0xFFFD;
    unicode::append_utf8(subject, cpt);
  }
  std::vector<std::pair<size_t, size_t>> pieces{{0, subject.size()}}, next;
  if (subject.empty()) pieces.clear();
  for (const auto& re : regexes_) {
    next.clear();
    for (const auto& [b, e] : pieces) re->split(subject, b, e, next);
    pieces.swap(next);
  }
  std::vector<std::string> words;
  words.reserve(pieces.size());
  for (const auto& [b, e] : pieces) {
    std::string w;
    w.reserve((e - b) * 2);
    for (size_t i = b; i < e; ++i) w += unicode::byte_to_symbol(static_cast<uint8_t>(subject[i]));
    words.push_back(std::move(w));
  }
  return words;
}

namespace {
using Symbol = MergeSymbol;
struct Bigram {
  int left, right;
  int rank;
  size_t size;
  std::string text;
};
struct BigramGreater {  // the queue's top: lowest rank, then leftmost
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};
}  // namespace

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t id = find_token(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> symbols = split_symbols(word);
  std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater> queue;
  const auto add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const std::string_view lt(word.data() + l.offset, l.n), rt(word.data() + r.offset, r.n);
    const int rk = rank(lt, rt);
    if (rk < 0) return;
    queue.push({left, right, rk, l.n + r.n, std::string(lt) + std::string(rt)});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<size_t>(b.left)];
    Symbol& r = symbols[static_cast<size_t>(b.right)];
    if (l.n == 0 || r.n == 0) continue;
    if (l.n + r.n != b.size || word.compare(l.offset, b.size, b.text) != 0 || l.offset + l.n != r.offset)
      continue;  // outdated
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = b.left;
    add(l.prev, b.left);
    add(b.left, l.next);
  }
  for (const Symbol& s : symbols) {
    if (s.n == 0) continue;
    const std::string_view piece(word.data() + s.offset, s.n);
    const int32_t id = find_token(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char c : piece) {  // as llama.cpp: single bytes of the symbol text, where they are tokens
      const int32_t b = find_token(std::string_view(&c, 1));
      if (b >= 0) out.push_back(b);
    }
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos && add_bos_) out.push_back(bos_);
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    for (const std::string& word : pre_tokenize(text.substr(f.offset, f.length))) encode_word(word, out);
  }
  if (add_bos && add_eos_) out.push_back(eos_);
  return out;
}

std::string BpeTokenizer::token_to_piece(int32_t id) const {
  check_id(id);
  const std::string& text = texts_[static_cast<size_t>(id)];
  switch (types_[static_cast<size_t>(id)]) {
    case TokenType::UserDefined:
      return text;
    case TokenType::Normal: {
      std::string out;
      out.reserve(text.size());
      for (size_t pos = 0; pos < text.size();) {
        const size_t start = pos;
        const uint32_t cpt = unicode::next_cpt(text, pos);
        const int b = unicode::symbol_to_byte(cpt);
        if (b >= 0)
          out += static_cast<char>(b);
        else
          out.append(text, start, pos - start);  // not a byte symbol: keep it
      }
      return out;
    }
    default:  // control, unknown, unused, undefined, byte
      return {};
  }
}

}  // namespace atelier::tok
