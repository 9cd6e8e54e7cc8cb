#include "image/png.h"

#include <fcntl.h>
#include <png.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/cancel.h"
#include "core/error.h"

namespace atelier::image {

namespace {

struct Sink {
  std::vector<uint8_t>* out;
};

void write_cb(png_structp png, png_bytep data, png_size_t n) {
  auto* sink = static_cast<Sink*>(png_get_io_ptr(png));
  sink->out->insert(sink->out->end(), data, data + n);
}
void flush_cb(png_structp) {}

// libpng reports errors by longjmp. Everything with a destructor lives in the
// caller; this function holds only plain pointers across setjmp. Returns false
// when libpng failed (message in *error, a fixed-size buffer).
bool encode_raw(png_structp png, png_infop info, const PngImage& image, png_textp texts, int n_text,
                png_bytep* rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8,
               image.channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (n_text > 0) png_set_text(png, info, texts, n_text);
  png_set_rows(png, info, rows);
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  return true;
}

char g_dummy;  // non-null user pointer for the error callback
thread_local char t_png_error[256];

void error_cb(png_structp png, png_const_charp msg) {
  std::snprintf(t_png_error, sizeof t_png_error, "%s", msg ? msg : "unknown libpng error");
  png_longjmp(png, 1);
}
void warning_cb(png_structp, png_const_charp) {}
// A cancellation point every 64 rows (core/cancel.h): a 4096x4096 picture takes seconds to compress.
void row_cb(png_structp png, png_uint_32 row, int) {
  if ((row & 63) == 0 && cancel_requested()) png_error(png, "cancelled");
}

bool is_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80 || c == 0) return false;
  return true;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

std::vector<uint8_t> encode_png(const PngImage& image, const std::vector<std::pair<std::string, std::string>>& text) {
  if (image.width <= 0 || image.height <= 0 || (image.channels != 1 && image.channels != 3) || !image.pixels)
    throw Error("PNG: bad image (" + std::to_string(image.width) + "x" + std::to_string(image.height) + ", " +
                std::to_string(image.channels) + " channels; 1 or 3 channels required)");
  for (const auto& [key, value] : text)
    if (key.empty() || key.size() > 79 || !is_ascii(key)) throw Error("PNG: text keyword \"" + key + "\" must be 1-79 ASCII characters");

  std::vector<uint8_t> out;
  Sink sink{&out};
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  const size_t stride = static_cast<size_t>(image.width) * image.channels;
  for (int y = 0; y < image.height; ++y) rows[y] = const_cast<png_bytep>(image.pixels + stride * y);
  std::vector<png_text> texts(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    std::memset(&texts[i], 0, sizeof(png_text));
    texts[i].compression = is_ascii(text[i].second) ? PNG_TEXT_COMPRESSION_NONE : PNG_ITXT_COMPRESSION_NONE;
    texts[i].key = const_cast<png_charp>(text[i].first.c_str());
    texts[i].text = const_cast<png_charp>(text[i].second.c_str());
    if (texts[i].compression == PNG_TEXT_COMPRESSION_NONE)
      texts[i].text_length = text[i].second.size();
    else
      texts[i].itxt_length = text[i].second.size();
  }

  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &g_dummy, error_cb, warning_cb);
  if (!png) throw Error("PNG: cannot create the encoder (out of memory)");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    throw Error("PNG: cannot create the encoder (out of memory)");
  }
  png_set_write_fn(png, &sink, write_cb, flush_cb);
  png_set_write_status_fn(png, row_cb);
  t_png_error[0] = 0;
  const bool ok = encode_raw(png, info, image, texts.data(), static_cast<int>(texts.size()), rows.data());
  png_destroy_write_struct(&png, &info);
  if (!ok && cancel_requested()) throw Error(StatusCode::Cancelled, "cancelled");
  if (!ok) throw Error(std::string("PNG: encoding failed: ") + t_png_error);
  return out;
}

void write_png_file(const std::string& path, const PngImage& image,
                    const std::vector<std::pair<std::string, std::string>>& text) {
  const std::vector<uint8_t> bytes = encode_png(image, text);
  const std::string tmp = path + ".tmp";
  // O_NOFOLLOW: a link planted at PATH.tmp is refused, not written through (the rename replaces a link at PATH, never its target).
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) throw IoError("cannot write " + path + ": " + errno_text(errno) + " (does the folder exist and is it writable?)");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      if (e == ENOSPC) throw DiskFullError("cannot write " + path + ": " + errno_text(e) + " (the disk is full: free some disk space)");
      throw IoError("cannot write " + path + ": " + errno_text(e));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    if (e == ENOSPC) throw DiskFullError("cannot write " + path + ": " + errno_text(e) + " (the disk is full: free some disk space)");
    throw IoError("cannot write " + path + ": " + errno_text(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw IoError("cannot write " + path + ": rename from " + tmp + " failed: " + errno_text(e));
  }
}

PngInfo read_png_info(const std::vector<uint8_t>& b) {
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (b.size() < 8 || std::memcmp(b.data(), kSig, 8) != 0) throw Error("not a PNG (bad signature)");
  PngInfo info;
  size_t pos = 8;
  bool have_ihdr = false;
  while (pos + 12 <= b.size()) {
    const uint32_t len = be32(&b[pos]);
    const std::string type(reinterpret_cast<const char*>(&b[pos + 4]), 4);
    if (len > b.size() - pos - 12) throw Error("PNG: chunk " + type + " runs past the end of the file");
    const uint8_t* d = &b[pos + 8];
    if (type == "IHDR") {
      if (len < 13) throw Error("PNG: IHDR too short");
      info.width = static_cast<int>(be32(d));
      info.height = static_cast<int>(be32(d + 4));
      info.bit_depth = d[8];
      info.color_type = d[9];
      have_ihdr = true;
    } else if (type == "tEXt") {
      const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(d, 0, len));
      if (nul) info.text[std::string(reinterpret_cast<const char*>(d), nul - d)] =
          std::string(reinterpret_cast<const char*>(nul + 1), d + len - (nul + 1));
    } else if (type == "iTXt") {
      // keyword \0 compression-flag compression-method language \0 translated-keyword \0 text
      const uint8_t* end = d + len;
      const uint8_t* k = static_cast<const uint8_t*>(std::memchr(d, 0, len));
      if (k && end - k >= 3 && k[1] == 0) {
        const uint8_t* lang = k + 3;
        const uint8_t* l = static_cast<const uint8_t*>(std::memchr(lang, 0, end - lang));
        const uint8_t* t = l ? static_cast<const uint8_t*>(std::memchr(l + 1, 0, end - (l + 1))) : nullptr;
        if (t) info.text[std::string(reinterpret_cast<const char*>(d), k - d)] =
            std::string(reinterpret_cast<const char*>(t + 1), end - (t + 1));
      }
    } else if (type == "IEND") {
      break;
    }
    pos += 12 + static_cast<size_t>(len);
  }
  if (!have_ihdr) throw Error("PNG: no IHDR chunk");
  return info;
}

PngInfo read_png_info_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(errno_code(errno), "cannot read " + path + ": " + errno_text(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return read_png_info(bytes);
}

}  // namespace atelier::image
