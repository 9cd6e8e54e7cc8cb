#include "image/sd_weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/mapped_file.h"
#include "formats/pickle.h"
#include "formats/safetensors.h"
#include "formats/sniff.h"

namespace atelier::image {

namespace fs = std::filesystem;

struct WeightStore::Source {
  std::unique_ptr<formats::SafetensorsFile> st;
  std::unique_ptr<formats::TorchCheckpoint> ckpt;
};

int64_t TensorRef::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t PageSpans::bytes() const {
  uint64_t n = 0;
  for (const auto& s : spans) n += s.second;
  return n;
}

kernels::WeightView Weight::view() const {
  kernels::WeightView v;
  v.type = type;
  v.data = data();
  v.rows = rows;
  v.cols = cols;
  v.row_stride_bytes = kernels::dtype_row_bytes(type, cols);
  return v;
}

namespace {


bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// "down_blocks.1.resnets.0.rest" -> (1, 0, "rest") for the given inner word.
bool parse_block(const std::string& name, const std::string& head, const std::string& inner, int* a, int* b,
                 std::string* rest) {
  if (!starts_with(name, head)) return false;
  size_t p = head.size();
  size_t dot = name.find('.', p);
  if (dot == std::string::npos) return false;
  try {
    *a = std::stoi(name.substr(p, dot - p));
  } catch (...) {
    return false;
  }
  if (!starts_with(name.substr(dot + 1), inner)) return false;
  p = dot + 1 + inner.size();
  dot = name.find('.', p);
  if (dot == std::string::npos) return false;
  try {
    *b = std::stoi(name.substr(p, dot - p));
  } catch (...) {
    return false;
  }
  *rest = name.substr(dot + 1);
  return true;
}

std::string map_resnet(const std::string& rest, bool unet) {
  static const std::pair<const char*, const char*> kUnet[] = {
      {"norm1.", "in_layers.0."},      {"conv1.", "in_layers.2."},          {"time_emb_proj.", "emb_layers.1."},
      {"norm2.", "out_layers.0."},     {"conv2.", "out_layers.3."},         {"conv_shortcut.", "skip_connection."}};
  static const std::pair<const char*, const char*> kVae[] = {
      {"norm1.", "norm1."}, {"conv1.", "conv1."}, {"norm2.", "norm2."}, {"conv2.", "conv2."}, {"conv_shortcut.", "nin_shortcut."}};
  if (unet) {
    for (const auto& [d, o] : kUnet)
      if (starts_with(rest, d)) return o + rest.substr(std::strlen(d));
  } else {
    for (const auto& [d, o] : kVae)
      if (starts_with(rest, d)) return o + rest.substr(std::strlen(d));
  }
  return "";
}

std::string map_vae_attention(const std::string& rest) {
  static const std::pair<const char*, const char*> kMap[] = {
      {"group_norm.", "norm."}, {"to_q.", "q."},   {"query.", "q."}, {"to_k.", "k."},
      {"key.", "k."},           {"to_v.", "v."},   {"value.", "v."}, {"to_out.0.", "proj_out."},
      {"proj_attn.", "proj_out."}};
  for (const auto& [d, o] : kMap)
    if (starts_with(rest, d)) return o + rest.substr(std::strlen(d));
  return "";
}

std::string map_unet(const std::string& n, const std::vector<bool>& up_attention) {
  int a = 0, b = 0;
  std::string rest;
  const std::string p = "model.diffusion_model.";
  if (starts_with(n, "conv_in.")) return p + "input_blocks.0.0." + n.substr(8);
  if (starts_with(n, "time_embedding.linear_1.")) return p + "time_embed.0." + n.substr(24);
  if (starts_with(n, "time_embedding.linear_2.")) return p + "time_embed.2." + n.substr(24);
  if (starts_with(n, "conv_norm_out.")) return p + "out.0." + n.substr(14);
  if (starts_with(n, "conv_out.")) return p + "out.2." + n.substr(9);
  if (parse_block(n, "down_blocks.", "resnets.", &a, &b, &rest)) {
    const std::string r = map_resnet(rest, true);
    return r.empty() ? "" : p + "input_blocks." + std::to_string(3 * a + b + 1) + ".0." + r;
  }
  if (parse_block(n, "down_blocks.", "attentions.", &a, &b, &rest))
    return p + "input_blocks." + std::to_string(3 * a + b + 1) + ".1." + rest;
  if (parse_block(n, "down_blocks.", "downsamplers.", &a, &b, &rest) && b == 0 && starts_with(rest, "conv."))
    return p + "input_blocks." + std::to_string(3 * a + 3) + ".0.op." + rest.substr(5);
  if (starts_with(n, "mid_block.resnets.")) {
    const std::string t = n.substr(18);
    const size_t dot = t.find('.');
    if (dot == std::string::npos) return "";
    const int i = t[0] - '0';
    const std::string r = map_resnet(t.substr(dot + 1), true);
    return r.empty() || dot != 1 || (i != 0 && i != 1) ? "" : p + "middle_block." + std::to_string(2 * i) + "." + r;
  }
  if (starts_with(n, "mid_block.attentions.0.")) return p + "middle_block.1." + n.substr(23);
  if (parse_block(n, "up_blocks.", "resnets.", &a, &b, &rest)) {
    const std::string r = map_resnet(rest, true);
    return r.empty() ? "" : p + "output_blocks." + std::to_string(3 * a + b) + ".0." + r;
  }
  if (parse_block(n, "up_blocks.", "attentions.", &a, &b, &rest))
    return p + "output_blocks." + std::to_string(3 * a + b) + ".1." + rest;
  if (parse_block(n, "up_blocks.", "upsamplers.", &a, &b, &rest) && b == 0 && starts_with(rest, "conv.")) {
    const bool attn = a >= 0 && static_cast<size_t>(a) < up_attention.size() && up_attention[a];
    return p + "output_blocks." + std::to_string(3 * a + 2) + (attn ? ".2.conv." : ".1.conv.") + rest.substr(5);
  }
  return "";
}

std::string map_vae(const std::string& n) {
  int a = 0, b = 0;
  std::string rest;
  const std::string p = "first_stage_model.";
  for (const char* same : {"quant_conv.", "post_quant_conv.", "encoder.conv_in.", "encoder.conv_out.", "decoder.conv_in.",
                           "decoder.conv_out."})
    if (starts_with(n, same)) return p + n;
  if (starts_with(n, "encoder.conv_norm_out.")) return p + "encoder.norm_out." + n.substr(22);
  if (starts_with(n, "decoder.conv_norm_out.")) return p + "decoder.norm_out." + n.substr(22);
  for (const char* part : {"encoder.", "decoder."}) {
    const std::string e = part;
    if (starts_with(n, e + "mid_block.resnets.")) {
      const std::string t = n.substr(e.size() + 18);
      if (t.size() < 3 || t[1] != '.' || (t[0] != '0' && t[0] != '1')) return "";
      const std::string r = map_resnet(t.substr(2), false);
      return r.empty() ? "" : p + e + "mid.block_" + (t[0] == '0' ? "1." : "2.") + r;
    }
    if (starts_with(n, e + "mid_block.attentions.0.")) {
      const std::string r = map_vae_attention(n.substr(e.size() + 23));
      return r.empty() ? "" : p + e + "mid.attn_1." + r;
    }
  }
  if (parse_block(n, "encoder.down_blocks.", "resnets.", &a, &b, &rest)) {
    const std::string r = map_resnet(rest, false);
    return r.empty() ? "" : p + "encoder.down." + std::to_string(a) + ".block." + std::to_string(b) + "." + r;
  }
  if (parse_block(n, "encoder.down_blocks.", "downsamplers.", &a, &b, &rest) && b == 0 && starts_with(rest, "conv."))
    return p + "encoder.down." + std::to_string(a) + ".downsample." + rest;
  // diffusers numbers the decoder's blocks from the lowest resolution; the
  // original layout numbers `up` from the highest (4 levels in SD's VAE).
  if (parse_block(n, "decoder.up_blocks.", "resnets.", &a, &b, &rest)) {
    const std::string r = map_resnet(rest, false);
    return r.empty() ? "" : p + "decoder.up." + std::to_string(3 - a) + ".block." + std::to_string(b) + "." + r;
  }
  if (parse_block(n, "decoder.up_blocks.", "upsamplers.", &a, &b, &rest) && b == 0 && starts_with(rest, "conv."))
    return p + "decoder.up." + std::to_string(3 - a) + ".upsample." + rest;
  return "";
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return nlohmann::json();
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    // The position only: nlohmann's message quotes the bytes it read ("last read: ...").
    throw Error(p.string() + ": not valid JSON (a syntax error at byte " + std::to_string(e.byte) + ")");
  } catch (const std::exception& e) {
    throw Error(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

int parse_positive(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const int v = std::stoi(s, &used);
    if (used == s.size() && v > 0) return v;
  } catch (...) {
  }
  throw Error(what + ": '" + s + "' is not a positive integer");
}

std::string diffusers_to_original(const std::string& component, const std::string& name,
                                  const std::vector<bool>& up_attention) {
  if (component == "unet") return map_unet(name, up_attention);
  if (component == "vae") return map_vae(name);
  if (component == "text_encoder")
    return starts_with(name, "text_model.") ? "cond_stage_model.transformer." + name : "";
  return "";
}

WeightStore::~WeightStore() = default;

std::string WeightStore::shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void WeightStore::add_file(const std::string& file, const std::string& component) {
  auto src = std::make_unique<Source>();
  struct Item {
    std::string name;
    TensorRef ref;
  };
  std::vector<Item> items;
  // By content (formats/sniff.h): store blobs have no extension, and a renamed file still loads.
  const formats::Sniffed kind = formats::sniff_model_file(file);
  formats::throw_if_unusable(kind);
  if (kind.kind != formats::FileKind::safetensors && kind.kind != formats::FileKind::pytorch_zip)
    throw UnsupportedError(file + ": this is a " + formats::file_kind_name(kind.kind) +
                           " file; a Stable Diffusion checkpoint is safetensors, a PyTorch .ckpt/.pth or a diffusers folder");
  if (kind.kind == formats::FileKind::safetensors) {
    src->st = formats::SafetensorsFile::open(file);
    for (const auto& t : src->st->tensors()) items.push_back({t.name, {t.dtype, t.shape, t.data, t.bytes}});
    if (component.empty())
      for (const auto& [k, v] : src->st->metadata()) metadata_[k] = v;
  } else {
    src->ckpt = formats::TorchCheckpoint::open(file);
    for (const auto& t : src->ckpt->tensors()) items.push_back({t.name, {t.dtype, t.shape, t.data, t.bytes}});
  }
  std::vector<bool> up_attention(4, false);
  if (component == "unet")
    for (const auto& it : items)
      for (int i = 0; i < 4; ++i)
        if (starts_with(it.name, "up_blocks." + std::to_string(i) + ".attentions.")) up_attention[i] = true;
  for (auto& it : items) {
    std::string name = it.name;
    if (!component.empty()) {
      name = diffusers_to_original(component, it.name, up_attention);
      if (name.empty()) continue;  // position ids and the like: nothing the networks read
    }
    tensors_[name] = std::move(it.ref);
  }
  sources_.push_back(std::move(src));
}

std::unique_ptr<WeightStore> WeightStore::open(const std::string& path, WeightPrecision precision) {
  std::unique_ptr<WeightStore> ws(new WeightStore());
  ws->path_ = path;
  ws->precision_ = precision;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    ws->diffusers_ = true;
    const fs::path root(path);
    auto pick = [&](const std::string& dir, std::initializer_list<const char*> names) -> std::string {
      for (const char* n : names)
        if (fs::is_regular_file(root / dir / n, ec)) return (root / dir / n).string();
      return "";
    };
    const std::string unet = pick("unet", {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors",
                                           "diffusion_pytorch_model.bin"});
    const std::string vae = pick("vae", {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors",
                                         "diffusion_pytorch_model.bin"});
    const std::string text = pick("text_encoder", {"model.safetensors", "model.fp16.safetensors", "pytorch_model.bin"});
    std::string missing;
    if (unet.empty()) missing += " unet/diffusion_pytorch_model.safetensors";
    if (vae.empty()) missing += " vae/diffusion_pytorch_model.safetensors";
    if (text.empty()) missing += " text_encoder/model.safetensors";
    if (!missing.empty())
      throw Error(path + ": not a complete diffusers Stable Diffusion folder; missing" + missing +
                  " (or their .bin / .fp16 variants)");
    ws->add_file(unet, "unet");
    ws->add_file(vae, "vae");
    ws->add_file(text, "text_encoder");
    // What the weights cannot say: head counts, the text encoder's activation, the prediction type.
    const auto uc = read_json(root / "unet" / "config.json");
    if (uc.is_object() && uc.contains("attention_head_dim")) ws->metadata_["diffusers.unet.attention_head_dim"] = uc["attention_head_dim"].dump();
    const auto tc = read_json(root / "text_encoder" / "config.json");
    if (tc.is_object()) {
      if (tc.contains("hidden_act") && tc["hidden_act"].is_string()) ws->metadata_["diffusers.text.hidden_act"] = tc["hidden_act"];
      if (tc.contains("num_attention_heads")) ws->metadata_["diffusers.text.num_attention_heads"] = tc["num_attention_heads"].dump();
    }
    const auto sc = read_json(root / "scheduler" / "scheduler_config.json");
    if (sc.is_object() && sc.contains("prediction_type") && sc["prediction_type"].is_string())
      ws->metadata_["diffusers.prediction_type"] = sc["prediction_type"];
  } else if (fs::is_regular_file(path, ec)) {
    ws->add_file(path, "");
  } else {
    throw NotFoundError(path + ": no such file or folder");
  }
  return ws;
}

const TensorRef* WeightStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorRef& WeightStore::get(const std::string& name) const {
  const TensorRef* t = find(name);
  if (!t) throw Error(path_ + ": tensor " + name + " is missing");
  return *t;
}

std::vector<std::string> WeightStore::names_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = tensors_.lower_bound(prefix); it != tensors_.end() && starts_with(it->first, prefix); ++it)
    out.push_back(it->first);
  return out;
}

std::optional<std::string> WeightStore::meta(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<DeviceCopy> Placement::add(const void* host, int64_t bytes) {
  auto d = std::make_shared<DeviceCopy>();
  d->host = host;
  d->bytes = bytes;
  pending_.push_back(d);
  return d;
}

int64_t Placement::place(kernels::Backend& be) {
  auto pending = std::move(pending_);
  pending_.clear();
  const bool reorder = be.layout() != kernels::Layout::NCHW;
  if (be.device().host_memory && !reorder) return 0;
  // A parameter whose owner is gone (only this list holds it) is skipped.
  auto round = [](int64_t b) { return (b + 63) / 64 * 64; };
  int64_t total = 0;
  for (const auto& d : pending)
    if (d.use_count() > 1) total += round(d->bytes);
  if (total == 0) return 0;
  buffers_.push_back(be.alloc(total));
  kernels::Buffer& buf = *buffers_.back();
  int64_t at = 0;
  for (const auto& d : pending) {
    if (d.use_count() <= 1) continue;
    if (reorder && d->conv_k > 1) {
      std::vector<uint8_t> t(static_cast<size_t>(d->bytes));
      kernels::conv_weights_for(be.layout(), d->conv_type, d->host, t.data(), d->conv_c_out, d->conv_c_in, d->conv_k,
                                d->conv_k);
      be.upload(buf, at, t.data(), d->bytes);
    } else {
      be.upload(buf, at, d->host, d->bytes);
    }
    d->device = buf.at<uint8_t>(at);
    at += round(d->bytes);
  }
  device_bytes_ += total;
  return total;
}

Param::Param(std::vector<float> v, Placement& placement) : host_(std::move(v)) {
  if (!host_.empty()) dev_ = placement.add(host_.data(), static_cast<int64_t>(host_.size() * sizeof(float)));
}

void Param::mark_conv(int64_t c_out, int64_t c_in, int64_t k) {
  if (!dev_) return;
  dev_->conv_c_out = c_out, dev_->conv_c_in = c_in, dev_->conv_k = k, dev_->conv_type = kernels::DType::F32;
}

const float* Param::data() const {
  if (dev_ && dev_->device) return static_cast<const float*>(dev_->device);
  return host_.empty() ? nullptr : host_.data();
}

Weight WeightStore::make_weight(formats::ElemType src, int64_t rows, int64_t cols) const {
  const auto st = formats::kernel_dtype(src);
  Weight w;
  w.rows = rows;
  w.cols = cols;
  switch (precision_) {
    case WeightPrecision::keep: w.type = *st; break;
    case WeightPrecision::f32: w.type = kernels::DType::F32; break;
    case WeightPrecision::f16: w.type = kernels::DType::F16; break;
  }
  w.bytes.resize(static_cast<size_t>(kernels::dtype_row_bytes(w.type, cols) * rows));
  return w;
}

namespace {

// Copies n elements of `src` (file type st, maybe unaligned) into `dst` of type dt.
void convert(kernels::DType st, const uint8_t* src, kernels::DType dt, uint8_t* dst, int64_t n) {
  const int64_t src_bytes = kernels::dtype_row_bytes(st, n);
  if (st == dt) {
    std::memcpy(dst, src, static_cast<size_t>(src_bytes));
    return;
  }
  std::vector<uint8_t> aligned(src, src + src_bytes);  // the file does not align tensors
  std::vector<float> f(static_cast<size_t>(n));
  kernels::dequantize_row(st, aligned.data(), f.data(), n);
  if (dt == kernels::DType::F32)
    std::memcpy(dst, f.data(), f.size() * 4);
  else
    kernels::quantize_row(dt, f.data(), dst, n);
}

}  // namespace

static void check_math_type(const std::string& path, const std::string& name, const TensorRef& t) {
  if (!formats::kernel_dtype(t.dtype))
    throw Error(path + ": tensor " + name + " has type " + std::string(formats::elem_name(t.dtype)) +
                "; Stable Diffusion weights must be F32, F16 or BF16");
}

Weight WeightStore::matrix(const std::string& name, int64_t rows, int64_t cols) const {
  return stacked({name}, rows, cols);
}

Weight WeightStore::stacked(const std::vector<std::string>& names, int64_t rows_each, int64_t cols) const {
  const TensorRef& first = get(names.at(0));
  check_math_type(path_, names[0], first);
  const auto ft = *formats::kernel_dtype(first.dtype);
  const bool same_type = precision_ == WeightPrecision::keep || (precision_ == WeightPrecision::f32 && ft == kernels::DType::F32) ||
                         (precision_ == WeightPrecision::f16 && ft == kernels::DType::F16);
  // One tensor already in the type kept, aligned to its element (the
  // kernels read F16/BF16 as 16-bit and F32 as 32-bit words): read in place.
  if (names.size() == 1 && same_type) {
    const bool shape_ok = first.shape.size() >= 2 && first.shape[0] == rows_each && first.elements() == rows_each * cols &&
                          (first.shape.size() == 2 || first.shape.size() == 4);
    const int64_t elem = ft == kernels::DType::F32 ? 4 : 2;
    if (shape_ok && reinterpret_cast<uintptr_t>(first.data) % static_cast<uintptr_t>(elem) == 0 &&
        first.bytes == static_cast<uint64_t>(rows_each * kernels::dtype_row_bytes(ft, cols))) {
      Weight w;
      w.type = ft;
      w.rows = rows_each;
      w.cols = cols;
      w.mapped = first.data;
      in_place_.emplace_back(first.data, first.bytes);
      w.dev = placement_.add(w.mapped, w.nbytes());
      return w;
    }
  }
  Weight w = make_weight(first.dtype, rows_each * static_cast<int64_t>(names.size()), cols);
  const int64_t row_bytes = kernels::dtype_row_bytes(w.type, cols);
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorRef& t = get(names[i]);
    check_math_type(path_, names[i], t);
    const bool shape_ok = t.shape.size() >= 2 && t.shape[0] == rows_each && t.elements() == rows_each * cols &&
                          (t.shape.size() == 2 || t.shape.size() == 4);
    if (!shape_ok)
      throw Error(path_ + ": tensor " + names[i] + " has shape " + shape_str(t.shape) + ", expected " +
                  std::to_string(rows_each) + " x " + std::to_string(cols) + " elements");
    convert(*formats::kernel_dtype(t.dtype), t.data, w.type, w.bytes.data() + i * rows_each * row_bytes, rows_each * cols);
    release_copied(t);
  }
  w.dev = placement_.add(w.bytes.data(), w.nbytes());
  return w;
}

Param WeightStore::vec(const std::string& name, int64_t n) const {
  const TensorRef& t = get(name);
  check_math_type(path_, name, t);
  if (t.elements() != n || t.shape.empty())
    throw Error(path_ + ": tensor " + name + " has shape " + shape_str(t.shape) + ", expected [" + std::to_string(n) + "]");
  std::vector<float> out(static_cast<size_t>(n));
  convert(*formats::kernel_dtype(t.dtype), t.data, kernels::DType::F32, reinterpret_cast<uint8_t*>(out.data()), n);
  release_copied(t);
  return param(std::move(out));
}

Param WeightStore::vec_or_empty(const std::string& name, int64_t n) const {
  return has(name) ? vec(name, n) : Param();
}

void WeightStore::rows_f32(const std::string& name, int64_t r0, int64_t nr, float* out) const {
  const TensorRef& t = get(name);
  check_math_type(path_, name, t);
  if (t.shape.size() != 2 || r0 < 0 || r0 + nr > t.shape[0])
    throw Error(path_ + ": tensor " + name + " (shape " + shape_str(t.shape) + "): rows " + std::to_string(r0) + ".." +
                std::to_string(r0 + nr) + " out of range");
  const auto st = *formats::kernel_dtype(t.dtype);
  const int64_t rb = kernels::dtype_row_bytes(st, t.shape[1]);
  convert(st, t.data + r0 * rb, kernels::DType::F32, reinterpret_cast<uint8_t*>(out), nr * t.shape[1]);
  release_copied(t);
}

// MappedFile::release clips to its own mapping, so asking every source is
// safe (memory outside the mappings is never touched) and covers a merged
// span that crosses two adjacent mappings.
void WeightStore::release_copied(const TensorRef& t) const {
  for (const auto& src : sources_) (src->st ? src->st->mapping() : src->ckpt->mapping()).release(t.data, t.bytes);
}

PageSpans WeightStore::take_in_place() {
  auto v = std::move(in_place_);
  in_place_.clear();
  std::sort(v.begin(), v.end());
  PageSpans out;
  for (const auto& [p, n] : v) {
    if (!out.spans.empty() && out.spans.back().first + out.spans.back().second >= p) {
      auto& last = out.spans.back();
      last.second = std::max<uint64_t>(last.second, static_cast<uint64_t>(p + n - last.first));
    } else {
      out.spans.emplace_back(p, n);
    }
  }
  return out;
}

uint64_t WeightStore::release(const PageSpans& spans) const {
  uint64_t released = 0;
  for (const auto& [p, n] : spans.spans)
    for (const auto& src : sources_) released += (src->st ? src->st->mapping() : src->ckpt->mapping()).release(p, n);
  return released;
}

// ---- building blocks

Conv2d Conv2d::load(const WeightStore& ws, const std::string& prefix, int64_t c_in, int64_t c_out, int64_t k,
                    int64_t stride) {
  Conv2d c;
  const TensorRef& t = ws.get(prefix + "weight");
  const bool ok = (t.shape.size() == 4 && t.shape[0] == c_out && t.shape[1] == c_in && t.shape[2] == k && t.shape[3] == k) ||
                  (k == 1 && t.shape.size() == 2 && t.shape[0] == c_out && t.shape[1] == c_in);
  if (!ok)
    throw Error(ws.path() + ": tensor " + prefix + "weight has shape " + WeightStore::shape_str(t.shape) + ", expected [" +
                std::to_string(c_out) + ", " + std::to_string(c_in) + ", " + std::to_string(k) + ", " + std::to_string(k) + "]");
  c.w = ws.matrix(prefix + "weight", c_out, c_in * k * k);
  c.b = ws.vec_or_empty(prefix + "bias", c_out);
  c.c_in = c_in, c.c_out = c_out, c.k = k, c.stride = stride, c.pad = k / 2;
  c.w.dev->conv_c_out = c_out, c.w.dev->conv_c_in = c_in, c.w.dev->conv_k = k, c.w.dev->conv_type = c.w.type;
  return c;
}


static kernels::Conv2dShape conv_shape(const Conv2d& c, int64_t n, int64_t h, int64_t w) {
  kernels::Conv2dShape s;
  s.n = n, s.c_in = c.c_in, s.h = h, s.w = w, s.c_out = c.c_out, s.kh = s.kw = c.k;
  s.stride_h = s.stride_w = c.stride, s.pad_h = s.pad_w = c.pad;
  return s;
}

void Conv2d::run(kernels::Backend& be, kernels::Act x, kernels::Act y, int64_t n, int64_t& h, int64_t& w) const {
  const kernels::Conv2dShape s = conv_shape(*this, n, h, w);
  be.conv2d(s, x, this->w.type, this->w.data(), b.empty() ? nullptr : b.data(), y);
  h = s.out_h();
  w = s.out_w();
}

int64_t Conv2d::out_elems(int64_t n, int64_t h, int64_t w) const {
  const kernels::Conv2dShape s = conv_shape(*this, n, h, w);
  return n * c_out * s.out_h() * s.out_w();
}

void Linear::run(kernels::Backend& be, kernels::Act x, kernels::Act y, int64_t rows) const {
  be.matmul(w.view(), x, y, rows);
  if (!b.empty()) be.add_bias(y, b.data(), rows, w.rows);
}

Linear Linear::load(const WeightStore& ws, const std::string& prefix, int64_t out, int64_t in, bool bias) {
  Linear l;
  l.w = ws.matrix(prefix + "weight", out, in);
  if (bias) l.b = ws.vec(prefix + "bias", out);
  return l;
}


Norm Norm::load(const WeightStore& ws, const std::string& prefix, int64_t c) {
  return Norm{ws.vec(prefix + "weight", c), ws.vec(prefix + "bias", c)};
}

}  // namespace atelier::image
