// Stable Diffusion 1.x/2.x model: synthetic narrow checkpoints (written by
// write_synthetic_sd) load from a single file and from a diffusers folder the
// test lays out itself (its own name mapping, so the loader's is checked);
// version detection on full-size headers (sparse files: names and shapes
// only); the CLIP encoder against plain loops; UNet batch invariance; VAE
// shapes and determinism; the published SD 1.5 parameter counts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <span>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "fake_device.h"
#include "image/clip_text.h"
#include "image/sd_model.h"
#include "image/taesd.h"
#include "image/unet.h"
#include "image/vae.h"

namespace atelier::image {
namespace {

namespace fs = std::filesystem;

// One folder per test process, removed at exit (owned by the same static, so
// it cannot be destroyed before the removal runs).
const fs::path& tmp_dir() {
  struct Dir {
    fs::path p = fs::temp_directory_path() / ("atelier_sd_" + std::to_string(::getpid()));
    Dir() { fs::create_directories(p); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  };
  static const Dir d;
  return d.p;
}

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

// Narrow models: UNet 32 channels, VAE 32, CLIP 64 wide with 2 layers (3 for
// SD2, which runs the penultimate one).
std::string synth(const std::string& arch, const std::string& type) {
  const std::string path = (tmp_dir() / (arch + "_" + type + ".safetensors")).string();
  if (!fs::exists(path)) {
    SdSynthSpec s;
    s.arch = arch;
    s.width_mult = 0.1;
    s.clip_layers = arch == "sd21" ? 3 : 2;
    s.type = type;
    s.seed = 7;
    write_synthetic_sd(s, path);
  }
  return path;
}

std::vector<float> randoms(size_t n, uint32_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = scale * (static_cast<float>(x >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

std::array<int32_t, 77> prompt_ids(int salt) {
  std::array<int32_t, 77> ids;
  ids.fill(49407);
  ids[0] = 49406;
  for (int i = 1; i < 9; ++i) ids[i] = (i * 7919 + salt * 104729) % 49406;
  return ids;
}

// ---- diffusers layout, written here from the original names

std::string unet_res(const std::string& r) {
  static const std::pair<const char*, const char*> m[] = {{"in_layers.0.", "norm1."},      {"in_layers.2.", "conv1."},
                                                          {"emb_layers.1.", "time_emb_proj."}, {"out_layers.0.", "norm2."},
                                                          {"out_layers.3.", "conv2."},     {"skip_connection.", "conv_shortcut."}};
  for (const auto& [a, b] : m)
    if (r.rfind(a, 0) == 0) return b + r.substr(std::strlen(a));
  ADD_FAILURE() << "unmapped resblock tensor " << r;
  return r;
}

std::string to_diffusers_unet(const std::string& n) {
  std::smatch m;
  static const std::regex in_re(R"(input_blocks\.(\d+)\.(\d)\.(.*))"), out_re(R"(output_blocks\.(\d+)\.(\d)\.(.*))"),
      mid_re(R"(middle_block\.(\d)\.(.*))");
  if (n.rfind("input_blocks.0.0.", 0) == 0) return "conv_in." + n.substr(17);
  if (n.rfind("time_embed.0.", 0) == 0) return "time_embedding.linear_1." + n.substr(13);
  if (n.rfind("time_embed.2.", 0) == 0) return "time_embedding.linear_2." + n.substr(13);
  if (n.rfind("out.0.", 0) == 0) return "conv_norm_out." + n.substr(6);
  if (n.rfind("out.2.", 0) == 0) return "conv_out." + n.substr(6);
  if (std::regex_match(n, m, in_re)) {
    const int b = std::stoi(m[1]);
    const std::string rest = m[3];
    if (b % 3 == 0) return "down_blocks." + std::to_string(b / 3 - 1) + ".downsamplers.0.conv." + rest.substr(3);  // op.
    const std::string blk = "down_blocks." + std::to_string((b - 1) / 3);
    const std::string j = std::to_string((b - 1) % 3);
    return m[2] == "0" ? blk + ".resnets." + j + "." + unet_res(rest) : blk + ".attentions." + j + "." + rest;
  }
  if (std::regex_match(n, m, mid_re)) {
    const std::string rest = m[2];
    if (m[1] == "1") return "mid_block.attentions.0." + rest;
    return "mid_block.resnets." + std::string(m[1] == "0" ? "0" : "1") + "." + unet_res(rest);
  }
  if (std::regex_match(n, m, out_re)) {
    const int b = std::stoi(m[1]);
    const std::string rest = m[3], blk = "up_blocks." + std::to_string(b / 3), j = std::to_string(b % 3);
    if (m[2] == "0") return blk + ".resnets." + j + "." + unet_res(rest);
    if (rest.rfind("conv.", 0) == 0) return blk + ".upsamplers.0." + rest;
    return blk + ".attentions." + j + "." + rest;
  }
  ADD_FAILURE() << "unmapped UNet tensor " << n;
  return n;
}

std::string to_diffusers_vae(const std::string& n, bool* squeeze) {
  *squeeze = false;
  std::smatch m;
  static const std::regex down_re(R"(encoder\.down\.(\d)\.block\.(\d)\.(.*))"), up_re(R"(decoder\.up\.(\d)\.block\.(\d)\.(.*))"),
      ds_re(R"(encoder\.down\.(\d)\.downsample\.(.*))"), us_re(R"(decoder\.up\.(\d)\.upsample\.(.*))"),
      mid_re(R"((encoder|decoder)\.mid\.(block_1|block_2|attn_1)\.(.*))"), no_re(R"((encoder|decoder)\.norm_out\.(.*))");
  auto res = [](std::string r) {
    if (r.rfind("nin_shortcut.", 0) == 0) r = "conv_shortcut." + r.substr(13);
    return r;
  };
  if (std::regex_match(n, m, down_re)) return "encoder.down_blocks." + m[1].str() + ".resnets." + m[2].str() + "." + res(m[3]);
  if (std::regex_match(n, m, up_re))
    return "decoder.up_blocks." + std::to_string(3 - std::stoi(m[1])) + ".resnets." + m[2].str() + "." + res(m[3]);
  if (std::regex_match(n, m, ds_re)) return "encoder.down_blocks." + m[1].str() + ".downsamplers.0." + m[2].str();
  if (std::regex_match(n, m, us_re)) return "decoder.up_blocks." + std::to_string(3 - std::stoi(m[1])) + ".upsamplers.0." + m[2].str();
  if (std::regex_match(n, m, no_re)) return m[1].str() + ".conv_norm_out." + m[2].str();
  if (std::regex_match(n, m, mid_re)) {
    const std::string part = m[1], what = m[2], rest = m[3];
    if (what != "attn_1") return part + ".mid_block.resnets." + (what == "block_1" ? "0." : "1.") + res(rest);
    static const std::pair<const char*, const char*> am[] = {
        {"norm.", "group_norm."}, {"q.", "to_q."}, {"k.", "to_k."}, {"v.", "to_v."}, {"proj_out.", "to_out.0."}};
    for (const auto& [a, b] : am)
      if (rest.rfind(a, 0) == 0) {
        *squeeze = std::string(a) != "norm.";
        return part + ".mid_block.attentions.0." + b + rest.substr(std::strlen(a));
      }
  }
  return n;  // conv_in, conv_out, quant_conv, post_quant_conv keep their names
}

void write_json(const fs::path& p, const nlohmann::json& j) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << j.dump(2);
}

// A diffusers folder holding the same tensors as the single file `src`.
std::string write_diffusers(const std::string& src, const std::string& name) {
  const fs::path root = tmp_dir() / name;
  if (fs::exists(root / "unet")) return root.string();
  const auto f = formats::SafetensorsFile::open(src);
  formats::SafetensorsWriter unet, vae, text;
  for (const auto& t : f->tensors()) {
    if (t.name.rfind("model.diffusion_model.", 0) == 0) {
      unet.add_tensor(to_diffusers_unet(t.name.substr(22)), t.dtype, t.shape, t.data, t.bytes);
    } else if (t.name.rfind("first_stage_model.", 0) == 0) {
      bool squeeze = false;
      const std::string n = to_diffusers_vae(t.name.substr(18), &squeeze);
      std::vector<int64_t> shape = t.shape;
      if (squeeze && shape.size() == 4) shape.resize(2);  // diffusers keeps the VAE attention as linears
      vae.add_tensor(n, t.dtype, shape, t.data, t.bytes);
    } else if (t.name.rfind("cond_stage_model.transformer.", 0) == 0) {
      text.add_tensor(t.name.substr(29), t.dtype, t.shape, t.data, t.bytes);
    } else {
      ADD_FAILURE() << "unexpected tensor " << t.name;
    }
  }
  fs::create_directories(root / "unet");
  fs::create_directories(root / "vae");
  fs::create_directories(root / "text_encoder");
  unet.write((root / "unet" / "diffusion_pytorch_model.safetensors").string());
  vae.write((root / "vae" / "diffusion_pytorch_model.safetensors").string());
  text.write((root / "text_encoder" / "model.safetensors").string());
  write_json(root / "unet" / "config.json", {{"attention_head_dim", 8}, {"cross_attention_dim", 64}});
  write_json(root / "text_encoder" / "config.json", {{"hidden_act", "quick_gelu"}, {"num_attention_heads", 1}});
  write_json(root / "scheduler" / "scheduler_config.json", {{"prediction_type", "epsilon"}});
  return root.string();
}

struct Outputs {
  std::vector<float> text, unet, decoded, encoded;
};

Outputs run_all(const SdModel& m) {
  Outputs o;
  const auto ids = prompt_ids(1);
  std::array<float, 77> w;
  w.fill(1.0f);
  w[3] = 1.3f;
  o.text = m.encode_prompt(ids.data(), w.data(), 77, &pool());
  const auto x = randoms(2 * 4 * 8 * 8, 3);
  const float t[2] = {999.0f, 10.5f};
  UnetBatch b;
  b.batch = 2, b.height = 8, b.width = 8, b.x = x.data(), b.timesteps = t;
  b.context = {o.text, o.text};
  o.unet.resize(x.size());
  m.unet(b, o.unet.data(), &pool());
  o.decoded = m.vae_decode(x.data(), 8, 8, &pool());
  o.encoded = m.vae_encode(o.decoded.data(), 64, 64, &pool());
  return o;
}

bool finite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

}  // namespace

TEST(SdModel, SyntheticSd15LoadsAsSd1) {
  const auto m = SdModel::open(synth("sd15", "f16"));
  EXPECT_EQ(m->version(), SdVersion::sd1);
  EXPECT_EQ(m->prediction(), Prediction::epsilon);
  EXPECT_EQ(m->latent_channels(), 4);
  EXPECT_EQ(m->unet_in_channels(), 4);
  EXPECT_EQ(m->context_dim(), 64);
  EXPECT_EQ(m->pad_token(), 49407);
  const SdInfo& i = m->info();
  EXPECT_EQ(i.unet.model_channels, 32);
  EXPECT_EQ(i.unet.channel_mult, (std::vector<int>{1, 2, 4, 4}));
  EXPECT_EQ(i.unet.attention, (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(i.unet.heads, (std::vector<int>{8, 8, 8, 8}));
  EXPECT_FALSE(i.unet.linear_proj);
  EXPECT_FALSE(i.clip.open_clip);
  EXPECT_TRUE(i.clip.quick_gelu);
  EXPECT_EQ(i.clip.layers_used, 2);
  EXPECT_EQ(i.vae.channels, 32);
  // F16 stays F16: about 2 bytes per parameter.
  EXPECT_LT(m->weight_bytes(), 2.2 * static_cast<double>(synthetic_sd_parameters({"sd15", 0.1, 0, 2, "f16", 7})));
}

TEST(SdModel, SyntheticSd21LoadsAsSd2WithVPrediction) {
  const auto m = SdModel::open(synth("sd21", "f16"));
  EXPECT_EQ(m->version(), SdVersion::sd2);
  EXPECT_EQ(m->prediction(), Prediction::v);
  EXPECT_EQ(m->pad_token(), 0);
  const SdInfo& i = m->info();
  EXPECT_TRUE(i.clip.open_clip);
  EXPECT_FALSE(i.clip.quick_gelu);
  EXPECT_EQ(i.clip.layers, 3);
  EXPECT_EQ(i.clip.layers_used, 2);  // penultimate
  EXPECT_TRUE(i.unet.linear_proj);
  EXPECT_EQ(i.unet.heads, (std::vector<int>{1, 2, 4, 4}));  // 32-wide heads written for the narrow model
  SdOptions o;
  o.prediction = Prediction::epsilon;
  EXPECT_EQ(SdModel::inspect(synth("sd21", "f16"), o).prediction, Prediction::epsilon);
  const Outputs out = run_all(*m);
  EXPECT_TRUE(finite(out.unet));
  EXPECT_TRUE(finite(out.encoded));
}

// SD 1.5's published sizes: UNet 859,520,964, VAE 83,653,863, CLIP ViT-L/14 text 123,060,480.
TEST(SdModel, FullSizeSynthHasSd15ParameterCount) {
  SdSynthSpec s;
  EXPECT_EQ(synthetic_sd_parameters(s), 859520964 + 83653863 + 123060480);
}

TEST(SdModel, SingleFileAndDiffusersFolderGiveTheSameBits) {
  const std::string file = synth("sd15", "f32");
  const auto a = SdModel::open(file);
  const auto b = SdModel::open(write_diffusers(file, "diffusers15"));
  EXPECT_EQ(b->info().unet.heads, a->info().unet.heads);
  EXPECT_EQ(b->info().clip.heads, a->info().clip.heads);
  EXPECT_EQ(b->prediction(), Prediction::epsilon);
  const Outputs oa = run_all(*a), ob = run_all(*b);
  ASSERT_TRUE(finite(oa.unet) && finite(oa.text) && finite(oa.encoded));
  EXPECT_EQ(oa.text, ob.text);
  EXPECT_EQ(oa.unet, ob.unet);
  EXPECT_EQ(oa.decoded, ob.decoded);
  EXPECT_EQ(oa.encoded, ob.encoded);
  // The outputs depend on the inputs (a network that ignored them would pass the above).
  EXPECT_NE(std::vector<float>(oa.unet.begin(), oa.unet.begin() + 256), std::vector<float>(oa.unet.begin() + 256, oa.unet.end()));
}

// ---- .ckpt: the same tensors written the way torch.save does ----------------
//
// A PyTorch zip archive (stored entries: NAME/data.pkl, NAME/data/<key>,
// NAME/byteorder, NAME/version) whose pickle (protocol 2) holds
// {"global_step": 470000, "state_dict": OrderedDict(name -> tensor)}, each
// tensor `_rebuild_tensor_v2(persistent storage, 0, size, stride, False,
// OrderedDict())` as torch.save writes them: the shape of an SD 1.x .ckpt.
class PickleOut {
 public:
  std::string bytes = std::string("\x80\x02", 2);
  void op(char c) { bytes += c; }
  void str(const std::string& v) {
    op('X');
    u32(static_cast<uint32_t>(v.size()));
    bytes += v;
  }
  void integer(int64_t v) {
    op('J');
    u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
  }
  void global(const std::string& module, const std::string& name) { bytes += "c" + module + "\n" + name + "\n"; }
  void ints_tuple(const std::vector<int64_t>& v) {
    op('(');
    for (int64_t x : v) integer(x);
    op('t');
  }
  void ordered_dict() {
    global("collections", "OrderedDict");
    op(')');
    op('R');
  }

 private:
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes += static_cast<char>((v >> (8 * i)) & 0xFF);
  }
};

class ZipOut {
 public:
  void add(const std::string& name, const std::string& data) {
    // Data aligned to 64 bytes as torch.save does, through the extra field.
    const size_t header = 30 + name.size();
    const size_t pad = (64 - (out_.size() + header + 4) % 64) % 64 + 4;
    Entry e{name, out_.size(), data.size()};
    le(0x04034b50, 4), le(20, 2), le(0, 2), le(0, 2), le(0, 2), le(0, 2), le(0, 4), le(data.size(), 4), le(data.size(), 4);
    le(name.size(), 2), le(pad, 2);
    out_ += name;
    le(0xCAFE, 2), le(pad - 4, 2);
    out_.append(pad - 4, '\0');
    out_ += data;
    entries_.push_back(e);
  }
  std::string finish() {
    const size_t cd = out_.size();
    for (const Entry& e : entries_) {
      le(0x02014b50, 4), le(20, 2), le(20, 2), le(0, 2), le(0, 2), le(0, 2), le(0, 2), le(0, 4);
      le(e.size, 4), le(e.size, 4), le(e.name.size(), 2), le(0, 2), le(0, 2), le(0, 2), le(0, 2), le(0, 4), le(e.offset, 4);
      out_ += e.name;
    }
    const size_t cd_size = out_.size() - cd;
    le(0x06054b50, 4), le(0, 2), le(0, 2), le(entries_.size(), 2), le(entries_.size(), 2), le(cd_size, 4), le(cd, 4), le(0, 2);
    return out_;
  }

 private:
  struct Entry {
    std::string name;
    size_t offset, size;
  };
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xFF);
  }
  std::string out_;
  std::vector<Entry> entries_;
};

std::string write_ckpt(const std::string& src, const std::string& name) {
  const std::string path = (tmp_dir() / (name + ".ckpt")).string();
  auto f = formats::SafetensorsFile::open(src);
  PickleOut pk;
  ZipOut zip;
  pk.op('}');
  pk.op('(');
  pk.str("global_step");
  pk.integer(470000);
  pk.str("state_dict");
  pk.ordered_dict();
  pk.op('(');
  int key = 0;
  std::vector<std::pair<std::string, std::string>> storages;
  for (const auto& t : f->tensors()) {
    const char* storage = t.dtype == formats::ElemType::F16 ? "HalfStorage" : t.dtype == formats::ElemType::BF16 ? "BFloat16Storage" : "FloatStorage";
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    std::vector<int64_t> stride(t.shape.size(), 1);
    for (size_t i = t.shape.size(); i-- > 1;) stride[i - 1] = stride[i] * t.shape[i];
    pk.str(t.name);
    pk.global("torch._utils", "_rebuild_tensor_v2");
    pk.op('(');
    pk.op('(');
    pk.str("storage");
    pk.global("torch", storage);
    pk.str(std::to_string(key));
    pk.str("cpu");
    pk.integer(numel);
    pk.op('t');
    pk.op('Q');  // BINPERSID
    pk.integer(0);
    pk.ints_tuple(t.shape);
    pk.ints_tuple(stride);
    pk.op('\x89');  // False
    pk.ordered_dict();
    pk.op('t');
    pk.op('R');
    storages.emplace_back(std::to_string(key++), std::string(reinterpret_cast<const char*>(t.data), t.bytes));
  }
  pk.op('u');  // the state dict's items
  pk.op('u');  // the top dict's items
  pk.op('.');
  zip.add("archive/data.pkl", pk.bytes);
  zip.add("archive/byteorder", "little");
  for (const auto& [k, data] : storages) zip.add("archive/data/" + k, data);
  zip.add("archive/version", "3\n");
  std::ofstream(path, std::ios::binary) << zip.finish();
  return path;
}

TEST(SdModel, CkptFromTorchSaveGivesTheSameBits) {
  for (const char* type : {"f32", "f16"}) {
    const std::string file = synth("sd15", type);
    const auto a = SdModel::open(file);
    const auto b = SdModel::open(write_ckpt(file, std::string("ckpt_") + type));
    EXPECT_EQ(b->version(), SdVersion::sd1);
    EXPECT_EQ(b->info().unet.heads, a->info().unet.heads);
    const Outputs oa = run_all(*a), ob = run_all(*b);
    EXPECT_EQ(oa.text, ob.text) << type;
    EXPECT_EQ(oa.unet, ob.unet) << type;
    EXPECT_EQ(oa.decoded, ob.decoded) << type;
    EXPECT_EQ(oa.encoded, ob.encoded) << type;
  }
}

TEST(SdModel, F16WeightsCloseToF32) {
  const Outputs a = run_all(*SdModel::open(synth("sd15", "f32")));
  const Outputs b = run_all(*SdModel::open(synth("sd15", "f16")));
  auto rel = [](const std::vector<float>& x, const std::vector<float>& y) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += x[i] * x[i];
    return std::sqrt(num / den);
  };
  // The f16 file rounds every weight (relative 2^-11); outputs move by about that much, not more.
  EXPECT_LT(rel(a.text, b.text), 2e-2);
  EXPECT_LT(rel(a.unet, b.unet), 2e-2);
  EXPECT_GT(rel(a.unet, b.unet), 0.0);
}

TEST(SdModel, UnetIsBatchInvariant) {
  const auto m = SdModel::open(synth("sd15", "f16"));
  const size_t per = 4 * 8 * 8;
  const auto x = randoms(3 * per, 11);
  std::vector<std::vector<float>> ctx;
  for (int i = 0; i < 3; ++i) {
    const auto ids = prompt_ids(i + 5);
    ctx.push_back(m->encode_prompt(ids.data(), nullptr, 77, &pool()));
  }
  const float t[3] = {981.0f, 500.25f, 1.0f};
  UnetBatch all;
  all.batch = 3, all.height = 8, all.width = 8, all.x = x.data(), all.timesteps = t;
  for (const auto& c : ctx) all.context.emplace_back(c);
  std::vector<float> out(3 * per);
  m->unet(all, out.data(), &pool());
  for (int s = 0; s < 3; ++s) {
    UnetBatch one;
    one.batch = 1, one.height = 8, one.width = 8, one.x = x.data() + s * per, one.timesteps = t + s;
    one.context = {ctx[static_cast<size_t>(s)]};
    std::vector<float> o(per);
    ThreadPool single(1);  // and thread-count invariant
    m->unet(one, o.data(), s == 1 ? &single : &pool());
    EXPECT_EQ(o, std::vector<float>(out.begin() + s * per, out.begin() + (s + 1) * per)) << "sample " << s;
  }
  // Different timesteps give different outputs for the same input.
  UnetBatch two;
  const float t2[2] = {10.0f, 900.0f};
  two.batch = 2, two.height = 8, two.width = 8, two.timesteps = t2;
  std::vector<float> xx(2 * per);
  std::copy_n(x.data(), per, xx.data());
  std::copy_n(x.data(), per, xx.data() + per);
  two.x = xx.data();
  two.context = {ctx[0], ctx[0]};
  std::vector<float> o2(2 * per);
  m->unet(two, o2.data(), &pool());
  EXPECT_NE(std::vector<float>(o2.begin(), o2.begin() + per), std::vector<float>(o2.begin() + per, o2.end()));
}

TEST(SdModel, UnetRejectsBadSizes) {
  const auto m = SdModel::open(synth("sd15", "f16"));
  std::vector<float> x(4 * 12 * 12), out(x.size());
  const float t = 1;
  const std::vector<float> ctx(77 * 64);
  UnetBatch b;
  b.batch = 1, b.height = 12, b.width = 12, b.x = x.data(), b.timesteps = &t, b.context = {ctx};
  EXPECT_THROW(m->unet(b, out.data()), Error);  // 12 is not a multiple of 8 (3 downsamplings)
}

TEST(SdModel, VaeShapesAndDeterminism) {
  const auto m = SdModel::open(synth("sd15", "f16"));
  const auto z = randoms(4 * 8 * 8, 5);
  const auto rgb = m->vae_decode(z.data(), 8, 8, &pool());
  ASSERT_EQ(rgb.size(), 3u * 64 * 64);
  for (float v : rgb) ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
  EXPECT_EQ(rgb, m->vae_decode(z.data(), 8, 8));  // same bits on one thread
  const auto lat = m->vae_encode(rgb.data(), 64, 64, &pool());
  ASSERT_EQ(lat.size(), 4u * 8 * 8);
  EXPECT_TRUE(finite(lat));
  EXPECT_EQ(lat, m->vae_encode(rgb.data(), 64, 64));
  // A non-square picture keeps its aspect.
  const auto wide = randoms(3 * 32 * 64, 9, 0.5f);
  EXPECT_EQ(m->vae_encode(wide.data(), 32, 64).size(), 4u * 4 * 8);
  EXPECT_THROW(m->vae_encode(wide.data(), 30, 64), Error);
}

// ---- the text encoder against plain loops

namespace {

struct NaiveClip {
  const formats::SafetensorsFile& f;
  bool open_clip;
  int width, heads;

  std::vector<double> get(const std::string& n) const {
    const auto& t = f.tensor(n);
    EXPECT_EQ(t.dtype, formats::ElemType::F32);
    std::vector<float> v(static_cast<size_t>(t.elements()));
    std::memcpy(v.data(), t.data, t.bytes);
    return std::vector<double>(v.begin(), v.end());
  }
  static void ln(std::vector<double>& x, int T, int w, const std::vector<double>& g, const std::vector<double>& b) {
    for (int t = 0; t < T; ++t) {
      double m = 0, v = 0;
      for (int i = 0; i < w; ++i) m += x[t * w + i];
      m /= w;
      for (int i = 0; i < w; ++i) v += (x[t * w + i] - m) * (x[t * w + i] - m);
      v /= w;
      for (int i = 0; i < w; ++i) x[t * w + i] = (x[t * w + i] - m) / std::sqrt(v + 1e-5) * g[i] + b[i];
    }
  }
  // y[t][o] = sum_i W[o][i] x[t][i] + b[o]
  static std::vector<double> lin(const std::vector<double>& x, int T, int in, const std::vector<double>& W,
                                 const std::vector<double>& b, int out, int row0 = 0) {
    std::vector<double> y(static_cast<size_t>(T * out));
    for (int t = 0; t < T; ++t)
      for (int o = 0; o < out; ++o) {
        double s = b[row0 + o];
        for (int i = 0; i < in; ++i) s += W[(row0 + o) * in + i] * x[t * in + i];
        y[t * out + o] = s;
      }
    return y;
  }

  std::vector<double> run(const std::array<int32_t, 77>& ids, int layers) const {
    const int T = 77, w = width, hd = w / heads;
    const std::string p = open_clip ? "cond_stage_model.model." : "cond_stage_model.transformer.text_model.";
    const auto tok = get(p + (open_clip ? "token_embedding.weight" : "embeddings.token_embedding.weight"));
    const auto pos = get(p + (open_clip ? "positional_embedding" : "embeddings.position_embedding.weight"));
    std::vector<double> x(static_cast<size_t>(T * w));
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < w; ++i) x[t * w + i] = tok[ids[t] * w + i] + pos[t * w + i];
    for (int l = 0; l < layers; ++l) {
      const std::string b = p + (open_clip ? "transformer.resblocks." : "encoder.layers.") + std::to_string(l) + ".";
      auto h = x;
      ln(h, T, w, get(b + (open_clip ? "ln_1.weight" : "layer_norm1.weight")), get(b + (open_clip ? "ln_1.bias" : "layer_norm1.bias")));
      std::vector<double> q, k, v;
      if (open_clip) {
        const auto W = get(b + "attn.in_proj_weight"), B = get(b + "attn.in_proj_bias");
        q = lin(h, T, w, W, B, w, 0), k = lin(h, T, w, W, B, w, w), v = lin(h, T, w, W, B, w, 2 * w);
      } else {
        const std::string a = b + "self_attn.";
        q = lin(h, T, w, get(a + "q_proj.weight"), get(a + "q_proj.bias"), w);
        k = lin(h, T, w, get(a + "k_proj.weight"), get(a + "k_proj.bias"), w);
        v = lin(h, T, w, get(a + "v_proj.weight"), get(a + "v_proj.bias"), w);
      }
      std::vector<double> att(static_cast<size_t>(T * w), 0.0);
      for (int hh = 0; hh < heads; ++hh)
        for (int i = 0; i < T; ++i) {
          std::vector<double> s(static_cast<size_t>(i + 1));
          double mx = -1e300;
          for (int j = 0; j <= i; ++j) {
            double d = 0;
            for (int e = 0; e < hd; ++e) d += q[i * w + hh * hd + e] * k[j * w + hh * hd + e];
            s[j] = d / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[j]);
          }
          double z = 0;
          for (auto& e : s) z += (e = std::exp(e - mx));
          for (int j = 0; j <= i; ++j)
            for (int e = 0; e < hd; ++e) att[i * w + hh * hd + e] += s[j] / z * v[j * w + hh * hd + e];
        }
      const std::string o = b + (open_clip ? "attn.out_proj." : "self_attn.out_proj.");
      const auto ao = lin(att, T, w, get(o + "weight"), get(o + "bias"), w);
      for (size_t i = 0; i < x.size(); ++i) x[i] += ao[i];
      h = x;
      ln(h, T, w, get(b + (open_clip ? "ln_2.weight" : "layer_norm2.weight")), get(b + (open_clip ? "ln_2.bias" : "layer_norm2.bias")));
      const std::string f1 = b + (open_clip ? "mlp.c_fc." : "mlp.fc1."), f2 = b + (open_clip ? "mlp.c_proj." : "mlp.fc2.");
      auto m = lin(h, T, w, get(f1 + "weight"), get(f1 + "bias"), 4 * w);
      for (auto& e : m) e = open_clip ? 0.5 * e * (1.0 + std::erf(e / std::sqrt(2.0))) : e / (1.0 + std::exp(-1.702 * e));
      const auto mo = lin(m, T, 4 * w, get(f2 + "weight"), get(f2 + "bias"), w);
      for (size_t i = 0; i < x.size(); ++i) x[i] += mo[i];
    }
    const std::string fn = p + (open_clip ? "ln_final." : "final_layer_norm.");
    ln(x, T, w, get(fn + "weight"), get(fn + "bias"));
    return x;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
  EXPECT_LT(worst, tol);
}

}  // namespace

TEST(SdClip, OpenAiClipMatchesPlainLoops) {
  const std::string path = synth("sd15", "f32");
  const auto f = formats::SafetensorsFile::open(path);
  const auto m = SdModel::open(path);
  const NaiveClip ref{*f, false, 64, 1};
  const auto ids = prompt_ids(3);
  const auto want = ref.run(ids, 2);
  expect_close(m->encode_prompt(ids.data(), nullptr, 77, &pool()), want, 2e-4);

  // Emphasis, A1111's way: scale tokens, restore the mean.
  std::array<float, 77> w;
  w.fill(1.0f);
  w[2] = 1.5f, w[5] = 0.5f;
  std::vector<double> z = want;
  double before = 0, after = 0;
  for (double v : z) before += v;
  for (int t = 0; t < 77; ++t)
    for (int i = 0; i < 64; ++i) z[t * 64 + i] *= w[t];
  for (double v : z) after += v;
  for (double& v : z) v *= before / after;
  expect_close(m->encode_prompt(ids.data(), w.data(), 77, &pool()), z, 2e-4);

  // Clip skip 2: one layer fewer.
  SdOptions o;
  o.clip_skip = 2;
  expect_close(SdModel::open(path, o)->encode_prompt(ids.data(), nullptr, 77), ref.run(ids, 1), 2e-4);

  // Two chunks: each encoded on its own.
  std::vector<int32_t> two(ids.begin(), ids.end());
  const auto ids2 = prompt_ids(4);
  two.insert(two.end(), ids2.begin(), ids2.end());
  const auto out2 = m->encode_prompt(two.data(), nullptr, 154, &pool());
  expect_close(std::vector<float>(out2.begin() + 77 * 64, out2.end()), ref.run(ids2, 2), 2e-4);
  EXPECT_THROW(m->encode_prompt(two.data(), nullptr, 100), Error);
}

TEST(SdClip, OpenClipPenultimateMatchesPlainLoops) {
  const std::string path = synth("sd21", "f32");
  const auto f = formats::SafetensorsFile::open(path);
  const auto m = SdModel::open(path);
  const auto ids = prompt_ids(8);
  const ClipConfig& c = m->info().clip;
  EXPECT_EQ(c.width, 128);  // 1024 x 0.1, to a multiple of 64: 2 heads
  EXPECT_EQ(c.heads, 2);
  expect_close(m->encode_prompt(ids.data(), nullptr, 77, &pool()), NaiveClip{*f, true, c.width, c.heads}.run(ids, 2), 2e-4);
}

// ---- the UNet and the VAE decoder against plain loops (ldm's modules, batch 1)

namespace {

struct Img {
  int c = 0, h = 0, w = 0;
  std::vector<double> v;
  double& at(int ch, int y, int x) { return v[(static_cast<size_t>(ch) * h + y) * w + x]; }
};

struct NaiveNet {
  const formats::SafetensorsFile& f;
  int head_dim = 0;  // SD 2.x: heads = channels / head_dim at each level; 0: the fixed count unet() is given

  bool has(const std::string& n) const { return f.find_tensor(n) != nullptr; }
  std::vector<double> get(const std::string& n) const {
    const auto& t = f.tensor(n);
    std::vector<float> v(static_cast<size_t>(t.elements()));
    std::memcpy(v.data(), t.data, t.bytes);
    return std::vector<double>(v.begin(), v.end());
  }
  const std::vector<int64_t>& shape(const std::string& n) const { return f.tensor(n).shape; }

  Img conv(const Img& x, const std::string& p, int stride, int pad) const {
    const auto W = get(p + "weight"), B = get(p + "bias");
    const auto& s = shape(p + "weight");
    const int co = static_cast<int>(s[0]), k = s.size() == 4 ? static_cast<int>(s[2]) : 1;
    Img y{co, (x.h + 2 * pad - k) / stride + 1, (x.w + 2 * pad - k) / stride + 1, {}};
    y.v.assign(static_cast<size_t>(co) * y.h * y.w, 0.0);
    for (int o = 0; o < co; ++o)
      for (int yy = 0; yy < y.h; ++yy)
        for (int xx = 0; xx < y.w; ++xx) {
          double acc = B[o];
          for (int i = 0; i < x.c; ++i)
            for (int ky = 0; ky < k; ++ky)
              for (int kx = 0; kx < k; ++kx) {
                const int sy = yy * stride - pad + ky, sx = xx * stride - pad + kx;
                if (sy < 0 || sx < 0 || sy >= x.h || sx >= x.w) continue;
                acc += W[((static_cast<size_t>(o) * x.c + i) * k + ky) * k + kx] * x.v[(static_cast<size_t>(i) * x.h + sy) * x.w + sx];
              }
          y.at(o, yy, xx) = acc;
        }
    return y;
  }
  static double silu(double v) { return v / (1.0 + std::exp(-v)); }
  Img gn(Img x, const std::string& p, double eps, bool act) const {
    const auto g = get(p + "weight"), b = get(p + "bias");
    const int per = x.c / 32, hw = x.h * x.w;
    for (int grp = 0; grp < 32; ++grp) {
      double m = 0, var = 0;
      const size_t o = static_cast<size_t>(grp) * per * hw, n = static_cast<size_t>(per) * hw;
      for (size_t i = 0; i < n; ++i) m += x.v[o + i];
      m /= static_cast<double>(n);
      for (size_t i = 0; i < n; ++i) var += (x.v[o + i] - m) * (x.v[o + i] - m);
      var /= static_cast<double>(n);
      for (size_t i = 0; i < n; ++i) {
        const int ch = static_cast<int>((o + i) / hw);
        double v = (x.v[o + i] - m) / std::sqrt(var + eps) * g[ch] + b[ch];
        x.v[o + i] = act ? silu(v) : v;
      }
    }
    return x;
  }
  // rows x in -> rows x out with W [out][in(...)]
  std::vector<double> lin(const std::vector<double>& x, int rows, const std::string& p) const {
    const auto W = get(p + "weight");
    const int out = static_cast<int>(shape(p + "weight")[0]), in = static_cast<int>(W.size() / out);
    const std::vector<double> B = has(p + "bias") ? get(p + "bias") : std::vector<double>(out, 0.0);
    std::vector<double> y(static_cast<size_t>(rows) * out);
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < out; ++o) {
        double acc = B[o];
        for (int i = 0; i < in; ++i) acc += W[static_cast<size_t>(o) * in + i] * x[static_cast<size_t>(r) * in + i];
        y[static_cast<size_t>(r) * out + o] = acc;
      }
    return y;
  }
  static std::vector<double> attend(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                                    int lq, int lk, int c, int heads) {
    const int hd = c / heads;
    std::vector<double> o(static_cast<size_t>(lq) * c, 0.0), s(static_cast<size_t>(lk));
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < lq; ++i) {
        double mx = -1e300, z = 0;
        for (int j = 0; j < lk; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += q[static_cast<size_t>(i) * c + h * hd + e] * k[static_cast<size_t>(j) * c + h * hd + e];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (int j = 0; j < lk; ++j)
          for (int e = 0; e < hd; ++e) o[static_cast<size_t>(i) * c + h * hd + e] += s[j] / z * v[static_cast<size_t>(j) * c + h * hd + e];
      }
    return o;
  }
  static std::vector<double> tokens(const Img& x) {
    std::vector<double> t(x.v.size());
    for (int ch = 0; ch < x.c; ++ch)
      for (int p = 0; p < x.h * x.w; ++p) t[static_cast<size_t>(p) * x.c + ch] = x.v[static_cast<size_t>(ch) * x.h * x.w + p];
    return t;
  }
  static void add_tokens(Img& x, const std::vector<double>& t) {
    for (int ch = 0; ch < x.c; ++ch)
      for (int p = 0; p < x.h * x.w; ++p) x.v[static_cast<size_t>(ch) * x.h * x.w + p] += t[static_cast<size_t>(p) * x.c + ch];
  }
  void ln(std::vector<double>& x, int rows, int c, const std::string& p) const {
    const auto g = get(p + "weight"), b = get(p + "bias");
    std::vector<double> one(static_cast<size_t>(c));
    for (int r = 0; r < rows; ++r) {
      double m = 0, var = 0;
      for (int i = 0; i < c; ++i) m += x[static_cast<size_t>(r) * c + i];
      m /= c;
      for (int i = 0; i < c; ++i) var += (x[static_cast<size_t>(r) * c + i] - m) * (x[static_cast<size_t>(r) * c + i] - m);
      var /= c;
      for (int i = 0; i < c; ++i) x[static_cast<size_t>(r) * c + i] = (x[static_cast<size_t>(r) * c + i] - m) / std::sqrt(var + 1e-5) * g[i] + b[i];
    }
  }
  static Img up2(const Img& x) {
    Img y{x.c, 2 * x.h, 2 * x.w, {}};
    y.v.resize(x.v.size() * 4);
    for (int c = 0; c < x.c; ++c)
      for (int yy = 0; yy < y.h; ++yy)
        for (int xx = 0; xx < y.w; ++xx) y.at(c, yy, xx) = x.v[(static_cast<size_t>(c) * x.h + yy / 2) * x.w + xx / 2];
    return y;
  }

  // ldm ResBlock
  Img res(const Img& x, const std::string& p, const std::vector<double>& emb_silu) const {
    Img h = conv(gn(x, p + "in_layers.0.", 1e-5, true), p + "in_layers.2.", 1, 1);
    const auto e = lin(emb_silu, 1, p + "emb_layers.1.");
    for (int c = 0; c < h.c; ++c)
      for (int i = 0; i < h.h * h.w; ++i) h.v[static_cast<size_t>(c) * h.h * h.w + i] += e[c];
    h = conv(gn(h, p + "out_layers.0.", 1e-5, true), p + "out_layers.3.", 1, 1);
    const Img s = has(p + "skip_connection.weight") ? conv(x, p + "skip_connection.", 1, 0) : x;
    for (size_t i = 0; i < h.v.size(); ++i) h.v[i] += s.v[i];
    return h;
  }
  // ldm SpatialTransformer, depth 1
  void spatial(Img& x, const std::string& p, int heads, const std::vector<double>& ctx, int lk) const {
    const int c = x.c, hw = x.h * x.w;
    if (head_dim > 0) heads = c / head_dim;
    auto t = lin(tokens(gn(x, p + "norm.", 1e-6, false)), hw, p + "proj_in.");
    const std::string b = p + "transformer_blocks.0.";
    auto n = t;
    ln(n, hw, c, b + "norm1.");
    auto a = attend(lin(n, hw, b + "attn1.to_q."), lin(n, hw, b + "attn1.to_k."), lin(n, hw, b + "attn1.to_v."), hw, hw, c, heads);
    auto o = lin(a, hw, b + "attn1.to_out.0.");
    for (size_t i = 0; i < t.size(); ++i) t[i] += o[i];
    n = t;
    ln(n, hw, c, b + "norm2.");
    a = attend(lin(n, hw, b + "attn2.to_q."), lin(ctx, lk, b + "attn2.to_k."), lin(ctx, lk, b + "attn2.to_v."), hw, lk, c, heads);
    o = lin(a, hw, b + "attn2.to_out.0.");
    for (size_t i = 0; i < t.size(); ++i) t[i] += o[i];
    n = t;
    ln(n, hw, c, b + "norm3.");
    const auto f = lin(n, hw, b + "ff.net.0.proj.");
    std::vector<double> g(static_cast<size_t>(hw) * 4 * c);
    for (int r = 0; r < hw; ++r)
      for (int i = 0; i < 4 * c; ++i) {
        const double val = f[static_cast<size_t>(r) * 8 * c + i], gate = f[static_cast<size_t>(r) * 8 * c + 4 * c + i];
        g[static_cast<size_t>(r) * 4 * c + i] = val * 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0)));
      }
    o = lin(g, hw, b + "ff.net.2.");
    for (size_t i = 0; i < t.size(); ++i) t[i] += o[i];
    add_tokens(x, lin(t, hw, p + "proj_out."));
  }
  // One ldm TimestepEmbedSequential: whatever modules the names say it holds.
  void seq(Img& x, const std::string& p, const std::vector<double>& emb, int heads, const std::vector<double>& ctx, int lk) const {
    for (int j = 0; j < 3; ++j) {
      const std::string q = p + std::to_string(j) + ".";
      if (has(q + "weight")) x = conv(x, q, 1, 1);
      else if (has(q + "op.weight")) x = conv(x, q + "op.", 2, 1);
      else if (has(q + "in_layers.0.weight")) x = res(x, q, emb);
      else if (has(q + "norm.weight")) spatial(x, q, heads, ctx, lk);
      else if (has(q + "conv.weight")) x = conv(up2(x), q + "conv.", 1, 1);
    }
  }
  Img unet(const Img& x0, double t, const std::vector<double>& ctx, int lk, int heads) const {
    const std::string u = "model.diffusion_model.";
    const int mc = static_cast<int>(shape(u + "input_blocks.0.0.weight")[0]), half = mc / 2;
    std::vector<double> te(static_cast<size_t>(mc));
    for (int i = 0; i < half; ++i) {
      const double arg = t * std::exp(-std::log(10000.0) * i / half);
      te[i] = std::cos(arg), te[half + i] = std::sin(arg);
    }
    auto emb = lin(te, 1, u + "time_embed.0.");
    for (auto& e : emb) e = silu(e);
    emb = lin(emb, 1, u + "time_embed.2.");
    for (auto& e : emb) e = silu(e);
    Img x = x0;
    std::vector<Img> hs;
    for (int i = 0; i < 12; ++i) {
      seq(x, u + "input_blocks." + std::to_string(i) + ".", emb, heads, ctx, lk);
      hs.push_back(x);
    }
    seq(x, u + "middle_block.", emb, heads, ctx, lk);
    for (int i = 0; i < 12; ++i) {
      const Img& s = hs.back();
      Img cat{x.c + s.c, x.h, x.w, x.v};
      cat.v.insert(cat.v.end(), s.v.begin(), s.v.end());
      hs.pop_back();
      x = std::move(cat);
      seq(x, u + "output_blocks." + std::to_string(i) + ".", emb, heads, ctx, lk);
    }
    return conv(gn(x, u + "out.0.", 1e-5, true), u + "out.2.", 1, 1);
  }

  // ldm ResnetBlock / AttnBlock / Decoder
  Img vres(const Img& x, const std::string& p) const {
    Img h = conv(gn(x, p + "norm1.", 1e-6, true), p + "conv1.", 1, 1);
    h = conv(gn(h, p + "norm2.", 1e-6, true), p + "conv2.", 1, 1);
    const Img s = has(p + "nin_shortcut.weight") ? conv(x, p + "nin_shortcut.", 1, 0) : x;
    for (size_t i = 0; i < h.v.size(); ++i) h.v[i] += s.v[i];
    return h;
  }
  void vattn(Img& x, const std::string& p) const {
    const int hw = x.h * x.w;
    const auto t = tokens(gn(x, p + "norm.", 1e-6, false));
    add_tokens(x, lin(attend(lin(t, hw, p + "q."), lin(t, hw, p + "k."), lin(t, hw, p + "v."), hw, hw, x.c, 1), hw, p + "proj_out."));
  }
  Img decode(Img z) const {
    const std::string d = "first_stage_model.decoder.";
    for (auto& v : z.v) v /= 0.18215;
    Img x = conv(conv(z, "first_stage_model.post_quant_conv.", 1, 0), d + "conv_in.", 1, 1);
    x = vres(x, d + "mid.block_1.");
    vattn(x, d + "mid.attn_1.");
    x = vres(x, d + "mid.block_2.");
    for (int i = 3; i >= 0; --i) {
      for (int j = 0; j < 3; ++j) x = vres(x, d + "up." + std::to_string(i) + ".block." + std::to_string(j) + ".");
      if (i > 0) x = conv(up2(x), d + "up." + std::to_string(i) + ".upsample.conv.", 1, 1);
    }
    x = conv(gn(x, d + "norm_out.", 1e-6, true), d + "conv_out.", 1, 1);
    for (auto& v : x.v) v = std::clamp((v + 1.0) / 2.0, 0.0, 1.0);
    return x;
  }
  // torch.nn.functional.pad(x, (0, 1, 0, 1)): the input at the top left, one zero column right and one zero row below.
  static Img pad_right_bottom(const Img& x) {
    Img y{x.c, x.h + 1, x.w + 1, {}};
    y.v.assign(static_cast<size_t>(y.c) * y.h * y.w, 0.0);
    for (int c = 0; c < x.c; ++c)
      for (int yy = 0; yy < x.h; ++yy)
        for (int xx = 0; xx < x.w; ++xx) y.at(c, yy, xx) = x.v[(static_cast<size_t>(c) * x.h + yy) * x.w + xx];
    return y;
  }
  // ldm Encoder + quant_conv, the distribution's mean scaled by 0.18215 (what img2img starts from).
  Img encode(Img x) const {
    const std::string e = "first_stage_model.encoder.";
    for (auto& v : x.v) v = 2.0 * v - 1.0;
    x = conv(x, e + "conv_in.", 1, 1);
    for (int i = 0; has(e + "down." + std::to_string(i) + ".block.0.conv1.weight"); ++i) {
      const std::string lv = e + "down." + std::to_string(i) + ".";
      for (int j = 0; has(lv + "block." + std::to_string(j) + ".conv1.weight"); ++j) x = vres(x, lv + "block." + std::to_string(j) + ".");
      if (has(lv + "downsample.conv.weight")) x = conv(pad_right_bottom(x), lv + "downsample.conv.", 2, 0);
    }
    x = vres(x, e + "mid.block_1.");
    vattn(x, e + "mid.attn_1.");
    x = vres(x, e + "mid.block_2.");
    x = conv(gn(x, e + "norm_out.", 1e-6, true), e + "conv_out.", 1, 1);
    x = conv(x, "first_stage_model.quant_conv.", 1, 0);
    Img mean{4, x.h, x.w, std::vector<double>(x.v.begin(), x.v.begin() + 4 * x.h * x.w)};
    for (auto& v : mean.v) v *= 0.18215;
    return mean;
  }
};

}  // namespace

TEST(SdUnet, MatchesPlainLoops) {
  const std::string path = synth("sd15", "f32");
  const auto f = formats::SafetensorsFile::open(path);
  const auto m = SdModel::open(path);
  const auto x = randoms(4 * 8 * 8, 21);
  const auto ids = prompt_ids(2);
  const auto ctx = m->encode_prompt(ids.data(), nullptr, 77, &pool());
  const float t = 613.0f;
  UnetBatch b;
  b.batch = 1, b.height = 8, b.width = 8, b.x = x.data(), b.timesteps = &t, b.context = {ctx};
  std::vector<float> out(x.size());
  m->unet(b, out.data(), &pool());
  const Img want = NaiveNet{*f}.unet(Img{4, 8, 8, std::vector<double>(x.begin(), x.end())}, t,
                                    std::vector<double>(ctx.begin(), ctx.end()), 77, 8);
  expect_close(out, want.v, 2e-3);
}

TEST(SdVae, DecoderMatchesPlainLoops) {
  const std::string path = synth("sd15", "f32");
  const auto f = formats::SafetensorsFile::open(path);
  const auto m = SdModel::open(path);
  const auto z = randoms(4 * 4 * 4, 23, 0.5f);
  const auto rgb = m->vae_decode(z.data(), 4, 4, &pool());
  const Img want = NaiveNet{*f}.decode(Img{4, 4, 4, std::vector<double>(z.begin(), z.end())});
  expect_close(rgb, want.v, 1e-3);
}

// SD 2.x's UNet: linear proj_in/proj_out, heads of 32 channels at every level
// (1, 2, 4 heads as the channels grow), the OpenCLIP penultimate context.
TEST(SdUnet, Sd21MatchesPlainLoops) {
  const std::string path = synth("sd21", "f32");
  const auto f = formats::SafetensorsFile::open(path);
  const auto m = SdModel::open(path);
  ASSERT_EQ(m->version(), SdVersion::sd2);
  ASSERT_EQ(f->tensor("model.diffusion_model.middle_block.1.proj_in.weight").shape.size(), 2u);  // linear, not a 1x1 conv
  const auto x = randoms(4 * 8 * 8, 22);
  const auto ids = prompt_ids(4);
  const auto ctx = m->encode_prompt(ids.data(), nullptr, 77, &pool());
  const float t = 377.0f;
  UnetBatch b;
  b.batch = 1, b.height = 8, b.width = 8, b.x = x.data(), b.timesteps = &t, b.context = {ctx};
  std::vector<float> out(x.size());
  m->unet(b, out.data(), &pool());
  NaiveNet ref{*f};
  ref.head_dim = 32;  // sd_synth's SD 2.x rule: min(64, model channels) = 32 here
  const Img want = ref.unet(Img{4, 8, 8, std::vector<double>(x.begin(), x.end())}, t, std::vector<double>(ctx.begin(), ctx.end()),
                            77, 0);
  expect_close(out, want.v, 2e-3);
}

// The encoder (img2img and inpainting start from it) on a non-square picture:
// three stride-2 downsamplings, each after SD's asymmetric (0, 1, 0, 1) zero pad.
TEST(SdVae, EncoderMatchesPlainLoops) {
  const std::string path = synth("sd15", "f32");
  const auto f = formats::SafetensorsFile::open(path);
  const auto m = SdModel::open(path);
  const int h = 24, w = 32;
  auto rgb = randoms(3 * h * w, 29, 0.5f);
  for (float& v : rgb) v += 0.5f;  // [0, 1], as pictures are
  const auto got = m->vae_encode(rgb.data(), h, w, &pool());
  const Img want = NaiveNet{*f}.encode(Img{3, h, w, std::vector<double>(rgb.begin(), rgb.end())});
  ASSERT_EQ(want.h, h / 8);
  ASSERT_EQ(want.w, w / 8);
  expect_close(got, want.v, 1e-4);
  // And relative to the latent's own size (its values are small: x 0.18215).
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) num += (got[i] - want.v[i]) * (got[i] - want.v[i]), den += want.v[i] * want.v[i];
  ASSERT_GT(den, 0.0);
  std::printf("VAE encoder vs plain loops: relative RMS error %.2e\n", std::sqrt(num / den));
  EXPECT_LT(std::sqrt(num / den), 1e-4);
}

// ---- detection from full-size headers (sparse files: no data written)

namespace {

struct Header {
  nlohmann::json j = nlohmann::json::object();
  uint64_t offset = 0;
  void add(const std::string& name, std::vector<int64_t> shape) {
    uint64_t n = 2;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    j[name] = {{"dtype", "F16"}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string write(const std::string& name) const {
    const std::string path = (tmp_dir() / name).string();
    std::string h = j.dump();
    while (h.size() % 8) h += ' ';
    std::ofstream out(path, std::ios::binary);
    const uint64_t len = h.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << h;
    out.close();
    fs::resize_file(path, 8 + len + offset);
    return path;
  }
};

// The tensors detection reads, at SD 1.5 / 2.1 sizes.
Header sd_header(bool sd2, int in_channels = 4) {
  Header h;
  const std::string u = "model.diffusion_model.";
  const int ctx = sd2 ? 1024 : 768;
  h.add(u + "input_blocks.0.0.weight", {320, in_channels, 3, 3});
  const int ch[4] = {320, 640, 1280, 1280};
  for (int l = 0; l < 4; ++l) {
    const std::string b = u + "input_blocks." + std::to_string(3 * l + 1) + ".";
    h.add(b + "0.in_layers.2.weight", {ch[l], l ? ch[l - 1] : 320, 3, 3});
    if (l < 3) h.add(b + "1.norm.weight", {ch[l]});
  }
  h.add(u + "input_blocks.11.0.in_layers.0.weight", {1280});
  h.add(u + "output_blocks.11.0.in_layers.0.weight", {640});
  h.add(u + "middle_block.1.transformer_blocks.0.attn2.to_k.weight", {1280, ctx});
  h.add(u + "middle_block.1.transformer_blocks.0.norm1.weight", {1280});
  if (sd2) h.add(u + "middle_block.1.proj_in.weight", {1280, 1280});
  else h.add(u + "middle_block.1.proj_in.weight", {1280, 1280, 1, 1});
  h.add(u + "out.2.weight", {4, 320, 3, 3});
  const std::string v = "first_stage_model.";
  h.add(v + "decoder.conv_out.weight", {3, 128, 3, 3});
  h.add(v + "post_quant_conv.weight", {4, 4, 1, 1});
  h.add(v + "quant_conv.weight", {8, 8, 1, 1});
  h.add(v + "encoder.conv_in.weight", {128, 3, 3, 3});
  const int vch[4] = {128, 256, 512, 512};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) h.add(v + "decoder.up." + std::to_string(i) + ".block." + std::to_string(j) + ".conv1.weight", {vch[i], vch[i], 3, 3});
  if (sd2) {
    const std::string c = "cond_stage_model.model.";
    h.add(c + "token_embedding.weight", {49408, 1024});
    h.add(c + "positional_embedding", {77, 1024});
    for (int l = 0; l < 24; ++l) h.add(c + "transformer.resblocks." + std::to_string(l) + ".ln_1.weight", {1024});
  } else {
    const std::string c = "cond_stage_model.transformer.text_model.";
    h.add(c + "embeddings.token_embedding.weight", {49408, 768});
    h.add(c + "embeddings.position_embedding.weight", {77, 768});
    for (int l = 0; l < 12; ++l) h.add(c + "encoder.layers." + std::to_string(l) + ".layer_norm1.weight", {768});
  }
  return h;
}

}  // namespace

TEST(SdDetect, Sd15Header) {
  const SdInfo i = SdModel::inspect(sd_header(false).write("h15.safetensors"));
  EXPECT_EQ(i.version, SdVersion::sd1);
  EXPECT_EQ(i.prediction, Prediction::epsilon);
  EXPECT_EQ(i.unet.context_dim, 768);
  EXPECT_EQ(i.unet.heads, (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(i.unet.channel_mult, (std::vector<int>{1, 2, 4, 4}));
  EXPECT_EQ(i.clip.layers, 12);
  EXPECT_EQ(i.clip.heads, 12);
  EXPECT_EQ(i.clip.layers_used, 12);
  EXPECT_TRUE(i.clip.quick_gelu);
  EXPECT_EQ(i.vae.channels, 128);
  EXPECT_EQ(i.vae.channel_mult, (std::vector<int>{1, 2, 4, 4}));
  EXPECT_NE(i.summary.find("SD 1.x"), std::string::npos);
  // Names alone do not make a model: loading says what is missing.
  try {
    SdModel::open(sd_header(false).write("h15b.safetensors"));
    ADD_FAILURE() << "loaded a header-only file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is missing"), std::string::npos) << e.what();
  }
}

TEST(SdDetect, Sd21Header) {
  const std::string path = sd_header(true).write("h21.safetensors");
  const SdInfo i = SdModel::inspect(path);
  EXPECT_EQ(i.version, SdVersion::sd2);
  EXPECT_EQ(i.prediction, Prediction::v);
  EXPECT_EQ(i.unet.context_dim, 1024);
  EXPECT_EQ(i.unet.heads, (std::vector<int>{5, 10, 20, 20}));  // 64-wide heads
  EXPECT_TRUE(i.unet.linear_proj);
  EXPECT_TRUE(i.clip.open_clip);
  EXPECT_EQ(i.clip.heads, 16);
  EXPECT_EQ(i.clip.layers_used, 23);
  EXPECT_FALSE(i.clip.quick_gelu);
  // The prediction type from metadata (SD 2.x base models are eps).
  Header h = sd_header(true);
  h.j["__metadata__"] = {{"modelspec.prediction_type", "epsilon"}};
  EXPECT_EQ(SdModel::inspect(h.write("h21eps.safetensors")).prediction, Prediction::epsilon);
  h.j["__metadata__"] = {{"prediction_type", "sideways"}};
  EXPECT_THROW(SdModel::inspect(h.write("h21bad.safetensors")), Error);
}

TEST(SdDetect, InpaintingAndRefusals) {
  EXPECT_EQ(SdModel::inspect(sd_header(false, 9).write("h15inp.safetensors")).unet.in_channels, 9);
  Header xl = sd_header(false);
  xl.add("model.diffusion_model.label_emb.0.0.weight", {1280, 2816});
  try {
    SdModel::inspect(xl.write("hxl.safetensors"));
    ADD_FAILURE() << "SDXL accepted";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("SDXL"), std::string::npos) << e.what();
  }
  // A text encoder that does not fit the UNet's cross-attention.
  Header mixed = sd_header(false);
  mixed.j.erase("model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_k.weight");
  mixed.add("model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_k.weight", {1280, 1024});
  EXPECT_THROW(SdModel::inspect(mixed.write("hmixed.safetensors")), Error);
  EXPECT_THROW(SdModel::inspect((tmp_dir() / "nothing.safetensors").string()), Error);
  // A folder that is not a complete diffusers layout.
  fs::create_directories(tmp_dir() / "half" / "unet");
  EXPECT_THROW(SdModel::inspect((tmp_dir() / "half").string()), Error);
}

TEST(SdFlops, Sd15PerStep) {
  UnetConfig c;  // SD 1.5 defaults
  const double f64 = unet_flops(c, 64, 64), f32 = unet_flops(c, 32, 32);
  // Convolutions and linears scale with pixels, self-attention with their square.
  EXPECT_GT(f64, 4.0 * f32);
  EXPECT_LT(f64, 5.0 * f32);
  // Widely quoted: about 0.4 T multiply-adds per 512x512 step.
  EXPECT_GT(f64, 2 * 0.3e12);
  EXPECT_LT(f64, 2 * 0.5e12);
}

// ---- on a device that is not the host (tests/fake_device.h): CLIP, the
// UNet, the VAE (decoder and encoder) and TAESD loaded onto it are handed
// only device memory by their ops (no mapped file page, no host vector of
// weights), and activations only of the device's type. In the device's
// layout: NCHW and NHWC give the CPU's bits (the layout only moves
// elements); BF16 activations give them within BF16's rounding.

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{a[i]} * a[i];
  }
  return a.size() != b.size() ? 1e9 : std::sqrt(num / std::max(den, 1e-30));
}

struct FakeCase {
  const char* name;
  test::FakeFormat fmt;
  double tol;  // 0: bit for bit
};

const FakeCase kFakeCases[] = {
    {"f32-nchw", {kernels::DType::F32, kernels::Layout::NCHW}, 0},
    {"f32-nhwc", {kernels::DType::F32, kernels::Layout::NHWC}, 0},
    {"bf16-nhwc", {kernels::DType::BF16, kernels::Layout::NHWC}, 0.03},
};

#define EXPECT_CLOSE(want, got, fc, what)                                                          \
  do {                                                                                             \
    if ((fc).tol == 0) {                                                                           \
      EXPECT_EQ(want, got) << (fc).name << " " << (what);                                          \
    } else {                                                                                       \
      EXPECT_LE(rel_diff(want, got), (fc).tol) << (fc).name << " " << (what);                      \
      EXPECT_GT(rel_diff(want, got), 0.0) << (fc).name << " " << (what) << ": not rounded";        \
    }                                                                                              \
  } while (0)

TEST(SdFakeDevice, NetworksRunOnDeviceMemoryOnlyInTheDevicesTypeAndLayout) {
  const auto cpu = SdModel::open(synth("sd15", "f16"));
  kernels::Backend& host = kernels::default_cpu_backend();
  const auto ids = prompt_ids(3);
  std::vector<float> ctx_cpu(static_cast<size_t>(77 * cpu->context_dim()));
  cpu->text_encoder().encode(ids.data(), ctx_cpu.data(), host);
  // Two samples with their own timesteps and contexts.
  const auto x = randoms(2 * 4 * 8 * 8, 5);
  const float t[2] = {613.0f, 21.0f};
  const auto ctx2 = randoms(ctx_cpu.size(), 9, 0.5f);
  UnetBatch b;
  b.batch = 2, b.height = 8, b.width = 8, b.x = x.data(), b.timesteps = t;
  b.context = {std::span<const float>(ctx_cpu), std::span<const float>(ctx2)};
  std::vector<float> eps_cpu(x.size());
  cpu->unet_net().forward(b, eps_cpu.data(), host);
  const auto z = randoms(4 * 4 * 4, 23, 0.5f);
  const auto rgb = randoms(3 * 32 * 32, 29, 0.5f);
  const auto dec_cpu = cpu->vae_net().decode(z.data(), 4, 4, host);
  const auto enc_cpu = cpu->vae_net().encode(rgb.data(), 32, 32, host);

  for (const FakeCase& fc : kFakeCases) {
    test::FakeDevice fake(nullptr, fc.fmt);
    const auto dev = SdModel::open(synth("sd15", "f16"), {}, fake);
    std::vector<float> ctx_dev(ctx_cpu.size());
    dev->text_encoder().encode(ids.data(), ctx_dev.data(), fake);
    EXPECT_CLOSE(ctx_cpu, ctx_dev, fc, "CLIP");

    std::vector<float> eps_dev(x.size());
    dev->unet_net().forward(b, eps_dev.data(), fake);
    EXPECT_CLOSE(eps_cpu, eps_dev, fc, "UNet");
    // A second step of the same shape reuses the workspace: no device
    // allocation inside a step.
    const int64_t allocs = fake.allocations();
    dev->unet_net().forward(b, eps_dev.data(), fake);
    EXPECT_EQ(fake.allocations(), allocs) << fc.name << ": a UNet step allocated device memory";

    EXPECT_CLOSE(dec_cpu, dev->vae_net().decode(z.data(), 4, 4, fake), fc, "VAE decoder");
    EXPECT_CLOSE(enc_cpu, dev->vae_net().encode(rgb.data(), 32, 32, fake), fc, "VAE encoder");
    EXPECT_EQ(fake.violations(), std::vector<std::string>{}) << fc.name;
    EXPECT_GT(fake.live_bytes(), 0);
  }
}

TEST(SdFakeDevice, TaesdRunsOnDeviceMemoryOnlyInTheDevicesTypeAndLayout) {
  const std::string dir = std::string(ATELIER_FIXTURES_DIR) + "/image/";
  kernels::Backend& host = kernels::default_cpu_backend();
  for (const FakeCase& fc : kFakeCases) {
    test::FakeDevice fake(nullptr, fc.fmt);
    for (const auto kind : {TaesdNet::Kind::decoder, TaesdNet::Kind::encoder}) {
      const bool dec = kind == TaesdNet::Kind::decoder;
      const std::string file = dir + (dec ? "taef2_decoder.pth" : "taef2_encoder.pth");
      const auto cpu = TaesdNet::open(file, kind);
      const auto dev = TaesdNet::open(file, kind, fake);
      const int c = dec ? cpu->latent_channels() : 3, h = dec ? 4 : 32;
      const auto in = randoms(static_cast<size_t>(c * h * h), 31, 0.5f);
      EXPECT_CLOSE(cpu->run(in.data(), h, h, host), dev->run(in.data(), h, h, fake), fc, dec ? "decoder" : "encoder");
    }
    EXPECT_EQ(fake.violations(), std::vector<std::string>{}) << fc.name;
  }
}

}  // namespace atelier::image
