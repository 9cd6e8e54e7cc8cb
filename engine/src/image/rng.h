// Torch-compatible initial noise: torch.manual_seed(seed) followed by
// successive torch.randn(shape) calls on one generator, reproduced on the CPU
// so a seed gives the same latents as A1111 / ComfyUI / stable-diffusion.cpp.
//
//   RngKind::Cuda  PyTorch's CUDA generator: Philox4x32-10 (cuRAND state per
//                  thread: key = seed, counter = (offset/4, thread index)),
//                  curand_normal4's float Box-Muller, ATen's grid-stride
//                  element-to-thread mapping, and the generator offset
//                  advancing by 4 * (float4 draws per thread) after each call.
//   RngKind::Cpu   PyTorch's default CPU generator: mt19937, normal_fill for
//                  numel >= 16 (float Box-Muller in blocks of 16, the last 16
//                  redrawn when numel % 16 != 0) and the double-precision
//                  Box-Muller with its cached second sample for numel < 16.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace atelier::image {

enum class RngKind { Cuda, Cpu };

// The GPU whose element-to-thread mapping the Cuda generator reproduces. ATen
// launches min(ceil(numel/256), sm_count * (max_threads_per_sm/256)) blocks of
// 256 threads; past one wave of threads values depend on the GPU. sm_count = 0
// (the default) means "enough blocks for every element", which is what every
// GPU gives for SD1.x latents ([1,4,64,64]) and recent GPUs for SDXL's.
struct CudaGrid {
  int sm_count = 0;
  int max_threads_per_sm = 2048;
};

// Which normal_fill_16 the CPU generator reproduces for numel >= 16: the
// AVX2 kernel (avx_mathfun log/sincos; what x86 PyTorch builds use) or the
// generic one (AVX512-dispatch and ARM builds), modelled with correctly
// rounded logf/cosf/sinf.
enum class CpuKernel { Avx2, Scalar };

class TorchRandn {
 public:
  TorchRandn(RngKind kind, uint64_t seed);
  TorchRandn(RngKind kind, uint64_t seed, CudaGrid grid, CpuKernel cpu_kernel = CpuKernel::Avx2);

  // One torch.randn call of numel elements (the shape only matters through numel).
  std::vector<float> randn(int64_t numel);

  // Cpu only: one raw 32-bit mt19937 draw, as torch.randint(0, 0xFFFFFFFF)
  // consumes (used to replay published call sequences).
  uint32_t random_u32();

  // Cuda only: the Philox offset the next call starts from.
  uint64_t philox_offset() const { return philox_offset_; }

 private:
  std::vector<float> randn_cuda(int64_t numel);
  std::vector<float> randn_cpu(int64_t numel);
  uint64_t random_u64();
  double uniform_double();

  RngKind kind_;
  uint64_t seed_;
  CudaGrid grid_;
  CpuKernel cpu_kernel_;
  // Cuda
  uint64_t philox_offset_ = 0;
  // Cpu (mt19937 state and torch's cached second double normal sample)
  std::array<uint32_t, 624> mt_{};
  int mt_index_ = 624;
  bool has_next_double_normal_ = false;
  double next_double_normal_ = 0.0;
};

}  // namespace atelier::image
