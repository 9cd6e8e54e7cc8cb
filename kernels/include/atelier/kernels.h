// atelier/kernels.h — the one public header of the kernels layer.
//
// Compute primitives on raw buffers. Knows nothing of models or jobs.
// Every op has one entry point here; the CPU implementation picks the widest
// SIMD variant this CPU supports at run time (AVX-512, AVX2, scalar), and a
// plain scalar reference sits beside it (`*_ref`) for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

namespace atelier::kernels {

// Tensor element types, numbered as GGML numbers them so GGUF type ids map 1:1.
enum class DType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
  // OCP microscaling FP4 (gpt-oss's experts): blocks of 32 values, one E8M0
  // scale byte (2^(e - 127)) then 16 bytes of 4-bit E2M1 codes (low nibbles
  // the first 16 values, high nibbles the next 16), as GGML's block_mxfp4.
  MXFP4 = 39,
  // Device-only (never in a file: dtype_known is false for it): FP8 E4M3
  // with one f32 scale per row (--precision fp8, the CUDA module's matrices).
  // A row of n elements (n a multiple of 16) is 16 bytes, the scale (f32)
  // then 12 zero bytes, followed by n E4M3 codes (OCP FP8: 1-4-3, bias 7,
  // largest finite 448, 0x7f / 0xff NaN); element i = scale * e4m3(code i).
  // quantize_row picks scale = max |x| / 448 (1 for an all-zero row) and
  // rounds to nearest even, saturating.
  E4M3_ROWS = 1000,
  // Device-only: OCP MXFP8 (E4M3), the fp8 KV cache (--kv-type fp8): blocks
  // of 32 values, one E8M0 scale byte s (2^(s - 127); 255 is NaN) then 32
  // E4M3 codes, 33 bytes; element i = e4m3(code i) * 2^(s - 127).
  // quantize_row picks the smallest s with max |x| <= 448 * 2^(s - 127)
  // (never clipping the block's largest value: large K rows keep their
  // magnitude; s = 0 for an all-zero block), then rounds each x * 2^(127 - s)
  // to nearest even, saturating (an infinity becomes +-448, NaN stays NaN).
  MXFP8 = 1001,
};

// Whether `id` is a DType this library can read (dequantize).
bool dtype_known(uint32_t id);
std::string_view dtype_name(DType t);             // "f32", "q4_K", ... as GGML spells them
int64_t dtype_block_elems(DType t);                // elements per block (1 for F32/F16/BF16)
int64_t dtype_block_bytes(DType t);                // bytes per block
// Bytes of a row of n elements; n must be a multiple of the block size
// (returns -1 otherwise, so callers can report a clear error).
int64_t dtype_row_bytes(DType t, int64_t n);

// Bytes of E4M3_ROWS' per-row header (its f32 scale, padded to 16).
constexpr int64_t kE4M3RowHeaderBytes = 16;
// MXFP8's block: 32 values in 33 bytes (the E8M0 scale, then the codes).
constexpr int64_t kMxfp8BlockElems = 32, kMxfp8BlockBytes = 33;
// The E8M0 scale byte of an MXFP8 block whose largest finite magnitude is
// amax (see DType::MXFP8), and its value 2^(s - 127) (NaN for 255).
uint8_t mxfp8_scale_byte(float amax);
float e8m0_to_f32(uint8_t s);

// fp16 / bf16 scalar conversions (round to nearest even); FP8 E4M3 (OCP),
// saturating to +-448 (NaN stays NaN).
float e4m3_to_f32(uint8_t c);
uint8_t f32_to_e4m3(float f);
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

// Decode n elements (a multiple of the block size) of type t into floats.
// The scalar reference; the definition of each format.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Encode n floats as type t. Supported for every type dequantize_row reads;
// returns false for a type that has no quantizer.
bool quantize_row(DType t, const float* src, void* dst, int64_t n);

// Where multi-threaded kernels run their slices. The engine's thread pool
// implements it; nullptr means "run on the calling thread".
class Executor {
 public:
  virtual ~Executor() = default;
  virtual int threads() const = 0;
  // Calls fn(begin, end) on disjoint ranges that cover [0, n); returns when all are done.
  virtual void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) = 0;
};

// Which SIMD level the dispatcher uses: "avx512", "avx2" or "scalar".
// ATELIER_SIMD=scalar|avx2|avx512 in the environment caps it (for tests and comparisons).
std::string_view simd_level();

// How a weight matrix's bytes are laid out.
//   rows:    GGML's layout, W[row][col] row after row, row_stride_bytes apart.
//   q8_0x16: Q8_0 re-laid out by pack_weights for the AVX-512 VNNI tile: per
//            group of 16 rows (the last one padded with zero rows), each
//            block's 16 x 32 quants interleaved 4 bytes per row (one 512-bit
//            register holds 4 columns of all 16 rows) and stored as q + 128,
//            then the group's fp16 scales; row_stride_bytes is the stride of
//            one group.
//   q8_0x8:  the same for the AVX2 tile: groups of 8 rows (one 256-bit
//            register holds 4 columns of all 8 rows), quants stored as q.
//   q4_0x16, q4_0x8: Q4_0 likewise (AVX-512 VNNI, AVX2): 4 of GGML's nibble
//            bytes per row in turn, then the scales.
//   q4_Kx16, q6_Kx16, q4_Kx8: Q4_K and Q6_K likewise (AVX-512 VNNI), Q4_K
//            for AVX2, the scales (and Q4_K's mins) unpacked to bytes.
//   f32x16, f16x16: F32 / F16 for the AVX-512 outer-product tile: per group
//            of 16 rows, column k of the 16 rows side by side (one register),
//            column after column; f16x8, f32x8: the same for AVX2, 8 rows.
enum class WeightLayout : uint8_t { rows, q8_0x16, q8_0x8, q4_0x16, q4_0x8, q4_Kx16, q6_Kx16, q4_Kx8, f32x16, f16x16, f16x8, f32x8 };

// A weight matrix: `rows` rows of `cols` elements of type `type`, each row
// `row_stride_bytes` apart (GGML layout: W[row][col], ne0 = cols).
struct WeightView {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride_bytes = 0;
  WeightLayout layout = WeightLayout::rows;
};

// Re-laying out weights once at load for this CPU's fastest tile (today:
// Q8_0 on AVX-512 with VNNI, where the packed tile does one multiply-add
// instruction per 64 products instead of three, and needs no horizontal sums;
// Q8_0 on AVX2, where each block's float scaling is done for 8 rows at once
// and the integer sums need no horizontal adds either; Q4_0 and Q4_K on
// both; Q6_K and F32 on AVX-512; F16 on both).
// packed_weight_bytes: bytes of the packed copy of w, or 0 when w is best used
// as it is (other types, other SIMD levels). pack_weights writes it to dst
// (64-byte aligned) and returns its view, which every matmul entry accepts
// (at a lower SIMD level through the scalar path). Products with the packed
// view are batch- and thread-invariant like any other, but not bit-identical
// to the unpacked view's: pack at load, then use only the packed view.
int64_t packed_weight_bytes(const WeightView& w);
WeightView pack_weights(const WeightView& w, void* dst);
// Bytes of w's own elements as GGML stores them (rows x the row's blocks),
// whatever its layout: the size a model reports.
int64_t weight_bytes(const WeightView& w);
// Row r of w decoded to w.cols floats, whatever its layout (a packed view's
// row is unpacked first): an embedding lookup in a table tied to a packed
// output matrix, so the table's unpacked copy need not stay resident.
void dequantize_weight_row(const WeightView& w, int64_t r, float* out);

// y[m][r] = sum_c x[m][c] * W[r][c]  for m < n_x_rows, r < W.rows.
// x: n_x_rows rows of W.cols floats (contiguous); y: n_x_rows rows of W.rows floats.
// Supported weight types: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K (others: dequantize first).
// Batch-invariant: row m of y is bit-identical whatever n_x_rows is and
// however the work is split over threads.
void matmul(const WeightView& w, const float* x, float* y, int64_t n_x_rows, Executor* ex = nullptr);
// The products of one x with several matrices (a layer's Q, K and V; gate
// and up): bit for bit one matmul per matrix, y[i] = x W[i]^T, but when the
// matrices share type, width and layout the activations are quantized once
// and all the matrices' rows are split over the threads in one pass.
void matmul_many(const WeightView* const* w, float* const* y, int count, const float* x, int64_t n_x_rows,
                 Executor* ex = nullptr);
// Plain scalar reference with the same contract (same activation
// quantization, simple loops).
void matmul_ref(const WeightView& w, const float* x, float* y, int64_t n_x_rows);
bool matmul_supports(DType t);

// y = x / sqrt(mean(x^2) + eps) * weight, n elements.
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);
void rms_norm_ref(const float* x, const float* weight, float* y, int64_t n, float eps);

// In-place numerically stable softmax of n floats.
void softmax(float* x, int64_t n);
void softmax_ref(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i]
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void swiglu_ref(const float* gate, const float* up, float* out, int64_t n);

// gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai): with g = min(gate, limit)
// and u = clamp(up, -limit, limit), out = g * sigmoid(alpha * g) * (u + 1).
// gpt-oss: alpha 1.702, limit 7.
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit);
void swiglu_oai_ref(const float* gate, const float* up, float* out, int64_t n, float alpha, float limit);

// Softmax of n scores with an attention sink (gpt-oss): a learned logit
// `sink` that joins the denominator and takes no value,
//   x_i = exp(x_i - m) / (sum_j exp(x_j - m) + exp(sink - m)),  m = max(max x, sink)
// (ggml's soft_max with sinks).
void softmax_sink(float* x, int64_t n, float sink);
void softmax_sink_ref(float* x, int64_t n, float sink);

// ---- mixture of experts (llama.cpp's build_moe_ffn) --------------------------
// Routing of one token over n_expert router logits to its k experts:
//   softmax:         p = softmax(logits); the k largest p; w = those p
//                    (Mixtral, Qwen3-MoE)
//   sigmoid:         p = sigmoid(logits); the k largest p; w = those p
//   softmax_weights: the k largest logits; w = softmax over those k (gpt-oss)
// then, with norm, w /= max(sum w, 2^-14) (llama.cpp's clamp), and w *= scale
// unless scale is 0 or 1. ids in descending order of the selection values, a
// tie going to the lower expert. ids, weights: k each.
enum class MoeGating : uint8_t { softmax, sigmoid, softmax_weights };
struct MoeRouting {
  int n_expert = 0, k = 0;
  MoeGating gating = MoeGating::softmax;
  bool norm = false;
  float scale = 1.0f;
};
void moe_route(const float* logits, const MoeRouting& r, int32_t* ids, float* weights);
void moe_route_ref(const float* logits, const MoeRouting& r, int32_t* ids, float* weights);

// The experts' products of a step, each expert's matrix run once over the
// rows routed to it (ggml's mul_mat_id): for r < rows, j < k, e = ids[r * k + j],
//   y[i][r * k + j] = x_row(r, j) W_i[e]^T  (+ bias[i][e * W_i[e].rows ...] when bias[i])
// where x_row(r, j) is x's row r when x_per_row is 1 (every expert of a token
// reads its input: gate and up) or row r * k + j when it is k (each slot its
// own input: down). experts[i] points to n_expert views of one type, width and
// layout (an expert's slice of a 3-D GGUF tensor, prepared like any matrix).
// A slot whose id is outside [0, n_expert) is left untouched. Bit for bit
// what one matmul per (r, j) row gives (the tiles are batch-invariant), so a
// token's result never depends on the others routed with it nor on threads.
// Several sets (count: gate and up) share one routing and one activation
// quantization per expert, and one split over the threads.
void matmul_id(const WeightView* const* experts, float* const* y, const float* const* bias, int count, int n_expert,
               const float* x, int x_per_row, const int32_t* ids, int64_t rows, int k, Executor* ex = nullptr);
void matmul_id_ref(const WeightView* const* experts, float* const* y, const float* const* bias, int count,
                   int n_expert, const float* x, int x_per_row, const int32_t* ids, int64_t rows, int k);

// out[r] = sum over j < k, in order, of weights[r * k + j] * y[r * k + j]
// (rows of dim), each product rounded before its add (ggml's mul then adds).
void moe_combine(const float* y, const float* weights, float* out, int64_t rows, int k, int64_t dim);
void moe_combine_ref(const float* y, const float* weights, float* out, int64_t rows, int k, int64_t dim);

// Rotary position embedding, in place, on n_heads heads of head_dim floats each
// (contiguous). Rotates the first rot_dim dims of every head.
//   neox = false: pairs (2i, 2i+1)          (LLaMA / GGML "normal")
//   neox = true:  pairs (i, i + rot_dim/2)  (GPT-NeoX, Qwen2, ...)
// theta_i = pos * freq_scale * base^(-2i/rot_dim) / freq_factors[i]
// freq_factors: rot_dim/2 per-pair divisors (Llama 3.1's rope_freqs), or nullptr for none.
// YaRN context extension (Peng et al. 2023, arXiv 2309.00071; GGUF
// rope.scaling.type "yarn"). With ext_factor > 0, pair i's angle mixes the
// extrapolated theta_e = pos * base^(-2i/rot_dim) and the interpolated
// freq_scale * theta_e by a ramp over the pairs: pairs that turn more than
// beta_fast times over the original context (i <= low) keep theta_e, those
// turning fewer than beta_slow times (i >= high) take freq_scale * theta_e,
// linear in between, where a pair turning b times sits at
//   d(b) = rot_dim * ln(n_ctx_orig / (2 pi b)) / (2 ln base),
//   low = max(0, floor(d(beta_fast))), high = min(rot_dim - 1, ceil(d(beta_slow))).
// cos and sin are scaled by attn_factor * (1 + 0.1 ln(1 / freq_scale)).
struct RopeYarn {
  float ext_factor = 1.0f;   // 0: plain interpolation (as no YaRN) but attn_factor still applies
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  int n_ctx_orig = 0;        // the context the model was trained with before scaling
  bool operator==(const RopeYarn&) const = default;
};

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, int64_t pos,
          float freq_base, float freq_scale, bool neox, const float* freq_factors = nullptr,
          const RopeYarn* yarn = nullptr);
void rope_ref(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, int64_t pos,
              float freq_base, float freq_scale, bool neox, const float* freq_factors = nullptr,
              const RopeYarn* yarn = nullptr);

// sum_i a[i] * b[i] over n floats; fixed accumulation order for a given n.
float dot_f32(const float* a, const float* b, int64_t n);
// y[i] += a * x[i]
void axpy_f32(float a, const float* x, float* y, int64_t n);
// The same with one operand stored as fp16 (an F16 KV cache).
float dot_f16_f32(const uint16_t* a, const float* b, int64_t n);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);
// Attention over a run of n_rows cached positions (contiguous rows of a KV
// cache), stride_elems apart; a row holds every KV head, head_dim elements
// each. Query heads h0 <= h < h1 read KV head h / group (grouped-query
// attention). Per head, and per row, exactly the arithmetic of a run of one
// row and one head, bit for bit, whatever n_rows, h0 and h1 are (so how the
// cache splits positions into runs, and the heads into tasks, never matters):
//   scores[(h - h0) * scores_stride + r] = dot_*(row r's head h / group, q + h * head_dim)
//   y[h * head_dim + i] += a[(h - h0) * a_stride + r] * row r's head h / group [i],
//     for r = 0, 1, ... in order, each step rounded as axpy_* rounds it.
// The AVX-512 level walks the run position by position for all the heads, so
// each cached row streams through once, in address order.
struct AttnHeads {
  int h0 = 0, h1 = 1, group = 1;
  int64_t head_dim = 0;
};
void dot_f32_heads(const float* rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, const float* q,
                   float* scores, int64_t scores_stride);
void dot_f16_heads(const uint16_t* rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, const float* q,
                   float* scores, int64_t scores_stride);
// A run of Q8_0 cache rows (a KvLayout of type Q8_0): GGML's blocks of 32
// values (an fp16 scale d, then 32 int8 q), element e of the run in block
// e / 32 from `blocks`, worth fp16(d) * q (exact in f32: 11 x 8 bits). The
// q8_0 ops need stride_elems and head_dim to be multiples of 32 (a head is
// whole blocks; KvLayout requires it). Half the bytes of F16 rows, as
// llama.cpp's `-ctk q8_0 -ctv q8_0`.
struct Q8Rows {
  const uint8_t* blocks = nullptr;
  int64_t elem = 0;
};
constexpr int64_t kQ8BlockElems = 32, kQ8BlockBytes = 34;
inline Q8Rows operator+(Q8Rows p, int64_t elems) { return {p.blocks, p.elem + elems}; }
// The same ops over Q8_0 rows: each value read is the f32 dequantized value,
// so every result is the F32 op's on a run holding those values, bit for bit.
void dot_q8_0_heads(Q8Rows rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, const float* q,
                    float* scores, int64_t scores_stride);
void axpy_q8_0_heads(const float* a, int64_t a_stride, Q8Rows rows, int64_t stride_elems, int64_t n_rows,
                     const AttnHeads& heads, float* y);
void dot_q8_0_heads_ref(Q8Rows rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, const float* q,
                        float* scores, int64_t scores_stride);
void axpy_q8_0_heads_ref(const float* a, int64_t a_stride, Q8Rows rows, int64_t stride_elems, int64_t n_rows,
                         const AttnHeads& heads, float* y);
// Up to kAttnQueries queries against the same run (a prompt's rows that
// attend the same positions): for each j < n_queries, exactly
// dot_*_heads(rows, stride_elems, n_rows, heads, q[j], scores[j], scores_stride[j]),
// bit for bit, with each cached row read once for all of them.
constexpr int kAttnQueries = 8;
void dot_f32_heads_queries(const float* rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads,
                           int n_queries, const float* const* q, float* const* scores, const int64_t* scores_stride);
void dot_f16_heads_queries(const uint16_t* rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads,
                           int n_queries, const float* const* q, float* const* scores, const int64_t* scores_stride);
void dot_q8_0_heads_queries(Q8Rows rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, int n_queries,
                            const float* const* q, float* const* scores, const int64_t* scores_stride);
void axpy_f32_heads(const float* a, int64_t a_stride, const float* rows, int64_t stride_elems, int64_t n_rows,
                    const AttnHeads& heads, float* y);
void axpy_f16_heads(const float* a, int64_t a_stride, const uint16_t* rows, int64_t stride_elems, int64_t n_rows,
                    const AttnHeads& heads, float* y);
// Up to kAttnQueries rows' value sums over the same run (a prompt's rows that
// attend the same positions): for each j < n_queries, exactly
// axpy_*_heads(a[j], a_stride[j], rows, stride_elems, n_rows, heads, y[j]),
// bit for bit, with each cached value loaded once for several rows.
void axpy_f32_heads_queries(int n_queries, const float* const* a, const int64_t* a_stride, const float* rows,
                            int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, float* const* y);
void axpy_f16_heads_queries(int n_queries, const float* const* a, const int64_t* a_stride, const uint16_t* rows,
                            int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, float* const* y);
void axpy_q8_0_heads_queries(int n_queries, const float* const* a, const int64_t* a_stride, Q8Rows rows,
                             int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, float* const* y);
// Plain loops of the scalar one-row ops (the scalar level's arithmetic).
void dot_f32_heads_ref(const float* rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads, const float* q,
                       float* scores, int64_t scores_stride);
void dot_f16_heads_ref(const uint16_t* rows, int64_t stride_elems, int64_t n_rows, const AttnHeads& heads,
                       const float* q, float* scores, int64_t scores_stride);
void axpy_f32_heads_ref(const float* a, int64_t a_stride, const float* rows, int64_t stride_elems, int64_t n_rows,
                        const AttnHeads& heads, float* y);
void axpy_f16_heads_ref(const float* a, int64_t a_stride, const uint16_t* rows, int64_t stride_elems, int64_t n_rows,
                        const AttnHeads& heads, float* y);
// The indices i < n with x[i] >= bound (never a NaN), ascending, into idx
// (room for n); returns how many. A sampler's scan for top-k candidates.
int64_t indices_at_least(const float* x, int64_t n, float bound, int32_t* idx);
int64_t indices_at_least_ref(const float* x, int64_t n, float bound, int32_t* idx);
// fp16 <-> f32 arrays.
void f32_to_fp16_row(const float* x, uint16_t* y, int64_t n);
void fp16_to_f32_row(const uint16_t* x, float* y, int64_t n);

// Physical limits of this machine, measured now (cpu/roofline.cpp), so that
// benchmarks can report achieved figures against them in the same run.
// Streaming read bandwidth over a buffer much larger than the caches, GB/s.
double measure_memory_bandwidth_gb_per_s(Executor* ex = nullptr, int64_t bytes = int64_t{512} << 20);
// Peak fp32 FMA throughput at the active SIMD level, GFLOP/s (2 flops per FMA lane).
double measure_peak_gflop_per_s(Executor* ex = nullptr);
// Peak int8 dot-product throughput of the integer matmul tiles' instruction
// at the active SIMD level (AVX-512 VNNI dpbusd; AVX2 maddubs + madd + add),
// in GOP/s (2 ops per multiply-add), all threads; the scalar level has no
// int8 instruction and reports its FMA peak.
double measure_peak_int8_gop_per_s(Executor* ex = nullptr);

// ---- image-model ops (f32 activations, NCHW) --------------------------------
// Each has a plain reference (`*_ref`: simple loops, sums in double, one
// thread) that the tests compare against. `ex` splits the work over threads;
// results do not depend on the number of threads.

// 2-D convolution, PyTorch Conv2d semantics (cross-correlation, zero padding,
// groups = 1). x: [n][c_in][h][w]; weight: [c_out][c_in][kh][kw] of type
// w_type (F32, F16 or BF16); bias: c_out floats or nullptr;
// y: [n][c_out][out_h()][out_w()].
struct Conv2dShape {
  int64_t n = 1, c_in = 0, h = 0, w = 0;
  int64_t c_out = 0, kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t out_h() const { return (h + 2 * pad_h - kh) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - kw) / stride_w + 1; }
  bool valid() const;
};
void conv2d(const Conv2dShape& s, const float* x, DType w_type, const void* weight, const float* bias, float* y,
            Executor* ex = nullptr);
void conv2d_ref(const Conv2dShape& s, const float* x, DType w_type, const void* weight, const float* bias, float* y);

// Group normalization (PyTorch GroupNorm): x, y: [n][c][hw]; channels split
// into `groups` equal groups; mean and biased variance over each group's
// (c/groups) * hw values; y = (x - mean) / sqrt(var + eps) * gamma[c] + beta[c]
// (gamma/beta may be nullptr: 1 and 0). silu = true applies SiLU afterwards
// (the norm-then-SiLU pair of every SD ResNet block). y may equal x.
void group_norm(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t groups, const float* gamma,
                const float* beta, float eps, bool silu, Executor* ex = nullptr);
void group_norm_ref(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t groups, const float* gamma,
                    const float* beta, float eps, bool silu);

// Layer normalization over the last dimension: rows of `dim` floats,
// y = (x - mean) / sqrt(var + eps) * gamma + beta (gamma/beta may be nullptr).
// y may equal x.
void layer_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* gamma, const float* beta, float eps,
                Executor* ex = nullptr);
void layer_norm_ref(const float* x, float* y, int64_t rows, int64_t dim, const float* gamma, const float* beta,
                    float eps);

// Element-wise activations, y may equal x.
//   silu(x) = x / (1 + exp(-x))
//   gelu(x) = x/2 (1 + erf(x / sqrt 2))                       (nn.GELU())
//   gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GELU(approximate="tanh"))
//   quick_gelu(x) = x / (1 + exp(-1.702 x))                    (OpenAI CLIP, SD 1.x's text encoder)
enum class Activation { silu, gelu, gelu_tanh, quick_gelu };
void activation(Activation a, const float* x, float* y, int64_t n, Executor* ex = nullptr);
void activation_ref(Activation a, const float* x, float* y, int64_t n);

// GEGLU as in SD's transformer feed-forward (diffusers GEGLU, ldm GEGLU):
// x: rows of 2*dim floats = [value | gate] (the projection's output split in
// two halves along the last dimension); y: rows of dim floats,
// y = value * gelu(gate) with the erf GELU.
void geglu(const float* x, float* y, int64_t rows, int64_t dim, Executor* ex = nullptr);
void geglu_ref(const float* x, float* y, int64_t rows, int64_t dim);

// A gated linear unit over one row of n floats: out = act(gate) * up, the
// activation as `activation` computes it (Gemma's feed-forward is
// gelu_tanh(gate) * up; silu gives swiglu). out may be gate or up.
void glu(Activation a, const float* gate, const float* up, float* out, int64_t n);
void glu_ref(Activation a, const float* gate, const float* up, float* out, int64_t n);

// Nearest-neighbour 2x upsampling (nn.Upsample(scale_factor=2)):
// x: [planes][h][w] -> y: [planes][2h][2w].
void upsample_nearest2x(const float* x, float* y, int64_t planes, int64_t h, int64_t w, Executor* ex = nullptr);
void upsample_nearest2x_ref(const float* x, float* y, int64_t planes, int64_t h, int64_t w);

// Scaled dot-product attention, multi-head, no mask, f32 throughout (scores
// and softmax in f32). Token-major layouts, as linear projections produce
// them: q: [batch][lq][heads * head_dim], k and v: [batch][lk][heads * head_dim],
// out: [batch][lq][heads * head_dim]; head h uses columns [h*head_dim, (h+1)*head_dim).
// out = softmax(q k^T * scale) v per head; scale <= 0 means 1/sqrt(head_dim).
// Blocked (flash-style online softmax over key blocks): memory is
// O(block * lk), never lq x lk, so 4096 x 4096 self-attention stays small.
struct AttentionShape {
  int64_t batch = 1, heads = 1, lq = 0, lk = 0, head_dim = 0;
  float scale = 0;
};
void attention(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
               Executor* ex = nullptr);
void attention_ref(const AttentionShape& s, const float* q, const float* k, const float* v, float* out);

// Sinusoidal timestep embedding (ldm `timestep_embedding`, diffusers
// `get_timestep_embedding`): for i < half = dim/2,
//   freq_i = exp(-ln(max_period) * i / (half - downscale_freq_shift)),
//   arg_i = t * freq_i,
// out = [cos(arg) | sin(arg)] when flip_sin_to_cos (SD 1.x/2.x UNets: ldm's
// order, diffusers flip_sin_to_cos=True, freq_shift=0), else [sin | cos];
// an odd dim gets a trailing zero. out: n_t rows of dim floats. Computed in
// f32 as torch does.
void timestep_embedding(const float* t, int64_t n_t, int64_t dim, float* out, bool flip_sin_to_cos = true,
                        float downscale_freq_shift = 0.0f, float max_period = 10000.0f);

}  // namespace atelier::kernels
