// The SD model's memory mechanism: matrices are read in place from the
// mapped file (the UNet's in-place bytes are exactly its matrices' bytes in
// the file's header), each network's pages leave the process while another
// runs (VmRSS rises by about the UNet's bytes in a step and falls by as much
// when the VAE runs), and none of it changes a bit of any output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/process_memory.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "image/sd_model.h"

namespace atelier::image {
namespace {

namespace fs = std::filesystem;

// A quarter-width SD 1.5 (tens of MB of F16 weights: big enough to see in
// VmRSS, small enough to write in seconds), written once per process.
const std::string& model_path() {
  struct File {
    std::string p = (fs::temp_directory_path() / ("atelier_sd_mem_" + std::to_string(::getpid()) + ".safetensors")).string();
    File() {
      SdSynthSpec s;
      s.width_mult = 0.25;
      s.clip_layers = 2;
      s.type = "f16";
      s.seed = 3;
      write_synthetic_sd(s, p);
    }
    ~File() {
      std::error_code ec;
      fs::remove(p, ec);
    }
  };
  static const File f;
  return f.p;
}

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

// Bytes of the file's matrices (2-D and 4-D tensors) under a prefix, from the header alone.
uint64_t matrix_bytes_in_file(const std::string& prefix) {
  const auto st = formats::SafetensorsFile::open(model_path());
  uint64_t n = 0;
  for (const auto& t : st->tensors())
    if (t.name.rfind(prefix, 0) == 0 && t.shape.size() >= 2) n += t.bytes;
  return n;
}

struct Outputs {
  std::vector<float> ctx, eps, rgb;
};

Outputs run(const SdModel& m) {
  Outputs o;
  std::vector<int32_t> ids(77, m.pad_token());
  ids[0] = 49406;
  ids[1] = 320;
  ids[2] = 2368;
  o.ctx = m.encode_prompt(ids.data(), nullptr, 77, &pool());
  std::vector<float> x(4 * 8 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) / 6.5f - 1.0f;
  const float t = 500.0f;
  UnetBatch b;
  b.batch = 1, b.height = 8, b.width = 8, b.x = x.data(), b.timesteps = &t;
  b.context = {o.ctx};
  o.eps.resize(x.size());
  m.unet(b, o.eps.data(), &pool());
  o.rgb = m.vae_decode(o.eps.data(), 8, 8, &pool());
  return o;
}

TEST(SdMemory, UnetMatricesAreReadInPlace) {
  const auto m = SdModel::open(model_path());
  const uint64_t unet = matrix_bytes_in_file("model.diffusion_model.");
  ASSERT_GT(unet, uint64_t{32} << 20);
  EXPECT_EQ(m->in_place_bytes(SdModel::Part::unet), unet);
  EXPECT_EQ(m->in_place_bytes(SdModel::Part::vae), matrix_bytes_in_file("first_stage_model."));
  // CLIP's separate q/k/v are stacked into one copy; the rest is in place.
  EXPECT_GT(m->in_place_bytes(SdModel::Part::text_encoder), 0u);
  EXPECT_LT(m->in_place_bytes(SdModel::Part::text_encoder), matrix_bytes_in_file("cond_stage_model."));
}

TEST(SdMemory, IdleNetworksLeaveTheProcess) {
  if (process_rss_bytes() == 0) GTEST_SKIP() << "no /proc/self/status here";
  const auto m = SdModel::open(model_path());
  const int64_t unet = static_cast<int64_t>(matrix_bytes_in_file("model.diffusion_model."));
  // (The text encoder's pages go the same way after encode_prompt, but here
  // they are too few to see: most of its bytes are the token table, of which
  // a prompt reads a few rows.)
  std::vector<int32_t> ids(77, m->pad_token());
  ids[0] = 49406;
  const auto ctx = m->encode_prompt(ids.data(), nullptr, 77, &pool());
  const int64_t encoded = process_rss_bytes();
  std::vector<float> x(4 * 8 * 8, 0.5f), eps(x.size());
  const float t = 999.0f;
  UnetBatch b;
  b.batch = 1, b.height = 8, b.width = 8, b.x = x.data(), b.timesteps = &t;
  b.context = {ctx};
  m->unet(b, eps.data(), &pool());
  const int64_t stepped = process_rss_bytes();
  // The UNet keeps its pages between steps...
  EXPECT_GT(stepped - encoded, unet * 8 / 10) << "RSS " << encoded << " -> " << stepped << ", UNet " << unet;
  // ...drops them when another prompt is encoded (another job joining)...
  m->encode_prompt(ids.data(), nullptr, 77, &pool());
  const int64_t joined = process_rss_bytes();
  EXPECT_GT(stepped - joined, unet * 7 / 10) << "RSS " << stepped << " -> " << joined << ", UNet " << unet;
  m->unet(b, eps.data(), &pool());
  const int64_t stepped2 = process_rss_bytes();
  EXPECT_GT(stepped2 - joined, unet * 8 / 10) << "RSS " << joined << " -> " << stepped2 << ", UNet " << unet;
  // ...and when the VAE runs.
  m->vae_decode(eps.data(), 8, 8, &pool());
  const int64_t decoded = process_rss_bytes();
  EXPECT_GT(stepped2 - decoded, unet * 7 / 10) << "RSS " << stepped2 << " -> " << decoded << ", UNet " << unet;
}

TEST(SdMemory, ReleasingChangesNoBits) {
  SdOptions keep;
  keep.release_idle_weights = false;
  const auto a = SdModel::open(model_path(), keep);
  const auto b = SdModel::open(model_path());
  const Outputs ra = run(*a);
  const Outputs rb1 = run(*b);
  const Outputs rb2 = run(*b);  // every page faulted back in after the first run's releases
  EXPECT_EQ(ra.ctx, rb1.ctx);
  EXPECT_EQ(ra.eps, rb1.eps);
  EXPECT_EQ(ra.rgb, rb1.rgb);
  EXPECT_EQ(rb1.ctx, rb2.ctx);
  EXPECT_EQ(rb1.eps, rb2.eps);
  EXPECT_EQ(rb1.rgb, rb2.rgb);
  // Released by hand in the middle of the keep model's life: the same too.
  for (auto p : {SdModel::Part::text_encoder, SdModel::Part::unet, SdModel::Part::vae}) a->release_weights(p);
  const Outputs ra2 = run(*a);
  EXPECT_EQ(ra.rgb, ra2.rgb);
  EXPECT_EQ(ra.eps, ra2.eps);
}

}  // namespace
}  // namespace atelier::image
