// The image networks on a device that is not the host (tests/fake_device.h):
// CLIP, the UNet, the VAE (decoder and encoder) and TAESD loaded onto it are
// handed only device memory by their ops (no mapped file page, no host
// vector of weights), and give the CPU's bits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "fake_device.h"
#include "image/clip_text.h"
#include "image/sd_model.h"
#include "image/taesd.h"
#include "image/unet.h"
#include "image/vae.h"

namespace atelier::image {
namespace {

namespace fs = std::filesystem;

std::string synth_sd15() {
  static const std::string path = [] {
    const fs::path p = fs::temp_directory_path() / ("atelier_fake_sd_" + std::to_string(::getpid()) + ".safetensors");
    SdSynthSpec s;
    s.arch = "sd15";
    s.width_mult = 0.1;
    s.clip_layers = 2;
    s.type = "f16";
    s.seed = 11;
    write_synthetic_sd(s, p.string());
    return p.string();
  }();
  return path;
}

std::vector<float> randoms(size_t n, uint32_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = scale * (static_cast<float>(x >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

class FakeDeviceImage : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove(synth_sd15(), ec);
  }
};

TEST_F(FakeDeviceImage, SdNetworksRunOnDeviceMemoryOnlyWithTheCpuBits) {
  const auto cpu = SdModel::open(synth_sd15());
  test::FakeDevice fake;
  const auto dev = SdModel::open(synth_sd15(), {}, fake);
  kernels::Backend& host = kernels::default_cpu_backend();

  std::array<int32_t, 77> ids;
  ids.fill(49407);
  ids[0] = 49406;
  for (int i = 1; i < 9; ++i) ids[i] = (i * 7919) % 49406;
  const int64_t width = cpu->context_dim();
  std::vector<float> ctx_cpu(static_cast<size_t>(77 * width)), ctx_dev(ctx_cpu.size());
  cpu->text_encoder().encode(ids.data(), ctx_cpu.data(), host);
  dev->text_encoder().encode(ids.data(), ctx_dev.data(), fake);
  EXPECT_EQ(ctx_cpu, ctx_dev) << "CLIP";

  // Two samples with their own timesteps and contexts.
  const auto x = randoms(2 * 4 * 8 * 8, 5);
  const float t[2] = {613.0f, 21.0f};
  const auto ctx2 = randoms(ctx_cpu.size(), 9, 0.5f);
  UnetBatch b;
  b.batch = 2, b.height = 8, b.width = 8, b.x = x.data(), b.timesteps = t;
  b.context = {std::span<const float>(ctx_cpu), std::span<const float>(ctx2)};
  std::vector<float> eps_cpu(x.size()), eps_dev(x.size());
  cpu->unet_net().forward(b, eps_cpu.data(), host);
  dev->unet_net().forward(b, eps_dev.data(), fake);
  EXPECT_EQ(eps_cpu, eps_dev) << "UNet";

  const auto z = randoms(4 * 4 * 4, 23, 0.5f);
  EXPECT_EQ(cpu->vae_net().decode(z.data(), 4, 4, host), dev->vae_net().decode(z.data(), 4, 4, fake)) << "VAE decoder";
  const auto rgb = randoms(3 * 32 * 32, 29, 0.5f);
  EXPECT_EQ(cpu->vae_net().encode(rgb.data(), 32, 32, host), dev->vae_net().encode(rgb.data(), 32, 32, fake))
      << "VAE encoder";

  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
  EXPECT_GT(fake.live_bytes(), 0);
}

TEST_F(FakeDeviceImage, TaesdRunsOnDeviceMemoryOnlyWithTheCpuBits) {
  const std::string dir = std::string(ATELIER_FIXTURES_DIR) + "/image/";
  test::FakeDevice fake;
  kernels::Backend& host = kernels::default_cpu_backend();
  for (const auto kind : {TaesdNet::Kind::decoder, TaesdNet::Kind::encoder}) {
    const std::string file = dir + (kind == TaesdNet::Kind::decoder ? "taef2_decoder.pth" : "taef2_encoder.pth");
    const auto cpu = TaesdNet::open(file, kind);
    const auto dev = TaesdNet::open(file, kind, fake);
    const int c = kind == TaesdNet::Kind::decoder ? cpu->latent_channels() : 3, h = kind == TaesdNet::Kind::decoder ? 4 : 32;
    const auto in = randoms(static_cast<size_t>(c * h * h), 31, 0.5f);
    EXPECT_EQ(cpu->run(in.data(), h, h, host), dev->run(in.data(), h, h, fake));
  }
  EXPECT_EQ(fake.violations(), std::vector<std::string>{});
}

}  // namespace
}  // namespace atelier::image
