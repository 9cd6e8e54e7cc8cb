// Errors keep their kind: each StatusCode comes from the throw site that knows
// what went wrong, through the public API (no message is mapped to a code by
// substring). One case per kind, plus the model-file sniffer end to end:
// files renamed to the wrong extension still load, by content.
#include <atelier/models.h>
#include <atelier/tools.h>
#include <atelier/store.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

using namespace atelier;
namespace fs = std::filesystem;

namespace {
const std::string kFix = ATELIER_FIXTURES_DIR;

class Scratch {
 public:
  Scratch() {
    static int n = 0;
    dir_ = fs::temp_directory_path() / ("atelier-error-kinds-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    fs::permissions(dir_ / "ro", fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string copy(const std::string& from, const std::string& name) const {
    fs::copy_file(from, dir_ / name, fs::copy_options::overwrite_existing);
    return path(name);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return path(name);
  }

 private:
  fs::path dir_;
};

TextModelOptions one_thread(const std::string& tokenizer = "") {
  TextModelOptions o;
  o.threads = 1;
  o.tokenizer_path = tokenizer;
  return o;
}

std::vector<int32_t> greedy_ids(TextModel& m, int n) {
  TextRequest r;
  r.prompt = "Once upon a time";
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  auto out = m.generate(r);
  EXPECT_TRUE(out.ok()) << out.status().message;
  return out.ok() ? out->ids : std::vector<int32_t>{};
}
}  // namespace

// ---- one case per kind ----------------------------------------------------

TEST(ErrorKinds, BadReferenceIsInvalidArgument) {
  Scratch s;
  ASSERT_TRUE(Store::open(s.path("store"), true).ok());
  const auto r = resolve_model("bad name!", s.path("store"));
  EXPECT_EQ(r.status().code, StatusCode::InvalidArgument) << r.status().message;
  EXPECT_EQ(resolve_model("stories:beta", s.path("store")).status().code, StatusCode::InvalidArgument);
  EXPECT_EQ(resolve_model("x@first", s.path("store")).status().code, StatusCode::InvalidArgument);
  auto st = Store::open(s.path("store"), true);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st.value()->import({{kFix + "/text/stories260K.gguf", "model"}}, "bad name!").status().code,
            StatusCode::InvalidArgument);
  EXPECT_EQ(st.value()->import({{kFix + "/text/stories260K.gguf", "weights?"}}, "ok").status().code,
            StatusCode::InvalidArgument);
  EXPECT_EQ(st.value()->promote("ok@1", "beta").status().code, StatusCode::InvalidArgument);
}

TEST(ErrorKinds, MissingStoreModelIsNotFound) {
  Scratch s;
  auto st = Store::open(s.path("store"), true);
  ASSERT_TRUE(st.ok());
  const auto r = resolve_model("nothing", s.path("store"));
  EXPECT_EQ(r.status().code, StatusCode::NotFound) << r.status().message;
  ASSERT_TRUE(st.value()->import({{kFix + "/text/stories260K.gguf", "model"}}, "tiny").ok());
  EXPECT_EQ(resolve_model("tiny@7", s.path("store")).status().code, StatusCode::NotFound);
  EXPECT_EQ(resolve_model("tiny:prod", s.path("store")).status().code, StatusCode::NotFound);
  EXPECT_EQ(st.value()->import({{s.path("absent.gguf"), "model"}}, "gone").status().code, StatusCode::NotFound);
}

TEST(ErrorKinds, Llama2cWithoutTokenizerIsNotFound) {
  Scratch s;
  const std::string bin = s.copy(kFix + "/text/stories260K.bin", "alone.bin");  // no tok*.bin beside it
  auto m = TextModel::open(bin, one_thread());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code, StatusCode::NotFound) << m.status().message;
  EXPECT_NE(m.status().message.find("--tokenizer"), std::string::npos) << m.status().message;
  auto given = TextModel::open(bin, one_thread(s.path("no-such-tokenizer.bin")));
  ASSERT_FALSE(given.ok());
  EXPECT_EQ(given.status().code, StatusCode::NotFound) << given.status().message;
  EXPECT_NE(given.status().message.find("tokenizer file not found"), std::string::npos) << given.status().message;
}

TEST(ErrorKinds, CorruptGgufIsInvalidModel) {
  Scratch s;
  const std::string bad = s.write("broken.gguf", std::string("GGUF\x03\0\0\0garbage garbage garbage", 31));
  auto m = TextModel::open(bad, one_thread());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code, StatusCode::InvalidModel) << m.status().message;
  EXPECT_NE(m.status().message.find(bad), std::string::npos) << m.status().message;
}

TEST(ErrorKinds, UnsupportedArchitectureIsUnsupported) {
  // A vocabulary-only GGUF of a falcon model: the tokenizer loads, the architecture is refused.
  auto m = TextModel::open(kFix + "/vocab/ggml-vocab-falcon.gguf", one_thread());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code, StatusCode::Unsupported) << m.status().message;
  EXPECT_NE(m.status().message.find("falcon"), std::string::npos) << m.status().message;
  // An image model given for text: a valid file of another kind.
  auto img = TextModel::open(kFix + "/image/quickdraw-cvae.safetensors", one_thread());
  ASSERT_FALSE(img.ok());
  EXPECT_EQ(img.status().code, StatusCode::Unsupported) << img.status().message;
}

TEST(ErrorKinds, SynthWithBadHeadCountIsInvalidArgument) {
  Scratch s;
  SynthImageSpec spec;
  spec.width_mult = 0.1;  // 32 UNet channels
  spec.unet_heads = 7;
  const Status st = synth_image_model(spec, s.path("x.safetensors"));
  EXPECT_EQ(st.code, StatusCode::InvalidArgument) << st.message;
  EXPECT_NE(st.message.find("heads"), std::string::npos) << st.message;
  EXPECT_FALSE(fs::exists(s.path("x.safetensors")));
}

TEST(ErrorKinds, WriteIntoReadOnlyFolderIsIo) {
  Scratch s;
  fs::create_directories(s.path("ro"));
  fs::permissions(s.path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  // root writes anywhere it may chmod; /proc refuses new files even to root.
  const std::string out = ::geteuid() == 0 ? "/proc/self/atelier-error-kinds.gguf" : s.path("ro/x.gguf");
  SynthTextSpec spec;
  spec.params = "260K";
  const Status st = synth_text_model(spec, out);
  EXPECT_EQ(st.code, StatusCode::Io) << st.message;
  EXPECT_NE(st.message.find("cannot"), std::string::npos) << st.message;
}

TEST(ErrorKinds, UnknownFileSaysWhatWasLookedFor) {
  Scratch s;
  const std::string txt = s.write("notes.bin", "just some notes, not a model\n");
  auto m = TextModel::open(txt, one_thread());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code, StatusCode::InvalidModel) << m.status().message;
  for (const char* what : {"GGUF", "safetensors", "llama2.c", txt.c_str()})
    EXPECT_NE(m.status().message.find(what), std::string::npos) << what << ": " << m.status().message;
}

TEST(ErrorKinds, TruncatedLlama2cSaysTruncated) {
  Scratch s;
  const std::string cut = s.path("cut.bin");
  {
    std::ifstream in(kFix + "/text/stories260K.bin", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 1000);
  }
  auto m = TextModel::open(cut, one_thread(kFix + "/text/tok512.bin"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code, StatusCode::InvalidModel) << m.status().message;
  EXPECT_NE(m.status().message.find("truncated"), std::string::npos) << m.status().message;
}

// ---- by content, not extension ----------------------------------------------

TEST(SniffedLoading, GgufRenamedToBinLoads) {
  Scratch s;
  const std::string bin = s.copy(kFix + "/text/stories260K.gguf", "x.bin");
  auto renamed = TextModel::open(bin, one_thread());
  ASSERT_TRUE(renamed.ok()) << renamed.status().message;
  EXPECT_EQ(renamed.value()->info().format, "gguf");
  auto original = TextModel::open(kFix + "/text/stories260K.gguf", one_thread());
  ASSERT_TRUE(original.ok());
  EXPECT_EQ(greedy_ids(*renamed.value(), 12), greedy_ids(*original.value(), 12));
}

TEST(SniffedLoading, Llama2cRenamedToDatLoadsWithItsTokenizer) {
  Scratch s;
  const std::string dat = s.copy(kFix + "/text/stories260K.bin", "x.dat");
  auto renamed = TextModel::open(dat, one_thread(kFix + "/text/tok512.bin"));
  ASSERT_TRUE(renamed.ok()) << renamed.status().message;
  EXPECT_EQ(renamed.value()->info().format, "llama2c");
  auto original = TextModel::open(kFix + "/text/stories260K.bin", one_thread(kFix + "/text/tok512.bin"));
  ASSERT_TRUE(original.ok()) << original.status().message;
  EXPECT_EQ(greedy_ids(*renamed.value(), 12), greedy_ids(*original.value(), 12));
}

TEST(SniffedLoading, SafetensorsRenamedToCkptGeneratesTheSamePixels) {
  Scratch s;
  SynthImageSpec spec;
  spec.width_mult = 0.1;
  spec.type = "f32";
  const std::string st = s.path("x.safetensors");
  ASSERT_TRUE(synth_image_model(spec, st).ok());
  const std::string ckpt = s.copy(st, "x.ckpt");
  ImageRequest r;
  r.prompt = "a red square";
  r.width = r.height = 64;
  r.steps = 2;
  r.seed = 5;
  r.threads = 1;
  r.tokenizer = kFix + "/clip/bpe_simple_vocab_16e6.txt.gz";
  r.model = st;
  auto a = generate_image(r);
  ASSERT_TRUE(a.ok()) << a.status().message;
  r.model = ckpt;
  auto b = generate_image(r);
  ASSERT_TRUE(b.ok()) << b.status().message;
  ASSERT_EQ(a->size(), 1u);
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ(a->at(0).pixels, b->at(0).pixels);
}

TEST(SniffedLoading, QuickDrawRenamedIsStillOnePass) {
  Scratch s;
  const std::string renamed = s.copy(kFix + "/image/quickdraw-cvae.safetensors", "cvae.model");
  ImageRequest r;
  r.model = renamed;
  r.prompt = "an owl";
  r.width = r.height = 64;
  r.seed = 3;
  r.threads = 1;
  auto out = generate_image(r);
  ASSERT_TRUE(out.ok()) << out.status().message;
  EXPECT_EQ(out->size(), 1u);
}

TEST(SniffedLoading, DiscoveryAndStoreReadContent) {
  Scratch s;
  s.copy(kFix + "/text/stories260K.gguf", "a.bin");         // GGUF under a llama2.c name
  s.copy(kFix + "/text/stories260K.bin", "b.dat");          // llama2.c under no model name
  s.copy(kFix + "/text/tok512.bin", "tok512.bin");          // a tokenizer: not listed
  s.copy(kFix + "/image/quickdraw-cvae.safetensors", "c.ckpt");
  s.write("d.gguf", "not a model");                          // listed, with why it cannot load
  s.write("readme.txt", "hello");                            // not listed
  fs::create_directories(s.path("sd/unet"));
  std::ofstream(s.path("sd/model_index.json")) << "{}";
  const auto files = scan_model_folders({s.path("")});
  std::map<std::string, ModelFile> by;
  for (const auto& f : files) by[fs::path(f.path).filename().string()] = f;
  ASSERT_EQ(by.size(), 5u);
  EXPECT_EQ(by["a.bin"].format, "gguf");
  EXPECT_EQ(by["a.bin"].kind, "text");
  EXPECT_EQ(by["b.dat"].format, "llama2c");
  EXPECT_EQ(by["c.ckpt"].format, "safetensors");
  EXPECT_EQ(by["c.ckpt"].kind, "image");
  EXPECT_EQ(by["sd"].format, "diffusers");
  EXPECT_EQ(by["d.gguf"].format, "unknown");
  EXPECT_NE(by["d.gguf"].summary.find("cannot load"), std::string::npos) << by["d.gguf"].summary;

  auto st = Store::open(s.path("store"), true);
  ASSERT_TRUE(st.ok());
  auto v = st.value()->import({{s.path("b.dat"), "model"}, {s.path("tok512.bin"), "tokenizer"}}, "renamed");
  ASSERT_TRUE(v.ok()) << v.status().message;
  auto info = st.value()->resolve("renamed");
  ASSERT_TRUE(info.ok()) << info.status().message;
  EXPECT_EQ(info->format, "llama2c");
  auto bad = st.value()->import({{s.path("d.gguf"), "model"}}, "bad");
  EXPECT_EQ(bad.status().code, StatusCode::InvalidModel) << bad.status().message;
  EXPECT_NE(bad.status().message.find("looked for"), std::string::npos) << bad.status().message;
}
