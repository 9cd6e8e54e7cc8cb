// Jinja renderer for chat templates (see chat_template.h).
//
// Implemented: text, {{ }}, {% %}, {# #} with trim_blocks + lstrip_blocks and
// the -/+ whitespace controls; if/elif/else, for (tuple targets, inline if,
// else, loop.* variables, break/continue), set (names, tuples, ns.attr,
// block set), macro (positional/keyword args, defaults), filter blocks,
// generation blocks (body rendered). Expressions: literals, lists, dicts,
// tuples (as lists), attribute/subscript/slices, arithmetic like Python,
// ~, comparisons, in/not in, and/or/not, ternaries, `is` tests, filters, the
// globals range/namespace/dict/raise_exception/strftime_now and the common
// str/dict methods.
// Not implemented: template inheritance/include/import, call blocks and
// `caller`, recursive loops, loop.cycle/changed/depth, *args/**kwargs in
// macros, str.format and `%` string formatting, autoescape, list mutation
// (append etc., refused as in the immutable sandbox).
#include "text/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace atelier::text {
namespace {

using json = nlohmann::ordered_json;

struct JErr {
  int line;
  std::string msg;
};

[[noreturn]] void fail(int line, std::string msg) { throw JErr{line, std::move(msg)}; }

// ------------------------------------------------------------------ lexer

enum class TT { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, End };

struct Token {
  TT t;
  std::string s;
  int line;
  int64_t i = 0;
  double f = 0;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_next = false;  // `-%}` etc.: strip leading whitespace of next text
    bool trim_next = false;   // trim_blocks: drop one newline
    while (pos < src_.size()) {
      size_t open = find_open(pos);
      std::string text(src_.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
      size_t text_start = pos;
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
        text_start += k;
      } else if (trim_next) {
        if (text.size() >= 1 && text[0] == '\n') text.erase(0, 1);
        else if (text.size() >= 2 && text[0] == '\r' && text[1] == '\n') text.erase(0, 2);
      }
      strip_next = trim_next = false;
      if (open == std::string_view::npos) {
        push_text(text);
        break;
      }
      char kind = src_[open + 1];
      char mod = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (mod == '-') {
        size_t k = text.size();
        while (k > 0 && is_space(text[k - 1])) --k;
        text.resize(k);
      } else if ((kind == '%' || kind == '#') && mod != '+') {
        // lstrip_blocks: spaces/tabs between a line start and the tag
        size_t k = text.size();
        while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
        size_t abs = open - (text.size() - k);
        if (k > 0 ? text[k - 1] == '\n' : (abs == 0 || src_[abs - 1] == '\n')) text.resize(k);
      }
      push_text(text);
      (void)text_start;
      line_ = line_at(open);
      pos = open + 2;
      if (mod == '-' || mod == '+') ++pos;
      if (kind == '#') {
        size_t close = src_.find("#}", pos);
        if (close == std::string_view::npos) fail(line_, "missing end of comment tag");
        strip_next = close > pos && src_[close - 1] == '-';
        trim_next = !strip_next;
        pos = close + 2;
        continue;
      }
      if (kind == '%' && is_raw(pos)) {
        pos = lex_raw(pos, strip_next, trim_next);
        continue;
      }
      toks_.push_back({kind == '%' ? TT::BlockBegin : TT::VarBegin, "", line_});
      std::string close = kind == '%' ? "%}" : "}}";
      pos = lex_inside(pos, close, strip_next);
      trim_next = kind == '%' && !strip_next;
      toks_.push_back({kind == '%' ? TT::BlockEnd : TT::VarEnd, "", line_});
    }
    toks_.push_back({TT::End, "", line_at(src_.size())});
    return std::move(toks_);
  }

 private:
  std::string_view src_;
  std::vector<Token> toks_;
  int line_ = 1;
  size_t line_pos_ = 0;
  int line_cnt_ = 1;

  int line_at(size_t p) {
    if (p < line_pos_) {
      line_pos_ = 0;
      line_cnt_ = 1;
    }
    for (; line_pos_ < p && line_pos_ < src_.size(); ++line_pos_)
      if (src_[line_pos_] == '\n') ++line_cnt_;
    return line_cnt_;
  }

  void push_text(const std::string& t) {
    if (!t.empty()) toks_.push_back({TT::Text, t, line_});
  }

  size_t find_open(size_t pos) const {
    while (true) {
      size_t p = src_.find('{', pos);
      if (p == std::string_view::npos || p + 1 >= src_.size()) return std::string_view::npos;
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  bool is_raw(size_t pos) const {
    size_t p = pos;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.substr(p, 3) != "raw") return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    return src_.substr(p, 2) == "%}" || src_.substr(p, 3) == "-%}";
  }

  size_t lex_raw(size_t pos, bool& strip_next, bool& trim_next) {
    size_t p = src_.find("%}", pos);
    bool strip = src_[p - 1] == '-';
    p += 2;
    // find {% endraw %}
    size_t q = p;
    while (true) {
      q = src_.find("{%", q);
      if (q == std::string_view::npos) fail(line_, "missing endraw");
      size_t r = q + 2;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) ++r;
      while (r < src_.size() && is_space(src_[r])) ++r;
      if (src_.substr(r, 6) == "endraw") {
        std::string body(src_.substr(p, q - p));
        if (strip) {
          size_t k = 0;
          while (k < body.size() && is_space(body[k])) ++k;
          body.erase(0, k);
        } else if (!body.empty() && body[0] == '\n') {
          body.erase(0, 1);
        }
        if (src_[q + 2] == '-') {
          size_t k = body.size();
          while (k > 0 && is_space(body[k - 1])) --k;
          body.resize(k);
        }
        push_text(body);
        size_t e = src_.find("%}", r);
        if (e == std::string_view::npos) fail(line_, "missing end of raw tag");
        strip_next = src_[e - 1] == '-';
        trim_next = !strip_next;
        return e + 2;
      }
      q += 2;
    }
  }

  size_t lex_inside(size_t pos, const std::string& close, bool& strip) {
    strip = false;
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      line_ = line_at(pos);
      if (pos >= src_.size()) fail(line_, "unexpected end of template, expected '" + close + "'");
      if (src_[pos] == '-' && src_.substr(pos + 1, 2) == close) {
        strip = true;
        return pos + 3;
      }
      if (src_[pos] == '+' && src_.substr(pos + 1, 2) == close) return pos + 3;
      if (src_.substr(pos, 2) == close) return pos + 2;
      char c = src_[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        toks_.push_back({TT::Name, std::string(src_.substr(pos, e - pos)), line_});
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        bool flt = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          flt = true;
          ++e;
          while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t k = e + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
            flt = true;
            e = k;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string num;
        for (size_t k = pos; k < e; ++k)
          if (src_[k] != '_') num += src_[k];
        Token t{flt ? TT::Float : TT::Int, num, line_};
        if (flt) {
          t.f = std::strtod(num.c_str(), nullptr);
        } else {
          errno = 0;
          t.i = std::strtoll(num.c_str(), nullptr, 10);
          if (errno == ERANGE) fail(line_, "integer literal too large");
        }
        toks_.push_back(t);
        pos = e;
      } else if (c == '"' || c == '\'') {
        std::string s;
        size_t e = pos + 1;
        while (true) {
          if (e >= src_.size()) fail(line_, "unexpected end of string");
          char d = src_[e];
          if (d == c) break;
          if (d == '\\' && e + 1 < src_.size()) {
            char x = src_[e + 1];
            e += 2;
            switch (x) {
              case 'n': s += '\n'; break;
              case 't': s += '\t'; break;
              case 'r': s += '\r'; break;
              case 'b': s += '\b'; break;
              case 'f': s += '\f'; break;
              case 'v': s += '\v'; break;
              case 'a': s += '\a'; break;
              case '0': s += '\0'; break;
              case '\\': s += '\\'; break;
              case '\'': s += '\''; break;
              case '"': s += '"'; break;
              case '\n': break;
              case 'x':
              case 'u':
              case 'U': {
                int n = x == 'x' ? 2 : x == 'u' ? 4 : 8;
                if (e + n > src_.size()) fail(line_, "bad escape");
                uint32_t cp = static_cast<uint32_t>(std::strtoul(std::string(src_.substr(e, n)).c_str(), nullptr, 16));
                e += n;
                append_utf8(s, cp);
                break;
              }
              default:
                s += '\\';
                s += x;
            }
            continue;
          }
          s += d;
          ++e;
        }
        toks_.push_back({TT::String, s, line_});
        pos = e + 1;
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                                    "(", ")", "[", "]", "{", "}", ".", ",", ":", "|"};
        bool found = false;
        for (const char* op : ops) {
          size_t n = std::strlen(op);
          if (src_.substr(pos, n) == op) {
            toks_.push_back({TT::Op, op, line_});
            pos += n;
            found = true;
            break;
          }
        }
        if (!found) fail(line_, std::string("unexpected char '") + c + "'");
      }
    }
  }

 public:
  static void append_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
};

// ------------------------------------------------------------------ AST

enum class NT {
  // expressions
  Lit, Name, Attr, Item, Slice, Call, Filter, Test, Unary, Bin, Cond, List, Dict, And, Or, Not, Compare,
  // statements
  Body, Text, Output, If, For, Set, SetBlock, Macro, FilterBlock, Break, Continue
};

struct Node;
using NodeP = std::unique_ptr<Node>;

struct Node {
  NT t;
  int line = 0;
  std::string s;                 // name, op, attribute
  json lit;                      // literal
  std::vector<NodeP> a;          // children / args / list items / body
  std::vector<std::pair<std::string, NodeP>> kw;  // keyword args
  NodeP x, y, z;                 // operands
  std::vector<std::string> names;  // for targets / macro params / compare ops
  bool neg = false;              // `is not`
};

NodeP mk(NT t, int line) {
  auto n = std::make_unique<Node>();
  n->t = t;
  n->line = line;
  return n;
}

class Parser {
 public:
  Parser(std::vector<Token> toks, int max_depth) : toks_(std::move(toks)), max_depth_(max_depth) {}

  NodeP parse_template() {
    auto body = parse_body({});
    if (peek().t != TT::End) fail(peek().line, "unexpected tag");
    return body;
  }

 private:
  std::vector<Token> toks_;
  size_t p_ = 0;
  int depth_ = 0;
  int max_depth_;
  std::string end_tag_;  // the block tag name that ended the last body

  struct Guard {
    Parser* p;
    explicit Guard(Parser* pp) : p(pp) {
      if (++p->depth_ > p->max_depth_) fail(p->peek().line, "template nesting too deep");
    }
    ~Guard() { --p->depth_; }
  };

  // Left-associative chains (a ~ b ~ c ..., x.a.b..., x|f|g...) nest without
  // recursion here but the tree is still deep: bound them too.
  void chain(int& n) {
    if (++n + depth_ > max_depth_) fail(peek().line, "template nesting too deep");
  }

  const Token& peek(size_t k = 0) const { return toks_[std::min(p_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[p_];
    if (p_ + 1 < toks_.size()) ++p_;
    return t;
  }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).t == TT::Op && peek(k).s == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).t == TT::Name && peek(k).s == n; }
  bool accept_op(const char* op) {
    if (is_op(op)) {
      next();
      return true;
    }
    return false;
  }
  bool accept_name(const char* n) {
    if (is_name(n)) {
      next();
      return true;
    }
    return false;
  }
  static std::string describe(const Token& t) {
    switch (t.t) {
      case TT::BlockEnd: return "end of statement block";
      case TT::VarEnd: return "end of print statement";
      case TT::End: return "end of template";
      case TT::Text: return "template data";
      default: return "'" + t.s + "'";
    }
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(peek().line, std::string("expected token '") + op + "', got " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().t != TT::Name) fail(peek().line, "expected a name, got " + describe(peek()));
    return next().s;
  }
  void expect(TT t) {
    if (peek().t != t) fail(peek().line, "unexpected " + describe(peek()));
    next();
  }

  // Parses statements until a block tag named in `ends`; leaves end_tag_ set
  // and the parser positioned after that tag's name.
  NodeP parse_body(const std::vector<std::string>& ends) {
    Guard g(this);
    auto body = mk(NT::Body, peek().line);
    while (true) {
      const Token& t = peek();
      if (t.t == TT::End) {
        if (!ends.empty()) fail(t.line, "unexpected end of template, expected '" + ends[0] + "'");
        return body;
      }
      if (t.t == TT::Text) {
        auto n = mk(NT::Text, t.line);
        n->s = t.s;
        next();
        body->a.push_back(std::move(n));
      } else if (t.t == TT::VarBegin) {
        next();
        auto n = mk(NT::Output, t.line);
        n->x = parse_tuple(true);
        expect(TT::VarEnd);
        body->a.push_back(std::move(n));
      } else if (t.t == TT::BlockBegin) {
        if (peek(1).t == TT::Name &&
            std::find(ends.begin(), ends.end(), peek(1).s) != ends.end()) {
          next();
          end_tag_ = next().s;
          return body;
        }
        next();
        body->a.push_back(parse_statement());
      } else {
        fail(t.line, "unexpected " + describe(t));
      }
    }
  }

  NodeP parse_statement() {
    int line = peek().line;
    if (peek().t != TT::Name) fail(line, "tag name expected");
    std::string kw = next().s;
    if (kw == "if") {
      auto n = mk(NT::If, line);
      n->a.push_back(parse_tuple(true));
      expect(TT::BlockEnd);
      while (true) {
        auto b = parse_body({"elif", "else", "endif"});
        n->kw.emplace_back("", std::move(b));
        if (end_tag_ == "elif") {
          n->a.push_back(parse_tuple(true));
          expect(TT::BlockEnd);
        } else if (end_tag_ == "else") {
          expect(TT::BlockEnd);
          n->x = parse_body({"endif"});
          expect(TT::BlockEnd);
          break;
        } else {
          expect(TT::BlockEnd);
          break;
        }
      }
      return n;
    }
    if (kw == "for") {
      auto n = mk(NT::For, line);
      bool paren = accept_op("(");
      do {
        n->names.push_back(expect_name());
      } while (accept_op(","));
      if (paren) expect_op(")");
      if (!accept_name("in")) fail(peek().line, "expected 'in'");
      n->x = parse_tuple(false);
      if (accept_name("if")) n->y = parse_expression(true);
      if (accept_name("recursive")) fail(line, "recursive loops are not supported");
      expect(TT::BlockEnd);
      n->z = parse_body({"else", "endfor"});
      if (end_tag_ == "else") {
        expect(TT::BlockEnd);
        n->kw.emplace_back("else", parse_body({"endfor"}));
      }
      expect(TT::BlockEnd);
      return n;
    }
    if (kw == "set") {
      std::string name = expect_name();
      if (is_op(".")) {
        next();
        auto n = mk(NT::Set, line);
        n->s = name;
        n->names.push_back(expect_name());
        n->neg = true;  // attribute assignment
        expect_op("=");
        n->x = parse_tuple(true);
        expect(TT::BlockEnd);
        return n;
      }
      std::vector<std::string> names{name};
      while (accept_op(",")) names.push_back(expect_name());
      if (accept_op("=")) {
        auto n = mk(NT::Set, line);
        n->names = names;
        n->x = parse_tuple(true);
        expect(TT::BlockEnd);
        return n;
      }
      auto n = mk(NT::SetBlock, line);
      n->s = name;
      while (accept_op("|")) n->a.push_back(parse_filter_call(nullptr));
      expect(TT::BlockEnd);
      n->x = parse_body({"endset"});
      expect(TT::BlockEnd);
      return n;
    }
    if (kw == "macro") {
      auto n = mk(NT::Macro, line);
      n->s = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pn = expect_name();
        NodeP def;
        if (accept_op("=")) def = parse_expression(true);
        n->kw.emplace_back(pn, std::move(def));
        if (!accept_op(",")) break;
      }
      expect_op(")");
      expect(TT::BlockEnd);
      n->x = parse_body({"endmacro"});
      if (peek().t == TT::Name) next();
      expect(TT::BlockEnd);
      return n;
    }
    if (kw == "filter") {
      auto n = mk(NT::FilterBlock, line);
      do {
        n->a.push_back(parse_filter_call(nullptr));
      } while (accept_op("|"));
      expect(TT::BlockEnd);
      n->x = parse_body({"endfilter"});
      expect(TT::BlockEnd);
      return n;
    }
    if (kw == "generation") {
      expect(TT::BlockEnd);
      auto b = parse_body({"endgeneration"});
      expect(TT::BlockEnd);
      return b;
    }
    if (kw == "break" || kw == "continue") {
      expect(TT::BlockEnd);
      return mk(kw == "break" ? NT::Break : NT::Continue, line);
    }
    if (kw == "do") {
      auto n = mk(NT::Output, line);
      n->x = parse_tuple(true);
      n->neg = true;  // discard
      expect(TT::BlockEnd);
      return n;
    }
    fail(line, "Encountered unknown tag '" + kw + "'.");
  }

  NodeP parse_tuple(bool condexpr) {
    int line = peek().line;
    auto first = parse_expression(condexpr);
    if (!is_op(",")) return first;
    auto n = mk(NT::List, line);
    n->a.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().t == TT::BlockEnd || peek().t == TT::VarEnd || is_op(")") || is_op("=") || is_name("in")) break;
      n->a.push_back(parse_expression(condexpr));
    }
    return n;
  }

  NodeP parse_expression(bool condexpr) {
    Guard g(this);
    auto e = parse_or();
    if (!condexpr) return e;
    int c = 0;
    while (is_name("if")) {
      chain(c);
      int line = next().line;
      auto n = mk(NT::Cond, line);
      n->x = std::move(e);
      n->y = parse_or();
      if (accept_name("else")) n->z = parse_expression(true);
      e = std::move(n);
    }
    return e;
  }

  NodeP parse_or() {
    auto l = parse_and();
    int c = 0;
    while (is_name("or")) {
      chain(c);
      auto n = mk(NT::Or, next().line);
      n->x = std::move(l);
      n->y = parse_and();
      l = std::move(n);
    }
    return l;
  }
  NodeP parse_and() {
    auto l = parse_not();
    int c = 0;
    while (is_name("and")) {
      chain(c);
      auto n = mk(NT::And, next().line);
      n->x = std::move(l);
      n->y = parse_not();
      l = std::move(n);
    }
    return l;
  }
  NodeP parse_not() {
    if (is_name("not")) {
      Guard g(this);
      auto n = mk(NT::Not, next().line);
      n->x = parse_not();
      return n;
    }
    return parse_compare();
  }
  NodeP parse_compare() {
    int line = peek().line;
    auto l = parse_math1();
    NodeP cmp;
    while (true) {
      std::string op;
      if (peek().t == TT::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                 peek().s == "<=" || peek().s == ">=")) {
        op = next().s;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = mk(NT::Compare, line);
        cmp->x = std::move(l);
      }
      cmp->names.push_back(op);
      cmp->a.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(l);
  }
  NodeP bin(const std::string& op, NodeP l, NodeP r, int line) {
    auto n = mk(NT::Bin, line);
    n->s = op;
    n->x = std::move(l);
    n->y = std::move(r);
    return n;
  }
  NodeP parse_math1() {
    auto l = parse_concat();
    int c = 0;
    while (is_op("+") || is_op("-")) {
      chain(c);
      const Token& t = next();
      std::string op = t.s;
      l = bin(op, std::move(l), parse_concat(), t.line);
    }
    return l;
  }
  NodeP parse_concat() {
    auto l = parse_math2();
    int c = 0;
    while (is_op("~")) {
      chain(c);
      int line = next().line;
      l = bin("~", std::move(l), parse_math2(), line);
    }
    return l;
  }
  NodeP parse_math2() {
    auto l = parse_pow();
    int c = 0;
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain(c);
      const Token& t = next();
      std::string op = t.s;
      l = bin(op, std::move(l), parse_pow(), t.line);
    }
    return l;
  }
  NodeP parse_pow() {
    auto l = parse_unary(true);
    int c = 0;
    while (is_op("**")) {
      chain(c);
      int line = next().line;
      l = bin("**", std::move(l), parse_unary(true), line);
    }
    return l;
  }
  NodeP parse_unary(bool with_filter) {
    Guard g(this);
    NodeP n;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      n = mk(NT::Unary, t.line);
      n->s = t.s;
      n->x = parse_unary(false);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filters(std::move(n));
    return n;
  }

  NodeP parse_primary() {
    const Token& t = peek();
    int line = t.line;
    if (t.t == TT::Name) {
      std::string s = next().s;
      if (s == "true" || s == "True") {
        auto n = mk(NT::Lit, line);
        n->lit = true;
        return n;
      }
      if (s == "false" || s == "False") {
        auto n = mk(NT::Lit, line);
        n->lit = false;
        return n;
      }
      if (s == "none" || s == "None") {
        auto n = mk(NT::Lit, line);
        n->lit = nullptr;
        return n;
      }
      auto n = mk(NT::Name, line);
      n->s = s;
      return n;
    }
    if (t.t == TT::String) {
      std::string s = next().s;
      while (peek().t == TT::String) s += next().s;
      auto n = mk(NT::Lit, line);
      n->lit = s;
      return n;
    }
    if (t.t == TT::Int || t.t == TT::Float) {
      auto n = mk(NT::Lit, line);
      if (t.t == TT::Int) n->lit = t.i;
      else n->lit = t.f;
      next();
      return n;
    }
    if (accept_op("(")) {
      if (accept_op(")")) return mk(NT::List, line);
      auto e = parse_expression(true);
      if (is_op(",")) {
        auto n = mk(NT::List, line);
        n->a.push_back(std::move(e));
        while (accept_op(",")) {
          if (is_op(")")) break;
          n->a.push_back(parse_expression(true));
        }
        e = std::move(n);
      }
      expect_op(")");
      return e;
    }
    if (accept_op("[")) {
      auto n = mk(NT::List, line);
      while (!is_op("]")) {
        n->a.push_back(parse_expression(true));
        if (!accept_op(",")) break;
      }
      expect_op("]");
      return n;
    }
    if (accept_op("{")) {
      auto n = mk(NT::Dict, line);
      while (!is_op("}")) {
        n->a.push_back(parse_expression(true));
        expect_op(":");
        n->a.push_back(parse_expression(true));
        if (!accept_op(",")) break;
      }
      expect_op("}");
      return n;
    }
    fail(line, "unexpected " + describe(t));
  }

  void parse_args(Node* n) {
    // after '('
    while (!is_op(")")) {
      if (peek().t == TT::Name && is_op("=", 1)) {
        std::string k = next().s;
        next();
        n->kw.emplace_back(k, parse_expression(true));
      } else {
        n->a.push_back(parse_expression(true));
      }
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  NodeP parse_postfix(NodeP n) {
    int c = 0;
    while (true) {
      chain(c);
      int line = peek().line;
      if (accept_op(".")) {
        auto a = mk(NT::Attr, line);
        a->x = std::move(n);
        if (peek().t == TT::Int) a->s = std::to_string(next().i), a->neg = true;
        else a->s = expect_name();
        n = std::move(a);
      } else if (accept_op("[")) {
        NodeP parts[3];
        bool slice = false;
        int idx = 0;
        while (true) {
          if (is_op(":")) {
            next();
            slice = true;
            if (++idx > 2) fail(line, "bad slice");
            continue;
          }
          if (is_op("]")) break;
          if (parts[idx]) fail(line, "expected ']'");
          parts[idx] = parse_expression(true);
        }
        expect_op("]");
        if (slice) {
          auto s = mk(NT::Slice, line);
          s->x = std::move(n);
          for (auto& p : parts) s->a.push_back(std::move(p));
          n = std::move(s);
        } else {
          if (!parts[0]) fail(line, "expected subscript");
          auto s = mk(NT::Item, line);
          s->x = std::move(n);
          s->y = std::move(parts[0]);
          n = std::move(s);
        }
      } else if (accept_op("(")) {
        auto c = mk(NT::Call, line);
        c->x = std::move(n);
        parse_args(c.get());
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  NodeP parse_filter_call(NodeP input) {
    auto f = mk(NT::Filter, peek().line);
    f->s = expect_name();
    while (accept_op(".")) f->s += "." + expect_name();
    f->x = std::move(input);
    if (accept_op("(")) parse_args(f.get());
    return f;
  }

  NodeP parse_filters(NodeP n) {
    int c = 0;
    while (true) {
      chain(c);
      if (accept_op("|")) {
        n = parse_filter_call(std::move(n));
      } else if (is_name("is")) {
        auto t = mk(NT::Test, next().line);
        if (accept_name("not")) t->neg = true;
        t->s = expect_name();
        t->x = std::move(n);
        if (accept_op("(")) {
          parse_args(t.get());
        } else if ((peek().t == TT::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is")) ||
                   peek().t == TT::String || peek().t == TT::Int || peek().t == TT::Float || is_op("[") ||
                   is_op("{")) {
          t->a.push_back(parse_unary(false));
        }
        n = std::move(t);
      } else {
        return n;
      }
    }
  }
};

// ------------------------------------------------------------------ values

struct Value {
  enum class K { Undef, Json, Ns, Macro, Func } k = K::Undef;
  json j;                     // Json
  std::shared_ptr<json> ns;   // Ns: attributes
  const Node* macro = nullptr;
  std::string name;           // Undef: the hint; Func: its name

  static Value undef(std::string hint) {
    Value v;
    v.name = std::move(hint);
    return v;
  }
  static Value of(json j) {
    Value v;
    v.k = K::Json;
    v.j = std::move(j);
    return v;
  }
  static Value func(std::string n) {
    Value v;
    v.k = K::Func;
    v.name = std::move(n);
    return v;
  }
  bool is_undef() const { return k == K::Undef; }
  bool is_json() const { return k == K::Json; }
};

bool truthy(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return false;
    case json::value_t::boolean: return j.get<bool>();
    case json::value_t::number_integer: return j.get<int64_t>() != 0;
    case json::value_t::number_unsigned: return j.get<uint64_t>() != 0;
    case json::value_t::number_float: return j.get<double>() != 0;
    case json::value_t::string: return !j.get_ref<const std::string&>().empty();
    case json::value_t::array:
    case json::value_t::object: return !j.empty();
    default: return true;
  }
}
bool truthy(const Value& v) {
  if (v.is_undef()) return false;
  if (v.is_json()) return truthy(v.j);
  return true;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == std::floor(d) && std::fabs(d) < 1e16) {
    char b[64];
    std::snprintf(b, sizeof b, "%.1f", d);
    return b;
  }
  char b[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(b, sizeof b, "%.*g", p, d);
    if (std::strtod(b, nullptr) == d) break;
  }
  std::string s = b;
  // Python writes exponents with at least two digits, as %g does
  return s;
}

std::string py_repr_str(const std::string& s) {
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string o(1, q);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c == '\n') {
      o += "\\n";
    } else if (c == '\r') {
      o += "\\r";
    } else if (c == '\t') {
      o += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  o += q;
  return o;
}

void py_str(const json& j, std::string& o, bool repr) {
  switch (j.type()) {
    case json::value_t::null: o += "None"; break;
    case json::value_t::boolean: o += j.get<bool>() ? "True" : "False"; break;
    case json::value_t::number_integer: o += std::to_string(j.get<int64_t>()); break;
    case json::value_t::number_unsigned: o += std::to_string(j.get<uint64_t>()); break;
    case json::value_t::number_float: o += py_float(j.get<double>()); break;
    case json::value_t::string:
      if (repr) o += py_repr_str(j.get_ref<const std::string&>());
      else o += j.get_ref<const std::string&>();
      break;
    case json::value_t::array: {
      o += '[';
      bool first = true;
      for (const auto& e : j) {
        if (!first) o += ", ";
        first = false;
        py_str(e, o, true);
      }
      o += ']';
      break;
    }
    case json::value_t::object: {
      o += '{';
      bool first = true;
      for (const auto& [k, e] : j.items()) {
        if (!first) o += ", ";
        first = false;
        o += py_repr_str(k);
        o += ": ";
        py_str(e, o, true);
      }
      o += '}';
      break;
    }
    default: break;
  }
}

std::string to_str(const Value& v) {
  if (v.is_undef()) return "";
  if (v.k == Value::K::Ns) return "<Namespace>";
  if (v.k == Value::K::Macro) return "<Macro '" + v.macro->s + "'>";
  if (v.k == Value::K::Func) return "<built-in function " + v.name + ">";
  std::string o;
  py_str(v.j, o, false);
  return o;
}

void json_escape(const std::string& s, std::string& o) {
  o += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  o += '"';
}

struct DumpOpts {
  int indent = -1;  // -1: none
  std::string indent_str;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

void py_dump(const json& j, std::string& o, const DumpOpts& d, int level) {
  switch (j.type()) {
    case json::value_t::null: o += "null"; break;
    case json::value_t::boolean: o += j.get<bool>() ? "true" : "false"; break;
    case json::value_t::number_float: {
      double f = j.get<double>();
      if (std::isnan(f)) o += "NaN";
      else if (std::isinf(f)) o += f > 0 ? "Infinity" : "-Infinity";
      else o += py_float(f);
      break;
    }
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: py_str(j, o, false); break;
    case json::value_t::string: json_escape(j.get_ref<const std::string&>(), o); break;
    case json::value_t::array:
    case json::value_t::object: {
      bool arr = j.is_array();
      if (j.empty()) {
        o += arr ? "[]" : "{}";
        break;
      }
      o += arr ? '[' : '{';
      auto nl = [&](int lv) {
        if (d.indent < 0) return;
        o += '\n';
        for (int i = 0; i < lv; ++i) o += d.indent_str;
      };
      bool first = true;
      auto sep = [&]() {
        if (!first) o += d.item_sep;
        first = false;
        nl(level + 1);
      };
      if (arr) {
        for (const auto& e : j) {
          sep();
          py_dump(e, o, d, level + 1);
        }
      } else {
        std::vector<std::pair<std::string, const json*>> items;
        for (const auto& [k, e] : j.items()) items.emplace_back(k, &e);
        if (d.sort_keys)
          std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        for (const auto& [k, e] : items) {
          sep();
          json_escape(k, o);
          o += d.key_sep;
          py_dump(*e, o, d, level + 1);
        }
      }
      nl(level);
      o += arr ? ']' : '}';
      break;
    }
    default: o += "null";
  }
}

// UTF-8 helpers: code point offsets
std::vector<size_t> cp_offsets(const std::string& s) {
  std::vector<size_t> v;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) v.push_back(i);
  v.push_back(s.size());
  return v;
}
size_t cp_len(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

const char* type_name(const Value& v) {
  if (v.is_undef()) return "Undefined";
  if (v.k == Value::K::Ns) return "Namespace";
  if (v.k != Value::K::Json) return "function";
  switch (v.j.type()) {
    case json::value_t::null: return "NoneType";
    case json::value_t::boolean: return "bool";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "int";
    case json::value_t::number_float: return "float";
    case json::value_t::string: return "str";
    case json::value_t::array: return "list";
    case json::value_t::object: return "dict";
    default: return "object";
  }
}

bool is_num(const json& j) { return j.is_number() || j.is_boolean(); }
bool is_int(const json& j) { return j.is_number_integer() || j.is_boolean(); }
double num_d(const json& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); }
int64_t num_i(const json& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<int64_t>(); }

bool py_eq(const json& a, const json& b) {
  if (is_num(a) && is_num(b)) {
    if (is_int(a) && is_int(b)) return num_i(a) == num_i(b);
    return num_d(a) == num_d(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!py_eq(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, e] : a.items()) {
      auto it = b.find(k);
      if (it == b.end() || !py_eq(e, *it)) return false;
    }
    return true;
  }
  return a == b;
}
bool val_eq(const Value& a, const Value& b) {
  if (a.is_json() && b.is_json()) return py_eq(a.j, b.j);
  if (a.is_undef() && b.is_undef()) return true;
  if (a.k == Value::K::Ns && b.k == Value::K::Ns) return a.ns == b.ns;
  if (a.k == Value::K::Macro && b.k == Value::K::Macro) return a.macro == b.macro;
  if (a.k == Value::K::Func && b.k == Value::K::Func) return a.name == b.name;
  return false;
}

// ------------------------------------------------------------------ interpreter

enum class Flow { Normal, Break, Continue };

struct Scope {
  std::map<std::string, Value> vars;
  Scope* parent = nullptr;
  const Value* find(const std::string& n) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(n);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

class Interp {
 public:
  Interp(const JinjaOptions& o) : opt_(o) {}

  void run(const Node* body, Scope& root, std::string& out) {
    root_ = &root;
    if (exec(body, root, out) != Flow::Normal) fail(body->line, "break or continue outside a loop");
  }

 private:
  const JinjaOptions& opt_;
  int64_t steps_ = 0;
  int depth_ = 0;
  Scope* root_ = nullptr;

  struct Depth {
    Interp* i;
    Depth(Interp* ii, int line) : i(ii) {
      if (++i->depth_ > i->opt_.max_depth) fail(line, "maximum nesting depth exceeded");
    }
    ~Depth() { --i->depth_; }
  };

  void step(int line, int64_t n = 1) {
    steps_ += n;
    if (steps_ > opt_.max_steps) fail(line, "template exceeded the step limit");
  }
  void check_size(size_t n, int line) const {
    if (n > opt_.max_output_bytes) fail(line, "template output exceeds the size limit");
  }
  [[noreturn]] static void undef_err(const Value& v, int line) {
    fail(line, v.name.empty() ? std::string("value is undefined") : v.name);
  }
  const json& need_json(const Value& v, int line) {
    if (v.is_undef()) undef_err(v, line);
    if (!v.is_json()) fail(line, std::string("unsupported operand of type ") + type_name(v));
    return v.j;
  }

  // ---- statements
  Flow exec(const Node* n, Scope& sc, std::string& out) {
    Depth d(this, n->line);
    step(n->line);
    switch (n->t) {
      case NT::Body:
        for (const auto& c : n->a) {
          Flow f = exec(c.get(), sc, out);
          if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
      case NT::Text:
        out += n->s;
        check_size(out.size(), n->line);
        return Flow::Normal;
      case NT::Output: {
        Value v = eval(n->x.get(), sc);
        if (!n->neg) {
          out += to_str(v);
          check_size(out.size(), n->line);
        }
        return Flow::Normal;
      }
      case NT::If:
        for (size_t i = 0; i < n->a.size(); ++i)
          if (truthy(eval(n->a[i].get(), sc))) return exec(n->kw[i].second.get(), sc, out);
        if (n->x) return exec(n->x.get(), sc, out);
        return Flow::Normal;
      case NT::For: return exec_for(n, sc, out);
      case NT::Set: {
        Value v = eval(n->x.get(), sc);
        if (n->neg) {
          const Value* ns = sc.find(n->s);
          if (!ns || ns->k != Value::K::Ns) fail(n->line, "cannot assign attribute on non-namespace object");
          (*ns->ns)[n->names[0]] = v.is_json() ? v.j : json();
          return Flow::Normal;
        }
        assign(n->names, v, sc, n->line);
        return Flow::Normal;
      }
      case NT::SetBlock: {
        std::string body;
        Scope inner{{}, &sc};
        exec(n->x.get(), inner, body);
        Value v = Value::of(body);
        for (const auto& f : n->a) v = filter_node(f.get(), v, sc);
        sc.vars[n->s] = v;
        return Flow::Normal;
      }
      case NT::Macro: {
        Value v;
        v.k = Value::K::Macro;
        v.macro = n;
        sc.vars[n->s] = v;
        return Flow::Normal;
      }
      case NT::FilterBlock: {
        std::string body;
        Scope inner{{}, &sc};
        exec(n->x.get(), inner, body);
        Value v = Value::of(body);
        for (const auto& f : n->a) v = filter_node(f.get(), v, sc);
        out += to_str(v);
        check_size(out.size(), n->line);
        return Flow::Normal;
      }
      case NT::Break: return Flow::Break;
      case NT::Continue: return Flow::Continue;
      default: fail(n->line, "bad statement");
    }
  }

  void assign(const std::vector<std::string>& names, const Value& v, Scope& sc, int line) {
    if (names.size() == 1) {
      sc.vars[names[0]] = v;
      return;
    }
    std::vector<Value> items = iterate(v, line);
    if (items.size() != names.size())
      fail(line, items.size() < names.size() ? "not enough values to unpack (expected " +
                                                   std::to_string(names.size()) + ", got " +
                                                   std::to_string(items.size()) + ")"
                                             : "too many values to unpack (expected " + std::to_string(names.size()) + ")");
    for (size_t i = 0; i < names.size(); ++i) sc.vars[names[i]] = items[i];
  }

  std::vector<Value> iterate(const Value& v, int line) {
    std::vector<Value> r;
    if (v.is_undef()) return r;
    if (v.k == Value::K::Ns || !v.is_json()) fail(line, std::string("'") + type_name(v) + "' object is not iterable");
    const json& j = v.j;
    if (j.is_array()) {
      step(line, static_cast<int64_t>(j.size()));
      for (const auto& e : j) r.push_back(Value::of(e));
    } else if (j.is_object()) {
      step(line, static_cast<int64_t>(j.size()));
      for (const auto& [k, e] : j.items()) r.push_back(Value::of(k));
    } else if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      auto off = cp_offsets(s);
      step(line, static_cast<int64_t>(off.size()));
      for (size_t i = 0; i + 1 < off.size(); ++i) r.push_back(Value::of(s.substr(off[i], off[i + 1] - off[i])));
    } else {
      fail(line, std::string("'") + type_name(v) + "' object is not iterable");
    }
    return r;
  }
  json iterate_json(const Value& v, int line) {
    json a = json::array();
    for (auto& e : iterate(v, line)) a.push_back(to_json(e));
    return a;
  }
  static json to_json(const Value& v) {
    if (v.is_json()) return v.j;
    if (v.k == Value::K::Ns) return *v.ns;
    return json();
  }

  Flow exec_for(const Node* n, Scope& sc, std::string& out) {
    Value seq = eval(n->x.get(), sc);
    if (seq.is_undef() && false) undef_err(seq, n->line);
    std::vector<Value> items = iterate(seq, n->line);
    Scope inner{{}, &sc};
    if (n->y) {
      std::vector<Value> kept;
      for (auto& it : items) {
        step(n->line);
        assign(n->names, it, inner, n->line);
        if (truthy(eval(n->y.get(), inner))) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    size_t len = items.size();
    for (size_t i = 0; i < len; ++i) {
      step(n->line);
      Scope body{{}, &sc};
      json loop = json::object();
      loop["index"] = i + 1;
      loop["index0"] = i;
      loop["revindex"] = len - i;
      loop["revindex0"] = len - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i + 1 == len;
      loop["length"] = len;
      loop["depth"] = 1;
      loop["depth0"] = 0;
      if (i > 0) loop["previtem"] = to_json(items[i - 1]);
      if (i + 1 < len) loop["nextitem"] = to_json(items[i + 1]);
      body.vars["loop"] = Value::of(std::move(loop));
      assign(n->names, items[i], body, n->line);
      Flow f = exec(n->z.get(), body, out);
      if (f == Flow::Break) break;
    }
    if (len == 0 && !n->kw.empty()) {
      Scope e{{}, &sc};
      return exec(n->kw[0].second.get(), e, out);
    }
    return Flow::Normal;
  }

  // ---- expressions
  Value eval(const Node* n, Scope& sc) {
    Depth d(this, n->line);
    step(n->line);
    switch (n->t) {
      case NT::Lit: return Value::of(n->lit);
      case NT::Name: {
        const Value* v = sc.find(n->s);
        if (v) return *v;
        static const char* funcs[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", "lipsum",
                                      "joiner", "cycler"};
        for (const char* f : funcs)
          if (n->s == f) return Value::func(f);
        return Value::undef("'" + n->s + "' is undefined");
      }
      case NT::List: {
        json a = json::array();
        for (const auto& e : n->a) a.push_back(to_json(eval(e.get(), sc)));
        return Value::of(std::move(a));
      }
      case NT::Dict: {
        json o = json::object();
        for (size_t i = 0; i + 1 < n->a.size(); i += 2) {
          Value k = eval(n->a[i].get(), sc);
          Value v = eval(n->a[i + 1].get(), sc);
          o[k.is_json() && k.j.is_string() ? k.j.get<std::string>() : to_str(k)] = to_json(v);
        }
        return Value::of(std::move(o));
      }
      case NT::Attr: {
        Value o = eval(n->x.get(), sc);
        if (n->neg) return get_item(o, Value::of(std::stoll(n->s)), n->line);
        return get_attr(o, n->s, n->line);
      }
      case NT::Item: {
        Value o = eval(n->x.get(), sc);
        Value k = eval(n->y.get(), sc);
        return get_item(o, k, n->line);
      }
      case NT::Slice: return eval_slice(n, sc);
      case NT::Call: return eval_call(n, sc);
      case NT::Filter: {
        Value in = eval(n->x.get(), sc);
        return filter_node(n, in, sc);
      }
      case NT::Test: {
        Value in = eval(n->x.get(), sc);
        Args args;
        for (const auto& a : n->a) args.push_back(eval(a.get(), sc));
        for (const auto& [k, a] : n->kw) args.push_back(eval(a.get(), sc));
        bool r = test(n->s, in, args, n->line);
        return Value::of(n->neg ? !r : r);
      }
      case NT::Unary: {
        Value v = eval(n->x.get(), sc);
        const json& j = need_json(v, n->line);
        if (!is_num(j)) fail(n->line, std::string("bad operand type for unary ") + n->s + ": '" + type_name(v) + "'");
        if (n->s == "+") return Value::of(is_int(j) ? json(num_i(j)) : j);
        if (is_int(j)) {
          int64_t x = num_i(j);
          if (x == INT64_MIN) fail(n->line, "integer overflow");
          return Value::of(-x);
        }
        return Value::of(-num_d(j));
      }
      case NT::Not: return Value::of(!truthy(eval(n->x.get(), sc)));
      case NT::And: {
        Value l = eval(n->x.get(), sc);
        if (!truthy(l)) return l;
        return eval(n->y.get(), sc);
      }
      case NT::Or: {
        Value l = eval(n->x.get(), sc);
        if (truthy(l)) return l;
        return eval(n->y.get(), sc);
      }
      case NT::Cond: {
        if (truthy(eval(n->y.get(), sc))) return eval(n->x.get(), sc);
        if (n->z) return eval(n->z.get(), sc);
        return Value::undef("the inline if-expression on line " + std::to_string(n->line) +
                            " evaluated to false and no else section was defined.");
      }
      case NT::Compare: {
        Value l = eval(n->x.get(), sc);
        for (size_t i = 0; i < n->a.size(); ++i) {
          Value r = eval(n->a[i].get(), sc);
          if (!compare(n->names[i], l, r, n->line)) return Value::of(false);
          l = std::move(r);
        }
        return Value::of(true);
      }
      case NT::Bin: return binop(n->s, eval(n->x.get(), sc), eval(n->y.get(), sc), n->line);
      default: fail(n->line, "bad expression");
    }
  }

  bool contains(const Value& hay, const Value& needle, int line) {
    if (hay.is_undef()) return false;
    if (!hay.is_json()) fail(line, std::string("argument of type '") + type_name(hay) + "' is not iterable");
    const json& h = hay.j;
    if (h.is_string()) {
      if (!needle.is_json() || !needle.j.is_string())
        fail(line, std::string("'in <string>' requires string as left operand, not ") + type_name(needle));
      return h.get_ref<const std::string&>().find(needle.j.get_ref<const std::string&>()) != std::string::npos;
    }
    if (h.is_array()) {
      step(line, static_cast<int64_t>(h.size()));
      for (const auto& e : h)
        if (needle.is_json() && py_eq(e, needle.j)) return true;
      return false;
    }
    if (h.is_object()) {
      if (!needle.is_json() || !needle.j.is_string()) return false;
      return h.contains(needle.j.get<std::string>());
    }
    fail(line, std::string("argument of type '") + type_name(hay) + "' is not iterable");
  }

  int cmp_order(const Value& a, const Value& b, const std::string& op, int line) {
    if (a.is_json() && b.is_json()) {
      const json &x = a.j, &y = b.j;
      if (is_num(x) && is_num(y)) {
        if (is_int(x) && is_int(y)) return num_i(x) < num_i(y) ? -1 : num_i(x) > num_i(y) ? 1 : 0;
        double p = num_d(x), q = num_d(y);
        return p < q ? -1 : p > q ? 1 : 0;
      }
      if (x.is_string() && y.is_string()) {
        int c = x.get_ref<const std::string&>().compare(y.get_ref<const std::string&>());
        return c < 0 ? -1 : c > 0 ? 1 : 0;
      }
      if (x.is_array() && y.is_array()) {
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
          if (py_eq(x[i], y[i])) continue;
          return cmp_order(Value::of(x[i]), Value::of(y[i]), op, line);
        }
        return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
      }
    }
    if (a.is_undef()) undef_err(a, line);
    if (b.is_undef()) undef_err(b, line);
    fail(line, "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
  }

  bool compare(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "==") return val_eq(l, r);
    if (op == "!=") return !val_eq(l, r);
    if (op == "in") return contains(r, l, line);
    if (op == "notin") return !contains(r, l, line);
    int c = cmp_order(l, r, op, line);
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  Value binop(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "~") {
      std::string s = to_str(l);
      s += to_str(r);
      check_size(s.size(), line);
      return Value::of(std::move(s));
    }
    const json& a = need_json(l, line);
    const json& b = need_json(r, line);
    auto bad = [&]() -> Value {
      fail(line, "unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        check_size(a.get_ref<const std::string&>().size() + b.get_ref<const std::string&>().size(), line);
        return Value::of(a.get<std::string>() + b.get<std::string>());
      }
      if (a.is_array() && b.is_array()) {
        check_size((a.size() + b.size()) * 8, line);
        step(line, static_cast<int64_t>(a.size() + b.size()));
        json c = a;
        for (const auto& e : b) c.push_back(e);
        return Value::of(std::move(c));
      }
    }
    if (op == "*") {
      if ((a.is_string() || a.is_array()) && is_int(b)) return repeat(a, num_i(b), line);
      if ((b.is_string() || b.is_array()) && is_int(a)) return repeat(b, num_i(a), line);
    }
    if (!is_num(a) || !is_num(b)) return bad();
    bool ints = is_int(a) && is_int(b);
    if (op == "/") {
      if (num_d(b) == 0) fail(line, "division by zero");
      return Value::of(num_d(a) / num_d(b));
    }
    if (ints) {
      int64_t x = num_i(a), y = num_i(b), z = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &z)) fail(line, "integer overflow");
        return Value::of(z);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(x, y, &z)) fail(line, "integer overflow");
        return Value::of(z);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(x, y, &z)) fail(line, "integer overflow");
        return Value::of(z);
      }
      if (op == "//" || op == "%") {
        if (y == 0) fail(line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail(line, "integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::of(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) return Value::of(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t res = 1;
        for (int64_t i = 0; i < y; ++i) {
          if (__builtin_mul_overflow(res, x, &res)) fail(line, "integer overflow");
          if (res == 0 || res == 1) break;
          if (x == -1) {
            res = (y % 2) ? -1 : 1;
            break;
          }
        }
        return Value::of(res);
      }
    }
    double x = num_d(a), y = num_d(b);
    if (op == "+") return Value::of(x + y);
    if (op == "-") return Value::of(x - y);
    if (op == "*") return Value::of(x * y);
    if (op == "//" || op == "%") {
      if (y == 0) fail(line, "float division by zero");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      if (op == "%") return Value::of(m);
      return Value::of(std::floor(x / y));
    }
    if (op == "**") return Value::of(std::pow(x, y));
    return bad();
  }

  Value repeat(const json& a, int64_t n, int line) {
    if (n <= 0) return Value::of(a.is_string() ? json("") : json::array());
    size_t unit = a.is_string() ? a.get_ref<const std::string&>().size() : a.size() * 8;
    if (unit && static_cast<uint64_t>(n) > opt_.max_output_bytes / unit) fail(line, "template output exceeds the size limit");
    step(line, n);
    if (a.is_string()) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += a.get_ref<const std::string&>();
      return Value::of(std::move(s));
    }
    json c = json::array();
    for (int64_t i = 0; i < n; ++i)
      for (const auto& e : a) c.push_back(e);
    return Value::of(std::move(c));
  }

  Value get_attr(const Value& o, const std::string& name, int line) {
    if (o.is_undef()) undef_err(o, line);
    if (o.k == Value::K::Ns) {
      auto it = o.ns->find(name);
      if (it == o.ns->end()) return Value::undef("'Namespace' object has no attribute '" + name + "'");
      return Value::of(*it);
    }
    if (o.is_json() && o.j.is_object()) {
      auto it = o.j.find(name);
      if (it != o.j.end()) return Value::of(*it);
      return Value::undef("'dict object' has no attribute '" + name + "'");
    }
    return Value::undef(std::string("'") + type_name(o) + " object' has no attribute '" + name + "'");
  }

  Value get_item(const Value& o, const Value& k, int line) {
    if (o.is_undef()) undef_err(o, line);
    if (o.k == Value::K::Ns && k.is_json() && k.j.is_string()) return get_attr(o, k.j.get<std::string>(), line);
    if (o.is_json()) {
      const json& j = o.j;
      if (j.is_object()) {
        std::string key = k.is_json() && k.j.is_string() ? k.j.get<std::string>() : to_str(k);
        auto it = j.find(key);
        if (it != j.end()) return Value::of(*it);
        return Value::undef("'dict object' has no attribute '" + key + "'");
      }
      if ((j.is_array() || j.is_string()) && k.is_json() && is_int(k.j)) {
        int64_t i = num_i(k.j);
        if (j.is_array()) {
          int64_t n = static_cast<int64_t>(j.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undef("list object has no element " + std::to_string(num_i(k.j)));
          return Value::of(j[static_cast<size_t>(i)]);
        }
        const std::string& s = j.get_ref<const std::string&>();
        auto off = cp_offsets(s);
        int64_t n = static_cast<int64_t>(off.size()) - 1;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undef("str object has no element " + std::to_string(num_i(k.j)));
        return Value::of(s.substr(off[i], off[i + 1] - off[i]));
      }
      if (k.is_json() && k.j.is_string()) return get_attr(o, k.j.get<std::string>(), line);
    }
    return Value::undef(std::string("'") + type_name(o) + " object' has no attribute '" + to_str(k) + "'");
  }

  Value eval_slice(const Node* n, Scope& sc) {
    Value o = eval(n->x.get(), sc);
    std::optional<int64_t> part[3];
    for (int i = 0; i < 3; ++i) {
      if (!n->a[i]) continue;
      Value v = eval(n->a[i].get(), sc);
      if (v.is_json() && v.j.is_null()) continue;
      if (!v.is_json() || !is_int(v.j)) fail(n->line, "slice indices must be integers or None");
      part[i] = num_i(v.j);
    }
    const json& j = need_json(o, n->line);
    int64_t len;
    std::vector<size_t> off;
    if (j.is_array()) {
      len = static_cast<int64_t>(j.size());
    } else if (j.is_string()) {
      off = cp_offsets(j.get_ref<const std::string&>());
      len = static_cast<int64_t>(off.size()) - 1;
    } else {
      fail(n->line, std::string("'") + type_name(o) + "' object is not subscriptable");
    }
    int64_t st = part[2].value_or(1);
    if (st == 0) fail(n->line, "slice step cannot be zero");
    auto norm = [&](std::optional<int64_t> v, int64_t def) {
      if (!v) return def;
      int64_t x = *v;
      if (x < 0) x += len;
      if (st > 0) return std::clamp<int64_t>(x, 0, len);
      return std::clamp<int64_t>(x, -1, len - 1);
    };
    int64_t b = norm(part[0], st > 0 ? 0 : len - 1), e = norm(part[1], st > 0 ? len : -1);
    std::vector<int64_t> idx;
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
    step(n->line, static_cast<int64_t>(idx.size()));
    if (j.is_array()) {
      json r = json::array();
      for (auto i : idx) r.push_back(j[static_cast<size_t>(i)]);
      return Value::of(std::move(r));
    }
    const std::string& s = j.get_ref<const std::string&>();
    std::string r;
    for (auto i : idx) r += s.substr(off[i], off[i + 1] - off[i]);
    return Value::of(std::move(r));
  }

  Value eval_call(const Node* n, Scope& sc) {
    Args args;
    Kwargs kw;
    auto eval_args = [&]() {
      for (const auto& a : n->a) args.push_back(eval(a.get(), sc));
      for (const auto& [k, a] : n->kw) kw.emplace_back(k, eval(a.get(), sc));
    };
    if (n->x->t == NT::Attr && !n->x->neg) {
      Value o = eval(n->x->x.get(), sc);
      if (o.is_json()) {
        eval_args();
        return method(o.j, n->x->s, args, kw, n->line);
      }
      Value f = get_attr(o, n->x->s, n->line);
      if (args.empty() && kw.empty()) eval_args();
      return call_value(f, args, kw, n->line);
    }
    Value f = eval(n->x.get(), sc);
    eval_args();
    return call_value(f, args, kw, n->line);
  }

  static const Value* kwarg(const Kwargs& kw, const char* name) {
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
  static const Value* arg(const Args& a, const Kwargs& kw, size_t i, const char* name) {
    if (i < a.size()) return &a[i];
    return kwarg(kw, name);
  }

  Value call_value(const Value& f, const Args& args, const Kwargs& kw, int line) {
    if (f.is_undef()) undef_err(f, line);
    if (f.k == Value::K::Macro) return call_macro(f.macro, args, kw, line);
    if (f.k != Value::K::Func) fail(line, std::string("'") + type_name(f) + "' object is not callable");
    const std::string& fn = f.name;
    if (fn == "raise_exception") {
      fail(line, args.empty() ? std::string("raise_exception") : to_str(args[0]));
    }
    if (fn == "range") {
      std::vector<int64_t> p;
      for (const auto& a : args) {
        if (!a.is_json() || !is_int(a.j)) fail(line, "range() integer argument expected");
        p.push_back(num_i(a.j));
      }
      if (p.empty() || p.size() > 3) fail(line, "range expected 1 to 3 arguments");
      int64_t b = p.size() == 1 ? 0 : p[0], e = p.size() == 1 ? p[0] : p[1], s = p.size() == 3 ? p[2] : 1;
      if (s == 0) fail(line, "range() arg 3 must not be zero");
      double cnt = s > 0 ? std::ceil((static_cast<double>(e) - b) / s) : std::ceil((static_cast<double>(b) - e) / -s);
      if (cnt > static_cast<double>(opt_.max_steps)) fail(line, "range too big, the template exceeded the step limit");
      json r = json::array();
      for (int64_t i = b; s > 0 ? i < e : i > e; i += s) r.push_back(i);
      step(line, static_cast<int64_t>(r.size()));
      return Value::of(std::move(r));
    }
    if (fn == "namespace" || fn == "dict") {
      json o = json::object();
      for (const auto& a : args)
        if (a.is_json() && a.j.is_object())
          for (const auto& [k, e] : a.j.items()) o[k] = e;
      for (const auto& [k, v] : kw) o[k] = to_json(v);
      if (fn == "dict") return Value::of(std::move(o));
      Value v;
      v.k = Value::K::Ns;
      v.ns = std::make_shared<json>(std::move(o));
      return v;
    }
    if (fn == "strftime_now") {
      std::string fmt = args.empty() ? std::string("%Y-%m-%d") : to_str(args[0]);
      std::time_t t = opt_.now_utc ? *opt_.now_utc : std::time(nullptr);
      std::tm tm{};
      if (opt_.now_utc) gmtime_r(&t, &tm);
      else localtime_r(&t, &tm);
      if (fmt.size() > 1000) fail(line, "strftime format too long");
      std::string buf(fmt.size() * 16 + 64, '\0');
      size_t k = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
      buf.resize(k);
      return Value::of(buf);
    }
    fail(line, "'" + fn + "' is not supported");
  }

  Value call_macro(const Node* m, const Args& args, const Kwargs& kw, int line) {
    Depth d(this, line);
    Scope sc{{}, root_};
    if (args.size() > m->kw.size()) fail(line, "macro '" + m->s + "' takes not more than " + std::to_string(m->kw.size()) + " argument(s)");
    for (size_t i = 0; i < m->kw.size(); ++i) {
      const std::string& pn = m->kw[i].first;
      if (i < args.size()) {
        sc.vars[pn] = args[i];
      } else if (const Value* v = kwarg(kw, pn.c_str())) {
        sc.vars[pn] = *v;
      } else if (m->kw[i].second) {
        sc.vars[pn] = eval(m->kw[i].second.get(), sc);
      } else {
        sc.vars[pn] = Value::undef("parameter '" + pn + "' was not provided");
      }
    }
    for (const auto& [k, v] : kw) {
      bool known = false;
      for (const auto& p : m->kw) known |= p.first == k;
      if (!known) fail(line, "macro '" + m->s + "' takes no keyword argument '" + k + "'");
    }
    std::string out;
    Flow f = exec(m->x.get(), sc, out);
    (void)f;
    return Value::of(std::move(out));
  }

  static std::string strip_chars(const std::string& s, const std::string* chars, bool l, bool r) {
    auto in = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_space(c); };
    size_t b = 0, e = s.size();
    if (l)
      while (b < e && in(s[b])) ++b;
    if (r)
      while (e > b && in(s[e - 1])) --e;
    return s.substr(b, e - b);
  }
  static std::string title(const std::string& s) {
    std::string o = s;
    bool prev_alpha = false;
    for (char& c : o) {
      unsigned char u = static_cast<unsigned char>(c);
      if (std::isalpha(u)) {
        c = static_cast<char>(prev_alpha ? std::tolower(u) : std::toupper(u));
        prev_alpha = true;
      } else {
        prev_alpha = u >= 0x80;
      }
    }
    return o;
  }
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string capitalize(const std::string& s) {
    std::string o = lower(s);
    if (!o.empty()) o[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(o[0])));
    return o;
  }
  std::string replace(const std::string& s, const std::string& a, const std::string& b, int64_t count, int line) {
    std::string o;
    if (a.empty()) {
      auto off = cp_offsets(s);
      int64_t done = 0;
      for (size_t i = 0; i + 1 < off.size(); ++i) {
        if (count < 0 || done < count) o += b, ++done;
        o += s.substr(off[i], off[i + 1] - off[i]);
        check_size(o.size(), line);
      }
      if (count < 0 || done < count) o += b;
      return o;
    }
    size_t p = 0;
    int64_t done = 0;
    while (true) {
      size_t q = s.find(a, p);
      if (q == std::string::npos || (count >= 0 && done >= count)) break;
      o.append(s, p, q - p);
      o += b;
      check_size(o.size(), line);
      p = q + a.size();
      ++done;
    }
    o.append(s, p, std::string::npos);
    check_size(o.size(), line);
    return o;
  }
  json split(const std::string& s, const Value* sep, int64_t maxsplit, int line) {
    json r = json::array();
    if (!sep || (sep->is_json() && sep->j.is_null())) {
      size_t i = 0;
      while (true) {
        while (i < s.size() && is_space(s[i])) ++i;
        if (i >= s.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(r.size()) >= maxsplit) {
          std::string rest = s.substr(i);
          r.push_back(strip_chars(rest, nullptr, false, true));
          break;
        }
        size_t e = i;
        while (e < s.size() && !is_space(s[e])) ++e;
        r.push_back(s.substr(i, e - i));
        i = e;
      }
      step(line, static_cast<int64_t>(r.size()));
      return r;
    }
    std::string d = to_str(*sep);
    if (d.empty()) fail(line, "empty separator");
    size_t p = 0;
    while (true) {
      size_t q = s.find(d, p);
      if (q == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(r.size()) >= maxsplit)) break;
      r.push_back(s.substr(p, q - p));
      p = q + d.size();
    }
    r.push_back(s.substr(p));
    step(line, static_cast<int64_t>(r.size()));
    return r;
  }

  Value method(const json& o, const std::string& m, const Args& a, const Kwargs& kw, int line) {
    auto sarg = [&](size_t i, const char* name) -> const std::string* {
      const Value* v = arg(a, kw, i, name);
      if (!v || (v->is_json() && v->j.is_null())) return nullptr;
      if (!v->is_json() || !v->j.is_string()) fail(line, m + " arg must be None or str");
      return &v->j.get_ref<const std::string&>();
    };
    auto iarg = [&](size_t i, const char* name, int64_t def) -> int64_t {
      const Value* v = arg(a, kw, i, name);
      if (!v) return def;
      if (!v->is_json() || !is_int(v->j)) fail(line, "an integer is required");
      return num_i(v->j);
    };
    if (o.is_string()) {
      const std::string& s = o.get_ref<const std::string&>();
      if (m == "strip") return Value::of(strip_chars(s, sarg(0, "chars"), true, true));
      if (m == "lstrip") return Value::of(strip_chars(s, sarg(0, "chars"), true, false));
      if (m == "rstrip") return Value::of(strip_chars(s, sarg(0, "chars"), false, true));
      if (m == "upper") return Value::of(upper(s));
      if (m == "lower") return Value::of(lower(s));
      if (m == "title") return Value::of(title(s));
      if (m == "capitalize") return Value::of(capitalize(s));
      if (m == "split") return Value::of(split(s, arg(a, kw, 0, "sep"), iarg(1, "maxsplit", -1), line));
      if (m == "rsplit" && !arg(a, kw, 1, "maxsplit")) return Value::of(split(s, arg(a, kw, 0, "sep"), -1, line));
      if (m == "splitlines") {
        json r = json::array();
        size_t p = 0;
        while (p < s.size()) {
          size_t q = s.find_first_of("\r\n", p);
          if (q == std::string::npos) {
            r.push_back(s.substr(p));
            break;
          }
          r.push_back(s.substr(p, q - p));
          p = q + ((s[q] == '\r' && q + 1 < s.size() && s[q + 1] == '\n') ? 2 : 1);
        }
        return Value::of(std::move(r));
      }
      if (m == "startswith" || m == "endswith") {
        const Value* v = arg(a, kw, 0, "prefix");
        if (!v || !v->is_json()) fail(line, m + " takes at least 1 argument");
        std::vector<std::string> opts;
        if (v->j.is_array()) {
          for (const auto& e : v->j) {
            if (!e.is_string()) fail(line, "tuple for " + m + " must only contain str");
            opts.push_back(e.get<std::string>());
          }
        } else if (v->j.is_string()) {
          opts.push_back(v->j.get<std::string>());
        } else {
          fail(line, m + " first arg must be str or a tuple of str");
        }
        for (const auto& p : opts) {
          if (p.size() > s.size()) continue;
          if (m == "startswith" ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0)
            return Value::of(true);
        }
        return Value::of(false);
      }
      if (m == "replace") {
        const std::string* x = sarg(0, "old");
        const std::string* y = sarg(1, "new");
        if (!x || !y) fail(line, "replace expected 2 arguments");
        return Value::of(replace(s, *x, *y, iarg(2, "count", -1), line));
      }
      if (m == "find" || m == "rfind" || m == "index" || m == "count") {
        const std::string* x = sarg(0, "sub");
        if (!x) fail(line, m + " expected an argument");
        if (m == "count") {
          if (x->empty()) return Value::of(static_cast<int64_t>(cp_len(s) + 1));
          int64_t c = 0;
          for (size_t p = s.find(*x); p != std::string::npos; p = s.find(*x, p + x->size())) ++c;
          return Value::of(c);
        }
        size_t p = m == "rfind" ? s.rfind(*x) : s.find(*x);
        if (p == std::string::npos) {
          if (m == "index") fail(line, "substring not found");
          return Value::of(-1);
        }
        return Value::of(static_cast<int64_t>(cp_len(s.substr(0, p))));
      }
      if (m == "join") {
        const Value* v = arg(a, kw, 0, "iterable");
        if (!v) fail(line, "join expected an argument");
        std::string r;
        bool first = true;
        for (const auto& e : iterate(*v, line)) {
          if (!first) r += s;
          first = false;
          if (!e.is_json() || !e.j.is_string()) fail(line, "sequence item: expected str instance");
          r += e.j.get<std::string>();
          check_size(r.size(), line);
        }
        return Value::of(std::move(r));
      }
      if (m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isspace" || m == "isupper" || m == "islower") {
        if (s.empty()) return Value::of(false);
        bool cased = false;
        for (unsigned char c : s) {
          if (m == "isdigit" && !std::isdigit(c)) return Value::of(false);
          if (m == "isalpha" && !std::isalpha(c)) return Value::of(false);
          if (m == "isalnum" && !std::isalnum(c)) return Value::of(false);
          if (m == "isspace" && !std::isspace(c)) return Value::of(false);
          if (m == "isupper" && std::islower(c)) return Value::of(false);
          if (m == "islower" && std::isupper(c)) return Value::of(false);
          cased |= std::isalpha(c) != 0;
        }
        return Value::of(m.rfind("is", 0) == 0 && (m == "isupper" || m == "islower") ? cased : true);
      }
    } else if (o.is_object()) {
      if (m == "items") {
        json r = json::array();
        for (const auto& [k, e] : o.items()) r.push_back(json::array({k, e}));
        step(line, static_cast<int64_t>(r.size()));
        return Value::of(std::move(r));
      }
      if (m == "keys") {
        json r = json::array();
        for (const auto& [k, e] : o.items()) r.push_back(k);
        return Value::of(std::move(r));
      }
      if (m == "values") {
        json r = json::array();
        for (const auto& [k, e] : o.items()) r.push_back(e);
        return Value::of(std::move(r));
      }
      if (m == "get") {
        const Value* k = arg(a, kw, 0, "key");
        if (!k) fail(line, "get expected at least 1 argument");
        if (k->is_json() && k->j.is_string()) {
          auto it = o.find(k->j.get<std::string>());
          if (it != o.end()) return Value::of(*it);
        }
        const Value* d = arg(a, kw, 1, "default");
        return d ? *d : Value::of(nullptr);
      }
      auto it = o.find(m);
      if (it != o.end()) fail(line, std::string("'") + type_name(Value::of(*it)) + "' object is not callable");
    } else if (o.is_array()) {
      if (m == "index") {
        const Value* v = arg(a, kw, 0, "value");
        for (size_t i = 0; v && i < o.size(); ++i)
          if (v->is_json() && py_eq(o[i], v->j)) return Value::of(static_cast<int64_t>(i));
        fail(line, "value is not in list");
      }
      if (m == "count") {
        const Value* v = arg(a, kw, 0, "value");
        int64_t c = 0;
        for (size_t i = 0; v && i < o.size(); ++i)
          if (v->is_json() && py_eq(o[i], v->j)) ++c;
        return Value::of(c);
      }
      if (m == "append" || m == "extend" || m == "pop" || m == "insert" || m == "remove" || m == "clear" ||
          m == "sort" || m == "reverse")
        fail(line, "access to attribute '" + m + "' of 'list' object is unsafe.");
    }
    Value v = get_attr(Value::of(o), m, line);
    if (v.is_undef()) undef_err(v, line);
    fail(line, std::string("'") + type_name(v) + "' object is not callable");
  }

  bool test(const std::string& t, const Value& v, const Args& a, int line) {
    const json* j = v.is_json() ? &v.j : nullptr;
    auto argj = [&](size_t i) -> const Value& {
      if (i >= a.size()) fail(line, "test '" + t + "' needs an argument");
      return a[i];
    };
    if (t == "defined") return !v.is_undef();
    if (t == "undefined") return v.is_undef();
    if (t == "none") return j && j->is_null();
    if (t == "string") return j && j->is_string();
    if (t == "number") return j && is_num(*j);
    if (t == "integer") return j && j->is_number_integer();
    if (t == "float") return j && j->is_number_float();
    if (t == "boolean") return j && j->is_boolean();
    if (t == "true") return j && j->is_boolean() && j->get<bool>();
    if (t == "false") return j && j->is_boolean() && !j->get<bool>();
    if (t == "mapping") return (j && j->is_object()) || v.k == Value::K::Ns;
    if (t == "iterable") return j && (j->is_array() || j->is_object() || j->is_string());
    if (t == "sequence") return j && (j->is_array() || j->is_object() || j->is_string());
    if (t == "callable") return v.k == Value::K::Macro || v.k == Value::K::Func;
    if (t == "lower") return j && j->is_string() && lower(j->get<std::string>()) == j->get<std::string>();
    if (t == "upper") return j && j->is_string() && upper(j->get<std::string>()) == j->get<std::string>();
    if (t == "even" || t == "odd" || t == "divisibleby") {
      const json& x = need_json(v, line);
      if (!is_int(x)) fail(line, "test '" + t + "' needs an integer");
      int64_t n = num_i(x);
      if (t == "even") return n % 2 == 0;
      if (t == "odd") return n % 2 != 0;
      const json& d = need_json(argj(0), line);
      if (!is_int(d) || num_i(d) == 0) fail(line, "divisibleby needs a non-zero integer");
      return n % num_i(d) == 0;
    }
    if (t == "eq" || t == "equalto" || t == "==") return val_eq(v, argj(0));
    if (t == "ne" || t == "!=") return !val_eq(v, argj(0));
    if (t == "sameas") return val_eq(v, argj(0)) && type_name(v) == type_name(argj(0));
    if (t == "lt" || t == "lessthan" || t == "<") return compare("<", v, argj(0), line);
    if (t == "gt" || t == "greaterthan" || t == ">") return compare(">", v, argj(0), line);
    if (t == "le" || t == "<=") return compare("<=", v, argj(0), line);
    if (t == "ge" || t == ">=") return compare(">=", v, argj(0), line);
    if (t == "in") return contains(argj(0), v, line);
    fail(line, "No test named '" + t + "'.");
  }

  Value filter_node(const Node* f, const Value& in, Scope& sc) {
    Args args;
    Kwargs kw;
    for (const auto& a : f->a) args.push_back(eval(a.get(), sc));
    for (const auto& [k, a] : f->kw) kw.emplace_back(k, eval(a.get(), sc));
    return filter(f->s, in, args, kw, f->line);
  }

  std::string need_str(const Value& v, int line) {
    if (v.is_undef()) return "";
    (void)line;
    return to_str(v);
  }

  json attr_path(const json& item, const std::string& path, int line) {
    Value cur = Value::of(item);
    size_t p = 0;
    while (true) {
      size_t q = path.find('.', p);
      std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) && cur.is_json() && cur.j.is_array())
        cur = get_item(cur, Value::of(std::stoll(part)), line);
      else
        cur = cur.is_undef() ? cur : get_item(cur, Value::of(part), line);
      if (q == std::string::npos) break;
      p = q + 1;
    }
    if (cur.is_undef()) return json(nlohmann::json::value_t::discarded);
    return to_json(cur);
  }

  Value filter(const std::string& name, const Value& in, const Args& a, const Kwargs& kw, int line) {
    step(line);
    const std::string& f = name;
    if (f == "default" || f == "d") {
      const Value* dv = arg(a, kw, 0, "default_value");
      const Value* b = arg(a, kw, 1, "boolean");
      bool boolean = b && truthy(*b);
      if (in.is_undef() || (boolean && !truthy(in))) return dv ? *dv : Value::of("");
      return in;
    }
    if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") {
      if (f == "safe") return in;
      std::string s = to_str(in), o;
      for (char c : s) {
        switch (c) {
          case '&': o += "&amp;"; break;
          case '<': o += "&lt;"; break;
          case '>': o += "&gt;"; break;
          case '"': o += "&#34;"; break;
          case '\'': o += "&#39;"; break;
          default: o += c;
        }
      }
      return Value::of(o);
    }
    if (f == "string") return in.is_undef() ? Value::of("") : Value::of(to_str(in));
    if (f == "tojson") {
      DumpOpts d;
      const Value* ind = kwarg(kw, "indent");
      if (!ind && a.size() > 1) ind = &a[1];
      if (ind && ind->is_json() && !ind->j.is_null()) {
        if (ind->j.is_string()) {
          d.indent = 1;
          d.indent_str = ind->j.get<std::string>();
        } else if (is_int(ind->j)) {
          d.indent = static_cast<int>(std::clamp<int64_t>(num_i(ind->j), 0, 1000));
          d.indent_str = std::string(static_cast<size_t>(d.indent), ' ');
        }
        d.item_sep = ",";
      }
      const Value* sep = kwarg(kw, "separators");
      if (sep && sep->is_json() && sep->j.is_array() && sep->j.size() == 2) {
        d.item_sep = to_str(Value::of(sep->j[0]));
        d.key_sep = to_str(Value::of(sep->j[1]));
      }
      const Value* sk = kwarg(kw, "sort_keys");
      d.sort_keys = sk && truthy(*sk);
      if (in.is_undef()) fail(line, "Object of type Undefined is not JSON serializable");
      std::string o;
      py_dump(to_json(in), o, d, 0);
      check_size(o.size(), line);
      return Value::of(o);
    }
    if (f == "length" || f == "count") {
      if (in.is_undef()) return Value::of(0);
      const json& j = need_json(in, line);
      if (j.is_string()) return Value::of(static_cast<int64_t>(cp_len(j.get_ref<const std::string&>())));
      if (j.is_array() || j.is_object()) return Value::of(static_cast<int64_t>(j.size()));
      fail(line, std::string("object of type '") + type_name(in) + "' has no len()");
    }
    if (f == "trim") {
      const Value* c = arg(a, kw, 0, "chars");
      std::string cs = c ? to_str(*c) : "";
      return Value::of(strip_chars(need_str(in, line), c ? &cs : nullptr, true, true));
    }
    if (f == "upper") return Value::of(upper(need_str(in, line)));
    if (f == "lower") return Value::of(lower(need_str(in, line)));
    if (f == "title") return Value::of(title(need_str(in, line)));
    if (f == "capitalize") return Value::of(capitalize(need_str(in, line)));
    if (f == "replace") {
      if (a.size() < 2) fail(line, "replace needs 2 arguments");
      int64_t cnt = a.size() > 2 && a[2].is_json() && is_int(a[2].j) ? num_i(a[2].j) : -1;
      return Value::of(replace(need_str(in, line), to_str(a[0]), to_str(a[1]), cnt, line));
    }
    if (f == "wordcount") return Value::of(static_cast<int64_t>(split(need_str(in, line), nullptr, -1, line).size()));
    if (f == "indent") {
      const Value* w = arg(a, kw, 0, "width");
      const Value* ff = arg(a, kw, 1, "first");
      const Value* bl = arg(a, kw, 2, "blank");
      std::string pad = !w ? std::string(4, ' ')
                           : (w->is_json() && w->j.is_string() ? w->j.get<std::string>()
                                                               : std::string(static_cast<size_t>(std::clamp<int64_t>(w->is_json() && is_int(w->j) ? num_i(w->j) : 4, 0, 1000)), ' '));
      bool first = ff && truthy(*ff), blank = bl && truthy(*bl);
      std::string s = need_str(in, line), o;
      std::vector<std::string> lines;
      size_t p = 0;
      while (true) {
        size_t q = s.find('\n', p);
        if (q == std::string::npos) {
          lines.push_back(s.substr(p));
          break;
        }
        lines.push_back(s.substr(p, q - p));
        p = q + 1;
      }
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i) o += '\n';
        bool do_pad = i == 0 ? first : (blank || !strip_chars(lines[i], nullptr, true, true).empty());
        if (do_pad) o += pad;
        o += lines[i];
        check_size(o.size(), line);
      }
      return Value::of(o);
    }
    if (f == "int") {
      if (in.is_json() && is_num(in.j)) return Value::of(is_int(in.j) ? num_i(in.j) : static_cast<int64_t>(num_d(in.j)));
      const Value* d = arg(a, kw, 0, "default");
      std::string s = strip_chars(to_str(in), nullptr, true, true);
      char* e = nullptr;
      errno = 0;
      long long x = std::strtoll(s.c_str(), &e, 10);
      if (!s.empty() && *e == 0 && errno == 0) return Value::of(static_cast<int64_t>(x));
      double dd = std::strtod(s.c_str(), &e);
      if (!s.empty() && *e == 0 && std::isfinite(dd) && std::fabs(dd) < 9e18) return Value::of(static_cast<int64_t>(dd));
      return d ? *d : Value::of(0);
    }
    if (f == "float") {
      if (in.is_json() && is_num(in.j)) return Value::of(num_d(in.j));
      const Value* d = arg(a, kw, 0, "default");
      std::string s = strip_chars(to_str(in), nullptr, true, true);
      char* e = nullptr;
      double dd = std::strtod(s.c_str(), &e);
      if (!s.empty() && *e == 0) return Value::of(dd);
      return d ? *d : Value::of(0.0);
    }
    if (f == "abs") {
      const json& j = need_json(in, line);
      if (is_int(j)) {
        int64_t x = num_i(j);
        if (x == INT64_MIN) fail(line, "integer overflow");
        return Value::of(x < 0 ? -x : x);
      }
      if (j.is_number_float()) return Value::of(std::fabs(j.get<double>()));
      fail(line, std::string("bad operand type for abs(): '") + type_name(in) + "'");
    }
    if (f == "round") {
      const json& j = need_json(in, line);
      if (!is_num(j)) fail(line, "round needs a number");
      const Value* pr = arg(a, kw, 0, "precision");
      const Value* me = arg(a, kw, 1, "method");
      int64_t p = pr && pr->is_json() && is_int(pr->j) ? std::clamp<int64_t>(num_i(pr->j), -300, 300) : 0;
      std::string method = me ? to_str(*me) : "common";
      double x = num_d(j), m = std::pow(10.0, static_cast<double>(p));
      if (method == "common" && p >= 0) {
        char b[400];
        std::snprintf(b, sizeof b, "%.*f", static_cast<int>(p), x);
        return Value::of(std::strtod(b, nullptr));
      }
      double r = method == "ceil" ? std::ceil(x * m) / m : method == "floor" ? std::floor(x * m) / m : std::nearbyint(x * m) / m;
      return Value::of(r);
    }
    if (f == "first" || f == "last") {
      if (in.is_json() && in.j.is_array()) {
        if (in.j.empty()) return Value::undef("No " + f + " item, sequence was empty.");
        return Value::of(f == "first" ? in.j.front() : in.j.back());
      }
      auto items = iterate(in, line);
      if (items.empty()) return Value::undef("No " + f + " item, sequence was empty.");
      return f == "first" ? items.front() : items.back();
    }
    if (f == "list") return Value::of(iterate_json(in, line));
    if (f == "reverse") {
      if (in.is_json() && in.j.is_string()) {
        auto items = iterate(in, line);
        std::string r;
        for (auto it = items.rbegin(); it != items.rend(); ++it) r += it->j.get<std::string>();
        return Value::of(r);
      }
      json l = iterate_json(in, line);
      std::reverse(l.begin(), l.end());
      return Value::of(std::move(l));
    }
    if (f == "join") {
      const Value* d = arg(a, kw, 0, "d");
      const Value* at = arg(a, kw, 1, "attribute");
      std::string sep = d ? to_str(*d) : "", r;
      bool first = true;
      for (const auto& e : iterate(in, line)) {
        if (!first) r += sep;
        first = false;
        if (at) {
          json v = attr_path(to_json(e), to_str(*at), line);
          if (!v.is_discarded()) r += to_str(Value::of(v));
        } else {
          r += to_str(e);
        }
        check_size(r.size(), line);
      }
      return Value::of(r);
    }
    if (f == "items") {
      if (in.is_undef()) return Value::of(json::array());
      const json& j = need_json(in, line);
      if (!j.is_object()) fail(line, "items filter needs a mapping");
      return method(j, "items", {}, {}, line);
    }
    if (f == "dictsort") {
      const json& j = need_json(in, line);
      if (!j.is_object()) fail(line, "dictsort needs a mapping");
      const Value* cs = arg(a, kw, 0, "case_sensitive");
      const Value* by = arg(a, kw, 1, "by");
      const Value* rv = arg(a, kw, 2, "reverse");
      bool case_s = cs && truthy(*cs), by_value = by && to_str(*by) == "value", rev = rv && truthy(*rv);
      json r = method(j, "items", {}, {}, line).j;
      std::vector<json> v(r.begin(), r.end());
      std::stable_sort(v.begin(), v.end(), [&](const json& x, const json& y) {
        Value p = Value::of(x[by_value ? 1 : 0]), q = Value::of(y[by_value ? 1 : 0]);
        if (!case_s && p.j.is_string() && q.j.is_string()) p.j = lower(p.j.get<std::string>()), q.j = lower(q.j.get<std::string>());
        int c = cmp_order(p, q, "<", line);
        return rev ? c > 0 : c < 0;
      });
      return Value::of(json(v));
    }
    if (f == "sort") {
      json l = iterate_json(in, line);
      const Value* rv = arg(a, kw, 0, "reverse");
      const Value* cs = arg(a, kw, 1, "case_sensitive");
      const Value* at = arg(a, kw, 2, "attribute");
      bool rev = rv && truthy(*rv), case_s = cs && truthy(*cs);
      std::string attr = at ? to_str(*at) : "";
      std::vector<json> v(l.begin(), l.end());
      auto key = [&](const json& x) {
        json k = at ? attr_path(x, attr, line) : x;
        if (k.is_discarded()) fail(line, "sort attribute missing");
        if (!case_s && k.is_string()) k = lower(k.get<std::string>());
        return Value::of(k);
      };
      step(line, static_cast<int64_t>(v.size()) * 8);
      std::stable_sort(v.begin(), v.end(), [&](const json& x, const json& y) {
        int c = cmp_order(key(x), key(y), "<", line);
        return rev ? c > 0 : c < 0;
      });
      return Value::of(json(v));
    }
    if (f == "unique") {
      json l = iterate_json(in, line), r = json::array();
      const Value* cs = arg(a, kw, 0, "case_sensitive");
      const Value* at = arg(a, kw, 1, "attribute");
      bool case_s = cs && truthy(*cs);
      std::vector<json> seen;
      step(line, static_cast<int64_t>(l.size() * l.size() / 16 + l.size()));
      for (const auto& e : l) {
        json k = at ? attr_path(e, to_str(*at), line) : e;
        if (!case_s && k.is_string()) k = lower(k.get<std::string>());
        bool dup = false;
        for (const auto& s : seen) dup |= py_eq(s, k);
        if (!dup) {
          seen.push_back(k);
          r.push_back(e);
        }
      }
      return Value::of(std::move(r));
    }
    if (f == "batch") {
      const Value* n = arg(a, kw, 0, "linecount");
      if (!n || !n->is_json() || !is_int(n->j) || num_i(n->j) <= 0) fail(line, "batch needs a positive count");
      const Value* fill = arg(a, kw, 1, "fill_with");
      size_t c = static_cast<size_t>(num_i(n->j));
      json l = iterate_json(in, line), r = json::array(), cur = json::array();
      for (const auto& e : l) {
        cur.push_back(e);
        if (cur.size() == c) r.push_back(cur), cur = json::array();
      }
      if (!cur.empty()) {
        if (fill)
          while (cur.size() < c) cur.push_back(to_json(*fill));
        r.push_back(cur);
      }
      return Value::of(std::move(r));
    }
    if (f == "map") {
      json r = json::array();
      if (!truthy(in)) return Value::of(std::move(r));
      const Value* at = kwarg(kw, "attribute");
      if (at) {
        const Value* def = kwarg(kw, "default");
        for (const auto& e : iterate(in, line)) {
          json v = attr_path(to_json(e), to_str(*at), line);
          r.push_back(v.is_discarded() ? (def ? to_json(*def) : json()) : v);
        }
        return Value::of(std::move(r));
      }
      if (a.empty()) fail(line, "map needs a filter name or attribute");
      std::string fn = to_str(a[0]);
      Args rest(a.begin() + 1, a.end());
      for (const auto& e : iterate(in, line)) r.push_back(to_json(filter(fn, e, rest, kw, line)));
      return Value::of(std::move(r));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      bool attr = f.size() > 6;
      bool want = f[0] == 's';
      size_t base = attr ? 1 : 0;
      if (attr && a.empty()) fail(line, f + " needs an attribute");
      std::string at = attr ? to_str(a[0]) : "";
      std::string tn = a.size() > base ? to_str(a[base]) : "";
      Args targs(a.begin() + static_cast<std::ptrdiff_t>(std::min(a.size(), base + 1)), a.end());
      json r = json::array();
      if (!truthy(in)) return Value::of(std::move(r));
      for (const auto& e : iterate(in, line)) {
        step(line);
        Value v = e;
        if (attr) {
          json x = attr_path(to_json(e), at, line);
          v = x.is_discarded() ? Value::undef("no attribute '" + at + "'") : Value::of(x);
        }
        bool ok = tn.empty() ? truthy(v) : test(tn, v, targs, line);
        if (ok == want) r.push_back(to_json(e));
      }
      return Value::of(std::move(r));
    }
    if (f == "sum") {
      const Value* at = arg(a, kw, 0, "attribute");
      const Value* st = arg(a, kw, 1, "start");
      Value acc = st ? *st : Value::of(0);
      for (const auto& e : iterate(in, line)) {
        Value v = e;
        if (at) v = Value::of(attr_path(to_json(e), to_str(*at), line));
        acc = binop("+", acc, v, line);
      }
      return acc;
    }
    if (f == "min" || f == "max") {
      auto items = iterate(in, line);
      if (items.empty()) return Value::undef("No aggregated item, sequence was empty.");
      Value best = items[0];
      for (const auto& e : items)
        if (cmp_order(e, best, "<", line) == (f == "min" ? -1 : 1)) best = e;
      return best;
    }
    if (f == "center" || f == "truncate" || f == "format" || f == "urlencode" || f == "xmlattr" || f == "pprint" ||
        f == "filesizeformat" || f == "striptags" || f == "urlize" || f == "wordwrap" || f == "groupby" ||
        f == "attr" || f == "random" || f == "slice")
      fail(line, "filter '" + f + "' is not supported");
    fail(line, "No filter named '" + f + "'.");
  }
};

}  // namespace

Result<std::string> render_jinja(std::string_view source, const nlohmann::ordered_json& variables,
                                 const JinjaOptions& options) {
  try {
    Lexer lx(source);
    Parser ps(lx.run(), options.max_depth);
    NodeP tpl = ps.parse_template();
    Scope root;
    if (variables.is_object())
      for (const auto& [k, v] : variables.items()) root.vars[k] = Value::of(v);
    Interp in(options);
    std::string out;
    in.run(tpl.get(), root, out);
    return out;
  } catch (const JErr& e) {
    return Status::error(StatusCode::InvalidArgument,
                         "chat template error at line " + std::to_string(e.line) + ": " + e.msg);
  } catch (const std::bad_alloc&) {
    return Status::error(StatusCode::InvalidArgument, "chat template error at line 0: out of memory");
  } catch (const std::exception& e) {
    return Status::error(StatusCode::InvalidArgument, std::string("chat template error at line 0: ") + e.what());
  }
}

}  // namespace atelier::text
