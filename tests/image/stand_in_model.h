// A stand-in for a Stable Diffusion network whose evaluation is a simple
// row-wise formula: for testing what sits around the network (the pipeline,
// the scheduler's image lane) independently of any real checkpoint. Shared by
// tests/image and tests/serve.
#pragma once

#include <functional>
#include <vector>

#include "image/sd_pipeline.h"
#include "tokenizer/clip.h"

namespace atelier::image::test {

class StandInModel : public DiffusionModel {
 public:
  explicit StandInModel(Prediction p = Prediction::epsilon) : prediction_(p), schedule_(NoiseSchedule::scaled_linear()) {}
  int latent_channels() const override { return 4; }
  int context_dim() const override { return 8; }
  Prediction prediction() const override { return prediction_; }
  int32_t pad_id() const override { return 49407; }
  const NoiseSchedule& schedule() const override { return schedule_; }
  void encode_text(const tok::PromptChunk& chunk, float* out) override {
    for (int k = 0; k < tok::ClipTokenizer::kContext; ++k)
      for (int d = 0; d < 8; ++d) out[k * 8 + d] = static_cast<float>(chunk.ids[k] % 97) * 0.01f * chunk.weights[k] + d * 1e-3f;
  }
  // Row-wise: out = 0.1 x + 1e-4 t + mean(context row).
  void unet(int n, int h, int w, const float* x, const float* t, int ctx_tokens, const float* ctx, float* out) override {
    if (before_unet) before_unet();
    ++calls;
    rows.push_back(n);
    const size_t per = static_cast<size_t>(4) * h * w, pc = static_cast<size_t>(ctx_tokens) * 8;
    for (int r = 0; r < n; ++r) {
      double m = 0;
      for (size_t i = 0; i < pc; ++i) m += ctx[r * pc + i];
      m /= static_cast<double>(pc);
      for (size_t i = 0; i < per; ++i) out[r * per + i] = 0.1f * x[r * per + i] + 1e-4f * t[r] + static_cast<float>(m);
    }
  }
  std::vector<float> decode(const float* latent, int h, int w) override {
    std::vector<float> rgb(static_cast<size_t>(3) * 64 * h * w);
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 8 * h; ++y)
        for (int x = 0; x < 8 * w; ++x)
          rgb[(static_cast<size_t>(c) * 8 * h + y) * 8 * w + x] = 0.5f + 0.1f * latent[(c * h + y / 8) * w + x / 8];
    return rgb;
  }
  std::vector<float> encode(const float*, int height, int width) override {
    return std::vector<float>(static_cast<size_t>(4) * (height / 8) * (width / 8), 0.25f);
  }

  int calls = 0;
  std::vector<int> rows;
  std::function<void()> before_unet;  // e.g. a sleep, standing in for a slow network

 private:
  Prediction prediction_;
  NoiseSchedule schedule_;
};

}  // namespace atelier::image::test
