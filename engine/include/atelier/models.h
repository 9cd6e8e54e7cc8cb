// atelier/models.h — models on their own: text models (TextModel, Vocabulary,
// model headers, chat templates), image generation on the calling thread, PNG
// writing, and model references (resolve_model)
//
// Pure C++20, no Qt. Nothing here throws: every fallible call returns a
// Status or a Result whose message says what was wrong and what to do.
#pragma once

#include <atelier/requests.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace atelier {

// ---------------------------------------------------------------- text models

struct TextModelOptions {
  int threads = 0;                  // 0: one per hardware thread
  KvType kv_type = KvType::F16;
  int context_tokens = 0;           // 0: the model's training context (4096 when the file does not say)
  std::string tokenizer_path;       // llama2.c .bin models: tokenizer.bin (default: tokenizer.bin / tok512.bin beside the model)
  // Where the weights and the KV cache live: "cpu", or a device name that
  // select_device() returned ("cuda:0"). Unsupported when it cannot be opened.
  std::string device = "cpu";
  // --precision on a GPU (auto, bf16, fp16, fp8: engine/src/text/precision.h),
  // handed to the device's backend before the weights are prepared; the CPU
  // ignores it.
  std::string precision = "auto";
};

struct ModelInfo {
  std::string path;
  std::string format;        // "gguf", "llama2c"
  std::string architecture;  // "llama"
  std::string name;
  std::string tokenizer;     // "llama", "gpt2", "bert"
  std::string weight_types;  // e.g. "q8_0 (85), f32 (25)"
  int64_t n_params = 0;
  int64_t weight_bytes = 0;  // bytes of every matrix (resident; a dense model reads them all per generated token)
  // What one generated token reads: weight_bytes, but of a mixture of experts
  // only expert_used_count of expert_count experts (weight_bytes is what is resident).
  int64_t active_weight_bytes = 0;
  int n_vocab = 0, n_ctx_train = 0, n_embd = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, n_ff = 0;
  std::string chat_template;        // GGUF tokenizer.chat_template ("" when the model has none)
  std::string bos_token, eos_token; // the texts of the BOS and EOS tokens ("" when the vocabulary has none)
};

// ---------------------------------------------------------------- chat templates

struct ChatMessage {
  std::string role;       // "system", "user", "assistant", ...
  std::string content;
  std::string reasoning;  // an assistant's reasoning, kept apart (the template sees it as reasoning_content when not empty)
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;  // variables the template sees
  std::vector<std::pair<std::string, std::string>> variables;  // further string variables (NAME=VALUE)
  // The tools offered (a JSON list of {"type": "function", "function": {name,
  // description, parameters}}, as transformers and llama.cpp pass `tools`);
  // "" = the template sees no tools variable.
  std::string tools_json;
  // Further variables of any JSON type (a JSON object, e.g. {"enable_thinking": false}); "" = none.
  std::string variables_json;
};

// Renders a Jinja chat template as Hugging Face's apply_chat_template does
// (trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now,
// tojson). MESSAGES_JSON: a JSON array of message objects (role, content and
// whatever else templates read: tool_calls, name ...). InvalidArgument with
// "chat template error at line N: ..." on a template error or a
// raise_exception, or when the messages are not a JSON array.
Result<std::string> render_chat_template(const std::string& template_text, const std::string& messages_json,
                                         const ChatTemplateOptions& options = {});
Result<std::string> render_chat_template(const std::string& template_text, const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options = {});

// The prompt a chat model continues: its own template (with its BOS/EOS texts)
// when it has one, else the plain format, one block per message:
//   "System: <content>\n\n" for system messages, "User: <content>\n" and
//   "Assistant: <content>\n" for the others, then "Assistant:" when
//   add_generation_prompt (stop generation at "\nUser:").
Result<std::string> format_chat_prompt(const ModelInfo& model, const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt = true);
// The same for messages as JSON (MESSAGES_JSON as render_chat_template takes
// it: tool_calls, tool_call_id, reasoning_content pass through) with OPTIONS'
// tools and variables (its BOS/EOS texts are the model's).
Result<std::string> format_chat_prompt(const ModelInfo& model, const std::string& messages_json, ChatTemplateOptions options);

namespace text {
struct LoadedTextModel;  // engine-internal
}

class TextModel {
 public:
  // Loads a GGUF or llama2.c model. InvalidModel/Unsupported/NotFound with a clear message otherwise.
  static Result<std::shared_ptr<TextModel>> open(const std::string& path, const TextModelOptions& options = {});
  ~TextModel();
  TextModel(const TextModel&) = delete;
  TextModel& operator=(const TextModel&) = delete;

  const ModelInfo& info() const;
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_bos, bool parse_special) const;
  std::string token_piece(int32_t id) const;

  // Runs one request to completion on the calling thread. on_token is called
  // for every sampled token; returning false cancels (stop_reason "cancelled").
  Result<TextResult> generate(const TextRequest& request,
                              const std::function<bool(const TokenEvent&)>& on_token = {});

 private:
  explicit TextModel(std::shared_ptr<text::LoadedTextModel> model);
  std::shared_ptr<text::LoadedTextModel> model_;
};

// What a text model file is, read from its header without loading the
// weights (GGUF: metadata and tensor table only; a llama2.c checkpoint is
// small and is opened). n_params counts every tensor's elements;
// weight_bytes is not filled. TOKENIZER: a llama2.c model's tokenizer file.
// A synth: reference (SynthModelRef below): its preset's facts, format "synthetic".
Result<ModelInfo> read_model_info(const std::string& path, const std::string& tokenizer = "");

// The context a text model gets when TextModelOptions::context_tokens is 0:
// its training context (N_CTX_TRAIN, ModelInfo::n_ctx_train), 4096 when the
// file does not say. The KV budget and admission decide what fits of it.
inline int default_context_tokens(int n_ctx_train) { return n_ctx_train > 0 ? n_ctx_train : 4096; }

// A tokenizer on its own: from a GGUF (weights not needed, so vocabulary-only
// files work), a Hugging Face tokenizer.json, a llama2.c tokenizer.bin, or a
// synth: reference (its synthetic vocabulary).
class Vocabulary {
 public:
  static Result<std::shared_ptr<Vocabulary>> open(const std::string& path);
  ~Vocabulary();
  Vocabulary(const Vocabulary&) = delete;
  Vocabulary& operator=(const Vocabulary&) = delete;

  std::string model() const;  // "llama", "gpt2", "bert"
  int n_vocab() const;
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_bos, bool parse_special) const;
  std::string token_piece(int32_t id) const;

  struct Impl;

 private:
  explicit Vocabulary(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------- image

// Generates every image of the request on the calling thread. InvalidArgument:
// a bad request value, a prompt naming no class (QuickDraw); NotFound: no such
// file; Unsupported: another kind of model; InvalidModel: a damaged file.
Result<std::vector<ImageResult>> generate_image(const ImageRequest& request);
// The same, resolving request.model in the model store at STORE_DIR ("" =
// default_store_dir()), reporting progress (may be empty).
Result<std::vector<ImageResult>> generate_image(const ImageRequest& request, const std::string& store_dir,
                                                const ImageProgressFn& progress = {});

// The estimate of REQUEST (request.model resolved in STORE_DIR, "" = the
// default store). A one-pass generator (QuickDraw) always fits. NotFound /
// Unsupported / InvalidModel as generate_image would say.
// LIMIT_BYTES > 0 caps the device's memory (EngineConfig::image_memory_bytes).
Result<ImageEstimate> estimate_image(const ImageRequest& request, const std::string& store_dir = "", int64_t limit_bytes = 0);

// Where image INDEX of COUNT goes when a request names OUT: OUT itself for
// one image, OUT-1.png ... OUT-N.png (the stem numbered) for several.
std::string numbered_output_path(const std::string& out, int index, int count);

// The rule for a file named by someone who may name files only inside FOLDER
// (an API client's output or picture, a batch line's output): NAME is
// relative, holds no ".." part and no NUL byte, and no part of it that exists
// below FOLDER is a symbolic link (refused, never followed: checked with
// lstat). Returns FOLDER/NAME; InvalidArgument saying which rule NAME broke.
// Whether the file itself exists is the caller's question.
Result<std::string> file_inside(const std::string& folder, const std::string& name);

// Writes a progress report's preview as an RGB PNG. InvalidArgument when it has none; Io on failure.
Status write_preview_png(const ImageProgress& progress, const std::string& path);

// Writes result as an 8-bit PNG with two text chunks: "parameters"
// (result.parameters, A1111's format) and "atelier" (the request as JSON, its
// seed replaced by result.seed). Written to PATH.tmp then renamed. Io with the
// system's reason on failure; InvalidArgument for an empty result.
Status write_png(const ImageResult& result, const ImageRequest& request, const std::string& path);

// ---------------------------------------------------------------- model references

// Where the model store lives by default: $ATELIER_HOME, else
// $XDG_DATA_HOME/atelier, else ~/.local/share/atelier (the queue's default
// data dir too).
std::string default_store_dir();

// What a model reference names. The one place where references are resolved:
// the command line, the engine's queue and the window all call resolve_model.
struct ResolvedModel {
  std::string path;          // the file to load: a blob in the store, or the plain file
  std::string digest;        // "sha256:<64 hex>" of that file; "" for a plain file unless check_digest; a synth: reference's SynthModelRef::digest
  std::string display;       // "stories260k@1", or the plain file's path
  std::string name;          // the store model's name ("" for a plain file)
  int version = 0;           // its version number (0 for a plain file)
  std::string kind;          // "text" or "image" ("" for a plain file)
  std::string format;        // "gguf", "safetensors", "pytorch", "llama2c" ("" for a plain file)
  std::vector<std::pair<std::string, std::string>> files;  // role -> path, every file of the version
  bool in_store = false;
  std::string file(const std::string& role) const;  // the path of ROLE, "" when absent
};

struct ResolveOptions {
  // Hash the file before it is used: a store blob must still hash to its
  // digest (a corrupted blob is refused with InvalidModel), a plain file gets
  // its digest computed. Done once per file per process (a file whose size or
  // modification time changed is hashed again), so jobs do not rehash.
  bool check_digest = false;
};

// REF: a synth: reference (SynthModelRef below: path its canonical form,
// kind "text", format "synthetic", never hashed), a path to an existing file
// (used as it is, no store entry needed), or a store reference: NAME (prod, else stable, else the newest version),
// NAME@VERSION, NAME:CHANNEL, sha256:HEX (at least 12 digits). STORE_DIR ""
// means default_store_dir(); a store that does not exist yet is not created.
// NotFound names what to pull or import; InvalidArgument for a malformed
// reference; InvalidModel for a corrupted blob (with check_digest).
Result<ResolvedModel> resolve_model(const std::string& ref, const std::string& store_dir = "",
                                    const ResolveOptions& options = {});

// Whether resolve_model takes REF as a file path rather than a store
// reference: it holds a '/' or ends in a model file's extension (.gguf,
// .bin, .safetensors, .pth, .pt, .ckpt, .json).
bool model_ref_is_path(const std::string& ref);

// A synthetic model reference: a seeded random Llama-shaped text model made
// on the runner's device when it loads, no file (benchmarks of an 8B model
// without a 16 GB download). Grammar:
//   synth:PARAMS[:TYPE][:seed=N]
// PARAMS a dense synth preset (260K, 15M, 42M, 110M, 1B, 8B: Llama 3.1 8B's
// shapes), TYPE the matrices' type (f32, f16, bf16, q8_0, q4_0, q4_K, q6_K,
// q4_k_m; fp8 on a GPU with FP8; default bf16, any case), N the seed
// (default 1), TYPE and seed in either order: synth:8B, synth:8B:q4_k_m,
// synth:110M:bf16:seed=7. The same reference, the same weights on a device.
// Its vocabulary is synthetic (SynthModelRef::vocabulary below). The store
// has no entry for it (its commands refuse it); a store model may not be
// named "synth".
struct SynthModelRef {
  std::string params;         // a preset name
  std::string type = "bf16";  // canonical spelling (q4_K, q6_K; the rest lower case)
  uint64_t seed = 1;
  // "synth:8B:bf16:seed=1": every field written out, what a job records as its model's path.
  std::string canonical() const;
  // What a job records as the model's digest: a stable function of the spec
  // and the generator's version ("synthetic-v1:8B:bf16:seed=1"), no file hash.
  std::string digest() const;
};
// Whether REF is meant as one (it starts with "synth:"); then resolve_model
// takes it as such and refuses it when malformed.
bool is_synth_model_ref(std::string_view ref);
// InvalidArgument naming the bad field and the grammar.
Result<SynthModelRef> parse_synth_model_ref(const std::string& ref);
// The synthetic vocabulary of a preset of N_VOCAB tokens: 0 <unk>, 1 <s>
// (BOS, added), 2 </s> (EOS), 3..258 the bytes <0x00>..<0xFF>, 259 U+2581
// (a space), then "<tID>" pieces (the token's own id) to the end. Text
// tokenizes as its bytes, one token each (a space as 259; no space prefix),
// so prompts of N tokens are N - 1 bytes and decode(encode(text)) == text; a
// generated "<tID>" id detokenizes as those characters.
inline constexpr int kSynthFirstPieceId = 260;

}  // namespace atelier
