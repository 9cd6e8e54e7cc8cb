// Devices by name, and the CUDA module loaded on first use (atelier/devices.h).
#include <atelier/devices.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

namespace atelier::kernels {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, Device*>& registry() {
  static std::map<std::string, Device*> r;
  return r;
}

std::filesystem::path executable_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

// The module, once: its entry points, or why it could not be used.
struct CudaModule {
  void* handle = nullptr;
  atelier_cuda_device_count_fn device_count = nullptr;
  atelier_cuda_open_device_fn open = nullptr;
  std::string why;
};

const CudaModule& cuda_module() {
  static const CudaModule m = [] {
    CudaModule mod;
    std::vector<std::string> tried;
    if (const char* env = std::getenv("ATELIER_CUDA_MODULE"); env && *env) {
      tried.push_back(env);
    } else {
      const auto dir = executable_dir();
      tried.push_back((dir / "libatelier_cuda.so").string());
      tried.push_back((dir / ".." / "lib" / "atelier" / "libatelier_cuda.so").string());
    }
    std::string errors;
    for (const auto& path : tried) {
      if (!std::filesystem::exists(path)) {
        errors += "\n  " + path + ": not there";
        continue;
      }
      // RTLD_LOCAL: the CUDA libraries it pulls in stay its own.
      void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        // Most often a CUDA library (libcudart, libcublasLt) the loader cannot find.
        const char* e = ::dlerror();
        errors += "\n  " + path + ": " + (e ? e : "dlopen failed");
        continue;
      }
      auto abi = reinterpret_cast<atelier_cuda_abi_version_fn>(::dlsym(h, "atelier_cuda_abi_version"));
      mod.device_count = reinterpret_cast<atelier_cuda_device_count_fn>(::dlsym(h, "atelier_cuda_device_count"));
      mod.open = reinterpret_cast<atelier_cuda_open_device_fn>(::dlsym(h, "atelier_cuda_open_device"));
      if (!abi || !mod.device_count || !mod.open || abi() != ATELIER_CUDA_ABI_VERSION) {
        errors += "\n  " + path + ": not a CUDA module of this build of Atelier (reinstall atelier-cuda of the same version)";
        mod.device_count = nullptr;
        mod.open = nullptr;
        ::dlclose(h);
        continue;
      }
      mod.handle = h;
      return mod;
    }
    mod.why =
        "this build's CUDA module (libatelier_cuda.so) could not be loaded:" + errors +
        "\nInstall the atelier-cuda package (or build with -DATELIER_CUDA=ON), and the CUDA runtime libraries "
        "(libcudart, libcublasLt), or set ATELIER_CUDA_MODULE to the module's path; --device cpu runs without it.";
    return mod;
  }();
  return m;
}

}  // namespace

void register_device(const std::string& name, Device* device) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (device) registry()[name] = device;
  else registry().erase(name);
}

std::vector<std::string> cuda_devices(std::string* why) {
  const CudaModule& m = cuda_module();
  std::vector<std::string> names;
  if (!m.device_count) {
    if (why) *why = m.why;
    return names;
  }
  char buf[512] = {0};
  const int n = m.device_count(buf, sizeof buf);
  if (n < 0) {
    if (why) *why = buf;
    return names;
  }
  if (n == 0 && why) *why = "the CUDA driver found no CUDA device on this machine";
  for (int i = 0; i < n; ++i) names.push_back("cuda:" + std::to_string(i));
  return names;
}

DeviceChoice open_device(const std::string& spec) {
  DeviceChoice c;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (auto it = registry().find(spec); it != registry().end()) {
      c.device = it->second;
      c.name = spec;
      return c;
    }
  }
  if (spec == "cpu") {
    c.device = &cpu_device();
    c.name = "cpu";
    return c;
  }
  int index = -1;
  if (spec == "cuda") index = 0;
  else if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && spec.size() < 9 &&
           spec.find_first_not_of("0123456789", 5) == std::string::npos)
    index = std::stoi(spec.substr(5));
  if (index < 0) {
    c.why = "unknown device '" + spec + "': use cpu, cuda or cuda:N (N counts from 0)";
    return c;
  }
  c.name = "cuda:" + std::to_string(index);
  const CudaModule& m = cuda_module();
  if (!m.open) {
    c.why = m.why;
    return c;
  }
  char buf[512] = {0};
  const int n = m.device_count(buf, sizeof buf);
  if (n < 0) {
    c.why = buf;
    return c;
  }
  if (index >= n) {
    c.why = c.name + ": this machine has " + std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") +
            (n > 0 ? " (cuda:0 to cuda:" + std::to_string(n - 1) + ")" : "");
    return c;
  }
  std::fill(buf, buf + sizeof buf, 0);
  c.device = m.open(index, buf, sizeof buf);
  if (!c.device) c.why = buf[0] ? buf : "the CUDA device could not be opened";
  return c;
}

}  // namespace atelier::kernels
