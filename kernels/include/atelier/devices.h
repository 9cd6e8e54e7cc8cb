// atelier/devices.h — finding a device by name ("cpu", "cuda", "cuda:N"),
// and the CUDA module's entry points.
//
// One build runs everywhere (issue 33): the CUDA backend is a module,
// libatelier_cuda.so, that this process loads with dlopen the first time a
// CUDA device is asked for (as ggml's dynamically loaded backends do), so a
// binary starts on a machine without any CUDA library and says what is
// missing only when a GPU is asked for. The module is looked for in
// $ATELIER_CUDA_MODULE (a file), then beside the executable, then in
// ../lib/atelier beside it (the package's place).
#pragma once

#include <atelier/backend.h>

#include <string>
#include <vector>

namespace atelier::kernels {

// What open_device found: the device, or nullptr and why (what is missing
// and how to get it: "no CUDA module ...: install atelier-cuda", "the CUDA
// driver is missing ...", "cuda:3: this machine has 1 CUDA device").
struct DeviceChoice {
  Device* device = nullptr;  // lives for the process
  std::string name;          // "cpu", "cuda:0"
  std::string why;           // the refusal's reason when device is nullptr
};

// "cpu", "cuda" (= "cuda:0"), "cuda:N", or a name register_device gave.
// Anything else is refused with the accepted forms.
DeviceChoice open_device(const std::string& spec);

// The CUDA devices this machine has ("cuda:0", ...; empty when the module,
// the driver or a device is missing, with why saying which).
std::vector<std::string> cuda_devices(std::string* why = nullptr);

// A device found by open_device under `name` (tests: a fake device as
// "fake:0"); nullptr removes it. The caller keeps it alive while registered.
void register_device(const std::string& name, Device* device);

}  // namespace atelier::kernels

// The CUDA module's C entry points (kernels/cuda), resolved with dlsym. The
// Device it returns is a C++ object built by the same compiler against the
// same headers: the module is refused unless its ABI version matches.
#define ATELIER_CUDA_ABI_VERSION 1
extern "C" {
typedef int (*atelier_cuda_abi_version_fn)();
// Number of CUDA devices (>= 0), or -1 with why (at most why_len bytes,
// NUL-terminated) when the driver or runtime cannot be used.
typedef int (*atelier_cuda_device_count_fn)(char* why, int why_len);
// Device `index`, created once and kept for the process; nullptr with why.
typedef atelier::kernels::Device* (*atelier_cuda_open_device_fn)(int index, char* why, int why_len);
}
