// A narrow random SD 1.5-shaped checkpoint (32-channel UNet, f32) for the
// engine and serving tests: written on first use, removed when the test
// process exits.
#pragma once

#include <atelier/tools.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace atelier::test {

inline const std::string& narrow_sd_model() {
  struct File {
    std::string path;
    ~File() {
      if (!path.empty()) std::filesystem::remove(path);
    }
  };
  static File file;
  if (file.path.empty()) {
    const std::string p =
        (std::filesystem::temp_directory_path() / ("atelier-sd-narrow-" + std::to_string(::getpid()) + ".safetensors")).string();
    SynthImageSpec spec;
    spec.width_mult = 0.1;
    spec.type = "f32";
    const Status st = synth_image_model(spec, p);
    EXPECT_TRUE(st.ok()) << st.message;
    file.path = p;
  }
  return file.path;
}

}  // namespace atelier::test
