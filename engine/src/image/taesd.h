// TAESD-family tiny autoencoders (madebyollin/taesd, MIT): SD 1.x/2.x TAESD
// (4 latent channels), taesdxl, taef1 / taesd3 (16) and taef2 (FLUX.2, 32,
// with the `use_midblock_gn` blocks). One code path for all of them: the
// layer list is taesd.py's Encoder / Decoder, and every width, the latent
// channel count and which blocks carry the GroupNorm branch are read from the
// tensor shapes and names.
//
//   Encoder: conv(3,64) Block | conv s2 no-bias, Block x3 | (twice more) | conv(64,L)
//            indices 0, 1, 2, 3-5, 6, 7-9, 10, 11-13, 14   (8x downscale)
//   Decoder: Clamp conv(L,64) ReLU | Block x3, Upsample, conv no-bias | (x3) | Block conv(64,3)
//            indices 0, 1, 2, 3-5, 6, 7, 8-10, 11, 12, 13-15, 16, 17, 18, 19
//   Block(x) = relu(conv4(relu(conv2(relu(conv0(x'))))) + skip(x')),
//            x' = x + pool(x) when the block has `pool.*` tensors (taef2):
//            pool = conv1x1(n, 4n) -> GroupNorm(4 groups, eps 1e-5) -> ReLU -> conv1x1(4n, n)
//            skip = conv1x1 without bias when the widths differ, else identity.
//   Clamp(x) = 3 tanh(x / 3). Every conv is 3x3 with padding 1 unless 1x1.
//
// Images are planar RGB [3][h][w] in [0, 1]; latents are raw [L][h/8][w/8]
// (the model's own latent scale: for SD that is the VAE latent already
// multiplied by its scaling factor, what the UNet samples).
#pragma once

#include <atelier/backend.h>
#include <atelier/kernels.h>

#include <memory>
#include <string>
#include <vector>

#include "image/workspace.h"

namespace atelier::image {

class Placement;  // sd_weights.h

class TaesdNet {
 public:
  enum class Kind { encoder, decoder };

  // Loads a `.pth` (PyTorch zip, restricted unpickler) or `.safetensors`
  // file with taesd.py's state-dict names ("3.conv.0.weight"). Weights are
  // widened to f32 (the models are ~1.3M parameters). Throws Error naming the
  // file and the tensor when a name or shape does not fit the architecture.
  // Its parameters are placed on `backend` (a copy where it does not read host memory).
  static std::unique_ptr<TaesdNet> open(const std::string& path, Kind kind,
                                        kernels::Backend& backend = kernels::default_cpu_backend());
  ~TaesdNet();

  Kind kind() const;
  int latent_channels() const;

  // Encoder: rgb [3][h][w] (h, w multiples of 8) -> latents [L][h/8][w/8].
  // Decoder: latents [L][h][w] -> rgb [3][8h][8w], clamped to [0, 1].
  // `ex` runs the convolutions' tiles (nullptr: the calling thread).
  // Throws Error on bad sizes.
  std::vector<float> run(const float* input, int height, int width, kernels::Executor* ex = nullptr) const;
  // The same on `backend` (every step a backend op, one reused workspace).
  std::vector<float> run(const float* input, int height, int width, kernels::Backend& backend) const;

  struct Layer;  // taesd.cpp

 private:
  TaesdNet();
  void check(int height, int width) const;
  // The largest tensor of a pass, and the F32 staging of its input and output.
  struct Sizes {
    int64_t big = 0, stage = 0;
  };
  Sizes sizes(int64_t h, int64_t w) const;
  int64_t workspace_floats(int64_t h, int64_t w) const;
  std::vector<float> run(Workspace::Lease& ws, const float* input, int height, int width) const;
  mutable Workspace work_;
  Kind kind_ = Kind::decoder;
  int latent_channels_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<Placement> placement_;  // the device copies of the layers' parameters
};

}  // namespace atelier::image
