// Step previews: a small RGB picture of the latent being denoised, either the
// cheap linear latent-to-RGB projection (any model with published factors)
// or a TAESD decoder (taesd.h) when the model has one.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace atelier::image {

class TaesdNet;

// 8-bit interleaved RGB, row-major; what a Preview event carries.
struct Preview {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// rgb[k] = bias[k] + sum_c latent[c] * factors[c][k], shown as (rgb + 1) / 2.
struct LatentRgbProjection {
  std::vector<std::array<float, 3>> factors;  // one row per latent channel
  std::array<float, 3> bias{};
  // SD 1.x/2.x (the 4-channel VAE latent at the sampler's scale, i.e. after
  // the 0.18215 scaling): ComfyUI's latent_formats.SD15 factors.
  static LatentRgbProjection sd15();
};

// latent: [channels][h][w] with channels == projection.factors.size(); the
// preview has the latent's size (1/8 of the image). Values are clamped to
// [0, 1] and rounded to 8 bits. Throws Error on a channel mismatch.
Preview latent_preview(const float* latent, int channels, int height, int width, const LatentRgbProjection& projection);

// The TAESD decoder's picture of the latent (8x the latent's size).
Preview taesd_preview(const TaesdNet& decoder, const float* latent, int height, int width);

}  // namespace atelier::image
