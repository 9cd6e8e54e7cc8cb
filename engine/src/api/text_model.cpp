// TextModel: the public handle over a loaded LLaMA-family model
// (text::LoadedTextModel, loaded by text::load_text_model) and its tokenizer;
// generate runs text::Generation as a batch of one.
#include <atelier/models.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <atelier/devices.h>

#include "core/utf8.h"
#include "core/error.h"
#include "api/text_model_impl.h"
#include "text/precision.h"
#include "text/json_constraint.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/sniff.h"
#include "text/generation.h"

namespace atelier {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// What PATH holds, by content; throws unless it is a text model (GGUF or a
// llama2.c checkpoint), naming what it is instead.
formats::FileKind text_model_kind(const std::string& path) {
  const formats::Sniffed s = formats::sniff_model_file(path);
  formats::throw_if_unusable(s);
  switch (s.kind) {
    case formats::FileKind::gguf:
    case formats::FileKind::llama2c: return s.kind;
    case formats::FileKind::llama2c_tokenizer:
      throw Error(path + ": this is a llama2.c tokenizer, not a model; give the checkpoint with -m and this file with --tokenizer");
    case formats::FileKind::clip_vocab: throw Error(path + ": this is a CLIP vocabulary, not a model");
    default:
      throw UnsupportedError(path + ": this is a " + formats::file_kind_name(s.kind) +
                             " model (an image model?); text generation needs a GGUF file or a llama2.c checkpoint");
  }
}

std::string find_llama2c_tokenizer(const std::string& model_path, const std::string& given) {
  if (!given.empty()) {
    if (!fs::exists(given)) throw NotFoundError(given + ": tokenizer file not found");
    // A FIFO or device would block the reader until killed.
    if (!fs::is_regular_file(given)) throw InvalidArgumentError(given + " is not a regular file (a folder, FIFO or device): pass the tokenizer file");
    return given;
  }
  const fs::path dir = fs::path(model_path).parent_path();
  for (const char* name : {"tokenizer.bin", "tok512.bin"}) {
    fs::path p = dir / name;
    if (fs::exists(p)) return p.string();
  }
  // llama2.c names small-vocabulary tokenizers tokN.bin; take one if it is the only one.
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir.empty() ? "." : dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("tok", 0) == 0 && e.path().extension() == ".bin") found.push_back(e.path());
  }
  if (found.size() == 1) return found[0].string();
  throw NotFoundError(model_path + ": a llama2.c checkpoint needs its tokenizer; none found beside it (looked for "
              "tokenizer.bin, tok512.bin); pass --tokenizer FILE");
}

}  // namespace

int64_t kv_type_bytes(KvType t, int64_t values) { return text::kv_bytes(t, values); }

Status validate_request(const TextRequest& r, int n_ctx) {
  auto bad = [](const std::string& m) { return Status::error(StatusCode::InvalidArgument, m); };
  const SamplingParams& s = r.sampling;
  if (r.max_new_tokens < 1 || r.max_new_tokens > n_ctx)
    return bad("max new tokens must be between 1 and the context size " + std::to_string(n_ctx) + ", got " +
               std::to_string(r.max_new_tokens));
  if (!(s.temperature >= 0.0f) || s.temperature > 100.0f) return bad("temperature must be between 0 and 100");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return bad("top-p must be in (0, 1]");
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) return bad("min-p must be in [0, 1]");
  // The same limits as the flags (request_options.cpp), so a batch line or an API request cannot pass what -h refuses.
  if (!(s.repeat_penalty > 0.0f && s.repeat_penalty <= 100.0f)) return bad("repeat penalty must be in (0, 100] (1 turns it off)");
  if (s.repeat_last_n < 0) return bad("repeat-last-n must be >= 0");
  if (s.top_k < 0) return bad("top-k must be >= 0 (0 turns it off)");
  if (!(s.frequency_penalty >= -100.0f && s.frequency_penalty <= 100.0f))
    return bad("frequency penalty must be a number between -100 and 100");
  if (!(s.presence_penalty >= -100.0f && s.presence_penalty <= 100.0f))
    return bad("presence penalty must be a number between -100 and 100");
  if (const size_t at = first_bad_utf8(r.prompt); at != std::string_view::npos)
    return bad("the prompt is not valid UTF-8 (byte " + std::to_string(at) + "): pass text in UTF-8");
  for (const auto& stop : r.stop) {
    if (stop.empty()) return bad("a stop string must not be empty");
    if (first_bad_utf8(stop) != std::string_view::npos) return bad("a stop string is not valid UTF-8: pass text in UTF-8");
  }
  if (r.top_logprobs < 0 || r.top_logprobs > 20) return bad("top_logprobs must be between 0 and 20");
  if (!r.json_schema.empty()) {
    auto m = text::JsonMatcher::compile(r.json_schema);
    if (!m.ok()) return bad("json_schema: " + m.status().message);
    if (m->close_bytes() > r.max_new_tokens)
      return bad("json_schema: its shortest valid value takes " + std::to_string(m->close_bytes()) +
                 " tokens, more than max new tokens " + std::to_string(r.max_new_tokens) + "; allow more tokens");
  }
  if (!r.json_trigger.empty() && r.json_schema.empty())
    return bad("json_trigger needs a json_schema (the value that follows the trigger)");
  return {};
}


TextModel::TextModel(std::shared_ptr<text::LoadedTextModel> model) : model_(std::move(model)) {}
TextModel::~TextModel() = default;

const ModelInfo& TextModel::info() const { return model_->info; }

Result<std::shared_ptr<text::LoadedTextModel>> text::load_text_model(const std::string& path,
                                                                     const TextModelOptions& options,
                                                                     kernels::Backend* backend) {
  if (is_synth_model_ref(path)) {  // made on the device, no file
    auto ref = parse_synth_model_ref(path);
    if (!ref.ok()) return ref.status();
    if (options.threads < 0 || options.threads > 1024)
      return Status::error(StatusCode::InvalidArgument, "threads must be between 1 and 1024 (0: one per core)");
    if (options.context_tokens < 0)
      return Status::error(StatusCode::InvalidArgument, "context size must be >= 0 (0: the model's own)");
    return synth_text_model_on(ref->params, ref->type, ref->seed, options, backend);
  }
  std::unique_ptr<kernels::Backend> own;
  if (!backend && !options.device.empty() && options.device != "cpu") {
    const kernels::DeviceChoice d = kernels::open_device(options.device);
    if (!d.device) return Status::error(StatusCode::Unsupported, "--device " + options.device + ": " + d.why);
    if (!d.device->info().host_memory) own = d.device->make_backend(nullptr, 0);
  }
  kernels::Backend& be = backend ? *backend : own ? *own : kernels::default_cpu_backend();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return Status::error(StatusCode::NotFound, path + ": no such model file");
  if (options.threads < 0 || options.threads > 1024)
    return Status::error(StatusCode::InvalidArgument, "threads must be between 1 and 1024 (0: one per core)");
  if (options.context_tokens < 0)
    return Status::error(StatusCode::InvalidArgument, "context size must be >= 0 (0: the model's own)");
  return guarded([&]() -> Result<std::shared_ptr<text::LoadedTextModel>> {
    // The precision policy reaches the device before any matrix is prepared.
    if (!be.device().host_memory) text::apply_precision(be, options.precision, options.kv_type);
    else text::precision_plan({}, text::PrecisionChoice::Auto, options.kv_type);  // refuses a GPU's KV types
    auto impl = std::make_shared<text::LoadedTextModel>();
    impl->backend = std::move(own);
    impl->options = options;
    if (text_model_kind(path) == formats::FileKind::gguf) {
      std::shared_ptr<formats::GgufFile> file = formats::GgufFile::open(path);
      impl->tokenizer = tok::Tokenizer::from_gguf(*file);
      impl->info.chat_template = file->get_string("tokenizer.chat_template", "");
      impl->weights = text::load_llama_gguf(file, be);
      file->drop_metadata();  // everything is read: the vocabulary lives on in the tokenizer
    } else {  // a llama2.c checkpoint: its header's dimensions match its size, whatever its name
      impl->weights = text::load_llama2c(path, be);
      const std::string tok_path = find_llama2c_tokenizer(path, options.tokenizer_path);
      impl->tokenizer = tok::Tokenizer::from_llama2c(
          formats::load_llama2c_tokenizer(tok_path, impl->weights.hp.n_vocab));
    }
    const text::LlamaWeights& w = impl->weights;
    if (impl->tokenizer->n_vocab() != w.hp.n_vocab)
      throw Error(path + ": the vocabulary has " + std::to_string(impl->tokenizer->n_vocab()) +
                  " tokens but the embedding matrix has " + std::to_string(w.hp.n_vocab) + " rows");
    text::check_kv_type(w.hp, options.kv_type);  // at load, not at the first request
    ModelInfo& info = impl->info;
    info.path = path;
    info.format = w.format;
    info.architecture = w.hp.architecture;
    info.name = w.hp.name;
    info.tokenizer = impl->tokenizer->model_name();
    info.weight_types = w.weight_types;
    info.n_params = w.n_params;
    info.n_vocab = w.hp.n_vocab;
    info.n_ctx_train = w.hp.n_ctx_train;
    info.n_embd = w.hp.n_embd;
    info.n_layers = w.hp.n_layer;
    info.n_heads = w.hp.n_head;
    info.n_kv_heads = w.hp.n_head_kv;
    info.n_ff = w.hp.n_ff;
    const auto token_text = [&](int32_t id) { return id >= 0 && id < impl->tokenizer->n_vocab() ? impl->tokenizer->token_text(id) : std::string(); };
    info.bos_token = token_text(impl->tokenizer->bos_id());
    info.eos_token = token_text(impl->tokenizer->eos_id());
    info.weight_bytes = kernels::weight_bytes(w.output);
    for (const auto& L : w.layers) {
      for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.gate_inp})
        info.weight_bytes += kernels::weight_bytes(*m);
      int64_t experts = 0;
      for (const auto* set : {&L.gate_exps, &L.up_exps, &L.down_exps})  // every expert is resident, used or not
        for (const auto& e : *set) experts += kernels::weight_bytes(e);
      info.weight_bytes += experts;
      if (w.hp.n_expert > 0) info.active_weight_bytes -= experts - experts / w.hp.n_expert * w.hp.n_expert_used;
    }
    info.active_weight_bytes += info.weight_bytes;
    // The model's own training length: the KV budget (the queue) or the
    // cache this request needs (generate) decide what fits, not a cap.
    impl->n_ctx = options.context_tokens > 0 ? options.context_tokens : default_context_tokens(w.hp.n_ctx_train);
    text::select_rope_factors(impl->weights, impl->n_ctx);  // phi3 LongRoPE: short or long factors for this context
    impl->pool = std::make_unique<ThreadPool>(options.threads);
    return impl;
  });
}

Result<std::shared_ptr<TextModel>> TextModel::open(const std::string& path, const TextModelOptions& options) {
  auto loaded = text::load_text_model(path, options);
  if (!loaded.ok()) return loaded.status();
  return std::shared_ptr<TextModel>(new TextModel(loaded.value()));
}

Result<std::vector<int32_t>> TextModel::tokenize(std::string_view text, bool add_bos, bool parse_special) const {
  return guarded([&]() -> Result<std::vector<int32_t>> { return model_->tokenizer->encode(text, add_bos, parse_special); });
}

std::string TextModel::token_piece(int32_t id) const {
  if (id < 0 || id >= model_->tokenizer->n_vocab()) return {};
  return model_->tokenizer->token_to_piece(id);
}

// A batch of one through text::Generation, the loop the scheduler runs too.
Result<TextResult> TextModel::generate(const TextRequest& request,
                                       const std::function<bool(const TokenEvent&)>& on_token) {
  text::LoadedTextModel& m = *model_;
  if (Status s = validate_request(request, m.n_ctx); !s.ok()) return s;
  return guarded([&]() -> Result<TextResult> {
    TextResult result;
    std::vector<int32_t> prompt = m.tokenizer->encode(request.prompt, request.add_bos, request.parse_special);
    const int n_prompt = static_cast<int>(prompt.size());
    if (n_prompt == 0) return Status::error(StatusCode::InvalidArgument, "the prompt is empty and the model has no BOS token; give a prompt");
    if (n_prompt >= m.n_ctx)
      return Status::error(StatusCode::InvalidArgument,
                           "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                               std::to_string(m.n_ctx) + "; shorten the prompt or raise the context size");
    const int n_ctx = std::min(m.n_ctx, n_prompt + request.max_new_tokens);
    std::optional<text::KvCache> kv;
    std::optional<text::LlamaRunner> on;
    if (m.backend) {  // a device: the cache and the steps on it
      kv.emplace(m.weights.hp, n_ctx, m.options.kv_type, *m.backend);
      on.emplace(m.weights, *m.backend);
    } else {
      kv.emplace(m.weights.hp, n_ctx, m.options.kv_type);
      on.emplace(m.weights, m.pool.get());
    }
    text::KvCache& cache = *kv;
    text::LlamaRunner& runner = *on;
    // The last sampled token needs no KV slot: the sequence may hold n_ctx + 1 tokens.
    text::Generation gen(*m.tokenizer, request, std::move(prompt), m.n_ctx + 1);

    // Prefill in chunks so scratch memory stays bounded for long prompts.
    constexpr int kChunk = 256;
    auto t0 = Clock::now();
    for (int p = 0; p < n_prompt; p += kChunk) {
      const int n = std::min(kChunk, n_prompt - p);
      runner.forward(gen.token_data() + p, n, p, cache, p + n == n_prompt ? gen.logits() : nullptr);
    }
    TextStats& st = result.stats;
    st.prompt_tokens = n_prompt;
    st.prompt_ms = ms_since(t0);
    st.seed = gen.seed();

    auto t1 = Clock::now();
    for (;;) {
      const int32_t id = gen.sample();
      if (gen.ends_with_eos(id)) {
        st.stop_reason = "eos";
        break;
      }
      const TokenEvent ev = gen.accept(id);
      const bool keep_going = !on_token || on_token(ev);
      if (const char* reason = gen.end_reason(!keep_going)) {
        st.stop_reason = reason;
        break;
      }
      runner.forward(&id, 1, gen.n_tokens() - 1, cache, gen.logits());
    }
    st.gen_ms = ms_since(t1);
    result.prompt_ids = gen.prompt_ids();
    result.ids = gen.new_ids();
    result.logprobs = gen.logprobs();
    st.new_tokens = static_cast<int>(result.ids.size());
    st.prompt_tokens_per_s = st.prompt_ms > 0 ? st.prompt_tokens * 1000.0 / st.prompt_ms : 0;
    st.new_tokens_per_s = st.gen_ms > 0 ? st.new_tokens * 1000.0 / st.gen_ms : 0;
    result.text = gen.text();
    return result;
  });
}

Result<ModelInfo> read_model_info(const std::string& path, const std::string& tokenizer) {
  if (is_synth_model_ref(path)) {  // its preset's facts, on the CPU's plan
    auto ref = parse_synth_model_ref(path);
    if (!ref.ok()) return ref.status();
    auto layout = synth_layout(ref.value(), text::PrecisionPlan{});
    if (!layout.ok()) return layout.status();
    return layout->info;
  }
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return Status::error(StatusCode::NotFound, path + ": no such model file");
  if (formats::sniff_model_file(path).kind != formats::FileKind::gguf) {  // by content: llama2.c loads whole
    TextModelOptions o;
    o.threads = 1;
    o.tokenizer_path = tokenizer;
    auto model = TextModel::open(path, o);
    if (!model.ok()) return model.status();
    return model.value()->info();
  }
  return guarded([&]() -> Result<ModelInfo> {
    const std::unique_ptr<formats::GgufFile> f = formats::GgufFile::open(path);
    ModelInfo info;
    info.path = path;
    info.format = "gguf";
    info.architecture = f->get_string("general.architecture", "");
    info.name = f->get_string("general.name", "");
    info.tokenizer = f->get_string("tokenizer.ggml.model", "");
    const std::string p = info.architecture + ".";
    info.n_ctx_train = static_cast<int>(f->get_int(p + "context_length", 0));
    info.n_embd = static_cast<int>(f->get_int(p + "embedding_length", 0));
    info.n_layers = static_cast<int>(f->get_int(p + "block_count", 0));
    info.n_heads = static_cast<int>(f->get_int(p + "attention.head_count", 0));
    info.n_kv_heads = static_cast<int>(f->get_int(p + "attention.head_count_kv", info.n_heads));
    info.n_ff = static_cast<int>(f->get_int(p + "feed_forward_length", 0));
    info.chat_template = f->get_string("tokenizer.chat_template", "");
    if (f->has("tokenizer.ggml.tokens")) {
      const std::vector<std::string> tokens = f->get_string_array("tokenizer.ggml.tokens");
      info.n_vocab = static_cast<int>(tokens.size());
      const auto text_of = [&](const char* key) {
        const int64_t id = f->get_int(key, -1);
        return id >= 0 && id < static_cast<int64_t>(tokens.size()) ? tokens[static_cast<size_t>(id)] : std::string();
      };
      info.bos_token = text_of("tokenizer.ggml.bos_token_id");
      info.eos_token = text_of("tokenizer.ggml.eos_token_id");
    }
    for (const auto& t : f->tensors()) info.n_params += t.elements();
    return info;
  });
}

}  // namespace atelier
