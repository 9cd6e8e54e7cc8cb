// Shared by the engine and serving suites: a narrow synthetic SD checkpoint,
// a thread-safe event recorder, and per-process scratch folders.
#pragma once

#include <atelier/engine.h>
#include <atelier/tools.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
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

// The fixture stories260K.gguf with llama.context_length set to CTX (the
// UINT32 after the key, as GGUF lays it out), written to a temporary file.
inline std::string stories_with_context(uint32_t ctx) {
  std::ifstream in(std::string(ATELIER_FIXTURES_DIR) + "/text/stories260K.gguf", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string key = "llama.context_length";
  const size_t at = bytes.find(key);
  uint32_t type = 0;
  if (at != std::string::npos) std::memcpy(&type, bytes.data() + at + key.size(), 4);
  EXPECT_EQ(type, 4u) << "llama.context_length should be a GGUF UINT32";
  if (type != 4u) return "";
  std::memcpy(bytes.data() + at + key.size() + 4, &ctx, 4);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("atelier-ctx" + std::to_string(ctx) + "-" + std::to_string(::getpid()) + ".gguf")).string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
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
