// The QuickDraw CVAE against the independent airplane golden, label matching,
// seeds, and PNG parameter chunks written then read back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "image/png.h"
#include "image/quickdraw.h"

using atelier::image::QuickDrawModel;

namespace {

const std::string kFix = ATELIER_FIXTURES_DIR;
const std::string kModel = kFix + "/image/quickdraw-cvae.safetensors";

const QuickDrawModel& model() {
  static const std::unique_ptr<QuickDrawModel> m = QuickDrawModel::open(kModel);
  return *m;
}

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

}  // namespace

TEST(QuickDraw, AirplaneGoldenWithHalfLatent) {
  const std::vector<float> golden = read_f32(kFix + "/image/quickdraw-cvae.golden-airplane-zhalf.f32");
  ASSERT_EQ(golden.size(), 28u * 28u);
  std::array<float, QuickDrawModel::kLatent> z;
  z.fill(0.5f);
  const std::vector<float> out = model().decode(model().match_label("airplane"), z);
  ASSERT_EQ(out.size(), golden.size());
  double max_err = 0;
  for (size_t i = 0; i < out.size(); ++i) max_err = std::max(max_err, double(std::fabs(out[i] - golden[i])));
  EXPECT_LE(max_err, 1e-5);
}

TEST(QuickDraw, LabelsFromPromptWords) {
  const auto& m = model();
  ASSERT_EQ(m.labels().size(), 50u);
  auto idx = [&](const std::string& label) {
    for (size_t i = 0; i < m.labels().size(); ++i)
      if (m.labels()[i] == label) return static_cast<int>(i);
    return -1;
  };
  EXPECT_EQ(m.match_label("an octopus"), idx("octopus"));
  EXPECT_EQ(m.match_label("A cute OCTOPUS, doodle"), idx("octopus"));
  EXPECT_EQ(m.match_label("an alarm clock"), idx("alarm_clock"));
  EXPECT_EQ(m.match_label("alarm_clock"), idx("alarm_clock"));
  EXPECT_EQ(m.match_label("two apples"), idx("apple"));
  EXPECT_EQ(m.match_label("Ice Cream cones"), idx("ice_cream"));
  EXPECT_EQ(m.match_label("a pickup truck"), idx("pickup_truck"));
  EXPECT_EQ(m.match_label("pants"), idx("pants"));
  EXPECT_EQ(m.match_label("mushrooms in the forest"), idx("mushroom"));
}

TEST(QuickDraw, NoMatchingClassListsThemAll) {
  try {
    model().match_label("a giraffe");
    FAIL() << "expected a LabelError";
  } catch (const atelier::image::LabelError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("giraffe"), std::string::npos) << msg;
    for (const char* l : {"airplane", "alarm clock", "octopus", "knife", "paper clip"})
      EXPECT_NE(msg.find(l), std::string::npos) << l << " missing from: " << msg;
  }
}

TEST(QuickDraw, LatentFromSeedIsTorchCpuRand) {
  // torch.manual_seed(0); torch.rand(2) -> tensor([0.4963, 0.7682])
  const auto z = QuickDrawModel::latent_from_seed(0);
  EXPECT_NEAR(z[0], 0.4962566f, 1e-6);
  EXPECT_NEAR(z[1], 0.7682218f, 1e-6);
  for (float v : z) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LT(v, 1.0f);
  }
}

TEST(QuickDraw, SameSeedSamePixelsDifferentSeedDifferent) {
  const int label = model().match_label("octopus");
  auto gen = [&](uint64_t seed) {
    return atelier::image::resize_grey_to_u8(model().decode(label, QuickDrawModel::latent_from_seed(seed)), 28, 28, 64, 64);
  };
  EXPECT_EQ(gen(3), gen(3));
  EXPECT_NE(gen(3), gen(4));
}

TEST(QuickDraw, UpscaleStaysInRangeAndKeepsSize) {
  std::vector<float> img(28 * 28, 0.0f);
  img[14 * 28 + 14] = 1.0f;  // a lone bright pixel: bicubic rings around it
  const auto up = atelier::image::resize_grey_to_u8(img, 28, 28, 256, 128);
  EXPECT_EQ(up.size(), 256u * 128u);
  EXPECT_GT(*std::max_element(up.begin(), up.end()), 200);
  EXPECT_EQ(*std::min_element(up.begin(), up.end()), 0);
}

TEST(Png, ParametersRoundTrip) {
  const std::string path = (std::filesystem::temp_directory_path() / ("atelier_png_" + std::to_string(::getpid()) + ".png")).string();
  std::vector<uint8_t> px(16 * 8 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 7);
  const std::string params =
      "an octopus\nNegative prompt: blurry\nSteps: 1, Sampler: CVAE decoder, CFG scale: 1, Seed: 3, Size: 16x8, "
      "Model hash: 0123456789, Model: quickdraw-cvae";
  const std::string json = "{\"prompt\":\"une pieuvre \xc3\xa0 Paris\"}";  // UTF-8: goes as iTXt
  atelier::image::write_png_file(path, {16, 8, 3, px.data()}, {{"parameters", params}, {"atelier", json}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const auto info = atelier::image::read_png_info_file(path);
  EXPECT_EQ(info.width, 16);
  EXPECT_EQ(info.height, 8);
  EXPECT_EQ(info.bit_depth, 8);
  EXPECT_EQ(info.color_type, 2);  // RGB
  EXPECT_EQ(info.text.at("parameters"), params);
  EXPECT_EQ(info.text.at("atelier"), json);
  std::filesystem::remove(path);
}

TEST(Png, MissingFolderIsAClearError) {
  std::vector<uint8_t> px(8 * 8, 128);
  try {
    atelier::image::write_png_file("/nonexistent-atelier-dir/x.png", {8, 8, 1, px.data()}, {});
    FAIL() << "expected an error";
  } catch (const atelier::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-atelier-dir/x.png"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
}

