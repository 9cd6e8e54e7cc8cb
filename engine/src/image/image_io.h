// Reading pictures (PNG, JPEG, WebP) and converting between
// interleaved 8-bit RGB and the planar float [3][h][w] in [0, 1] that image
// models take, plus PSNR for tests and quality checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atelier::image {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // row-major, interleaved R, G, B
};

// Decodes a PNG, JPEG or WebP file into 8-bit RGB (grey widened, alpha
// dropped, a JPEG's EXIF orientation applied), as OpenCV's imread would.
// Throws Error naming the path when it cannot be read or decoded.
RgbImage read_rgb_file(const std::string& path);

// Resized to width x height. automatic: area averaging when shrinking
// (antialiased), bicubic when enlarging. Throws Error on bad sizes.
enum class ResizeFilter { automatic, area, linear, cubic, lanczos };
RgbImage resize_rgb(const RgbImage& image, int width, int height, ResizeFilter filter = ResizeFilter::automatic);

// [3][h][w] floats, value / 255.
std::vector<float> to_planar(const RgbImage& image);
// Planar [3][h][w] -> 8-bit interleaved: clamped to [0, 1], x * 255 rounded
// to nearest.
RgbImage from_planar(const float* planar, int width, int height);

// Peak signal-to-noise ratio in dB over all channels of two same-sized 8-bit
// images (infinity when identical). Throws Error on a size mismatch.
double psnr(const RgbImage& a, const RgbImage& b);

}  // namespace atelier::image
