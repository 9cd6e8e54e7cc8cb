// The QuickDraw CVAE: a real, tiny, pretrained class-conditional doodle
// generator (ml5, MIT; trained on Quick, Draw!, CC-BY 4.0) stored as
// safetensors with Keras layouts. Its decoder maps z[16] ++ one_hot[51] to a
// 28x28 grey image in [0,1]:
//
//   dense_5 [67] -> [784], relu, reshape H7 x W7 x C16 (channels_last)
//   conv2d_transpose_1 3x3 s1 same 16 -> 32, relu;  upsample x2 (nearest)
//   conv2d_transpose_2 3x3 s1 same 32 -> 16, relu;  upsample x2 (nearest)
//   conv2d_transpose_3 3x3 s1 same 16 -> 1, sigmoid
//
// The prompt's words pick the class; z comes from the seed; the 28x28 output
// is upscaled smoothly to the requested size.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace atelier::formats {
class SafetensorsFile;
}

namespace atelier::image {

// A prompt that names none of the model's classes (a request problem, not a
// model problem: InvalidArgument wherever it is caught).
class LabelError : public Error {
 public:
  explicit LabelError(const std::string& message) : Error(StatusCode::InvalidArgument, message) {}
};

class QuickDrawModel {
 public:
  static constexpr int kSide = 28;      // output is kSide x kSide
  static constexpr int kLatent = 16;    // z dimensions
  static constexpr int kOneHot = 51;    // one-hot width (class index + 1 is hot)
  static constexpr const char* kArchitecture = "quickdraw-cvae";

  // True when the file's __metadata__ architecture is "quickdraw-cvae".
  static bool is_quickdraw(const formats::SafetensorsFile& file);

  // Loads and checks every tensor's type and shape. Throws Error (names the
  // file and what is wrong).
  static std::unique_ptr<QuickDrawModel> open(const std::string& path);

  const std::vector<std::string>& labels() const { return labels_; }

  // The class the prompt names: words are compared case-insensitively,
  // underscores in labels match spaces ("alarm clock" -> alarm_clock), and a
  // plural "s"/"es" is tolerated ("octopuses", "apples"). When several labels
  // match, the one with the most words wins (then the earliest in the
  // prompt). Throws LabelError listing every class when none matches.
  int match_label(std::string_view prompt) const;

  // z for a seed: torch.manual_seed(seed); torch.rand(16) on PyTorch's CPU
  // generator (mt19937; each float is (random_u32() & 0xFFFFFF) / 2^24, the
  // 24-bit float path of at::uniform_real_distribution). The CPU generator is
  // used whatever --rng says: 16 uniforms are not worth a GPU launch, and
  // this is what a torch port of the model would draw on the CPU.
  static std::array<float, kLatent> latent_from_seed(uint64_t seed);

  // The decoder: kSide * kSide floats in [0,1], row-major.
  std::vector<float> decode(int label, const std::array<float, kLatent>& z) const;

 private:
  QuickDrawModel() = default;
  std::vector<std::string> labels_;
  // Keras layouts: dense kernel [in, out]; Conv2DTranspose kernel [kh, kw, out, in].
  std::vector<float> dense_w_, dense_b_;
  std::vector<float> ct1_w_, ct1_b_, ct2_w_, ct2_b_, ct3_w_, ct3_b_;
};

// Smooth upscaling (OpenCV bicubic; area averaging when shrinking) of a grey
// float image in [0,1] to width x height, clamped and rounded to 8 bits.
std::vector<uint8_t> resize_grey_to_u8(const std::vector<float>& src, int src_w, int src_h, int width, int height);

}  // namespace atelier::image
