#include "image/taesd.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "core/cancel.h"
#include "core/error.h"
#include "formats/pickle.h"
#include "formats/safetensors.h"
#include "formats/sniff.h"
#include "image/sd_weights.h"

namespace atelier::image {

namespace {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Every tensor of the file, widened to f32, by state-dict name.
class TensorSet {
 public:
  TensorSet(const std::string& path, Placement& placement) : path_(path), placement_(placement) {
    const bool st = formats::sniff_model_file(path).kind == formats::FileKind::safetensors;  // by content, not name
    if (st) {
      auto f = formats::SafetensorsFile::open(path);
      for (const auto& t : f->tensors()) add(t.name, t.dtype, t.shape, t.data, t.elements());
    } else {
      auto f = formats::TorchCheckpoint::open(path);
      for (const auto& t : f->tensors()) add(t.name, t.dtype, t.shape, t.data, t.elements());
    }
  }

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }

  // The tensor, checked against `shape` (-1 matches any extent); marks it used.
  const Tensor& get(const std::string& name, const std::vector<int64_t>& shape) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw Error(path_ + ": tensor " + name + " is missing (not a TAESD-family file?)");
    const Tensor& t = it->second;
    bool ok = t.shape.size() == shape.size();
    for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || shape[i] == t.shape[i];
    if (!ok) throw Error(path_ + ": tensor " + name + " has shape " + str(t.shape) + ", expected " + str(shape));
    used_.insert(name);
    return t;
  }

  // Throws when the file holds tensors the architecture did not use (another
  // variant, such as the 32x "f32" one, would otherwise load half-wrong).
  void check_all_used() const {
    for (const auto& [name, t] : tensors_)
      if (!used_.count(name)) throw UnsupportedError(path_ + ": unexpected tensor " + name + " for a TAESD-family model");
  }

  const std::string& path() const { return path_; }
  // A tensor's values as a parameter to place on the network's device.
  Param param(const Tensor& t) { return Param(t.data, placement_); }

  static std::string str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + (s[i] < 0 ? std::string("*") : std::to_string(s[i]));
    return out + "]";
  }

 private:
  void add(const std::string& name, formats::ElemType type, const std::vector<int64_t>& shape, const uint8_t* data,
           int64_t n) {
    const auto dt = formats::kernel_dtype(type);
    if (!dt) throw Error(path_ + ": tensor " + name + " has type " + std::string(formats::elem_name(type)) +
                         "; TAESD weights must be F32, F16 or BF16");
    Tensor t;
    t.shape = shape;
    t.data.resize(static_cast<size_t>(n));
    if (n > 0) kernels::dequantize_row(*dt, data, t.data.data(), n);
    tensors_[name] = std::move(t);
  }

  std::string path_;
  Placement& placement_;
  std::map<std::string, Tensor> tensors_;
  std::set<std::string> used_;
};

struct Conv {
  int64_t c_in = 0, c_out = 0, k = 3, stride = 1;
  Param weight, bias;  // bias empty: none

  static Conv load(TensorSet& ts, const std::string& prefix, int64_t c_in, int64_t stride, bool allow_bias = true) {
    Conv c;
    const Tensor& w = ts.get(prefix + "weight", {-1, c_in, -1, -1});
    c.c_in = w.shape[1];
    c.c_out = w.shape[0];
    c.k = w.shape[2];
    if (w.shape[3] != c.k || (c.k != 1 && c.k != 3))
      throw Error(ts.path() + ": tensor " + prefix + "weight: expected a 1x1 or 3x3 kernel, got " + TensorSet::str(w.shape));
    c.stride = stride;
    c.weight = ts.param(w);
    c.weight.mark_conv(c.c_out, c.c_in, c.k);
    if (allow_bias && ts.has(prefix + "bias")) c.bias = ts.param(ts.get(prefix + "bias", {c.c_out}));
    return c;
  }

};

// x: [c_in][h][w] -> y: [c_out][h'][w'] on the backend (padding k/2).
void conv_run(kernels::Backend& be, const Conv& c, kernels::Act x, kernels::Act y, int64_t& h, int64_t& w) {
  kernels::Conv2dShape s;
  s.c_in = c.c_in, s.h = h, s.w = w, s.c_out = c.c_out, s.kh = s.kw = c.k;
  s.stride_h = s.stride_w = c.stride, s.pad_h = s.pad_w = c.k / 2;
  be.conv2d(s, x, kernels::DType::F32, c.weight.data(), c.bias.empty() ? nullptr : c.bias.data(), y);
  h = s.out_h();
  w = s.out_w();
}

int64_t conv_out_elems(const Conv& c, int64_t h, int64_t w) {
  const int64_t p = c.k / 2;
  return c.c_out * ((h + 2 * p - c.k) / c.stride + 1) * ((w + 2 * p - c.k) / c.stride + 1);
}

}  // namespace

struct TaesdNet::Layer {
  enum class Type { clamp, relu, upsample, conv, block } type = Type::conv;
  Conv conv;                                  // conv; block: conv.0
  Conv conv2, conv4;                          // block
  std::optional<Conv> skip;                   // block, when widths differ
  std::optional<Conv> pool_in, pool_out;      // block with the GroupNorm branch
  Param pool_gamma, pool_beta;
  int64_t channels_out = 0;
};

TaesdNet::TaesdNet() : placement_(std::make_unique<Placement>()) {}
TaesdNet::~TaesdNet() = default;
TaesdNet::Kind TaesdNet::kind() const { return kind_; }
int TaesdNet::latent_channels() const { return latent_channels_; }

std::unique_ptr<TaesdNet> TaesdNet::open(const std::string& path, Kind kind, kernels::Backend& backend) {
  using T = Layer::Type;
  // taesd.py's Sequential; 's' marks the stride-2 convolutions.
  static const char kEncoder[] = "cBsBBBsBBBsBBBc";
  static const char kDecoder[] = "ZcRBBBUcBBBUcBBBUcBc";
  std::unique_ptr<TaesdNet> net(new TaesdNet());
  TensorSet ts(path, *net->placement_);
  net->kind_ = kind;
  int64_t ch = kind == Kind::encoder ? 3 : -1;  // the decoder's input width comes from its first conv
  const std::string arch = kind == Kind::encoder ? kEncoder : kDecoder;
  for (size_t i = 0; i < arch.size(); ++i) {
    auto layer = std::make_unique<Layer>();
    const std::string p = std::to_string(i) + ".";
    switch (arch[i]) {
      case 'Z': layer->type = T::clamp; break;
      case 'R': layer->type = T::relu; break;
      case 'U': layer->type = T::upsample; break;
      case 'c':
      case 's':
        layer->type = T::conv;
        layer->conv = Conv::load(ts, p, ch, arch[i] == 's' ? 2 : 1);
        if (ch < 0) net->latent_channels_ = static_cast<int>(layer->conv.c_in);
        ch = layer->conv.c_out;
        break;
      case 'B': {
        layer->type = T::block;
        if (ts.has(p + "pool.0.weight")) {
          layer->pool_in = Conv::load(ts, p + "pool.0.", ch, 1, false);
          const int64_t wide = layer->pool_in->c_out;
          if (wide % 4) throw Error(path + ": " + p + "pool.0.weight: " + std::to_string(wide) + " channels do not split into 4 groups");
          layer->pool_gamma = ts.param(ts.get(p + "pool.1.weight", {wide}));
          layer->pool_beta = ts.param(ts.get(p + "pool.1.bias", {wide}));
          layer->pool_out = Conv::load(ts, p + "pool.3.", wide, 1, false);
          if (layer->pool_out->c_out != ch) throw Error(path + ": " + p + "pool.3.weight does not map back to " + std::to_string(ch) + " channels");
        }
        layer->conv = Conv::load(ts, p + "conv.0.", ch, 1);
        layer->conv2 = Conv::load(ts, p + "conv.2.", layer->conv.c_out, 1);
        layer->conv4 = Conv::load(ts, p + "conv.4.", layer->conv2.c_out, 1);
        if (layer->conv4.c_out != ch) layer->skip = Conv::load(ts, p + "skip.", ch, 1, false);
        ch = layer->conv4.c_out;
        break;
      }
    }
    layer->channels_out = ch;
    net->layers_.push_back(std::move(layer));
  }
  ts.check_all_used();
  if (kind == Kind::encoder) net->latent_channels_ = static_cast<int>(ch);
  else if (ch != 3) throw Error(path + ": the decoder ends in " + std::to_string(ch) + " channels, not RGB");
  net->placement_->place(backend);
  return net;
}

TaesdNet::Sizes TaesdNet::sizes(int64_t h, int64_t w) const {
  // The largest tensor of the pass (walking its shapes), for each of 3 slots.
  using T = Layer::Type;
  int64_t c = kind_ == Kind::encoder ? 3 : latent_channels_, big = c * h * w;
  const int64_t in = big;
  for (const auto& l : layers_) {
    if (l->type == T::upsample) h *= 2, w *= 2;
    if (l->type == T::conv) {
      big = std::max(big, conv_out_elems(l->conv, h, w));
      const int64_t p = l->conv.k / 2;
      h = (h + 2 * p - l->conv.k) / l->conv.stride + 1, w = (w + 2 * p - l->conv.k) / l->conv.stride + 1;
    }
    if (l->type == T::block) {
      if (l->pool_in) big = std::max(big, l->pool_in->c_out * h * w);
      for (const Conv* cv : {&l->conv, &l->conv2, &l->conv4}) big = std::max(big, cv->c_out * h * w);
    }
    c = l->channels_out;
    big = std::max(big, c * h * w);
  }
  return Sizes{big, std::max(in, c * h * w)};
}

int64_t TaesdNet::workspace_floats(int64_t h, int64_t w) const {
  const Sizes z = sizes(h, w);
  return 3 * z.big + z.stage + 4 * 16;
}

std::vector<float> TaesdNet::run(const float* input, int height, int width, kernels::Executor* ex) const {
  check(height, width);
  auto ws = work_.acquire(ex, workspace_floats(height, width));
  return run(ws, input, height, width);
}

std::vector<float> TaesdNet::run(const float* input, int height, int width, kernels::Backend& backend) const {
  check(height, width);
  auto ws = work_.acquire(backend, workspace_floats(height, width));
  return run(ws, input, height, width);
}

void TaesdNet::check(int height, int width) const {
  if (height <= 0 || width <= 0) throw Error("taesd: bad input size");
  if (kind_ == Kind::encoder && (height % 8 || width % 8))
    throw Error("taesd: the encoder needs a width and height that are multiples of 8, got " + std::to_string(width) +
                "x" + std::to_string(height));
}

std::vector<float> TaesdNet::run(Workspace::Lease& ws, const float* input, int height, int width) const {
  using T = Layer::Type;
  kernels::Backend& be = ws.be();
  const Sizes z = sizes(height, width);
  // Three slots: the current activation and two others; the host's F32 NCHW
  // input and output pass through the staging.
  kernels::Act S[3] = {ws.take(z.big), ws.take(z.big), ws.take(z.big)};
  const kernels::Act stage = ws.take_f32(z.stage);
  int cur = 0;
  auto other = [&](int k) { return S[(cur + 1 + k) % 3]; };
  auto move_to = [&](int k) { cur = (cur + 1 + k) % 3; };
  int64_t h = height, w = width;
  int64_t c = kind_ == Kind::encoder ? 3 : latent_channels_;
  ws.upload(stage.data(), input, c * h * w * int64_t{sizeof(float)});
  be.relayout(stage, kernels::Layout::NCHW, S[cur], be.layout(), 1, c, h * w);
  for (const auto& l : layers_) {
    throw_if_cancelled();  // a cancellation point between layers (core/cancel.h)
    const kernels::Act x = S[cur];
    switch (l->type) {
      case T::clamp: be.tanh_clamp(x, x, c * h * w, 3.0f); break;
      case T::relu: be.relu(x, x, c * h * w); break;
      case T::upsample:
        be.upsample_nearest2x(x, other(0), 1, c, h, w);
        move_to(0);
        h *= 2;
        w *= 2;
        break;
      case T::conv:
        conv_run(be, l->conv, x, other(0), h, w);
        move_to(0);
        break;
      case T::block: {
        const kernels::Act a = other(0), b = other(1);
        if (l->pool_in) {
          int64_t ph = h, pw = w;
          conv_run(be, *l->pool_in, x, a, ph, pw);
          be.group_norm(a, a, 1, l->pool_in->c_out, h * w, 4, l->pool_gamma.data(), l->pool_beta.data(), 1e-5f, false);
          be.relu(a, a, l->pool_in->c_out * h * w);
          conv_run(be, *l->pool_out, a, b, ph, pw);
          be.add(x, b, x, c * h * w);
        }
        int64_t bh = h, bw = w;
        const int64_t n = l->conv4.c_out * h * w;
        conv_run(be, l->conv, x, a, bh, bw);
        be.relu(a, a, l->conv.c_out * h * w);
        conv_run(be, l->conv2, a, b, bh, bw);
        be.relu(b, b, l->conv2.c_out * h * w);
        conv_run(be, l->conv4, b, a, bh, bw);
        if (l->skip) {
          int64_t sh = h, sw = w;
          conv_run(be, *l->skip, x, b, sh, sw);
          be.add(a, b, a, n);
        } else {
          be.add(a, x, a, n);
        }
        be.relu(a, a, n);
        move_to(0);
        break;
      }
    }
    c = l->channels_out;
  }
  if (kind_ == Kind::decoder) {
    kernels::Affine unit;
    unit.lo = 0.0f, unit.hi = 1.0f;
    be.affine(S[cur], S[cur], c * h * w, unit);
  }
  std::vector<float> out(static_cast<size_t>(c * h * w));
  be.relayout(S[cur], be.layout(), stage, kernels::Layout::NCHW, 1, c, h * w);
  ws.download(stage.data(), out.data(), c * h * w * int64_t{sizeof(float)});
  return out;
}

}  // namespace atelier::image
