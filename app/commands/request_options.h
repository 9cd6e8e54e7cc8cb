// Flag sets shared by several commands.
#pragma once

#include <atelier/engine.h>
#include <atelier/requests.h>

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace atelier::app {

// -p, -n, --temp, --top-k, --top-p, --min-p, the penalties, --seed, --stop.
// (-m is registered by each command: its meaning differs.)
void add_request_options(CLI::App& cmd, TextRequest& req);

// --seed: a whole number from 0 to 2^64 - 2. Anything else (-5, 2^64, 1.5) is
// refused (exit 2) instead of wrapping around or silently becoming random.
void add_seed_option(CLI::App& cmd, uint64_t& seed, const char* help);

// --kv-type f16|f32|q8_0|bf16|fp8: the KV cache precision (default: what `type` holds).
void add_kv_type_option(CLI::App& cmd, KvType& type);

// --device, --precision, --gpu-memory-fraction (issue 33), on every command that runs models.
struct DeviceOptions {
  std::string device = "auto";
  std::string precision = "auto";
  double gpu_memory_fraction = 0.9;
  // --deterministic: a GPU's batch-invariant kernels (ATELIER_CUDA_DETERMINISTIC=1,
  // set when the flag is parsed, before any device opens). The CPU always is.
  bool deterministic = false;
};
void add_device_options(CLI::App& cmd, DeviceOptions& o);
// The one line commands print on stderr: "device: cpu (auto: no usable GPU (...); running on the CPU)".
std::string device_line(const DeviceSelection& d);

}  // namespace atelier::app
