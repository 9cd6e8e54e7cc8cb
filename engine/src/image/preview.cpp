#include "image/preview.h"

#include <string>

#include "core/error.h"
#include "image/image_io.h"
#include "image/taesd.h"

namespace atelier::image {

LatentRgbProjection LatentRgbProjection::sd15() {
  LatentRgbProjection p;
  p.factors = {{0.3512f, 0.2297f, 0.3227f},
               {0.3250f, 0.4974f, 0.2350f},
               {-0.2829f, 0.1762f, 0.2721f},
               {-0.2120f, -0.2616f, -0.7177f}};
  return p;
}

Preview latent_preview(const float* latent, int channels, int height, int width, const LatentRgbProjection& proj) {
  if (channels != static_cast<int>(proj.factors.size()))
    throw Error("preview: the latent has " + std::to_string(channels) + " channels, the projection expects " +
                std::to_string(proj.factors.size()));
  if (height <= 0 || width <= 0) throw Error("preview: bad latent size");
  const size_t plane = static_cast<size_t>(height) * width;
  std::vector<float> planar(plane * 3);
  for (size_t i = 0; i < plane; ++i)
    for (int k = 0; k < 3; ++k) {
      float v = proj.bias[size_t(k)];
      for (int c = 0; c < channels; ++c) v += latent[size_t(c) * plane + i] * proj.factors[size_t(c)][size_t(k)];
      planar[size_t(k) * plane + i] = (v + 1.0f) / 2.0f;
    }
  const RgbImage img = from_planar(planar.data(), width, height);
  return {img.width, img.height, img.pixels};
}

Preview taesd_preview(const TaesdNet& decoder, const float* latent, int height, int width) {
  const std::vector<float> rgb = decoder.run(latent, height, width);
  const RgbImage img = from_planar(rgb.data(), width * 8, height * 8);
  return {img.width, img.height, img.pixels};
}

}  // namespace atelier::image
