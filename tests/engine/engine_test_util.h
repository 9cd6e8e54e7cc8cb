// Shared by the engine and serving suites: a narrow synthetic SD checkpoint,
// a thread-safe event recorder, and per-process scratch folders.
#pragma once

#include <atelier/engine.h>
#include <atelier/tools.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace atelier::test {

// A narrow random SD 1.5-shaped checkpoint (32-channel UNet, f32): written
// on first use, removed when the test process exits.
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

// Every event a subscription delivered, in order (the sink runs on an engine thread).
struct EventLog {
  std::mutex mu;
  std::vector<Event> events;
  void operator()(const Event& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  }
  std::vector<Event> snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return events;
  }
};

// An empty scratch folder named by TAG and this process (ctest runs each case in its own).
inline std::filesystem::path fresh_dir(const std::string& tag) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / ("atelier-test-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d;
}

}  // namespace atelier::test
