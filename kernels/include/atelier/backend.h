// atelier/backend.h — the device seam: a device, its buffers, and one entry
// point per op, in row-batched form.
//
// Shaped after ggml's ggml-backend.h (a backend owns buffers whose memory
// only it dereferences; upload / download / synchronize move bytes across)
// and llama.cpp's per-op CUDA dispatch (each op one launch over all the rows
// of a step). Models hold a `Backend&`, keep their activations and KV in its
// buffers, and call these ops; they do no arithmetic of their own, so a CUDA
// backend (ATELIER_CUDA, later) slots in beside the CPU one without a second
// copy of any model.
//
// Activations are `Act`s: device memory of the backend's act_dtype() (F32 on
// the CPU; BF16 or F16 on a GPU), addressed in elements whatever their
// size, and images lie in the backend's layout() (NCHW on the CPU, NHWC on a
// GPU). A model never assumes either: it allocates act_dtype() elements,
// moves between layouts with relayout(), and converts at its edges with
// copy(). Parameters (norm weights, biases) are F32 device memory; matrices
// are WeightViews the backend prepared; metadata (ids, positions, slots,
// lengths) is int32 device memory.
//
// Pointers passed to the ops are device addresses: `Buffer::data()` plus an
// offset, of a buffer this backend allocated (or weights it prepared). On
// the CPU backend they are host memory, so host data (a mapped file, a
// std::vector) may be passed directly; a device backend would refuse that.
// Ops are issued in order on one stream; `synchronize()` waits for them, and
// `download` synchronizes first. Every op is batch-invariant: a row's result
// never depends on the other rows of the call, nor on the thread count.
#pragma once

#include <atelier/kernels.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace atelier::kernels {

class Backend;

// Where an image's elements lie: NCHW [n][c][h][w] (PyTorch's, the CPU
// kernels'), NHWC [n][h][w][c] (cuDNN's fast FP16 path; also token-major
// rows of c). Conv weights follow the layout: [c_out][c_in][kh][kw] for
// NCHW, [c_out][kh][kw][c_in] for NHWC (conv_weights_for).
enum class Layout : uint8_t { NCHW, NHWC };
const char* layout_name(Layout l);

// Device memory of activations: elements of one type (F32, F16 or BF16),
// addressed in elements whatever their size, so a model's offsets are the
// same on every device. An Act does not own its memory.
class Act {
 public:
  Act() = default;
  Act(void* p, DType t) : p_(static_cast<uint8_t*>(p)), t_(t) {}
  void* data() const { return p_; }
  DType type() const { return t_; }
  int64_t elem_bytes() const { return t_ == DType::F32 ? 4 : 2; }
  explicit operator bool() const { return p_ != nullptr; }
  Act operator+(int64_t elems) const { return Act(p_ + elems * elem_bytes(), t_); }
  Act& operator+=(int64_t elems) {
    p_ += elems * elem_bytes();
    return *this;
  }
  bool operator==(const Act& o) const { return p_ == o.p_ && t_ == o.t_; }
  // The elements as floats: for F32 activations only (an F32 kernel reading
  // them); anything else is a model's or backend's bug, thrown as such.
  float* f32() const {
    if (t_ != DType::F32 && p_) throw std::logic_error("an F32 op was handed activations of another type");
    return reinterpret_cast<float*>(p_);
  }

 private:
  uint8_t* p_ = nullptr;
  DType t_ = DType::F32;
};
// Bytes of n activations of type t (F32, F16, BF16).
inline int64_t act_bytes(DType t, int64_t n) { return n * (t == DType::F32 ? 4 : 2); }

// A conv's [c_out][c_in][kh][kw] weights (elements of w_type: F32, F16 or
// BF16) reordered for `layout` into dst (the same bytes): NCHW copies them,
// NHWC writes [c_out][kh][kw][c_in].
void conv_weights_for(Layout layout, DType w_type, const void* oihw, void* dst, int64_t c_out, int64_t c_in, int64_t kh,
                      int64_t kw);

// A block of device memory. The CPU backend's is 64-byte aligned host
// memory, uninitialised (pages are committed when first written).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;  // device address of byte 0
  virtual int64_t bytes() const = 0;
  template <class T>
  T* at(int64_t offset_bytes) {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(data()) + offset_bytes);
  }
};

struct DeviceInfo {
  std::string name;            // "cpu"
  std::string description;     // "x86-64, avx512, 2 threads"
  bool host_memory = true;     // buffers are host memory (no copies needed to read them)
  // Batch invariance, a capability each device states (ARCHITECTURE.md): a
  // row's result is bit for bit the same whatever other rows share the call
  // and however many threads run it, so the same request and seed give the
  // same output alone or in any batch. The CPU backend's every op keeps it
  // (the op suite checks it). A device whose fastest kernels cannot says
  // false, and keeps it only when asked to be deterministic.
  bool batch_invariant = true;
  DType act_dtype = DType::F32;   // Backend::act_dtype()
  // CUDA compute capability, major * 10 + minor (80 Ampere, 89 Ada, 90 Hopper):
  // what the precision policy (engine/src/text/precision.h) may use; 0 elsewhere.
  int compute_capability = 0;
  Layout layout = Layout::NCHW;   // Backend::layout()
};

// Where a KV cache's rows live: the slot s of layer l (s = block * block_tokens
// + offset) starts at base + (s / block_tokens) * block_stride_elems +
// l * layer_stride_elems + (s % block_tokens) * row_elems, for K at `k` and V
// at `v` (elements of `type`: F32 or F16). Within a block, consecutive slots
// are row_elems apart. A contiguous cache is one block of n_ctx slots.
// Q8_0 (half F16's bytes): the same element offsets, every one a multiple of
// 32, each row GGML's Q8_0 blocks, so offset e is byte e / 32 * 34 (Q8Rows,
// kernels.h); head_dim must be a multiple of 32.
struct KvLayout {
  DType type = DType::F32;
  void* k = nullptr;
  void* v = nullptr;
  int64_t row_elems = 0;  // n_head_kv * head_dim
  int block_tokens = 1;
  int64_t block_stride_elems = 0;
  int64_t layer_stride_elems = 0;
};

// Attention of `rows` query rows, each over its own sequence's cached
// positions 0..len-1 (paged: vLLM's paged attention; causal by construction).
// Device arrays (int32): row_len[r] positions (0: the row is skipped, its
// output untouched), row_table[r] the offset in block_tables of the row's
// block table (block ids, in position order). max_len >= every row_len.
// q, out: rows x n_head * head_dim. Grouped-query: head h reads KV head
// h / (n_head / n_head_kv). out = softmax(q k^T * scale) v, scores in f32.
struct PagedAttention {
  int64_t rows = 0;
  int n_head = 1, n_head_kv = 1;
  int64_t head_dim = 0;
  float scale = 1.0f;
  int layer = 0;
  int max_len = 0;
  // > 0: sliding-window attention (Mistral): a row of length len attends only
  // its last `window` positions, [max(0, len - window), len).
  int window = 0;
  // gpt-oss's attention sinks: n_head F32 logits (device memory), each
  // joining its head's softmax denominator (kernels::softmax_sink); nullptr: none.
  const float* sinks = nullptr;
  const int32_t* row_len = nullptr;
  const int32_t* row_table = nullptr;
  const int32_t* block_tables = nullptr;
};

// RoPE over rows: x is rows x n_heads * head_dim, row r rotated at position
// positions[r] (device int32). See kernels::rope for the pairing and theta.
struct RopeParams {
  int64_t n_heads = 1, head_dim = 0, rot_dim = 0;
  float freq_base = 10000.0f, freq_scale = 1.0f;
  bool neox = false;
  const float* freq_factors = nullptr;  // rot_dim / 2 divisors or nullptr
  const RopeYarn* yarn = nullptr;       // YaRN scaling (kernels.h) or nullptr
};

// See Backend::affine.
struct Affine {
  float add = 0.0f, mul = 1.0f, div = 1.0f;
  float lo = -INFINITY, hi = INFINITY;
};

struct Pad2d {
  int64_t top = 0, bottom = 0, left = 0, right = 0;
};

// One row's sampling parameters for Backend::sample (text::Sampler's rules,
// llama.cpp's order): penalties, then greedy (temperature <= 0: the first
// maximum, the lowest id) or top-k, top-p, min-p, temperature and the draw.
// The draw r is the caller's (a job's own seeded stream), so a job takes one
// draw per sampled token whichever side samples it.
struct SampleRow {
  double r = 0;                // uniform in [0, 1): the inverse CDF's point (unused when greedy)
  float temperature = 0;       // <= 0: greedy
  int32_t top_k = 0;           // <= 0 or >= n_vocab: every token
  float top_p = 1.0f;          // >= 1: off
  float min_p = 0.0f;          // <= 0: off
  float repeat_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  // The row's (token, count) penalty pairs: penalty_tokens[2 * (offset + i)]
  // is a token, [+ 1] its count in the recent window; ids outside the
  // vocabulary are skipped. Each token at most once (a device applies the
  // pairs in parallel).
  int32_t penalty_offset = 0, penalty_count = 0;
  int32_t skip = 0;            // nonzero: not sampled here (out_ids[r] = -1, the row untouched)
};
static_assert(sizeof(SampleRow) == 48, "SampleRow is uploaded as bytes: keep its layout");

// What a device computes the products of float matrices (F32 / F16 / BF16
// in the file) in: engine/src/text/precision.h's policy, handed to the
// backend before a model's weights are prepared (Backend::set_weight_precision).
// Quantized matrices the device reads as they are stay quantized whatever it says.
enum class WeightPrecision : uint8_t {
  bf16,      // BF16 products, FP32 accumulation (a GPU's default)
  fp16,      // FP16 products, FP32 accumulation
  fp8_e4m3,  // E4M3 with one f32 scale per row (DType::E4M3_ROWS), FP32 accumulation
};
const char* weight_precision_name(WeightPrecision p);  // "bf16", "fp16", "fp8-e4m3"

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceInfo device() const = 0;
  // The element type of activations and the layout of images on this device.
  virtual DType act_dtype() const { return DType::F32; }
  virtual Layout layout() const { return Layout::NCHW; }

  // ---- buffers
  // Throws std::bad_alloc when the device has no room.
  virtual std::unique_ptr<Buffer> alloc(int64_t bytes) = 0;
  virtual void upload(Buffer& dst, int64_t offset, const void* src, int64_t bytes) = 0;
  virtual void download(Buffer& src, int64_t offset, void* dst, int64_t bytes) = 0;
  virtual void synchronize() = 0;
  // Every byte of b set to value (ggml_backend_buffer_clear). A cache cleared
  // at creation commits its pages there, not in the first forward pass.
  virtual void clear(Buffer& b, uint8_t value = 0) = 0;
  // Makes bytes [offset, offset + bytes) of b resident now without changing
  // them, so that a lazily committed buffer (a KV pool: a GiB costs nothing
  // until used) does not fault its pages in inside a step. Safe to call from
  // another thread while ops read and write b, those bytes included. False
  // where it cannot (the pages are then committed on first touch, as before);
  // a device whose buffers are committed at alloc has nothing to do.
  virtual bool commit(Buffer& b, int64_t offset, int64_t bytes) {
    (void)b, (void)offset, (void)bytes;
    return true;
  }

  // ---- captured steps (CUDA graphs)
  // Runs `ops` (a sequence of this backend's ops) as one step named `key`.
  // A device may record the sequence the first times it sees a key (a CUDA
  // graph: stream capture, then instantiation) and afterwards replay the
  // recording instead of issuing the ops one by one. So the caller promises:
  // every run of one key issues the same ops with the same arguments
  // (pointers, shapes, scalars), whatever changes from step to step lies in
  // device memory (uploaded before run_step), and nothing inside allocates,
  // uploads, downloads or synchronizes. Keys are the caller's: a key must
  // name everything the ops' arguments depend on, and callers sharing a
  // backend keep their keys apart (new_graph_scope). The ops may not run at all on a
  // replay (their host code is skipped), so they must have no host side
  // effects. The default (the CPU) runs them.
  virtual void run_step(uint64_t key, const std::function<void()>& ops) {
    (void)key;
    ops();
  }
  // Forgets every recorded step: the memory they point into is about to be
  // freed or moved (a runner's workspace grows, a runner ends). A recording
  // that was dropped is recorded again when its key next comes.
  virtual void drop_graphs() {}

  // ---- weights
  // The precision of the float matrices prepare_weights / prepare_weights_at
  // (and prepared_weight_bytes) prepare from now on: call it before a model's
  // load (text::load_text_model does, from the job's PrecisionPlan). The CPU
  // keeps every matrix in its file's type and ignores it.
  virtual void set_weight_precision(WeightPrecision p) { (void)p; }
  // The view of w this device's matmul is fastest with. On the CPU:
  // kernels::pack_weights into a buffer stored in `storage` (Q8_0 on
  // AVX-512 VNNI), or w itself (storage left empty) when there is no better
  // layout. Prepare once at load, then use only the returned view (products
  // with a packed view are not bit-identical to the unpacked one's).
  virtual WeightView prepare_weights(const WeightView& w, std::unique_ptr<Buffer>& storage) = 0;
  // A model's matrices prepared into one buffer (as ggml keeps a model's
  // weights in one backend buffer): prepared_weight_bytes(w) bytes for each
  // (a 64-byte multiple), then prepare_weights_at writes that view at a
  // 64-byte aligned offset of dst and returns it. Here a matrix with no
  // better layout is copied as it is: on the CPU the buffer lies in 2 MiB
  // pages, which a token's pass over every weight reads faster than a file
  // mapping's 4 KiB pages. The products are those of prepare_weights' view.
  virtual int64_t prepared_weight_bytes(const WeightView& w) = 0;
  virtual WeightView prepare_weights_at(const WeightView& w, Buffer& dst, int64_t offset) = 0;

  // ---- synthetic weights (`bench text --synth 8B`: a model made on the device, no file)
  // Writes rows x cols elements of type t at byte `offset` of dst, a row every
  // dtype_row_bytes(t, cols) bytes: row r is scale * u_i, the u_i uniform in
  // [-1, 1) drawn in order from SplitMix64 seeded with seed + r (u = (next()
  // >> 11) * 2^-52 - 1, as atelier/splitmix.h), encoded by
  // kernels::quantize_row (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K). This
  // default draws on the host and uploads in pieces of about 64 MiB; a device
  // overrides it to draw in place (an 8B model in seconds). A benchmark needs
  // only the shapes and the distribution: an override need not be bit-exact.
  // Throws std::invalid_argument for a type without a quantizer or cols not a
  // multiple of its block.
  virtual void fill_random(Buffer& dst, int64_t offset, DType t, int64_t rows, int64_t cols, uint64_t seed, float scale);

  // ---- matrix products (every weight type of kernels::matmul)
  // y = x W^T, rows x W.rows; see kernels::matmul / matmul_many. y may be
  // F32 where x is not (logits: sampled in F32).
  virtual void matmul(const WeightView& w, Act x, Act y, int64_t rows) = 0;
  virtual void matmul_many(const WeightView* const* w, const Act* y, int count, Act x, int64_t rows) = 0;
  // y[r] = decoded row ids[r] of table (an embedding lookup), in any layout
  // prepare_weights returns; ids device int32.
  virtual void get_rows(const WeightView& table, const int32_t* ids, Act y, int64_t rows) = 0;
  // y[r] = x[ids[r]] for rows of dim elements (a gather).
  virtual void copy_rows(Act x, const int32_t* ids, Act y, int64_t rows, int64_t dim) = 0;

  // ---- norms over rows of dim elements (statistics in f32)
  virtual void rms_norm(Act x, const float* weight, Act y, int64_t rows, int64_t dim, float eps) = 0;
  // x += delta, then y = rms_norm(x) * weight (the residual and the next norm
  // in one pass); weight == nullptr: only the add.
  virtual void add_rms_norm(Act x, Act delta, const float* weight, Act y, int64_t rows, int64_t dim, float eps) = 0;
  virtual void layer_norm(Act x, Act y, int64_t rows, int64_t dim, const float* gamma, const float* beta,
                          float eps) = 0;
  // x, y: n images of c channels of hw pixels in the backend's layout; see
  // kernels::group_norm.
  virtual void group_norm(Act x, Act y, int64_t n, int64_t c, int64_t hw, int64_t groups, const float* gamma,
                          const float* beta, float eps, bool silu) = 0;

  // ---- element-wise
  virtual void rope(Act x, int64_t rows, const int32_t* positions, const RopeParams& p) = 0;
  // y = a + b over n elements (y may be a or b).
  virtual void add(Act a, Act b, Act y, int64_t n) = 0;
  // x[r] += bias for rows of dim elements (x: act_dtype() or F32 logits).
  virtual void add_bias(Act x, const float* bias, int64_t rows, int64_t dim) = 0;
  virtual void activation(Activation a, Act x, Act y, int64_t n) = 0;
  // out = silu(gate) * up, rows of dim elements (out may be gate).
  virtual void swiglu(Act gate, Act up, Act out, int64_t rows, int64_t dim) = 0;
  // out = act(gate) * up, rows of dim elements (out may be gate): Gemma's
  // gelu_tanh-gated feed-forward (see kernels::glu).
  virtual void glu(Activation a, Act gate, Act up, Act out, int64_t rows, int64_t dim) = 0;
  // x rows of 2*dim = [value | gate] -> y rows of dim = value * gelu(gate).
  virtual void geglu(Act x, Act y, int64_t rows, int64_t dim) = 0;
  // In-place softmax of rows of n elements.
  virtual void softmax(Act x, int64_t rows, int64_t n) = 0;
  // y = clamp(((x + add) * mul) / div, lo, hi) over n elements, each step
  // skipped where it is the identity (add 0, mul 1, div 1, infinite bounds),
  // so x passes bit for bit (-0 stays -0). y may be x.
  virtual void affine(Act x, Act y, int64_t n, const Affine& a) = 0;
  // y = max(x, 0) (nn.ReLU) and y = tanh(x / limit) * limit (TAESD's soft
  // clamp; Gemma's final logit soft-capping, so tanh_clamp also takes F32
  // activations, the logits, on any device), n elements; y may be x.
  virtual void relu(Act x, Act y, int64_t n) = 0;
  virtual void tanh_clamp(Act x, Act y, int64_t n, float limit) = 0;
  // y = x, n elements, converted between x's and y's types (F32, F16,
  // BF16: a model's edges, where host F32 meets the device's activations).
  virtual void copy(Act x, Act y, int64_t n) = 0;
  // Per image i < n and channel ch < c: every pixel of x += bias[i * c + ch]
  // (a per-sample, per-channel bias: the UNet's time embedding).
  virtual void add_channel_bias(Act x, Act bias, int64_t n, int64_t c, int64_t hw) = 0;
  // Per image i < n: y[i] = a[i]'s ca channels then b[i]'s cb (torch.cat along channels).
  virtual void concat_channels(Act a, int64_t ca, Act b, int64_t cb, Act y, int64_t n, int64_t hw) = 0;
  // See kernels::timestep_embedding; t: n device floats.
  virtual void timestep_embedding(const float* t, int64_t n, int64_t dim, Act out, bool flip_sin_to_cos = true,
                                  float downscale_freq_shift = 0.0f, float max_period = 10000.0f) = 0;
  // n images of c channels of hw pixels from layout `from` to layout `to`
  // (y != x; types may differ, as copy). NCHW -> NHWC is channels-first
  // planes to token-major rows (an attention block's way in); a model's
  // NCHW input enters the backend's layout by relayout(x, NCHW, y, layout()).
  virtual void relayout(Act x, Layout from, Act y, Layout to, int64_t n, int64_t c, int64_t hw) = 0;
  // n images of c channels, h x w -> (top + h + bottom) x (left + w + right), zeros around.
  virtual void pad2d(Act x, Act y, int64_t n, int64_t c, int64_t h, int64_t w, const Pad2d& p) = 0;

  // ---- mixture of experts (llama.cpp's build_moe_ffn; ggml's mul_mat_id)
  // Each row of logits (rows x r.n_expert; F32 or act_dtype()) routed to its
  // r.k experts (kernels::moe_route): ids (int32) and weights (F32), device
  // arrays of rows * r.k.
  virtual void moe_route(Act logits, int64_t rows, const MoeRouting& r, int32_t* ids, float* weights) = 0;
  // kernels::matmul_id: each expert's matrix run once over the rows routed to
  // it. experts[i]: a host array of n_expert views this backend prepared (one
  // type, width and layout); y[i]: rows * k rows of experts[i][0].rows; bias[i]:
  // nullptr or n_expert x experts[i][0].rows F32 device floats; ids: device
  // int32 (rows * k). x_per_row 1: row r feeds its k slots; k: slot r * k + j
  // reads row r * k + j. Each slot's row is what a one-row matmul gives it.
  virtual void matmul_id(const WeightView* const* experts, const Act* y, const float* const* bias, int count,
                         int n_expert, Act x, int x_per_row, const int32_t* ids, int64_t rows, int k) = 0;
  // out[r] = sum_j weights[r * k + j] * y[r * k + j], rows of dim (kernels::moe_combine).
  virtual void moe_combine(Act y, const float* weights, Act out, int64_t rows, int k, int64_t dim) = 0;
  // gpt-oss's clamped SwiGLU (kernels::swiglu_oai), rows of dim; out may be gate.
  virtual void swiglu_oai(Act gate, Act up, Act out, int64_t rows, int64_t dim, float alpha, float limit) = 0;

  // ---- sampling (issue 33)
  // One token per row of F32 logits (rows x n_vocab) by params[r] (device
  // array), with penalty pairs from penalty_tokens (device int32), into
  // out_ids (device int32; -1 for a skipped row). The rows sampled are
  // modified in place (penalties applied; the rest is scratch). The
  // selection rules are sample_ref's (text::Sampler's); a device's floating
  // point may differ from it only where rounding puts two tokens at a
  // boundary (a cumulative probability at top_p or r, a probability at the
  // min-p threshold), and it keeps its own determinism: the same logits,
  // params and r give the same token whatever else shares the call.
  virtual void sample(Act logits, int64_t rows, int n_vocab, const SampleRow* params, const int32_t* penalty_tokens,
                      int32_t* out_ids) = 0;

  // ---- KV and attention
  // Stores row r of k and v (rows x kv.row_elems) at slot slots[r] of
  // `layer` (device int32; -1 skips the row: a shared prefix block already
  // holds it, or the row belongs to another cache), converted to kv.type.
  virtual void store_kv(const KvLayout& kv, int layer, Act k, Act v, const int32_t* slots, int64_t rows) = 0;
  // rope(q, rq), rope(k, rk), then store_kv(k, v) in one pass over the rows
  // (as llama.cpp's CUDA backend fuses ROPE with SET_ROWS): bit for bit the
  // three ops, one split over the threads instead of three.
  virtual void rope_store_kv(Act q, Act k, Act v, int64_t rows, const int32_t* positions, const RopeParams& rq,
                             const RopeParams& rk, const KvLayout& kv, int layer, const int32_t* slots) = 0;
  virtual void paged_attention(const KvLayout& kv, const PagedAttention& a, Act q, Act out) = 0;
  // Unmasked multi-head attention over token-major q, k, v (image models).
  virtual void attention(const AttentionShape& s, Act q, Act k, Act v, Act out) = 0;
  // Causal self-attention (position i sees 0..i; a text encoder's mask) of
  // s.batch sequences of s.lq == s.lk tokens: q, k, v token-major rows
  // `stride` elements apart (a fused qkv projection: q at 0, k at width, v
  // at 2 * width, stride 3 * width), sequences lq * stride apart; out:
  // s.batch x lq x heads * head_dim. Scores in f32; scale <= 0 means
  // 1/sqrt(head_dim).
  virtual void causal_attention(const AttentionShape& s, Act q, Act k, Act v, int64_t stride, Act out) = 0;

  // ---- images (the backend's layout)
  // weight: conv_weights_for(layout(), ...) of w_type; bias F32 or nullptr.
  virtual void conv2d(const Conv2dShape& s, Act x, DType w_type, const void* weight, const float* bias, Act y) = 0;
  virtual void upsample_nearest2x(Act x, Act y, int64_t n, int64_t c, int64_t h, int64_t w) = 0;
};

// A number no other call returns in this process: a caller of
// Backend::run_step puts it in its keys (scope << 32 | the caller's own
// step number), so two callers sharing a backend never name the same step,
// nor does a caller name a step of one that ended before it.
uint64_t new_graph_scope();

// A device's memory, as a runner admits models and jobs against it.
struct DeviceMemory {
  int64_t total_bytes = 0;     // the device's memory (the machine's RAM for the CPU)
  int64_t free_bytes = 0;      // free now (the kernel's MemAvailable; cudaMemGetInfo on a GPU)
  int64_t reserved_bytes = 0;  // held back for the driver and libraries' workspaces, never admitted
};

// A device's sensors, where it has them (NVML on an NVIDIA GPU): what
// `atelier metrics`, /metrics and the engine monitor show beside memory.
struct DeviceTelemetry {
  bool available = false;          // false: the device has no sensors (the CPU) or they cannot be read
  double utilization_percent = 0;  // share of the last sample period a kernel ran
  double temperature_c = 0;
  int64_t memory_used_bytes = 0, memory_total_bytes = 0;
};

// One device apart from its streams (issue 32): its memory, and a backend
// per lane (text, image), each on a stream of its own with its own priority.
// Buffers and prepared weights of one backend of a device are usable by every
// other backend of the same device, so each model is on the device once.
class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceInfo info() const = 0;
  virtual DeviceMemory memory() const = 0;
  // A backend on a stream of its own. `ex`: the host threads a CPU backend
  // splits ops over (their OS priority is the lane's there); `priority`:
  // higher runs first where the device orders streams (CUDA stream priorities).
  virtual std::unique_ptr<Backend> make_backend(Executor* ex = nullptr, int priority = 0) = 0;
  virtual DeviceTelemetry telemetry() const { return {}; }
};

// The host as a device: its backends are make_cpu_backend's, its memory the
// machine's (/proc/meminfo: MemTotal, MemAvailable), nothing reserved.
Device& cpu_device();

// The CPU backend: today's kernels at this CPU's SIMD level, split over `ex`
// (nullptr: the calling thread). Bit for bit what calling them directly does.
std::unique_ptr<Backend> make_cpu_backend(Executor* ex = nullptr);
// A process-wide CPU backend without an executor: the default for loaders
// (preparing weights needs no threads). CPU backends share host memory, so
// weights prepared by one are usable by any other.
Backend& default_cpu_backend();

// ---- plain references of the backend-level ops (one thread, simple loops),
// for the op suite. The others' references are the kernels' *_ref.
void store_kv_ref(const KvLayout& kv, int layer, const float* k, const float* v, const int32_t* slots, int64_t rows);
// Sums in double, softmax in double.
void causal_attention_ref(const AttentionShape& s, const float* q, const float* k, const float* v, int64_t stride,
                          float* out);
void paged_attention_ref(const KvLayout& kv, const PagedAttention& a, const float* q, float* out);
// Backend::sample in plain loops, on host arrays: text::Sampler's arithmetic
// (candidates sorted by logit, ties to the lower id; softmax with expf and a
// double sum in that order; cumulative sums in double), so with the same r
// it picks the Sampler's token. logits are modified in place.
void sample_ref(float* logits, int64_t rows, int n_vocab, const SampleRow* params, const int32_t* penalty_tokens,
                int32_t* out_ids);

}  // namespace atelier::kernels
