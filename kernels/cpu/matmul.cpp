// matmul: activation quantization, threading and SIMD dispatch; the scalar
// kernels (one dot per (m, r), also used by matmul_ref).
#include <atelier/kernels.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "matmul_internal.h"
#include "ops_internal.h"
#include "quants.h"
#include "simd.h"

namespace atelier::kernels {

using namespace cpu;

namespace {

ActKind act_kind(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::MXFP4: return ActKind::q8_0;
    case DType::Q4_K:
    case DType::Q6_K: return ActKind::q8_K;
    default: return ActKind::f32;
  }
}

int64_t act_row_bytes(ActKind k, int64_t cols) {
  switch (k) {
    case ActKind::q8_0: return cols / kQK * int64_t(sizeof(ActQ8_0));
    case ActKind::q8_K: return cols / kQK_K * int64_t(sizeof(BlockQ8_K));
    case ActKind::f32: break;
  }
  return 0;
}

// ---- scalar dots: plain loops, the reference arithmetic --------------------

float dot_f32_row(const char* w, const float* x, int64_t k) {
  const auto* wf = reinterpret_cast<const float*>(w);
  float s = 0;
  for (int64_t i = 0; i < k; ++i) s += wf[i] * x[i];
  return s;
}

float dot_f16_row(const char* w, const float* x, int64_t k) {
  const auto* wh = reinterpret_cast<const uint16_t*>(w);
  float s = 0;
  for (int64_t i = 0; i < k; ++i) s += fp16_to_f32(wh[i]) * x[i];
  return s;
}

float dot_bf16_row(const char* w, const float* x, int64_t k) {
  const auto* wh = reinterpret_cast<const uint16_t*>(w);
  float s = 0;
  for (int64_t i = 0; i < k; ++i) s += bf16_to_f32(wh[i]) * x[i];
  return s;
}

float dot_q8_0_row(const char* w, const char* xq, int64_t k) {
  const auto* wb = reinterpret_cast<const BlockQ8_0*>(w);
  const auto* xb = reinterpret_cast<const ActQ8_0*>(xq);
  float s = 0;
  for (int64_t b = 0; b < k / kQK; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < kQK; ++j) isum += wb[b].qs[j] * xb[b].qs[j];
    s += (fp16_to_f32(wb[b].d) * xb[b].d) * static_cast<float>(isum);
  }
  return s;
}

float dot_q4_0_row(const char* w, const char* xq, int64_t k) {
  const auto* wb = reinterpret_cast<const BlockQ4_0*>(w);
  const auto* xb = reinterpret_cast<const ActQ8_0*>(xq);
  float s = 0;
  for (int64_t b = 0; b < k / kQK; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      isum += ((wb[b].qs[j] & 0x0F) - 8) * xb[b].qs[j];
      isum += ((wb[b].qs[j] >> 4) - 8) * xb[b].qs[j + kQK / 2];
    }
    s += (fp16_to_f32(wb[b].d) * xb[b].d) * static_cast<float>(isum);
  }
  return s;
}

// GGML's ggml_vec_dot_mxfp4_q8_0: per block the integer dot of the doubled
// E2M1 values with the activation quants, times e8m0_half(e) * d_x.
float dot_mxfp4_row(const char* w, const char* xq, int64_t k) {
  const auto* wb = reinterpret_cast<const BlockMXFP4*>(w);
  const auto* xb = reinterpret_cast<const ActQ8_0*>(xq);
  float s = 0;
  for (int64_t b = 0; b < k / kQK; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      isum += kMxfp4Values[wb[b].qs[j] & 0x0F] * xb[b].qs[j];
      isum += kMxfp4Values[wb[b].qs[j] >> 4] * xb[b].qs[j + kQK / 2];
    }
    s += (e8m0_half(wb[b].e) * xb[b].d) * static_cast<float>(isum);
  }
  return s;
}

float dot_q4_K_row(const char* w, const char* xq, int64_t k) {
  const auto* wb = reinterpret_cast<const BlockQ4_K*>(w);
  const auto* xb = reinterpret_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    const uint8_t* q = wb[b].qs;
    const int8_t* x = xb[b].qs;
    int32_t isum = 0, imin = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      get_scale_min_k4(j, wb[b].scales, &sc, &m);
      const int shift = (j & 1) * 4;
      const uint8_t* qc = q + (j / 2) * 32;
      int32_t dot = 0;
      for (int l = 0; l < 32; ++l) dot += ((qc[l] >> shift) & 0xF) * x[j * 32 + l];
      isum += sc * dot;
      imin += m * (xb[b].bsums[2 * j] + xb[b].bsums[2 * j + 1]);
    }
    s += (fp16_to_f32(wb[b].d) * xb[b].d) * static_cast<float>(isum) -
         (fp16_to_f32(wb[b].dmin) * xb[b].d) * static_cast<float>(imin);
  }
  return s;
}

float dot_q6_K_row(const char* w, const char* xq, int64_t k) {
  const auto* wb = reinterpret_cast<const BlockQ6_K*>(w);
  const auto* xb = reinterpret_cast<const BlockQ8_K*>(xq);
  float s = 0;
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    int8_t q[kQK_K];  // decode the 6-bit codes in element order
    const uint8_t* ql = wb[b].ql;
    const uint8_t* qh = wb[b].qh;
    for (int n = 0; n < kQK_K; n += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        q[n + l + 0] = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        q[n + l + 32] = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        q[n + l + 64] = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        q[n + l + 96] = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      }
    }
    int32_t isum = 0;
    for (int sb = 0; sb < kQK_K / 16; ++sb) {
      int32_t dot = 0;
      for (int l = 0; l < 16; ++l) dot += q[sb * 16 + l] * xb[b].qs[sb * 16 + l];
      isum += wb[b].scales[sb] * dot;
    }
    s += (fp16_to_f32(wb[b].d) * xb[b].d) * static_cast<float>(isum);
  }
  return s;
}

// Types without a kernel: decode the weight row, then a float dot.
float dot_generic_row(DType t, const char* w, const float* x, int64_t k) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(k));
  dequantize_row(t, w, row.data(), k);
  return dot_f32_row(reinterpret_cast<const char*>(row.data()), x, k);
}

// Row r of a packed view back in GGML's layout (its type's blocks).
void unpack_row(const WeightView& w, int64_t r, uint8_t* out) {
  const WeightLayout l = w.layout;
  const int rows = packed_group_rows(l), qb = packed_quant_bytes(l);
  const int64_t nb = w.cols / dtype_block_elems(w.type), j = r % rows;
  const auto* g = static_cast<const uint8_t*>(w.data) + (r / rows) * w.row_stride_bytes;
  if (packed_float(l)) {  // element k of row j: column k's slot j
    for (int64_t k = 0; k < nb; ++k) std::memcpy(out + k * qb, g + (k * rows + j) * qb, static_cast<size_t>(qb));
    return;
  }
  const uint8_t* meta = g + nb * rows * qb;
  if (packed_type(l) == DType::Q4_K) {
    auto* blk = reinterpret_cast<BlockQ4_K*>(out);
    for (int64_t b = 0; b < nb; ++b, ++blk, meta += rows * kQ4KMetaBytes) {
      std::memcpy(&blk->d, meta + 2 * j, 2);
      std::memcpy(&blk->dmin, meta + 2 * rows + 2 * j, 2);
      uint8_t sc[8], mn[8];
      for (int s = 0; s < 8; ++s) sc[s] = meta[4 * rows + rows * s + j], mn[s] = meta[12 * rows + (s / 2) * 2 * rows + 2 * j + s % 2];
      // GGML's 12-byte packing of eight 6-bit scales and mins (the inverse of get_scale_min_k4).
      for (int s = 0; s < 4; ++s) {
        blk->scales[s] = static_cast<uint8_t>(sc[s] | ((sc[s + 4] >> 4) << 6));
        blk->scales[s + 4] = static_cast<uint8_t>(mn[s] | ((mn[s + 4] >> 4) << 6));
        blk->scales[s + 8] = static_cast<uint8_t>((sc[s + 4] & 0xF) | ((mn[s + 4] & 0xF) << 4));
      }
      for (int c = 0; c < qb; ++c) blk->qs[c] = g[packed_quant_offset(l, b, j, c)];
    }
    return;
  }
  if (l == WeightLayout::q6_Kx16) {
    auto* blk = reinterpret_cast<BlockQ6_K*>(out);
    for (int64_t b = 0; b < nb; ++b, ++blk, meta += rows * kQ6KMetaBytes) {
      std::memcpy(&blk->d, meta + 2 * j, 2);
      for (int s = 0; s < 16; ++s) blk->scales[s] = static_cast<int8_t>(meta[2 * rows + rows * s + j]);
      for (int c = 0; c < 128; ++c) blk->ql[c] = g[packed_quant_offset(l, b, j, c)];
      for (int c = 0; c < 64; ++c) blk->qh[c] = g[packed_quant_offset(l, b, j, 128 + c)];
    }
    return;
  }
  const auto* scales = reinterpret_cast<const uint16_t*>(meta);
  for (int64_t b = 0; b < nb; ++b, out += 2 + qb) {  // GGML block: fp16 d, then the quant bytes
    std::memcpy(out, &scales[b * rows + j], 2);
    for (int c = 0; c < qb; ++c) out[2 + c] = packed_code(l, g[packed_quant_offset(l, b, j, c)]);
  }
}

// Writes row j of a packed group from GGML's blocks (src nullptr: a padding
// row, all zero).
void pack_row(WeightLayout l, int64_t nb, const uint8_t* src, int64_t j, uint8_t* g) {
  const int rows = packed_group_rows(l), qb = packed_quant_bytes(l);
  uint8_t* meta = g + nb * rows * qb;
  if (packed_float(l)) {  // a padding row is +0.0 (all zero bytes)
    for (int64_t k = 0; k < nb; ++k) {
      uint8_t* dst = g + (k * rows + j) * qb;
      if (src) std::memcpy(dst, src + k * qb, static_cast<size_t>(qb));
      else std::memset(dst, 0, static_cast<size_t>(qb));
    }
    return;
  }
  if (packed_type(l) == DType::Q4_K) {
    for (int64_t b = 0; b < nb; ++b, meta += rows * kQ4KMetaBytes) {
      BlockQ4_K blk{};
      if (src) std::memcpy(&blk, src + b * sizeof(BlockQ4_K), sizeof blk);
      std::memcpy(meta + 2 * j, &blk.d, 2);
      std::memcpy(meta + 2 * rows + 2 * j, &blk.dmin, 2);
      for (int s = 0; s < 8; ++s) {
        uint8_t sc, mn;
        get_scale_min_k4(s, blk.scales, &sc, &mn);
        meta[4 * rows + rows * s + j] = sc;
        meta[12 * rows + (s / 2) * 2 * rows + 2 * j + s % 2] = mn;
      }
      for (int c = 0; c < qb; ++c) g[packed_quant_offset(l, b, j, c)] = blk.qs[c];
    }
    return;
  }
  if (l == WeightLayout::q6_Kx16) {
    for (int64_t b = 0; b < nb; ++b, meta += rows * kQ6KMetaBytes) {
      BlockQ6_K blk{};
      if (src) std::memcpy(&blk, src + b * sizeof(BlockQ6_K), sizeof blk);
      std::memcpy(meta + 2 * j, &blk.d, 2);
      for (int s = 0; s < 16; ++s) meta[2 * rows + rows * s + j] = static_cast<uint8_t>(blk.scales[s]);
      for (int c = 0; c < 128; ++c) g[packed_quant_offset(l, b, j, c)] = blk.ql[c];
      for (int c = 0; c < 64; ++c) g[packed_quant_offset(l, b, j, 128 + c)] = blk.qh[c];
    }
    return;
  }
  auto* scales = reinterpret_cast<uint16_t*>(meta);
  // A padding row is all zero quants (Q8_0 q = 0; Q4_0 nibbles 8 - 8 = 0).
  const uint8_t zero = packed_type(l) == DType::Q4_0 ? 0x88 : 0;
  for (int64_t b = 0; b < nb; ++b) {  // GGML blocks: fp16 d, then the quant bytes
    const uint8_t* blk = src ? src + b * (2 + qb) : nullptr;
    uint16_t d = 0;
    if (blk) std::memcpy(&d, blk, 2);
    scales[b * rows + j] = d;
    for (int c = 0; c < qb; ++c) g[packed_quant_offset(l, b, j, c)] = packed_code(l, blk ? blk[2 + c] : zero);
  }
}

float dot_ref(const MatmulArgs& a, int64_t m, int64_t r) {
  const int64_t k = a.w->cols;
  if (a.w->layout != WeightLayout::rows) {
    thread_local std::vector<uint8_t> row;
    row.resize(static_cast<size_t>(dtype_row_bytes(a.w->type, k)));
    unpack_row(*a.w, r, row.data());
    const char* w = reinterpret_cast<const char*>(row.data());
    if (a.w->type == DType::F32) return dot_f32_row(w, a.x + m * k, k);
    if (a.w->type == DType::F16) return dot_f16_row(w, a.x + m * k, k);
    if (a.w->type == DType::Q4_K) return dot_q4_K_row(w, act_row(a, m), k);
    if (a.w->type == DType::Q6_K) return dot_q6_K_row(w, act_row(a, m), k);
    return a.w->type == DType::Q4_0 ? dot_q4_0_row(w, act_row(a, m), k) : dot_q8_0_row(w, act_row(a, m), k);
  }
  const char* w = weight_row(a, r);
  const float* x = a.x + m * k;
  switch (a.w->type) {
    case DType::F32: return dot_f32_row(w, x, k);
    case DType::F16: return dot_f16_row(w, x, k);
    case DType::BF16: return dot_bf16_row(w, x, k);
    case DType::Q8_0: return dot_q8_0_row(w, act_row(a, m), k);
    case DType::Q4_0: return dot_q4_0_row(w, act_row(a, m), k);
    case DType::Q4_K: return dot_q4_K_row(w, act_row(a, m), k);
    case DType::Q6_K: return dot_q6_K_row(w, act_row(a, m), k);
    case DType::MXFP4: return dot_mxfp4_row(w, act_row(a, m), k);
    default: return dot_generic_row(a.w->type, w, x, k);
  }
}

// The scalar level: the reference dots, weight row outer so each row is read
// from memory once for all activation rows.
void rows_ref(const MatmulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t m = 0; m < a.m_rows; ++m) a.y[m * a.w->rows + r] = dot_ref(a, m, r);
}

// Quantizes the activations as the weight type wants them; the buffer lives
// in `storage`.
MatmulArgs prepare(const WeightView& w, const float* x, float* y, int64_t n_x_rows,
                   std::vector<unsigned char>& storage, Executor* ex = nullptr) {
  MatmulArgs a;
  a.w = &w;
  a.x = x;
  a.y = y;
  a.m_rows = n_x_rows;
  const ActKind kind = act_kind(w.type);
  a.xq_row_bytes = act_row_bytes(kind, w.cols);
  if (kind == ActKind::f32) return a;
  storage.resize(static_cast<size_t>(a.xq_row_bytes * n_x_rows));
  // The AVX2 quantizers give the scalar ones' bytes exactly (tested).
  const bool simd = active_simd() != Simd::scalar;
  auto quantize = [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      unsigned char* dst = storage.data() + m * a.xq_row_bytes;
      if (kind == ActKind::q8_0) {
        const int group = w.type == DType::Q8_0 ? kActGroupQ8_0 : 1;
        if (simd) avx2::quantize_act_q8_0(x + m * w.cols, dst, w.cols, group);
        else quantize_act_q8_0(x + m * w.cols, reinterpret_cast<ActQ8_0*>(dst), w.cols, group);
      } else {
        if (simd) avx2::quantize_act_q8_K(x + m * w.cols, dst, w.cols);
        else quantize_act_q8_K(x + m * w.cols, reinterpret_cast<BlockQ8_K*>(dst), w.cols);
      }
    }
  };
  // Rows are quantized independently; for a batch, over the threads (16
  // decode rows on one thread were ~5 % of a step while the other waited).
  if (ex && ex->threads() > 1 && n_x_rows >= 4) ex->parallel_for(n_x_rows, quantize);
  else quantize(0, n_x_rows);
  a.xq = storage.data();
  return a;
}

bool shape_ok(const WeightView& w, int64_t n_x_rows) {
  return n_x_rows > 0 && w.rows > 0 && w.cols > 0 && w.data && dtype_row_bytes(w.type, w.cols) >= 0 &&
         (w.layout == WeightLayout::rows || w.type == packed_type(w.layout));
}

}  // namespace

namespace cpu {
RowsFn rows_fn_scalar(DType) { return &rows_ref; }
}  // namespace cpu

bool matmul_supports(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q6_K:
    case DType::MXFP4: return true;
    default: return false;
  }
}

namespace {
// The packed layout this level's tile wants for type t, or rows for none.
WeightLayout packed_layout_here(DType t) {
  // F32 at avx2 packs too since the avx2 tile keeps its accumulators in
  // registers (547a9d6): on a Zen 3 its 110M prompts ran at about 92 % of
  // F16's rate, where the row-dot tile had stayed at about 78 %.
  if (t == DType::F32)
    return active_simd() == Simd::avx512 ? WeightLayout::f32x16 : active_simd() == Simd::avx2 ? WeightLayout::f32x8 : WeightLayout::rows;
  if (t == DType::F16)
    return active_simd() == Simd::avx512 ? WeightLayout::f16x16 : active_simd() == Simd::avx2 ? WeightLayout::f16x8 : WeightLayout::rows;
  if (t == DType::Q4_K)
    return active_simd() == Simd::avx512 ? WeightLayout::q4_Kx16
           : active_simd() == Simd::avx2 ? WeightLayout::q4_Kx8
                                         : WeightLayout::rows;
  if (t == DType::Q6_K) return active_simd() == Simd::avx512 ? WeightLayout::q6_Kx16 : WeightLayout::rows;
  if (t != DType::Q8_0 && t != DType::Q4_0) return WeightLayout::rows;
  const bool q8 = t == DType::Q8_0;
  switch (active_simd()) {
    case Simd::avx512: return q8 ? WeightLayout::q8_0x16 : WeightLayout::q4_0x16;
    case Simd::avx2: return q8 ? WeightLayout::q8_0x8 : WeightLayout::q4_0x8;
    case Simd::scalar: break;
  }
  return WeightLayout::rows;
}
}  // namespace

int64_t packed_weight_bytes(const WeightView& w) {
  const WeightLayout l = packed_layout_here(w.type);
  if (l == WeightLayout::rows || w.layout != WeightLayout::rows || w.rows <= 0 || w.cols <= 0 ||
      w.cols % dtype_block_elems(w.type) != 0 || !w.data)
    return 0;
  const int rows = packed_group_rows(l);
  return (w.rows + rows - 1) / rows * packed_group_bytes(l, w.cols);
}

WeightView pack_weights(const WeightView& w, void* dst) {
  const int64_t bytes = packed_weight_bytes(w);
  if (bytes == 0) return w;
  const WeightLayout l = packed_layout_here(w.type);
  const int rows = packed_group_rows(l);
  const int64_t nb = w.cols / dtype_block_elems(w.type), stride = packed_group_bytes(l, w.cols);
  auto* out = static_cast<uint8_t*>(dst);
  const int64_t groups = bytes / stride, used = nb * rows * (packed_quant_bytes(l) + packed_meta_bytes(l));
  // Every byte but each group's tail is written below (padding rows as
  // zeros); the tail is zeroed so the copy is fully defined.
  for (int64_t gi = 0; gi < groups; ++gi) std::memset(out + gi * stride + used, 0, static_cast<size_t>(stride - used));
  for (int64_t r = 0; r < groups * rows; ++r)
    pack_row(l, nb, r < w.rows ? static_cast<const uint8_t*>(w.data) + r * w.row_stride_bytes : nullptr, r % rows,
             out + (r / rows) * stride);
  WeightView v = w;
  v.data = dst;
  v.row_stride_bytes = stride;
  v.layout = l;
  return v;
}

int64_t weight_bytes(const WeightView& w) { return w.rows * dtype_row_bytes(w.type, w.cols); }

void dequantize_weight_row(const WeightView& w, int64_t r, float* out) {
  if (w.layout == WeightLayout::rows)
    return dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_stride_bytes, out, w.cols);
  thread_local std::vector<uint8_t> row;
  row.resize(static_cast<size_t>(dtype_row_bytes(w.type, w.cols)));
  unpack_row(w, r, row.data());
  dequantize_row(w.type, row.data(), out, w.cols);
}

namespace {

// The tile function and the thread unit (weight rows) for w at this level.
std::pair<RowsFn, int64_t> rows_fn(const WeightView& w, int64_t n_x_rows) {
  RowsFn fn = nullptr;
  int64_t unit = kRowUnit;
  if (w.layout == WeightLayout::q8_0x16) {
    unit = n_x_rows < 4 ? kPackedNarrowRowUnit : kPackedRowUnit;
    // Below AVX-512 (a capped level) the scalar path unpacks row by row.
    if (active_simd() == Simd::avx512) fn = &q8_0x16_rows_avx512;
  } else if (w.layout == WeightLayout::q4_0x16 || w.layout == WeightLayout::q4_Kx16 || w.layout == WeightLayout::q6_Kx16) {
    unit = kPackedNarrowRowUnit;
    if (active_simd() == Simd::avx512)
      fn = w.layout == WeightLayout::q4_0x16   ? &q4_0x16_rows_avx512
           : w.layout == WeightLayout::q4_Kx16 ? &q4_Kx16_rows_avx512
                                               : &q6_Kx16_rows_avx512;
  } else if (packed_float(w.layout)) {
    unit = kPackedFloatRowUnit;
    // f16x8 and f32x8 run at avx2 or above (an AVX-512 CPU has AVX2), x16 at avx512.
    if (w.layout == WeightLayout::f16x8 || w.layout == WeightLayout::f32x8) {
      if (active_simd() != Simd::scalar) fn = w.layout == WeightLayout::f16x8 ? &f16x8_rows_avx2 : &f32x8_rows_avx2;
    } else if (active_simd() == Simd::avx512) {
      fn = w.layout == WeightLayout::f32x16 ? &f32x16_rows_avx512 : &f16x16_rows_avx512;
    }
  } else if (w.layout == WeightLayout::q8_0x8 || w.layout == WeightLayout::q4_0x8 || w.layout == WeightLayout::q4_Kx8) {
    unit = kPackedX8RowUnit;
    // Packed at the avx2 level, run there or above (an AVX-512 CPU has AVX2).
    if (active_simd() != Simd::scalar)
      fn = w.layout == WeightLayout::q8_0x8   ? &q8_0x8_rows_avx2
           : w.layout == WeightLayout::q4_0x8 ? &q4_0x8_rows_avx2
                                              : &q4_Kx8_rows_avx2;
  } else if (matmul_supports(w.type)) {
    switch (active_simd()) {
      // A type with no 512-bit tile (MXFP4) runs the AVX2 one: an AVX-512 CPU has AVX2.
      case Simd::avx512: fn = rows_fn_avx512(w.type); if (!fn) fn = rows_fn_avx2(w.type); break;
      case Simd::avx2: fn = rows_fn_avx2(w.type); break;
      case Simd::scalar: break;
    }
  }
  if (!fn) fn = rows_fn_scalar(w.type);
  return {fn, unit};
}

}  // namespace

void matmul(const WeightView& w, const float* x, float* y, int64_t n_x_rows, Executor* ex) {
  const WeightView* ws[] = {&w};
  float* ys[] = {y};
  matmul_many(ws, ys, 1, x, n_x_rows, ex);
}

void matmul_many(const WeightView* const* w, float* const* y, int count, const float* x, int64_t n_x_rows, Executor* ex) {
  for (int i = 1; i < count; ++i)
    if (w[i]->type != w[0]->type || w[i]->cols != w[0]->cols || w[i]->layout != w[0]->layout) {
      for (int j = 0; j < count; ++j) matmul_many(&w[j], &y[j], 1, x, n_x_rows, ex);
      return;
    }
  if (count <= 0) return;
  for (int i = 0; i < count; ++i)
    if (!shape_ok(*w[i], n_x_rows)) return;
  // Not a structured binding: clang 14 (the fuzz build) cannot capture one in the lambda below.
  const auto rows = rows_fn(*w[0], n_x_rows);
  const auto fn = rows.first;
  const auto unit = rows.second;
  thread_local std::vector<unsigned char> storage;
  const MatmulArgs a = prepare(*w[0], x, y[0], n_x_rows, storage, ex);  // one quantization for all
  // Matrix i's rows are units [first[i], first[i + 1]) of the joint range.
  std::vector<int64_t> first(static_cast<size_t>(count) + 1, 0);
  for (int i = 0; i < count; ++i) first[i + 1] = first[i] + (w[i]->rows + unit - 1) / unit;
  auto run = [&](int64_t b, int64_t e) {
    for (int i = 0; i < count; ++i) {
      const int64_t lo = std::max(b, first[i]), hi = std::min(e, first[i + 1]);
      if (lo >= hi) continue;
      MatmulArgs ai = a;
      ai.w = w[i];
      ai.y = y[i];
      fn(ai, (lo - first[i]) * unit, std::min((hi - first[i]) * unit, w[i]->rows));
    }
  };
  const int64_t units = first[count];
  if (!ex || units == 1) return run(0, units);  // a one-thread pool still slices under a cancel flag (engine core/cancel.h)
  ex->parallel_for(units, run);
}

void matmul_ref(const WeightView& w, const float* x, float* y, int64_t n_x_rows) {
  if (!shape_ok(w, n_x_rows)) return;
  std::vector<unsigned char> storage;
  const MatmulArgs a = prepare(w, x, y, n_x_rows, storage);
  for (int64_t m = 0; m < n_x_rows; ++m)
    for (int64_t r = 0; r < w.rows; ++r) y[m * w.rows + r] = dot_ref(a, m, r);
}

}  // namespace atelier::kernels

namespace atelier::kernels {

namespace {
bool routable(const WeightView* const* experts, int count, int n_expert) {
  if (count <= 0 || n_expert <= 0) return false;
  const WeightView& w0 = experts[0][0];
  for (int i = 0; i < count; ++i)
    for (int e = 0; e < n_expert; ++e) {
      const WeightView& w = experts[i][e];
      if (w.type != w0.type || w.cols != w0.cols || w.layout != w0.layout || w.rows != experts[i][0].rows) return false;
    }
  return true;
}
}  // namespace

// The slots of the step grouped by expert (each group in slot order), each
// expert's input rows gathered and quantized once for all the sets, then
// every (set, expert)'s weight rows split over the threads in one
// parallel_for, as matmul_many splits several matrices; the outputs are
// scattered back to their slots. Each gathered row's product is the one-row
// product (the tiles are batch-invariant), so the grouping never shows.
void matmul_id(const WeightView* const* experts, float* const* y, const float* const* bias, int count, int n_expert,
               const float* x, int x_per_row, const int32_t* ids, int64_t rows, int k, Executor* ex) {
  if (rows <= 0 || k <= 0 || count <= 0) return;
  if (!routable(experts, count, n_expert)) {  // sets of different types: one call per set
    if (count > 1)
      for (int i = 0; i < count; ++i) matmul_id(&experts[i], &y[i], &bias[i], 1, n_expert, x, x_per_row, ids, rows, k, ex);
    return;
  }
  const int64_t cols = experts[0][0].cols, slots = rows * k;
  // Counting sort of the slots by expert.
  thread_local std::vector<int64_t> start, order;
  start.assign(static_cast<size_t>(n_expert) + 1, 0);
  for (int64_t s = 0; s < slots; ++s)
    if (ids[s] >= 0 && ids[s] < n_expert) ++start[static_cast<size_t>(ids[s]) + 1];
  for (int e = 0; e < n_expert; ++e) start[static_cast<size_t>(e) + 1] += start[static_cast<size_t>(e)];
  const int64_t used = start[static_cast<size_t>(n_expert)];
  if (used == 0) return;
  order.resize(static_cast<size_t>(used));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t s = 0; s < slots; ++s)
      if (ids[s] >= 0 && ids[s] < n_expert) order[static_cast<size_t>(fill[static_cast<size_t>(ids[s])]++)] = s;
  }
  // Gathered inputs (used x cols) and outputs per set (used x rows_i).
  thread_local std::vector<float> xg;
  thread_local std::vector<std::vector<float>> yg;
  xg.resize(static_cast<size_t>(used * cols));
  for (int64_t g = 0; g < used; ++g) {
    const int64_t s = order[static_cast<size_t>(g)];
    const int64_t src = x_per_row == 1 ? s / k : s;
    std::memcpy(xg.data() + g * cols, x + src * cols, static_cast<size_t>(cols) * sizeof(float));
  }
  if (yg.size() < static_cast<size_t>(count)) yg.resize(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) yg[static_cast<size_t>(i)].resize(static_cast<size_t>(used * experts[i][0].rows));
  // One activation quantization per expert (shared by the sets), then the
  // (set, expert) units.
  struct Job {
    MatmulArgs a;
    RowsFn fn;
    int64_t unit, first;
  };
  thread_local std::vector<std::vector<unsigned char>> storage;
  if (storage.size() < static_cast<size_t>(n_expert)) storage.resize(static_cast<size_t>(n_expert));
  std::vector<Job> jobs;
  int64_t units = 0;
  for (int e = 0; e < n_expert; ++e) {
    const int64_t g0 = start[static_cast<size_t>(e)], n_e = start[static_cast<size_t>(e) + 1] - g0;
    if (n_e == 0) continue;
    const MatmulArgs base = prepare(experts[0][e], xg.data() + g0 * cols, nullptr, n_e, storage[static_cast<size_t>(e)], ex);
    for (int i = 0; i < count; ++i) {
      const WeightView& w = experts[i][e];
      if (!shape_ok(w, n_e)) continue;
      const auto rf = rows_fn(w, n_e);
      Job j{base, rf.first, rf.second, units};
      j.a.w = &w;
      j.a.y = yg[static_cast<size_t>(i)].data() + g0 * w.rows;
      jobs.push_back(j);
      units += (w.rows + rf.second - 1) / rf.second;
    }
  }
  auto run = [&](int64_t b, int64_t end) {
    for (const Job& j : jobs) {
      const int64_t n = (j.a.w->rows + j.unit - 1) / j.unit;
      const int64_t lo = std::max(b, j.first), hi = std::min(end, j.first + n);
      if (lo < hi) j.fn(j.a, (lo - j.first) * j.unit, std::min((hi - j.first) * j.unit, j.a.w->rows));
    }
  };
  if (!ex || units <= 1) run(0, units);
  else ex->parallel_for(units, run);
  for (int i = 0; i < count; ++i) {
    const int64_t out = experts[i][0].rows;
    const float* src = yg[static_cast<size_t>(i)].data();
    for (int64_t g = 0; g < used; ++g) {
      const int64_t s = order[static_cast<size_t>(g)];
      float* dst = y[i] + s * out;
      std::memcpy(dst, src + g * out, static_cast<size_t>(out) * sizeof(float));
      if (bias && bias[i]) {
        const float* b = bias[i] + int64_t{ids[s]} * out;
        for (int64_t c = 0; c < out; ++c) dst[c] += b[c];
      }
    }
  }
}

void matmul_id_ref(const WeightView* const* experts, float* const* y, const float* const* bias, int count,
                   int n_expert, const float* x, int x_per_row, const int32_t* ids, int64_t rows, int k) {
  for (int64_t s = 0; s < rows * k; ++s) {
    const int32_t e = ids[s];
    if (e < 0 || e >= n_expert) continue;
    const float* xr = x + (x_per_row == 1 ? s / k : s) * experts[0][e].cols;
    for (int i = 0; i < count; ++i) {
      const WeightView& w = experts[i][e];
      matmul_ref(w, xr, y[i] + s * w.rows, 1);
      if (bias && bias[i])
        for (int64_t c = 0; c < w.rows; ++c) y[i][s * w.rows + c] += bias[i][int64_t{e} * w.rows + c];
    }
  }
}

}  // namespace atelier::kernels
