// Dumps llama.cpp's next-token logits for a fixed token sequence: the
// sequence but its last token as one prompt batch, then the last token as a
// decode step; prints the logits after it, one per line (%.9g). Built
// against a llama.cpp build by make_goldens.sh; not part of Atelier's build.
//   dump_logits MODEL.gguf 1,5,9,... > OUT
#include <llama.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf TOKEN,TOKEN,...\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> tokens;
  std::stringstream ss(argv[2]);
  for (std::string t; std::getline(ss, t, ',');) tokens.push_back(std::atoi(t.c_str()));
  if (tokens.size() < 2) return 2;
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 256;
  cp.n_batch = 256;
  cp.n_ubatch = 256;
  cp.n_threads = 1;
  cp.n_threads_batch = 1;
  cp.type_k = GGML_TYPE_F32;  // exact caches, as the tests' F32 KvCache
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  if (llama_decode(ctx, llama_batch_get_one(tokens.data(), static_cast<int32_t>(tokens.size() - 1))) != 0) return 1;
  if (llama_decode(ctx, llama_batch_get_one(&tokens.back(), 1)) != 0) return 1;
  const float* logits = llama_get_logits_ith(ctx, -1);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (int i = 0; i < n_vocab; ++i) std::printf("%.9g\n", logits[i]);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
