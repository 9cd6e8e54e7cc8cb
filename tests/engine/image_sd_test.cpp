// The Stable Diffusion pipeline through the engine API, on a narrow random
// SD 1.5-shaped checkpoint (written once per process): determinism, batch
// invariance, previews at every step, cancellation within one step, img2img,
// the A1111 infotext and clear errors.
#include <atelier/engine.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

using namespace atelier;
namespace fs = std::filesystem;

namespace {

const std::string kVocab = std::string(ATELIER_FIXTURES_DIR) + "/clip/bpe_simple_vocab_16e6.txt.gz";

// Written on first use, removed when the test process exits.
struct NarrowModel {
  std::string path;
  ~NarrowModel() {
    if (!path.empty()) fs::remove(path);
  }
} g_model;

const std::string& narrow_model() {
  if (g_model.path.empty()) {
    const std::string p = (fs::temp_directory_path() / ("atelier-sd-narrow-" + std::to_string(::getpid()) + ".safetensors")).string();
    SynthImageSpec spec;
    spec.width_mult = 0.1;
    spec.type = "f32";
    const Status st = synth_image_model(spec, p);
    EXPECT_TRUE(st.ok()) << st.message;
    g_model.path = p;
  }
  return g_model.path;
}

ImageRequest request(uint64_t seed) {
  ImageRequest r;
  r.model = narrow_model();
  r.prompt = "a (red:1.2) fox in the snow";
  r.negative_prompt = "blurry";
  r.width = r.height = 64;
  r.steps = 4;
  r.seed = seed;
  r.tokenizer = kVocab;
  r.threads = 2;
  return r;
}

std::vector<ImageResult> run(const ImageRequest& r, const ImageProgressFn& progress = {}) {
  auto out = generate_image(r, "", progress);
  EXPECT_TRUE(out.ok()) << out.status().message;
  return out.ok() ? out.value() : std::vector<ImageResult>{};
}

TEST(ImageSd, SameSeedSameImageOtherSeedOtherImage) {
  const auto a = run(request(7)), b = run(request(7)), c = run(request(8));
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(a[0].width, 64);
  EXPECT_EQ(a[0].channels, 3);
  EXPECT_EQ(a[0].pixels, b[0].pixels);
  EXPECT_NE(a[0].pixels, c[0].pixels);
}

TEST(ImageSd, AnImageIsTheSameAloneOrInABatch) {
  ImageRequest batch = request(20);
  batch.batch_size = 3;
  batch.sampler = "dpmpp_2m";
  batch.scheduler = "karras";
  const auto together = run(batch);
  ASSERT_EQ(together.size(), 3u);
  ImageRequest alone = batch;
  alone.batch_size = 1;
  alone.seed = 21;
  const auto single = run(alone);
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(together[1].seed, 21u);
  EXPECT_EQ(together[1].pixels, single[0].pixels);
  EXPECT_NE(together[0].pixels, together[1].pixels);
}

TEST(ImageSd, EveryStepReportsAPreview) {
  ImageRequest r = request(3);
  r.batch_count = 2;
  std::vector<std::pair<int, int>> seen;
  run(r, [&](const ImageProgress& p) {
    EXPECT_EQ(p.steps, 4);
    EXPECT_EQ(p.images, 2);
    EXPECT_EQ(p.preview_width, 8);  // the linear projection: latent size
    EXPECT_EQ(p.preview_rgb.size(), 8u * 8 * 3);
    seen.emplace_back(p.image, p.step);
    return true;
  });
  const std::vector<std::pair<int, int>> expect = {{0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 1}, {1, 2}, {1, 3}, {1, 4}};
  EXPECT_EQ(seen, expect);
}

TEST(ImageSd, CancellingStopsWithinOneStep) {
  int calls = 0;
  auto out = generate_image(request(3), "", [&](const ImageProgress& p) {
    ++calls;
    return p.step < 2;
  });
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code, StatusCode::Cancelled);
  EXPECT_EQ(calls, 2);
}

TEST(ImageSd, Img2ImgRunsItsShareOfTheStepsAndRecordsIt) {
  const auto first = run(request(5));
  ASSERT_EQ(first.size(), 1u);
  const std::string init = (fs::temp_directory_path() / ("atelier-sd-init-" + std::to_string(::getpid()) + ".png")).string();
  ASSERT_TRUE(write_png(first[0], request(5), init).ok());
  ImageRequest r = request(6);
  r.steps = 10;
  r.init_image = init;
  r.strength = 0.5f;
  int steps = 0;
  const auto out = run(r, [&](const ImageProgress& p) {
    steps = p.steps;
    return true;
  });
  fs::remove(init);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(steps, 6);  // A1111: int(0.5 * 10) + 1
  EXPECT_NE(out[0].parameters.find("Denoising strength: 0.5"), std::string::npos) << out[0].parameters;
}

TEST(ImageSd, ParametersAreA1111Infotext) {
  ImageRequest r = request(9);
  r.sampler = "euler_a";
  r.scheduler = "karras";
  const auto out = run(r);
  ASSERT_EQ(out.size(), 1u);
  const std::string& p = out[0].parameters;
  EXPECT_EQ(p.rfind("a (red:1.2) fox in the snow\nNegative prompt: blurry\nSteps: 4, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 9, Size: 64x64, Model hash: ", 0), 0u) << p;
}

TEST(ImageSd, BadRequestsAreRefusedClearly) {
  ImageRequest r = request(1);
  r.width = 60;
  EXPECT_EQ(generate_image(r).status().code, StatusCode::InvalidArgument);
  r = request(1);
  r.mask = kVocab;
  EXPECT_EQ(generate_image(r).status().code, StatusCode::InvalidArgument);  // a mask without an init image
  r = request(1);
  r.sampler = "plms";
  EXPECT_EQ(generate_image(r).status().code, StatusCode::InvalidArgument);
  r = request(1);
  r.tokenizer.clear();  // nothing beside a model in the temp folder
  const auto out = generate_image(r);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message.find("--tokenizer"), std::string::npos) << out.status().message;
}

}  // namespace
