// Bad inputs, table-driven (issue 14): every command's flags and every field
// of a request line (text and image, as a batch line and as flags) given
// values out of range, NaN, infinities, huge and overflowing numbers,
// negatives, the wrong type, invalid UTF-8, empty strings, and folders or
// FIFOs where files go. Each must end with exit 2 and a message naming the
// flag or field, never a crash (no 134/139, no "terminate called") and never
// a hang (each run is under `timeout`). The number of cases is printed.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using atelier::test::shell_quote;
using atelier::test::slurp;

namespace {

const std::string kFixtures = ATELIER_FIXTURES_DIR;
const std::string kModel = kFixtures + "/text/stories260K.gguf";
const std::string kCvae = kFixtures + "/image/quickdraw-cvae.safetensors";

struct Case {
  std::vector<std::string> args;
  std::string names;  // what the message must mention: the flag or field (its name without dashes, any case), or a path
  int want = 2;       // 2: bad usage; 1: a failure (the file is missing or not a model); 0: either (never 0 itself, never a crash)
};

struct Result {
  int code;
  std::string err;
};

struct Sandbox : atelier::test::ScratchDir {
  Sandbox() : ScratchDir("atelier_badinput") {}
  std::string path(const std::string& n) const { return (dir / n).string(); }
  Result run(const std::vector<std::string>& args) const {
    // -k: a process that ignores SIGTERM (as one did, looping) is killed 5 s later, so a hang fails the case, never the run.
    std::string cmd = "timeout -k 5 30 " + shell_quote(atelier::test::atelier_binary());
    for (const auto& a : args) cmd.append(" ").append(shell_quote(a));
    cmd.append(" </dev/null >/dev/null 2>").append(shell_quote(path("err")));
    const int rc = std::system(cmd.c_str());
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc), slurp(path("err"))};
  }
};

const std::string kBadUtf8 = "caf\xc3\x28 \xff\xfe";  // a broken 2-byte sequence, then bytes UTF-8 never uses

// Values a number flag must refuse, whatever its range.
const std::vector<std::string> kNotNumbers = {"nan", "NaN", "inf", "-inf", "1e400", "-1e400", "abc", "", "12abc", "99999999999999999999999"};
const std::vector<std::string> kNotWhole = {"1.5", "1e3x", "0.0.1"};

std::vector<Case> flag_cases(const Sandbox& sb) {
  const std::string dir = sb.dir.string(), fifo = sb.path("fifo"), png = sb.path("x.png"), data = sb.path("data");
  std::vector<Case> v;
  // `base` + FLAG VALUE for each VALUE: must fail naming FLAG.
  auto each = [&](const std::vector<std::string>& base, const std::string& flag, const std::vector<std::string>& values,
                  const std::string& names = "") {
    for (const auto& val : values) {
      std::vector<std::string> a = base;
      if (!flag.empty()) a.push_back(flag);
      a.push_back(val);
      v.push_back({a, names.empty() ? flag : names});
    }
  };
  // Folders and FIFOs where a file goes: bad usage, named by path. A missing
  // file, or an empty one where a model or picture goes: a failure (exit 1), named by path.
  auto files = [&](const std::vector<std::string>& base, const std::string& flag, bool empty_too = true) {
    for (const std::string& f : {dir, fifo}) {
      std::vector<std::string> a = base;
      if (!flag.empty()) a.push_back(flag);
      a.push_back(f);
      v.push_back({a, f, 2});
    }
    std::vector<std::string> fails = {sb.path("missing.file")};
    if (empty_too) fails.push_back(sb.path("empty.gguf"));
    for (const std::string& f : fails) {
      std::vector<std::string> a = base;
      if (!flag.empty()) a.push_back(flag);
      a.push_back(f);
      v.push_back({a, f, 0});  // some commands check existence while parsing flags (2), others when they open the file (1)
    }
  };
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  auto plus = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto numbers = kNotNumbers, whole = plus(kNotNumbers, kNotWhole);

  // text, queue add: the request flags.
  const std::vector<std::string> text = {"text", "-m", kModel, "-p", "Once"};
  const std::vector<std::string> qadd = {"queue", "--data-dir", data, "add", "-m", kModel, "-p", "Once"};
  for (const auto& base : {text, qadd}) {
    each(base, "-n", plus(whole, {"0", "-1", "2000000"}), "-n");
    each(base, "--temp", plus(numbers, {"-0.5", "101"}));
    each(base, "--top-k", plus(whole, {"-1", "99999999"}));
    each(base, "--top-p", plus(numbers, {"-0.1", "1.5"}));
    each(base, "--min-p", plus(numbers, {"-0.1", "2"}));
    each(base, "--repeat-penalty", plus(numbers, {"-1", "1000"}));
    each(base, "--repeat-last-n", plus(whole, {"-1", "99999999"}));
    each(base, "--frequency-penalty", plus(numbers, {"-101", "101"}), "frequency");
    each(base, "--presence-penalty", plus(numbers, {"-101", "101"}), "presence");
    each(base, "--seed", plus(whole, {"-1", "18446744073709551615", "18446744073709551616"}));
  }
  each(qadd, "--priority", whole);
  each(text, "--threads", plus(whole, {"0", "-3", "100000"}));
  each(text, "--ctx", plus(whole, {"0", "-1", "99999999"}));
  each(text, "--kv-type", {"f8", "", "F16x"});
  files({"text", "-p", "Once"}, "-m");
  files({"text", "-m", kFixtures + "/text/stories260K.bin", "-p", "Once"}, "--tokenizer");
  v.push_back({with(text, {"-n", "2", "--stop", ""}), "--stop"});
  // Text that is not UTF-8: a cut sequence, a lone surrogate, an overlong '/', past U+10FFFF, a stray continuation byte.
  const std::vector<std::string> not_utf8 = {kBadUtf8, "a\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80", "\x80x", "tail\xe6\x97"};
  each({"text", "-m", kModel, "-n", "2"}, "-p", not_utf8, "prompt");
  each({"queue", "--data-dir", data, "add", "-m", kModel, "-n", "2"}, "-p", not_utf8, "prompt");
  each(with(text, {"-n", "2"}), "--stop", not_utf8, "stop");


  // image: every number, every choice, every file.
  const std::vector<std::string> image = {"image", "-m", kCvae, "-p", "apple", "-o", png};
  each(image, "--steps", plus(whole, {"0", "-1", "100000"}));
  each({"image", "-m", kCvae, "-o", png}, "-p", not_utf8, "prompt");
  each(image, "--negative", not_utf8, "negative prompt");
  each(image, "--cfg", plus(numbers, {"-1", "1e30"}));
  each(image, "-W", plus(whole, {"0", "-8", "12", "16384", "1000000"}), "width");
  each(image, "-H", plus(whole, {"0", "-8", "12", "16384", "1000000"}), "height");
  each(image, "--batch-count", plus(whole, {"0", "-1", "100000"}));
  each(image, "--batch-size", plus(whole, {"0", "-1", "17"}));
  each(with(image, {"--init", kFixtures + "/image/llama_cute.jpg"}), "--strength", plus(numbers, {"0", "-0.5", "1.5"}));
  each(image, "--sampler", {"", "euler_x", "\xff"});
  each(image, "--rng", {"gpu", ""});
  each(image, "--scheduler", {"linear", ""});
  each(image, "--prediction", {"x", ""});
  each(image, "--threads", plus(whole, {"0", "-1", "100000"}));
  // Pictures and the preview decoder go to a narrow Stable Diffusion checkpoint (QuickDraw takes none).
  const std::vector<std::string> sd = {"image", "-m", sb.path("sd.safetensors"), "--tokenizer", kFixtures + "/clip/bpe_simple_vocab_16e6.txt.gz",
                                       "-p", "a fox", "-W", "64", "-H", "64", "--steps", "1", "-o", png};
  files(sd, "--init");
  files(with(sd, {"--init", kFixtures + "/image/llama_cute.jpg"}), "--mask");
  v.push_back({with(sd, {"--init", kModel}), kModel, 2});  // a GGUF is not a picture: bad input, refused before the job runs
  for (const std::string& f : {fifo}) v.push_back({with(sd, {"--taesd", f}), f, 2});
  for (const std::string& f : {dir, sb.path("missing.file"), sb.path("empty.gguf")}) v.push_back({with(sd, {"--taesd", f}), f, 1});
  v.push_back({with(image, {"--init", kFixtures + "/image/llama_cute.jpg"}), "QuickDraw"});
  for (const std::string& f : {fifo}) v.push_back({{"image", "-p", "apple", "-o", png, "-m", f}, f, 2});
  // A folder may be a diffusers checkpoint: an empty one is a model that does not load (1), as is an empty file.
  for (const std::string& f : {dir, sb.path("missing.file"), sb.path("empty.gguf")}) v.push_back({{"image", "-p", "apple", "-o", png, "-m", f}, f, 1});
  each({"image", "-p", "apple", "-o", png}, "-m", {""}, "model");
  each({"image", "-m", kCvae, "-p", "apple"}, "-o", {dir}, dir);
  each({"image", "-m", kCvae, "-p", "apple"}, "-o", {""}, "output");

  // The queue runner and its neighbours.
  const std::vector<std::string> headless = {"--headless", "--data-dir", data};
  each(headless, "--threads", plus(whole, {"0"}));
  each(headless, "--max-batch", plus(whole, {"0", "100000"}));
  each(headless, "--max-wait-ms", plus(whole, {"-1", "100000"}));
  each(headless, "--kv-mib", plus(whole, {"0", "99999999999"}));
  each({"queue", "--data-dir", data, "list"}, "--limit", plus(whole, {"0", "-1"}));
  each({"queue", "--data-dir", data, "list"}, "--state", {"done", ""});
  each({"queue", "--data-dir", data}, "cancel", {"x", "1.5", "99999999999999999999999", ""}, "ids");
  v.push_back({{"queue", "--data-dir", data, "cancel", "-1"}, "no job -1", 1});
  each({"batch", sb.path("one.jsonl"), "--data-dir", data}, "--shard", {"1", "4/0", "5/4", "-1/4", "a/b", "", "1/99999999999999999999"},
       "--shard");
  // A file where a folder goes: the folder cannot be made (exit 1, named).
  for (const std::string& f : {sb.path("one.jsonl"), fifo}) {
    v.push_back({{"batch", sb.path("one.jsonl"), "--data-dir", data, "--out", f}, f, 1});
    v.push_back({{"--headless", "--data-dir", f}, f, 1});
  }
  files({"batch", "--data-dir", data}, "", false);

  // The model store.
  const std::string store = sb.path("store");
  each({"models", "import", kModel, "--store", store}, "--name", {"", "a/b", "..", "x y", kBadUtf8, std::string(300, 'a')});
  each({"models", "import", kModel, "--name", "x", "--store", store}, "--kind", {"video", ""});
  each({"models", "import", kModel, "--name", "x", "--store", store}, "--role", {""}, "role");
  for (const std::string& f : {dir, fifo, sb.path("missing.file"), sb.path("empty.gguf")})
    v.push_back({{"models", "import", f, "--name", "x", "--store", store}, f, 0});  // refused as "not a model file" (1) or usage (2)
  for (const std::string& r : {std::string(""), std::string("x@"), std::string("x@-1"), std::string("x@99999999999999999999"),
                               std::string("sha256:zz"), kBadUtf8})
    v.push_back({{"models", "info", r, "--store", store}, "", 2});
  each({"models", "pull", "stories260k", "--mirror", kFixtures, "--store", store}, "--retries", plus(whole, {"-1", "101"}));
  each({"models", "promote", "x@1", "--store", store}, "", {"gold", ""}, "channel");
  const std::vector<std::string> synth = {"models", "synth", "--arch", "sd15", "-o", sb.path("s.safetensors")};
  each(synth, "--width-mult", plus(numbers, {"0", "-0.5", "1.5"}));
  each(synth, "--heads", plus(whole, {"-1", "7"}));
  each({"models", "synth", "-o", sb.path("s.gguf")}, "--arch", {"gpt", ""});
  each({"models", "synth", "-o", sb.path("s.gguf")}, "--type", {"q2", ""});
  each({"models", "synth", "--params", "260K", "-o", sb.path("s.gguf")}, "--seed", plus(whole, {"-1", "18446744073709551615"}));

  // Benchmarks and the server (a value they accept would start them: the timeout catches it).
  each({"bench", "text", "-m", kModel}, "-p", plus(whole, {"0", "100000"}));
  each({"bench", "text", "-m", kModel}, "-n", plus(whole, {"0"}));
  each({"bench", "text", "-m", kModel}, "--reps", plus(whole, {"0", "1001"}));
  each({"bench", "image", "-m", kCvae}, "-W", plus(whole, {"0", "8192"}), "width");
  v.push_back({{"bench", "image", "-m", kCvae, "-W", "12"}, "multiples of 8"});
  each({"bench", "image", "-m", kCvae}, "--batch", plus(whole, {"0", "65"}));
  each({"bench", "serve", "-m", kModel}, "--concurrency",
       {"", "0", "-1", "a,b", "99999999999", "4097", "1,,2", ",1", "1,", "1,0", "2,-3", "1,99999999999", "1, 2", "1.5"});
  // A list names its bad item: the empty one by its place, the others by value.
  for (const auto& [list, item] : std::vector<std::pair<std::string, std::string>>{
           {"1,,2", "item 2"}, {",4", "item 1"}, {"1,0", "'0'"}, {"2,-3", "'-3'"}, {"1,99999999999", "'99999999999'"}})
    v.push_back({{"bench", "serve", "-m", kModel, "--concurrency", list}, item});
  each({"bench", "mixed", "-m", kModel, "--image-model", kCvae}, "--text-start", plus(numbers, {"-1", "4000"}));
  each({"serve", "--data-dir", data}, "--port", plus(whole, {"-1", "65536"}));
  each({"serve", "--data-dir", data}, "--max-body-bytes", plus(whole, {"0", "1023"}));
  each({"serve", "--data-dir", data}, "--max-image-pixels", plus(whole, {"0"}));
  each({"serve", "--data-dir", data}, "--max-connections", plus(whole, {"0", "4097"}));
  each({"serve", "--data-dir", data}, "--header-timeout", plus(whole, {"0", "3601"}));
  each({"serve", "--data-dir", data}, "--body-timeout", plus(whole, {"0", "86401"}));
  files({"template", "render", "--messages", sb.path("msgs.json")}, "--template", false);
  files({"template", "render", "--template", sb.path("t.jinja")}, "--messages", false);
  v.push_back({{"template", "render", "--template", sb.path("t.jinja"), "--messages", sb.path("empty.gguf")}, "messages", 0});
  files({"tokenize", "-m", kModel, "--", "Once"}, "--tokenizer");
  return v;
}

// Batch lines: one field wrong at a time in an otherwise good line.
std::vector<std::pair<std::string, std::string>> line_cases() {
  const json text = {{"model", kModel}, {"prompt", "Once"}, {"max_new_tokens", 4}};
  const json image = {{"kind", "image"}, {"model", kCvae}, {"prompt", "apple"}, {"width", 32}, {"height", 32}};
  std::vector<std::pair<std::string, std::string>> v;
  auto set = [&](json line, const std::string& key, const json& val, const std::string& names = "") {
    if (key.rfind("sampling.", 0) == 0) line["sampling"][key.substr(9)] = val;
    else line[key] = val;
    v.push_back({line.dump(), names.empty() ? key.substr(key.rfind('.') + 1) : names});
  };
  // Raw JSON text for numbers nlohmann cannot hold, and for bytes it would refuse to dump.
  auto raw = [&](const json& base, const std::string& key, const std::string& value) {
    std::string s = base.dump();
    s.insert(s.size() - 1, ",\"" + key + "\":" + value);
    // 1e400 is refused while the line is parsed, before its field is known; the rest by name.
    v.push_back({s, value.find("e400") != std::string::npos ? "too large" : key});
  };
  const std::vector<json> wrong_type = {"4", json::array({1}), json::object(), true, nullptr};
  for (const char* k : {"max_new_tokens", "priority"}) {
    for (const auto& w : wrong_type) set(text, k, w);
    for (const char* n : {"1e400", "-1e400", "1e300", "2.5", "99999999999999999999"}) raw(text, k, n);
  }
  set(text, "max_new_tokens", 0);
  set(text, "max_new_tokens", -1);
  set(text, "max_new_tokens", 1 << 30);
  for (const char* k : {"sampling.temperature", "sampling.top_p", "sampling.min_p", "sampling.repeat_penalty",
                        "sampling.frequency_penalty", "sampling.presence_penalty"}) {
    for (const auto& w : wrong_type) set(text, k, w);
    set(text, k, -1000.0);
    set(text, k, 1e30);
  }
  set(text, "sampling.top_p", 1.5);
  set(text, "sampling.min_p", -0.1);
  set(text, "sampling.temperature", -0.5);
  for (const char* k : {"sampling.top_k", "sampling.repeat_last_n"}) {
    for (const auto& w : wrong_type) set(text, k, w);
    set(text, k, -1);
    set(text, k, 1e12);
  }
  for (const auto& w : {json(-5), json(1.5), json("7"), json(-1e30)}) set(text, "sampling.seed", w);
  set(text, "sampling", 7, "sampling");
  set(text, "sampling", json::array(), "sampling");
  set(text, "stop", 7, "stop");
  set(text, "stop", json::array({1, 2}), "stop");
  set(text, "stop", json::array({""}), "stop");
  set(text, "prompt", 7, "prompt");
  set(text, "prompt", nullptr, "prompt");
  set(text, "model", 7, "model");
  set(text, "model", "", "model");
  set(text, "interactive", "yes", "interactive");
  set(text, "logprobs", "yes", "logprobs");
  set(text, "top_logprobs", -1, "top_logprobs");
  set(text, "top_logprobs", 1000, "top_logprobs");
  set(text, "json_schema", "not a schema", "json_schema");
  set(text, "json_schema", json{{"type", "no-such-type"}}, "json_schema");
  set(text, "unknown_field", 1, "unknown_field");
  v.push_back({"{\"model\": \"" + kModel + "\", \"prompt\": \"" + kBadUtf8 + "\"}", "UTF-8"});
  v.push_back({"{\"model\": \"" + kModel + "\", \"prompt\": \"\\ud800\"}", "surrogate"});  // a lone surrogate
  v.push_back({"[1, 2]", "JSON object"});
  v.push_back({"\"just a string\"", "JSON object"});
  v.push_back({"{\"model\": 1", "JSON"});
  v.push_back({"{}", "'model'"});

  for (const char* k : {"width", "height"}) {
    for (const auto& w : wrong_type) set(image, k, w);
    for (const auto& n : {json(0), json(-8), json(12), json(16384), json(1e300)}) set(image, k, n);
  }
  for (const char* k : {"steps", "batch_count", "batch_size"}) {
    for (const auto& w : wrong_type) set(image, k, w);
    set(image, k, 0);
    set(image, k, -1);
    set(image, k, 1e9);
  }
  for (const char* k : {"cfg_scale"}) {  // strength is checked with an init image (the --strength flag cases)
    for (const auto& w : wrong_type) set(image, k, w);
    set(image, k, -1.0);
    set(image, k, 1e39);
  }
  set(image, "seed", -1);
  set(image, "seed", "1");
  for (const char* k : {"sampler", "scheduler", "rng", "prediction"}) {
    set(image, k, 7);
    set(image, k, "no-such-" + std::string(k));
  }
  for (const char* k : {"init_image", "mask", "tokenizer", "preview_decoder"}) set(image, k, 7);
  set(image, "kind", "video", "kind");
  set(image, "output", 7, "output");
  return v;
}

}  // namespace

// Four shards (case k runs in shard k % 4), so that ctest runs them side by
// side: the whole table is ~1000 runs of the binary (over 5 minutes in one
// process under ASan).
constexpr int kShards = 4;
class BadInput : public testing::TestWithParam<int> {};

TEST_P(BadInput, EveryFlagAndFieldGetsExitTwoAndItsName) {
  const int shard = GetParam();
  int k = 0;
  auto mine = [&] { return k++ % kShards == shard; };
  Sandbox sb;
  ASSERT_EQ(::mkfifo(sb.path("fifo").c_str(), 0600), 0);
  std::ofstream(sb.path("empty.gguf")).close();
  std::ofstream(sb.path("one.jsonl")) << json{{"model", kModel}, {"prompt", "Once"}, {"max_new_tokens", 2}}.dump() << "\n";
  std::ofstream(sb.path("t.jinja")) << "{% for m in messages %}{{ m.content }}{% endfor %}";
  std::ofstream(sb.path("msgs.json")) << R"([{"role": "user", "content": "hi"}])";
  ASSERT_EQ(sb.run({"models", "synth", "--arch", "sd15", "--width-mult", "0.1", "-o", sb.path("sd.safetensors")}).code, 0);

  int tried = 0, failures = 0;
  std::map<int, int> codes;
  auto lower = [](std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  // The message names the flag or field: "--top-p" may read "top-p", "top p" or "top_p", in any case.
  auto names_it = [&](const std::string& err, std::string name) {
    if (name.empty()) return true;
    if (err.find(name) != std::string::npos) return true;
    while (!name.empty() && name[0] == '-') name.erase(0, 1);
    const std::string e = lower(err);
    for (char sep : {'-', ' ', '_'}) {
      std::string n = lower(name);
      for (char& ch : n)
        if (ch == '-' || ch == '_') ch = sep;
      if (e.find(n) != std::string::npos) return true;
    }
    return false;
  };
  auto check = [&](const std::vector<std::string>& args, const std::string& names, int want, const std::string& shown) {
    ++tried;
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = sb.run(args);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 3) std::printf("slow (%.1f s): %s\n", s, shown.c_str());
    ++codes[r.code];
    const bool code_ok = want == 0 ? (r.code == 1 || r.code == 2) : r.code == want;
    const bool ok = code_ok && r.err.find("terminate called") == std::string::npos && names_it(r.err, names);
    if (!ok && ++failures <= 80)
      ADD_FAILURE() << shown << "\n  exit " << r.code << (r.code == 124 ? " (hung: killed by timeout)" : "") << ", want " << want
                    << " naming '" << names << "'\n  stderr: " << (r.err.size() > 400 ? "..." + r.err.substr(r.err.size() - 400) : r.err);
  };
  for (const Case& c : flag_cases(sb)) {
    if (!mine()) continue;
    std::string shown = "atelier";
    for (const auto& a : c.args) shown += " " + shell_quote(a);
    check(c.args, c.names, c.want, shown);
  }
  // Batch lines, each in its own file (a line refused at parse time stops the whole file).
  int n = 0;
  for (const auto& [line, names] : line_cases()) {
    if (!mine()) continue;
    const std::string f = sb.path("bad" + std::to_string(n++) + ".jsonl");
    std::ofstream(f, std::ios::binary) << line << "\n";
    // 2 when the line does not parse (nothing is queued); 1 when submit refuses the value (that line fails, named as
    // "line 1 (job 0): ...", the others run).
    // Each in its own --out: a PNG an earlier line wrote would refuse the next ("already exists") before its value is read.
    check({"batch", f, "--out", sb.path("out" + std::to_string(n)), "--data-dir", sb.path("data")}, names, 0, "batch line " + line);
  }
  std::printf("shard %d of %d: %d bad inputs tried, %d not refused as they should be; exit codes:", shard + 1, kShards, tried,
              failures);
  for (const auto& [code, count] : codes) std::printf(" %d x%d", code, count);
  std::printf("\n");
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Shards, BadInput, testing::Range(0, kShards));
