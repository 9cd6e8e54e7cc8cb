// read_rgb_file: PNG (grey, RGB, RGBA), JPEG (with EXIF orientation) and
// WebP decoded to 8-bit RGB; bad files refused with the path in the error.
// Goldens: pictures written here by libpng's and libwebp's own encoders
// (lossless), and the JPEG fixture's upright decode turned by plain loops.
#include <gtest/gtest.h>
#include <png.h>
#include <unistd.h>
#include <webp/encode.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "image/image_io.h"

namespace {

namespace fs = std::filesystem;
using atelier::image::read_rgb_file;
using atelier::image::RgbImage;

const std::string kImg = std::string(ATELIER_FIXTURES_DIR) + "/image/";

// This process's scratch folder, removed when it exits.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("atelier-image-io-" + std::to_string(::getpid()));
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

fs::path tmp(const std::string& name) {
  static Scratch scratch;
  fs::create_directories(scratch.dir);
  return scratch.dir / name;
}

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> pattern(int w, int h, int channels) {
  std::vector<uint8_t> p(size_t(w) * h * channels);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 37 + i / 7);
  return p;
}

// libpng's own writer, in the given simplified-API format.
void write_png(const fs::path& p, int w, int h, png_uint_32 format, const std::vector<uint8_t>& pixels) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = format;
  ASSERT_TRUE(png_image_write_to_file(&img, p.c_str(), 0, pixels.data(), 0, nullptr)) << img.message;
}

TEST(ImageIo, PngOfEveryColourTypeDecodesToItsRgb) {
  const int w = 37, h = 23;
  const auto rgb = pattern(w, h, 3), grey = pattern(w, h, 1), rgba = pattern(w, h, 4);
  write_png(tmp("rgb.png"), w, h, PNG_FORMAT_RGB, rgb);
  write_png(tmp("grey.png"), w, h, PNG_FORMAT_GRAY, grey);
  write_png(tmp("rgba.png"), w, h, PNG_FORMAT_RGBA, rgba);
  const RgbImage a = read_rgb_file(tmp("rgb.png"));
  ASSERT_EQ(a.width, w);
  ASSERT_EQ(a.height, h);
  EXPECT_EQ(a.pixels, rgb);
  const RgbImage g = read_rgb_file(tmp("grey.png"));
  ASSERT_EQ(g.pixels.size(), size_t(w) * h * 3);
  for (size_t i = 0; i < grey.size(); ++i)
    ASSERT_TRUE(g.pixels[3 * i] == grey[i] && g.pixels[3 * i + 1] == grey[i] && g.pixels[3 * i + 2] == grey[i]) << i;
  // Alpha dropped, the stored colours kept (not composited), as OpenCV's IMREAD_COLOR.
  const RgbImage c = read_rgb_file(tmp("rgba.png"));
  ASSERT_EQ(c.pixels.size(), size_t(w) * h * 3);
  for (size_t i = 0; i < size_t(w) * h; ++i)
    ASSERT_EQ(std::memcmp(&c.pixels[3 * i], &rgba[4 * i], 3), 0) << "pixel " << i;
}

TEST(ImageIo, LosslessWebpDecodesToItsPixels) {
  const int w = 41, h = 19;
  const auto rgb = pattern(w, h, 3);
  uint8_t* out = nullptr;
  const size_t n = WebPEncodeLosslessRGB(rgb.data(), w, h, w * 3, &out);
  ASSERT_GT(n, 0u);
  write_bytes(tmp("pic.webp"), std::vector<uint8_t>(out, out + n));
  WebPFree(out);
  const RgbImage a = read_rgb_file(tmp("pic.webp"));
  ASSERT_EQ(a.width, w);
  ASSERT_EQ(a.height, h);
  EXPECT_EQ(a.pixels, rgb);
}

// The fixture with an EXIF APP1 segment naming `orientation` inserted after its SOI.
std::vector<uint8_t> with_orientation(const std::vector<uint8_t>& jpeg, uint16_t orientation) {
  std::vector<uint8_t> app1 = {'E', 'x', 'i', 'f', 0, 0,      // Exif header
                               'I', 'I', 42, 0, 8, 0, 0, 0,  // little-endian TIFF, IFD0 at 8
                               1, 0,                         // one entry
                               0x12, 0x01, 3, 0, 1, 0, 0, 0,  // tag 0x0112, SHORT, count 1
                               static_cast<uint8_t>(orientation), 0, 0, 0,
                               0, 0, 0, 0};  // no next IFD
  const size_t len = app1.size() + 2;
  const std::vector<uint8_t> marker = {0xFF, 0xD8, 0xFF, 0xE1, static_cast<uint8_t>(len >> 8), static_cast<uint8_t>(len & 0xFF)};
  std::vector<uint8_t> out;
  out.reserve(marker.size() + app1.size() + jpeg.size());
  for (const uint8_t b : marker) out.push_back(b);
  for (const uint8_t b : app1) out.push_back(b);
  for (size_t i = 2; i < jpeg.size(); ++i) out.push_back(jpeg[i]);
  return out;
}

uint8_t px(const RgbImage& im, int x, int y, int c) { return im.pixels[(size_t(y) * im.width + x) * 3 + c]; }

TEST(ImageIo, JpegIsTurnedUprightByItsExifOrientation) {
  const auto jpeg = bytes_of(kImg + "llama_cute.jpg");
  const RgbImage up = read_rgb_file(kImg + "llama_cute.jpg");
  ASSERT_EQ(up.width, 1024);
  ASSERT_EQ(up.height, 1024);
  // Where pixel (x, y) of the displayed picture is in the stored one, for each
  // EXIF orientation (TIFF 6.0 / EXIF 2.3 definitions), W = H = 1024.
  const int n = 1023;
  struct Case {
    uint16_t o;
    int (*sx)(int, int, int);
    int (*sy)(int, int, int);
  };
  const Case cases[] = {
      {1, [](int x, int, int) { return x; }, [](int, int y, int) { return y; }},
      {2, [](int x, int, int n) { return n - x; }, [](int, int y, int) { return y; }},
      {3, [](int x, int, int n) { return n - x; }, [](int, int y, int n) { return n - y; }},
      {4, [](int x, int, int) { return x; }, [](int, int y, int n) { return n - y; }},
      {5, [](int, int y, int) { return y; }, [](int x, int, int) { return x; }},
      {6, [](int, int y, int) { return y; }, [](int x, int, int n) { return n - x; }},
      {7, [](int, int y, int n) { return n - y; }, [](int x, int, int n) { return n - x; }},
      {8, [](int, int y, int n) { return n - y; }, [](int x, int, int) { return x; }},
  };
  for (const Case& c : cases) {
    const fs::path p = tmp(std::string("o") + static_cast<char>('0' + c.o) + ".jpg");
    write_bytes(p, with_orientation(jpeg, c.o));
    const RgbImage im = read_rgb_file(p);
    ASSERT_EQ(im.width, 1024);
    ASSERT_EQ(im.height, 1024);
    int wrong = 0;
    for (int y = 0; y <= n; y += 31)
      for (int x = 0; x <= n; x += 29)
        for (int ch = 0; ch < 3; ++ch) wrong += px(im, x, y, ch) != px(up, c.sx(x, y, n), c.sy(x, y, n), ch);
    EXPECT_EQ(wrong, 0) << "orientation " << c.o;
  }
}

TEST(ImageIo, BadFilesAreRefusedNamingThePath) {
  const auto jpeg = bytes_of(kImg + "llama_cute.jpg");
  std::vector<uint8_t> png;
  write_png(tmp("whole.png"), 64, 64, PNG_FORMAT_RGB, pattern(64, 64, 3));
  png = bytes_of(tmp("whole.png"));
  struct Bad {
    std::string name;
    std::vector<uint8_t> bytes;
  };
  const Bad bad[] = {
      {"empty.png", {}},
      {"text.png", {'h', 'e', 'l', 'l', 'o'}},
      {"half.jpg", std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + 600)},
      {"half.png", std::vector<uint8_t>(png.begin(), png.begin() + static_cast<long>(png.size() / 2))},
      {"header.webp", {'R', 'I', 'F', 'F', 9, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', ' '}},
  };
  for (const Bad& b : bad) {
    const fs::path p = tmp(b.name);
    write_bytes(p, b.bytes);
    try {
      read_rgb_file(p);
      ADD_FAILURE() << b.name << " was decoded";
    } catch (const atelier::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
      EXPECT_EQ(e.code(), atelier::StatusCode::InvalidModel) << b.name << ": " << e.what();
    }
  }
  try {
    read_rgb_file(tmp("missing.png"));
    ADD_FAILURE() << "a missing file was decoded";
  } catch (const atelier::Error& e) {
    EXPECT_EQ(e.code(), atelier::StatusCode::NotFound) << e.what();
  }
}

}  // namespace
