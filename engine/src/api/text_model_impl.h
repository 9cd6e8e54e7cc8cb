// Internals shared by the engine's API files (text_model.cpp, bench.cpp) and
// the scheduler: a loaded text model (what a TextModel wraps, loaded directly
// by the scheduler and the bench), and the exception-to-Status guard used at
// the API boundary.
#pragma once

#include <atelier/models.h>

#include <memory>
#include <new>

#include "core/error.h"
#include "core/thread_pool.h"
#include "text/llama.h"
#include "text/precision.h"
#include "tokenizer/tokenizer.h"

namespace atelier {

namespace text {

// A text model loaded from a file: its weights, tokenizer and thread pool.
struct LoadedTextModel {
  // A device's backend (nullptr: the CPU's over pool). First: the weights'
  // and caches' buffers are its own and go before it.
  std::unique_ptr<kernels::Backend> backend;
  TextModelOptions options;
  ModelInfo info;
  LlamaWeights weights;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  std::unique_ptr<ThreadPool> pool;
  int n_ctx = 0;
};

// Loads a GGUF or llama2.c model (what TextModel::open does, and its errors).
// BACKEND: the device the weights are prepared for (nullptr: the CPU's);
// a device that does not read host memory gets a copy of every parameter.
Result<std::shared_ptr<LoadedTextModel>> load_text_model(const std::string& path, const TextModelOptions& options,
                                                         kernels::Backend* backend = nullptr);

}  // namespace text

// A synthetic model (api/synth.cpp; `bench text --synth PARAMS --type T`, a
// synth:PARAMS[:TYPE][:seed=N] reference, atelier/models.h): a synth preset's
// LLaMA made on BACKEND's device (nullptr: the one options.device names) with
// random weights drawn there (Backend::fill_random), no file, the synthetic
// vocabulary. T: f32, f16, bf16, q8_0, q4_0, q4_K, q6_K, q4_k_m, fp8.
// text::load_text_model hands synth: references here.
Result<std::shared_ptr<text::LoadedTextModel>> synth_text_model_on(const std::string& params, const std::string& type,
                                                                   uint64_t seed, const TextModelOptions& options,
                                                                   kernels::Backend* backend = nullptr);

// What a synthetic model will hold on a device of plan PREC, without making
// it: its header facts, hparams, matrices (types after the plan) and the
// bytes of its weights (matrices as allocated, norms F32).
struct SynthLayout {
  ModelInfo info;
  text::LlamaHparams hp;
  struct Matrix {
    std::string name;
    kernels::DType type;
    int64_t rows, cols;
  };
  std::vector<Matrix> matrices;
  int64_t weight_bytes = 0;
};
Result<SynthLayout> synth_layout(const SynthModelRef& ref, const text::PrecisionPlan& prec);
// A synth: reference's weight bytes on the CPU (its "file size"); 0 when it does not parse.
int64_t synth_model_bytes(const std::string& ref);

// InvalidArgument with a message naming the bad value, or Ok.
Status validate_request(const TextRequest& request, int n_ctx);

// Runs fn, turning the engine's exceptions into a Status with the code they
// were thrown with: exceptions stop here.
template <class F>
inline auto guarded(F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    return Status::error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return Status::error(StatusCode::Io, "out of memory: the model or context does not fit; use a smaller context or model");
  } catch (const std::exception& e) {
    return Status::error(StatusCode::Internal, std::string("internal error: ") + e.what());
  }
}


}  // namespace atelier
