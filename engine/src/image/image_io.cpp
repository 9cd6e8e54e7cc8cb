#include "image/image_io.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/error.h"

namespace atelier::image {

RgbImage read_rgb_file(const std::string& path) {
  cv::Mat bgr;
  try {
    bgr = cv::imread(path, cv::IMREAD_COLOR);  // 8-bit BGR whatever the file holds
  } catch (const cv::Exception& e) {
    throw Error(path + ": cannot decode the image (" + e.what() + ")");
  }
  if (bgr.empty()) throw Error(std::filesystem::exists(path) ? StatusCode::InvalidModel : StatusCode::NotFound, path + ": cannot read the image (missing, or not a format OpenCV decodes)");
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  RgbImage out;
  out.width = rgb.cols;
  out.height = rgb.rows;
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  for (int y = 0; y < out.height; ++y)
    std::copy_n(rgb.ptr<uint8_t>(y), static_cast<size_t>(out.width) * 3, out.pixels.data() + size_t(y) * out.width * 3);
  return out;
}

RgbImage resize_rgb(const RgbImage& image, int width, int height, ResizeFilter filter) {
  if (width <= 0 || height <= 0 || image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != size_t(image.width) * image.height * 3)
    throw Error("resize: bad image dimensions");
  const cv::Mat in(image.height, image.width, CV_8UC3, const_cast<uint8_t*>(image.pixels.data()));
  cv::Mat out;
  const bool shrink = width < image.width || height < image.height;
  int mode = shrink ? cv::INTER_AREA : cv::INTER_CUBIC;
  switch (filter) {
    case ResizeFilter::automatic: break;
    case ResizeFilter::area: mode = cv::INTER_AREA; break;
    case ResizeFilter::linear: mode = cv::INTER_LINEAR; break;
    case ResizeFilter::cubic: mode = cv::INTER_CUBIC; break;
    case ResizeFilter::lanczos: mode = cv::INTER_LANCZOS4; break;
  }
  cv::resize(in, out, cv::Size(width, height), 0, 0, mode);
  RgbImage r;
  r.width = width;
  r.height = height;
  r.pixels.resize(size_t(width) * height * 3);
  for (int y = 0; y < height; ++y) std::copy_n(out.ptr<uint8_t>(y), size_t(width) * 3, r.pixels.data() + size_t(y) * width * 3);
  return r;
}

std::vector<float> to_planar(const RgbImage& image) {
  const size_t plane = static_cast<size_t>(image.width) * image.height;
  std::vector<float> out(plane * 3);
  for (size_t i = 0; i < plane; ++i)
    for (size_t c = 0; c < 3; ++c) out[c * plane + i] = image.pixels[i * 3 + c] / 255.0f;
  return out;
}

RgbImage from_planar(const float* planar, int width, int height) {
  RgbImage out;
  out.width = width;
  out.height = height;
  const size_t plane = static_cast<size_t>(width) * height;
  out.pixels.resize(plane * 3);
  for (size_t i = 0; i < plane; ++i)
    for (size_t c = 0; c < 3; ++c) {
      const float v = std::clamp(planar[c * plane + i], 0.0f, 1.0f);
      out.pixels[i * 3 + c] = static_cast<uint8_t>(std::lround(v * 255.0f));
    }
  return out;
}

double psnr(const RgbImage& a, const RgbImage& b) {
  if (a.width != b.width || a.height != b.height || a.pixels.size() != b.pixels.size())
    throw Error("psnr: the images differ in size");
  double se = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    const double d = double(a.pixels[i]) - b.pixels[i];
    se += d * d;
  }
  if (se == 0) return std::numeric_limits<double>::infinity();
  const double mse = se / double(a.pixels.size());
  return 10.0 * std::log10(255.0 * 255.0 / mse);
}

}  // namespace atelier::image
