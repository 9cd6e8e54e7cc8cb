// Sampling on the device (Backend::sample): one block per row, penalties,
// greedy, top-k, top-p, min-p, temperature and the draw, without sorting the
// vocabulary (sample.cu says how).
#pragma once

#include "common.cuh"

namespace atelier::kernels::cuda {

void sample(cudaStream_t s, Act logits, int64_t rows, int n_vocab, const SampleRow* params, const int32_t* penalty_tokens,
            int32_t* out_ids);

}  // namespace atelier::kernels::cuda
