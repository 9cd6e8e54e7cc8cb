// Element-wise ops, softmax, gathers and conversions on the device. Inputs
// and outputs in any of F32 / F16 / BF16, arithmetic in FP32.
#pragma once

#include "common.cuh"

namespace atelier::kernels::cuda {

void add(cudaStream_t s, Act a, Act b, Act y, int64_t n);
void add_bias(cudaStream_t s, Act x, const float* bias, int64_t rows, int64_t dim);
void activation(cudaStream_t s, Activation a, Act x, Act y, int64_t n);
void swiglu(cudaStream_t s, Act gate, Act up, Act out, int64_t rows, int64_t dim);
void glu(cudaStream_t s, Activation a, Act gate, Act up, Act out, int64_t rows, int64_t dim);
void geglu(cudaStream_t s, Act x, Act y, int64_t rows, int64_t dim);
void softmax(cudaStream_t s, Act x, int64_t rows, int64_t n);
void affine(cudaStream_t s, Act x, Act y, int64_t n, const Affine& a);
void relu(cudaStream_t s, Act x, Act y, int64_t n);
void tanh_clamp(cudaStream_t s, Act x, Act y, int64_t n, float limit);
void copy(cudaStream_t s, Act x, Act y, int64_t n);
void relayout(cudaStream_t s, Act x, Layout from, Act y, Layout to, int64_t n, int64_t c, int64_t hw);
void copy_rows(cudaStream_t s, Act x, const int32_t* ids, Act y, int64_t rows, int64_t dim);

}  // namespace atelier::kernels::cuda
