// Golden logits from llama.cpp for tests/engine/arch_goldens_test.cpp: loads a
// GGUF, evaluates a fixed sequence of token ids in one batch (so no tokenizer
// is involved) and writes the logits of the chosen positions as text.
//
//   dump_logits MODEL.gguf N_CTX OUT.txt POSITIONS TOKENS
//     POSITIONS, TOKENS: comma-separated (positions index TOKENS)
//
// Built against llama.cpp by make_goldens.sh (outside the repository; see
// README.md). Everything in f32: F32 KV cache, flash attention off, so the
// only approximations left are llama.cpp's own kernels (its fp16-table GELU).
#include <llama.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

static std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s MODEL.gguf N_CTX OUT.txt POSITIONS TOKENS\n", argv[0]);
    return 2;
  }
  const std::vector<int> positions = parse_list(argv[4]), tokens = parse_list(argv[5]);
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
  }, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(std::atoi(argv[2]));
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(tokens.size());
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "cannot make a context\n");
    return 1;
  }
  llama_batch batch = llama_batch_init(static_cast<int32_t>(tokens.size()), 0, 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 0;
  }
  for (int p : positions) batch.logits[p] = 1;
  batch.n_tokens = static_cast<int32_t>(tokens.size());
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama_decode failed\n");
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE* out = std::fopen(argv[3], "w");
  if (!out) return 1;
  std::fprintf(out, "# llama.cpp logits: model %s, n_ctx %s\n# tokens %s\n", argv[1], argv[2], argv[5]);
  for (int p : positions) {
    const float* l = llama_get_logits_ith(ctx, p);
    std::fprintf(out, "%d", p);
    for (int v = 0; v < n_vocab; ++v) std::fprintf(out, " %.9g", l[v]);
    std::fprintf(out, "\n");
  }
  std::fclose(out);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
