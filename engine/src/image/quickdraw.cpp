#include "image/quickdraw.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "formats/safetensors.h"
#include "image/cv_ops.h"
#include "image/rng.h"

namespace atelier::image {

namespace {

std::vector<float> load_f32(const formats::SafetensorsFile& file, const std::string& name,
                            const std::vector<int64_t>& shape) {
  const formats::SafetensorsTensor& t = file.tensor(name);
  if (t.dtype != formats::ElemType::F32)
    throw Error(file.path() + ": tensor " + name + " is not F32 (the QuickDraw CVAE is stored in F32)");
  if (t.shape != shape) {
    std::string want, got;
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : t.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
    throw Error(file.path() + ": tensor " + name + " has shape [" + got + "], expected [" + want + "]");
  }
  std::vector<float> v(static_cast<size_t>(t.elements()));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(float));  // tensors may be unaligned
  return v;
}

// Keras Conv2DTranspose, 3x3, stride 1, padding "same", on an H x W x Cin
// (channels_last) input; kernel [3, 3, Cout, Cin]. A transposed convolution
// scatters each input pixel (p, q) to out[p + i - 1][q + j - 1] with weight
// K[i][j] (TF's conv2d_backprop_input, SAME padding: 1 before, 1 after for
// k = 3), i.e. out[y][x] = sum_ij in[y + 1 - i][x + 1 - j] K[i][j]: a
// correlation with the spatially flipped kernel.
//
// Plain loops on purpose: the largest layer is 28 x 28 x 16 x 9 multiply-adds
// per output channel (~0.1 MFLOP for the whole model), far below what a
// kernel dispatch or a thread pool would pay for itself, and a plain loop is
// its own reference.
std::vector<float> conv_transpose_same(const std::vector<float>& in, int h, int w, int cin, const std::vector<float>& k,
                                       const std::vector<float>& bias, int cout) {
  std::vector<float> out(static_cast<size_t>(h) * w * cout);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int o = 0; o < cout; ++o) {
        float acc = bias[o];
        for (int i = 0; i < 3; ++i) {
          const int sy = y + 1 - i;
          if (sy < 0 || sy >= h) continue;
          for (int j = 0; j < 3; ++j) {
            const int sx = x + 1 - j;
            if (sx < 0 || sx >= w) continue;
            const float* src = &in[(static_cast<size_t>(sy) * w + sx) * cin];
            const float* kk = &k[((static_cast<size_t>(i) * 3 + j) * cout + o) * cin];
            for (int c = 0; c < cin; ++c) acc += src[c] * kk[c];
          }
        }
        out[(static_cast<size_t>(y) * w + x) * cout + o] = acc;
      }
  return out;
}

void relu(std::vector<float>& v) {
  for (float& x : v) x = x > 0.0f ? x : 0.0f;
}

std::vector<float> upsample2_nearest(const std::vector<float>& in, int h, int w, int c) {
  std::vector<float> out(static_cast<size_t>(h) * 2 * w * 2 * c);
  for (int y = 0; y < 2 * h; ++y)
    for (int x = 0; x < 2 * w; ++x)
      std::memcpy(&out[(static_cast<size_t>(y) * 2 * w + x) * c], &in[(static_cast<size_t>(y / 2) * w + x / 2) * c],
                  sizeof(float) * c);
  return out;
}

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> words;
  std::string cur;
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c)) {
      cur += static_cast<char>(std::tolower(c));
    } else if (!cur.empty()) {
      words.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) words.push_back(cur);
  return words;
}

bool word_matches(const std::string& prompt_word, const std::string& label_word) {
  if (prompt_word == label_word) return true;
  if (prompt_word.size() == label_word.size() + 1 && prompt_word.back() == 's' &&
      prompt_word.compare(0, label_word.size(), label_word) == 0)
    return true;
  return prompt_word.size() == label_word.size() + 2 && prompt_word.compare(prompt_word.size() - 2, 2, "es") == 0 &&
         prompt_word.compare(0, label_word.size(), label_word) == 0;
}

}  // namespace

bool QuickDrawModel::is_quickdraw(const formats::SafetensorsFile& file) {
  auto it = file.metadata().find("architecture");
  return it != file.metadata().end() && it->second == kArchitecture;
}

std::unique_ptr<QuickDrawModel> QuickDrawModel::open(const std::string& path) {
  auto file = formats::SafetensorsFile::open(path);
  if (!is_quickdraw(*file))
    throw UnsupportedError(path + ": not a QuickDraw CVAE (metadata architecture is not \"" + kArchitecture + "\")");
  std::unique_ptr<QuickDrawModel> m(new QuickDrawModel());
  auto it = file->metadata().find("labels");
  if (it == file->metadata().end()) throw Error(path + ": metadata \"labels\" is missing");
  nlohmann::json labels = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!labels.is_array() || labels.size() != kOneHot - 1)
    throw Error(path + ": metadata \"labels\" must be a JSON list of " + std::to_string(kOneHot - 1) + " class names");
  for (const auto& l : labels) {
    if (!l.is_string() || l.get<std::string>().empty()) throw Error(path + ": metadata \"labels\" holds a non-string or empty entry");
    m->labels_.push_back(l.get<std::string>());
  }
  m->dense_w_ = load_f32(*file, "dense_5.kernel", {kLatent + kOneHot, 7 * 7 * 16});
  m->dense_b_ = load_f32(*file, "dense_5.bias", {7 * 7 * 16});
  m->ct1_w_ = load_f32(*file, "conv2d_transpose_1.kernel", {3, 3, 32, 16});
  m->ct1_b_ = load_f32(*file, "conv2d_transpose_1.bias", {32});
  m->ct2_w_ = load_f32(*file, "conv2d_transpose_2.kernel", {3, 3, 16, 32});
  m->ct2_b_ = load_f32(*file, "conv2d_transpose_2.bias", {16});
  m->ct3_w_ = load_f32(*file, "conv2d_transpose_3.kernel", {3, 3, 1, 16});
  m->ct3_b_ = load_f32(*file, "conv2d_transpose_3.bias", {1});
  return m;
}

int QuickDrawModel::match_label(std::string_view prompt) const {
  const std::vector<std::string> words = split_words(prompt);
  int best = -1;
  size_t best_len = 0, best_pos = 0;
  for (size_t li = 0; li < labels_.size(); ++li) {
    const std::vector<std::string> lw = split_words(labels_[li]);  // "_" is a separator too
    if (lw.empty() || lw.size() > words.size()) continue;
    for (size_t p = 0; p + lw.size() <= words.size(); ++p) {
      bool ok = true;
      for (size_t k = 0; k < lw.size() && ok; ++k) ok = word_matches(words[p + k], lw[k]);
      if (!ok) continue;
      if (best < 0 || lw.size() > best_len || (lw.size() == best_len && p < best_pos)) {
        best = static_cast<int>(li);
        best_len = lw.size();
        best_pos = p;
      }
      break;
    }
  }
  if (best < 0) {
    std::string list;
    for (const auto& l : labels_) {
      std::string spaced = l;
      std::replace(spaced.begin(), spaced.end(), '_', ' ');
      list += (list.empty() ? "" : ", ") + spaced;
    }
    throw LabelError("the prompt \"" + std::string(prompt) + "\" names none of this model's " +
                     std::to_string(labels_.size()) + " classes; name one of: " + list);
  }
  return best;
}

std::array<float, QuickDrawModel::kLatent> QuickDrawModel::latent_from_seed(uint64_t seed) {
  TorchRandn gen(RngKind::Cpu, seed);
  std::array<float, kLatent> z{};
  for (float& v : z) v = static_cast<float>(gen.random_u32() & 0xFFFFFFu) * (1.0f / 16777216.0f);
  return z;
}

std::vector<float> QuickDrawModel::decode(int label, const std::array<float, kLatent>& z) const {
  if (label < 0 || label >= static_cast<int>(labels_.size())) throw Error("QuickDraw: class index out of range");
  constexpr int kIn = kLatent + kOneHot, kDense = 7 * 7 * 16;
  float x[kIn] = {};
  for (int i = 0; i < kLatent; ++i) x[i] = z[i];
  x[kLatent + label + 1] = 1.0f;  // index 0 of the one-hot is unused by the trained model
  std::vector<float> h(kDense);
  for (int o = 0; o < kDense; ++o) {
    float acc = dense_b_[o];
    for (int i = 0; i < kIn; ++i) acc += x[i] * dense_w_[static_cast<size_t>(i) * kDense + o];
    h[o] = acc;
  }
  relu(h);  // now H7 x W7 x C16, channels_last
  h = conv_transpose_same(h, 7, 7, 16, ct1_w_, ct1_b_, 32);
  relu(h);
  h = upsample2_nearest(h, 7, 7, 32);
  h = conv_transpose_same(h, 14, 14, 32, ct2_w_, ct2_b_, 16);
  relu(h);
  h = upsample2_nearest(h, 14, 14, 16);
  h = conv_transpose_same(h, 28, 28, 16, ct3_w_, ct3_b_, 1);
  for (float& v : h) v = 1.0f / (1.0f + std::exp(-v));
  return h;
}

std::vector<uint8_t> resize_grey_to_u8(const std::vector<float>& src, int src_w, int src_h, int width, int height) {
  if (static_cast<size_t>(src_w) * src_h != src.size() || width <= 0 || height <= 0)
    throw Error("resize: bad image dimensions");
  std::vector<float> out(static_cast<size_t>(width) * height);
  const bool shrink = width < src_w || height < src_h;
  cv::resize(src.data(), src_w, src_h, 1, true, out.data(), width, height, shrink ? cv::Interp::area : cv::Interp::cubic);
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height);
  for (int y = 0; y < height; ++y) {
    const float* row = out.data() + static_cast<size_t>(y) * width;
    for (int x = 0; x < width; ++x) {
      const float v = std::clamp(row[x], 0.0f, 1.0f);  // bicubic overshoots at edges
      pixels[static_cast<size_t>(y) * width + x] = static_cast<uint8_t>(std::lround(v * 255.0f));
    }
  }
  return pixels;
}

}  // namespace atelier::image
