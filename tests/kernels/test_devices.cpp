// Devices by name (atelier/devices.h): the CPU, refusals that say what to do,
// registered devices, and a CUDA module that is missing or not ours.
#include <atelier/devices.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace atelier::kernels {
namespace {

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
  EXPECT_EXIT(
      {
        ::setenv("ATELIER_CUDA_MODULE", fake.c_str(), 1);
        const auto c = open_device("cuda:1");
        std::string why;
        const bool none = cuda_devices(&why).empty();
        const bool ok = c.device == nullptr && c.name == "cuda:1" && none &&
                        c.why.find(fake.string()) != std::string::npos &&
                        c.why.find("atelier-cuda") != std::string::npos && why == c.why;
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atelier::kernels
