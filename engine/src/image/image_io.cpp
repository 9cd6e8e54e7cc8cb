#include "image/image_io.h"

#include <cstdio>  // before jpeglib.h, which uses FILE

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/error.h"
#include "image/cv_ops.h"

namespace atelier::image {

// Pictures are decoded with libpng, libjpeg(-turbo) and libwebp directly
// rather than OpenCV's imgcodecs: that module loads ~120 more shared
// libraries (GDAL, poppler, HDF5, ...) into every process that links the
// engine, ~34 MB resident even in a text-only run.
namespace {

constexpr int64_t kMaxPixels = int64_t{1} << 28;  // 16384 x 16384: a picture, not a decompression bomb

[[noreturn]] void bad_image(const std::string& path, const std::string& why) {
  throw Error(StatusCode::InvalidModel, path + ": cannot decode the image (" + why + ")");
}

// Why a w x h picture is not read, or empty when it is.
std::string size_problem(int64_t w, int64_t h) {
  if (w > 0 && h > 0 && w * h <= kMaxPixels) return {};
  return std::to_string(w) + "x" + std::to_string(h) + " pixels is not a size this reads (at most 16384x16384)";
}

void check_size(const std::string& path, int64_t w, int64_t h) {
  if (std::string why = size_problem(w, h); !why.empty()) bad_image(path, why);
}

RgbImage decode_png(const std::string& path, const std::vector<uint8_t>& bytes) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size())) bad_image(path, img.message);
  check_size(path, img.width, img.height);
  // Read as straight RGBA and the alpha dropped (as OpenCV's IMREAD_COLOR
  // does), so a transparent mask keeps the colours it stores.
  img.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, rgba.data(), 0, nullptr)) {
    const std::string why = img.message;
    png_image_free(&img);
    bad_image(path, why);
  }
  RgbImage out;
  out.width = static_cast<int>(img.width);
  out.height = static_cast<int>(img.height);
  out.pixels.resize(size_t(out.width) * out.height * 3);
  for (size_t i = 0, n = size_t(out.width) * out.height; i < n; ++i) std::memcpy(&out.pixels[3 * i], &rgba[4 * i], 3);
  return out;
}

RgbImage decode_webp(const std::string& path, const std::vector<uint8_t>& bytes) {
  int w = 0, h = 0;
  if (!WebPGetInfo(bytes.data(), bytes.size(), &w, &h)) bad_image(path, "not a valid WebP stream");
  check_size(path, w, h);
  uint8_t* rgb = WebPDecodeRGB(bytes.data(), bytes.size(), &w, &h);
  if (!rgb) bad_image(path, "the WebP data is corrupt");
  RgbImage out;
  out.width = w;
  out.height = h;
  out.pixels.assign(rgb, rgb + size_t(w) * h * 3);
  WebPFree(rgb);
  return out;
}

// libjpeg reports errors through a callback that must not return: it jumps
// back into decode_jpeg_raw, which holds only trivially destructible state.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};
void jpeg_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegError*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

// The EXIF orientation (1..8) of an APP1 marker, 1 when it has none.
int exif_orientation(const jpeg_saved_marker_ptr markers) {
  for (jpeg_saved_marker_ptr m = markers; m; m = m->next) {
    const uint8_t* d = m->data;
    const size_t n = m->data_length;
    if (m->marker != JPEG_APP0 + 1 || n < 14 || std::memcmp(d, "Exif\0\0", 6) != 0) continue;
    const uint8_t* t = d + 6;  // the TIFF header
    const size_t tn = n - 6;
    const bool le = t[0] == 'I' && t[1] == 'I';
    if (!le && !(t[0] == 'M' && t[1] == 'M')) return 1;
    auto u16 = [&](size_t o) -> uint32_t { return o + 2 > tn ? 0 : le ? t[o] | t[o + 1] << 8 : t[o] << 8 | t[o + 1]; };
    auto u32 = [&](size_t o) -> uint32_t { return o + 4 > tn ? 0 : le ? u16(o) | u16(o + 2) << 16 : u16(o) << 16 | u16(o + 2); };
    const size_t ifd = u32(4);
    const uint32_t entries = u16(ifd);
    for (uint32_t i = 0; i < entries && ifd + 2 + 12 * (i + 1) <= tn; ++i) {
      const size_t e = ifd + 2 + 12 * i;
      if (u16(e) == 0x0112) {
        const uint32_t v = u16(e + 8);
        return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
      }
    }
  }
  return 1;
}

// Decoded as libjpeg's defaults (integer DCT, fancy upsampling), which is
// how OpenCV reads it; false with `why` set on corrupt data.
bool decode_jpeg_raw(const std::vector<uint8_t>& bytes, std::vector<uint8_t>& rgb, int& w, int& h, int& orientation,
                     std::string& why) {
  jpeg_decompress_struct c;
  JpegError err;
  c.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    why = err.message;
    jpeg_destroy_decompress(&c);
    return false;
  }
  jpeg_create_decompress(&c);
  jpeg_mem_src(&c, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_save_markers(&c, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&c, TRUE);
  if (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK) {
    why = "CMYK JPEG; save it as RGB";
    jpeg_destroy_decompress(&c);
    return false;
  }
  why = size_problem(c.image_width, c.image_height);  // before the decoder allocates for it
  if (!why.empty()) {
    jpeg_destroy_decompress(&c);
    return false;
  }
  orientation = exif_orientation(c.marker_list);
  c.out_color_space = JCS_RGB;
  jpeg_start_decompress(&c);
  w = static_cast<int>(c.output_width);
  h = static_cast<int>(c.output_height);
  rgb.resize(size_t(w) * h * 3);
  while (c.output_scanline < c.output_height) {
    JSAMPROW row = rgb.data() + size_t(c.output_scanline) * w * 3;
    jpeg_read_scanlines(&c, &row, 1);
  }
  jpeg_finish_decompress(&c);
  jpeg_destroy_decompress(&c);
  return true;
}

RgbImage decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> rgb;
  int w = 0, h = 0, orientation = 1;
  std::string why;
  if (!decode_jpeg_raw(bytes, rgb, w, h, orientation, why)) bad_image(path, why);
  RgbImage out;
  if (orientation == 1) {  // already upright: the decoded rows are the picture
    out.width = w;
    out.height = h;
    out.pixels = std::move(rgb);
    return out;
  }
  // Upright as the camera meant it (OpenCV's imread applies EXIF orientation too).
  out.pixels = cv::orient(rgb.data(), w, h, orientation, out.width, out.height);
  return out;
}

}  // namespace

RgbImage read_rgb_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    const bool there = std::filesystem::exists(path, ec);
    throw Error(there ? StatusCode::InvalidModel : StatusCode::NotFound,
                path + ": cannot read the image (" + (there ? "not a file" : "no such file") + ")");
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw Error(StatusCode::InvalidModel, path + ": cannot read the image (read error)");
  const auto starts = [&](const char* magic, size_t at = 0) {
    const size_t n = std::strlen(magic);
    return bytes.size() >= at + n && std::memcmp(bytes.data() + at, magic, n) == 0;
  };
  if (starts("\x89PNG\r\n\x1a\n")) return decode_png(path, bytes);
  if (starts("\xff\xd8\xff")) return decode_jpeg(path, bytes);
  if (starts("RIFF") && starts("WEBP", 8)) return decode_webp(path, bytes);
  throw Error(StatusCode::InvalidModel, path + ": cannot read the image (not a PNG, JPEG or WebP file; convert it to PNG)");
}

RgbImage resize_rgb(const RgbImage& image, int width, int height, ResizeFilter filter) {
  if (width <= 0 || height <= 0 || image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != size_t(image.width) * image.height * 3)
    throw Error("resize: bad image dimensions");
  const bool shrink = width < image.width || height < image.height;
  cv::Interp mode = shrink ? cv::Interp::area : cv::Interp::cubic;
  switch (filter) {
    case ResizeFilter::automatic: break;
    case ResizeFilter::area: mode = cv::Interp::area; break;
    case ResizeFilter::linear: mode = cv::Interp::linear; break;
    case ResizeFilter::cubic: mode = cv::Interp::cubic; break;
    case ResizeFilter::lanczos: mode = cv::Interp::lanczos4; break;
  }
  RgbImage r;
  r.width = width;
  r.height = height;
  r.pixels.resize(size_t(width) * height * 3);
  cv::resize(image.pixels.data(), image.width, image.height, 3, false, r.pixels.data(), width, height, mode);
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
