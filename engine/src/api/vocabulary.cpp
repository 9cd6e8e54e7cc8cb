// Vocabulary: a tokenizer loaded without a model's weights, so `atelier
// tokenize` works on vocabulary-only GGUF files and tokenizer.json files.
#include <atelier/models.h>

#include <filesystem>

#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/sniff.h"
#include "api/text_model_impl.h"

namespace atelier {

struct Vocabulary::Impl {
  std::unique_ptr<tok::Tokenizer> tokenizer;
};

Vocabulary::Vocabulary(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Vocabulary::~Vocabulary() = default;

Result<std::shared_ptr<Vocabulary>> Vocabulary::open(const std::string& path) {
  if (is_synth_model_ref(path)) {  // a synthetic model's vocabulary (SynthModelRef)
    auto ref = parse_synth_model_ref(path);
    if (!ref.ok()) return ref.status();
    auto layout = synth_layout(ref.value(), text::PrecisionPlan{});
    if (!layout.ok()) return layout.status();
    return guarded([&]() -> Result<std::shared_ptr<Vocabulary>> {
      auto impl = std::make_unique<Impl>();
      impl->tokenizer = tok::Tokenizer::synthetic(layout->hp.n_vocab);
      return std::shared_ptr<Vocabulary>(new Vocabulary(std::move(impl)));
    });
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::error(StatusCode::NotFound, path + ": no such file");
  return guarded([&]() -> Result<std::shared_ptr<Vocabulary>> {
    auto impl = std::make_unique<Impl>();
    // By content (formats/sniff.h); tokenizer.json files are JSON text, which the sniffer does not claim.
    const formats::FileKind kind = formats::sniff_model_file(path).kind;
    const std::string ext = std::filesystem::path(path).extension().string();
    if (kind == formats::FileKind::llama2c_tokenizer) {
      // A llama2.c tokenizer file (its vocabulary size is its own token count).
      impl->tokenizer = tok::Tokenizer::from_llama2c(formats::load_llama2c_tokenizer(path, 0));
    } else if (kind != formats::FileKind::gguf && ext == ".json") {
      impl->tokenizer = tok::Tokenizer::from_hf_json(path);
    } else {
      impl->tokenizer = tok::Tokenizer::from_gguf(*formats::GgufFile::open(path));
    }
    return std::shared_ptr<Vocabulary>(new Vocabulary(std::move(impl)));
  });
}

std::string Vocabulary::model() const { return impl_->tokenizer->model_name(); }
int Vocabulary::n_vocab() const { return impl_->tokenizer->n_vocab(); }

Result<std::vector<int32_t>> Vocabulary::tokenize(std::string_view text, bool add_bos, bool parse_special) const {
  return guarded([&]() -> Result<std::vector<int32_t>> { return impl_->tokenizer->encode(text, add_bos, parse_special); });
}

std::string Vocabulary::token_piece(int32_t id) const {
  if (id < 0 || id >= impl_->tokenizer->n_vocab()) return {};
  return impl_->tokenizer->token_to_piece(id);
}

}  // namespace atelier
