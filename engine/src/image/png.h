// PNG output with generation parameters, and a small reader of those
// parameters (tests, and "what made this image?").
//
// The writer encodes 8-bit grey (1 channel) or RGB (3 channels) with libpng
// and adds text chunks: tEXt when the value is ASCII, otherwise iTXt
// (uncompressed UTF-8), as AUTOMATIC1111 does for its `parameters` chunk.
// The bytes go to PATH.tmp, are fsynced, then renamed over PATH, so a failed
// write never leaves a half-written image behind.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace atelier::image {

struct PngImage {
  int width = 0, height = 0, channels = 0;  // channels: 1 grey, 3 RGB
  const uint8_t* pixels = nullptr;          // row-major, interleaved, width * channels bytes per row
};

// Encodes to bytes. Throws Error on bad dimensions or an encoder failure.
std::vector<uint8_t> encode_png(const PngImage& image, const std::vector<std::pair<std::string, std::string>>& text);

// encode_png, then PATH.tmp + fsync + rename. Throws Error naming the path and
// the system's reason (missing directory, disk full, permissions).
void write_png_file(const std::string& path, const PngImage& image,
                    const std::vector<std::pair<std::string, std::string>>& text);

// What read_png_info finds: the IHDR size and colour, and every tEXt and
// uncompressed iTXt chunk (keyword -> text). Compressed chunks are skipped.
struct PngInfo {
  int width = 0, height = 0, bit_depth = 0, color_type = 0;
  std::map<std::string, std::string> text;
};

// Parses the chunk structure of a PNG (bounds checked; pixels not decoded).
// Throws Error when the bytes are not a PNG or a chunk runs past the end.
PngInfo read_png_info(const std::vector<uint8_t>& bytes);
PngInfo read_png_info_file(const std::string& path);

}  // namespace atelier::image
