// Devices by name (atelier/devices.h): the CPU, refusals that say what to do,
// registered devices, and a CUDA module that is missing or not ours.
#include <atelier/devices.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <filesystem>
#include <fstream>

namespace atelier::kernels {
namespace {

// Death tests below run in a re-executed child with ATELIER_CUDA_MODULE set.
class ChildWithModule {
 public:
  explicit ChildWithModule(const std::string& path) : style_(GTEST_FLAG_GET(death_test_style)) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    const char* old = std::getenv("ATELIER_CUDA_MODULE");
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv("ATELIER_CUDA_MODULE", path.c_str(), 1);
  }
  ~ChildWithModule() {
    GTEST_FLAG_SET(death_test_style, style_);
    if (had_) ::setenv("ATELIER_CUDA_MODULE", old_.c_str(), 1);
    else ::unsetenv("ATELIER_CUDA_MODULE");
  }

 private:
  std::string style_, old_;
  bool had_ = false;
};

TEST(Devices, CpuIsAlwaysThere) {
  const auto c = open_device("cpu");
  ASSERT_NE(c.device, nullptr);
  EXPECT_EQ(c.device, &cpu_device());
  EXPECT_EQ(c.name, "cpu");
}

TEST(Devices, UnknownNamesAreRefusedWithTheForms) {
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:0:1", "", "CPU"}) {
    const auto c = open_device(bad);
    EXPECT_EQ(c.device, nullptr) << bad;
    EXPECT_NE(c.why.find("use cpu, cuda or cuda:N"), std::string::npos) << bad << ": " << c.why;
  }
}

TEST(Devices, RegisteredDevicesAreFound) {
  register_device("fake:0", &cpu_device());
  EXPECT_EQ(open_device("fake:0").device, &cpu_device());
  register_device("fake:0", nullptr);
  EXPECT_EQ(open_device("fake:0").device, nullptr);
}

// Run in a child (the module is looked up once per process): a file that is
// not a CUDA module is named, with what to do, and cuda is refused, not fatal.
TEST(Devices, CudaWithoutAUsableModuleSaysWhatToInstall) {
  const auto dir = std::filesystem::temp_directory_path() / ("atelier-devices-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto fake = dir / "libatelier_cuda.so";
  std::ofstream(fake) << "not an ELF file";
  // Re-executed (threadsafe style), the environment set first: this binary
  // opens the CUDA module while it starts (the op suite's CUDA cases), so a
  // forked child would inherit the module already looked up.
  const ChildWithModule child(fake.string());
  EXPECT_EXIT(
      {
        const auto c = open_device("cuda:1");
        std::string why;
        const bool none = cuda_devices(&why).empty();
        const bool ok = c.device == nullptr && c.name == "cuda:1" && none &&
                        c.why.find("atelier-devices-") != std::string::npos &&  // the file is named (the child re-runs this body: its own pid)
                        c.why.find("atelier-cuda") != std::string::npos && why == c.why;
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atelier::kernels

#ifdef ATELIER_CUDA_MODULE_PATH
namespace atelier::kernels {
namespace {

// This build's CUDA module loads, and either finds this machine's GPUs or
// says why not in the runtime's words (here, without a GPU: the driver is
// missing), never crashing. In a child: the module is looked up once per process.
TEST(Devices, ThisBuildsCudaModuleLoadsAndCountsDevices) {
  const ChildWithModule child(ATELIER_CUDA_MODULE_PATH);
  EXPECT_EXIT(
      {
        std::string why;
        const auto names = cuda_devices(&why);
        const auto c = open_device("cuda");
        bool ok;
        if (names.empty()) {  // no GPU: the module's reason, not the loader's
          ok = c.device == nullptr && !why.empty() && why.find("could not be loaded") == std::string::npos &&
               c.why == why;
        } else {
          ok = c.device != nullptr && c.device->info().name == "cuda:0" && !c.device->info().host_memory &&
               c.device == open_device("cuda:0").device;
        }
        if (!ok) std::fprintf(stderr, "why: %s / %s\n", why.c_str(), c.why.c_str());
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace atelier::kernels
#endif
