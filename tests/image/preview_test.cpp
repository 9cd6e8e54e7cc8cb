// The linear latent-to-RGB preview by hand, and the TAESD preview's size.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "image/preview.h"
#include "image/taesd.h"

using namespace atelier::image;

TEST(Preview, Sd15LinearProjectionByHand) {
  // 2x1 latent: pixel 0 has channel 0 = 1, pixel 1 has channel 3 = 1.
  std::vector<float> lat(4 * 2, 0.0f);
  lat[0 * 2 + 0] = 1.0f;
  lat[3 * 2 + 1] = 1.0f;
  const Preview p = latent_preview(lat.data(), 4, 1, 2, LatentRgbProjection::sd15());
  ASSERT_EQ(p.width, 2);
  ASSERT_EQ(p.height, 1);
  // (0.3512 + 1) / 2 * 255 = 172.28, (0.2297 + 1) / 2 * 255 = 156.79, (0.3227 + 1) / 2 * 255 = 168.64
  EXPECT_EQ(std::vector<int>(p.rgb.begin(), p.rgb.begin() + 3), (std::vector<int>{172, 157, 169}));
  // (-0.2120 + 1) / 2 * 255 = 100.47, (-0.2616 + 1) / 2 * 255 = 94.15, (-0.7177 + 1) / 2 * 255 = 35.99
  EXPECT_EQ(std::vector<int>(p.rgb.begin() + 3, p.rgb.end()), (std::vector<int>{100, 94, 36}));
  // A zero latent is mid grey; large values clamp.
  std::vector<float> zero(4, 0.0f);
  EXPECT_EQ(latent_preview(zero.data(), 4, 1, 1, LatentRgbProjection::sd15()).rgb, (std::vector<uint8_t>{128, 128, 128}));
  std::vector<float> big{10, 10, 10, 0};
  EXPECT_EQ(latent_preview(big.data(), 4, 1, 1, LatentRgbProjection::sd15()).rgb, (std::vector<uint8_t>{255, 255, 255}));
  EXPECT_THROW(latent_preview(lat.data(), 3, 1, 2, LatentRgbProjection::sd15()), atelier::Error);
}

TEST(Preview, TaesdPreviewSize) {
  const auto dec = TaesdNet::open(std::string(ATELIER_FIXTURES_DIR) + "/image/taef2_decoder.pth", TaesdNet::Kind::decoder);
  std::vector<float> lat(32 * 2 * 3, 0.1f);
  const Preview p = taesd_preview(*dec, lat.data(), 2, 3);
  EXPECT_EQ(p.width, 24);
  EXPECT_EQ(p.height, 16);
  EXPECT_EQ(p.rgb.size(), 24u * 16u * 3u);
}
