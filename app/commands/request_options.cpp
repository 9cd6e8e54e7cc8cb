// The flags that fill a TextRequest, shared by `text` and `queue add` so a
// job queued for later reads exactly like one run now.
#include "commands/request_options.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace atelier::app {

void add_request_options(CLI::App& cmd, TextRequest& req) {
  SamplingParams& sp = req.sampling;
  cmd.add_option("-p,--prompt", req.prompt, "Prompt text")->required();
  cmd.add_option("-n,--n-predict", req.max_new_tokens, "Maximum new tokens")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd.add_option("--temp", sp.temperature, "Temperature; 0 is greedy")->check(CLI::Range(0.0f, 100.0f))->capture_default_str();
  cmd.add_option("--top-k", sp.top_k, "Keep the K most likely tokens; 0 turns it off")->check(CLI::Range(0, 1 << 24))->capture_default_str();
  cmd.add_option("--top-p", sp.top_p, "Nucleus sampling mass; 1 turns it off")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  cmd.add_option("--min-p", sp.min_p, "Drop tokens below P times the top probability; 0 turns it off")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  cmd.add_option("--repeat-penalty", sp.repeat_penalty, "Penalty for repeated tokens; 1 turns it off")->check(CLI::Range(0.0f, 100.0f))->capture_default_str();
  cmd.add_option("--repeat-last-n", sp.repeat_last_n, "Window of recent tokens the penalties look at")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd.add_option("--frequency-penalty", sp.frequency_penalty, "Subtract F times a token's count")->check(CLI::Range(-100.0f, 100.0f))->capture_default_str();
  cmd.add_option("--presence-penalty", sp.presence_penalty, "Subtract P from tokens already present")->check(CLI::Range(-100.0f, 100.0f))->capture_default_str();
  add_seed_option(cmd, sp.seed, "Random seed, 0..18446744073709551614 (default: random; printed in the summary)");
  cmd.add_option("--stop", req.stop, "Stop before this string (repeatable)")->allow_extra_args(false);
}

void add_seed_option(CLI::App& cmd, uint64_t& seed, const char* help) {
  cmd.add_option_function<std::string>(
         "--seed",
         [&seed](const std::string& v) {
           const auto bad = [&v] {
             return CLI::ValidationError("--seed", "a seed is a whole number from 0 to 18446744073709551614, got '" + v + "'");
           };
           if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos) throw bad();
           errno = 0;
           const unsigned long long x = std::strtoull(v.c_str(), nullptr, 10);
           if (errno == ERANGE || x >= SamplingParams::kRandomSeed) throw bad();
           seed = x;
         },
         help)
      ->type_name("UINT");
}

void add_kv_type_option(CLI::App& cmd, KvType& type) {
  cmd.add_option_function<std::string>(
         "--kv-type",
         [&type](const std::string& v) {
           if (!kv_type_from_name(v, &type))
             throw CLI::ValidationError("--kv-type", "'" + v + "' is not a KV cache type; use f16, bf16, f32, q8_0 or fp8");
         },
         std::string("KV cache precision: f16, f32 (exact; CPU only), q8_0 (half of f16's memory), bf16 or fp8 "
                     "(MXFP8: E4M3 in blocks of 32 with a shared scale, 33 bytes per 32 values) (GPU only) (default: ") +
             kv_type_name(type) + ")")
      ->type_name("TYPE");
}

void add_device_options(CLI::App& cmd, DeviceOptions& o) {
  cmd.add_option("--device", o.device,
                 "Where models run: auto (the first CUDA GPU when its driver and the CUDA module are present and the "
                 "model fits, else the CPU), cpu, cuda, cuda:N")
      ->type_name("DEVICE")
      ->capture_default_str();
  cmd.add_option("--precision", o.precision,
                 "Matrix products on a GPU: auto (bf16; fp16 before sm_80), bf16, fp16, fp8 (E4M3, sm_89+); quantized "
                 "files stay quantized; the CPU uses each file's own types")
      ->check(CLI::IsMember({"auto", "bf16", "fp16", "fp8"}))
      ->capture_default_str();
  cmd.add_option("--gpu-memory-fraction", o.gpu_memory_fraction,
                 "Share of a GPU's memory the engine may take (weights, workspace, and the KV pool, which gets the rest)")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  // The CUDA module reads the switch when it opens a device, which happens
  // only once the command runs: set here, at parsing, it is there in time.
  cmd.add_flag_callback(
      "--deterministic",
      [&o] {
        o.deterministic = true;
        ::setenv("ATELIER_CUDA_DETERMINISTIC", "1", 1);
      },
      "On a GPU: batch-invariant kernels (every product on the matrix-vector kernels, attention row by row), so "
      "the same request and seed give the same tokens alone or in any batch, at a slower prefill; the CPU always "
      "is (same as ATELIER_CUDA_DETERMINISTIC=1)");
}

std::string device_line(const DeviceSelection& d) {
  return "device: " + d.name + " (" + d.why + ")" + (d.precision.empty() ? "" : "; precision: " + d.precision);
}

}  // namespace atelier::app
