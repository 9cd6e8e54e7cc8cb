// libFuzzer: arbitrary bytes (invalid UTF-8 included) through every tokenizer
// kind: SentencePiece (stories260K), byte-level BPE (GPT-2), WordPiece (BERT)
// and CLIP's BPE, each loaded once from the fixtures.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"
#include "tokenizer/clip.h"
#include "tokenizer/tokenizer.h"

namespace {
struct Tokenizers {
  std::vector<std::unique_ptr<atelier::tok::Tokenizer>> gguf;
  std::unique_ptr<atelier::tok::ClipTokenizer> clip;
  Tokenizers() {
    const std::string f = ATELIER_FIXTURES_DIR;
    for (const char* p : {"/text/stories260K.gguf", "/vocab/ggml-vocab-gpt-2.gguf", "/vocab/ggml-vocab-bert-bge.gguf"})
      gguf.push_back(atelier::tok::Tokenizer::from_gguf(*atelier::formats::GgufFile::open(f + p)));
    clip = atelier::tok::ClipTokenizer::open(f + "/clip/bpe_simple_vocab_16e6.txt.gz");
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Tokenizers t;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& tok : t.gguf) {
    try {
      for (int32_t id : tok->encode(text, true, true))
        if (id < 0 || id >= tok->n_vocab()) __builtin_trap();  // an id outside the vocabulary is a bug
      (void)tok->encode(text, false, false);
    } catch (const std::exception&) {
    }
  }
  try {
    (void)t.clip->encode_with_specials(text);
  } catch (const std::exception&) {
  }
  return 0;
}
