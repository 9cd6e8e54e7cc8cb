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

// `bench text --synth PARAMS --type T` (api/synth.cpp): a synth preset's
// LLaMA made on options.device with random weights drawn there
// (Backend::fill_random), no file and no tokenizer. T: f32, f16, bf16, q8_0,
// q4_0, q4_K, q6_K, q4_k_m.
Result<std::shared_ptr<text::LoadedTextModel>> synth_text_model_on(const std::string& params, const std::string& type,
                                                                   uint64_t seed, const TextModelOptions& options);

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
