// Where the Stable Diffusion model's tensors come from (internal to the SD
// model: sd_model, clip_text, unet, vae).
//
// One name space for every source: the original single-file layout
// (`model.diffusion_model.*`, `first_stage_model.*`, `cond_stage_model.*`).
// A diffusers folder (unet/, vae/, text_encoder/) is mapped into it on open
// (diffusers_to_original), so the networks are written against one set of
// names. Matrices in the type the networks keep (F16 stays F16) are read in
// place from the mapping (`Weight::mapped`): nothing is copied, and their
// pages (`PageSpans`) can leave the process between uses (`release`) and fault
// back in from the page cache when read again. What is converted (a
// precision change, stacked q/k/v, biases and norms widened to f32) is copied
// and the file's pages of it released at once, so the model is never
// resident twice while it loads.
#pragma once

#include <atelier/backend.h>
#include <atelier/kernels.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formats/tensor_types.h"

namespace atelier::image {

// How matrices are kept in memory. `keep`: the file's type (F32, F16, BF16;
// the kernels take all three); f16 halves an F32 checkpoint's memory.
enum class WeightPrecision { keep, f32, f16 };

struct TensorRef {
  formats::ElemType dtype = formats::ElemType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into a mapping; may be unaligned
  uint64_t bytes = 0;
  int64_t elements() const;
};

// A parameter's copy on the device its network runs on: `device` is set by
// Placement::place on a device that does not read host memory; elsewhere
// the host bytes are the device's (nothing copied).
struct DeviceCopy {
  const void* host = nullptr;
  int64_t bytes = 0;
  const void* device = nullptr;
  // A conv's weights ([c_out][c_in][k][k] of conv_type on the host): placed
  // in the device's layout order (kernels::conv_weights_for).
  int64_t conv_c_out = 0, conv_c_in = 0, conv_k = 0;
  kernels::DType conv_type = kernels::DType::F32;
};

// The parameters a network's loader made, placed on a backend (issue 32:
// every parameter on the device, none handed to an op from a mapping or a
// host vector). Weight and Param register here when made; place() copies
// what was added since its last call into one buffer of the backend.
class Placement {
 public:
  std::shared_ptr<DeviceCopy> add(const void* host, int64_t bytes);
  // Nothing to copy on a device that reads host memory in NCHW order (the
  // CPU). Returns the bytes copied.
  int64_t place(kernels::Backend& be);
  int64_t device_bytes() const { return device_bytes_; }

 private:
  std::vector<std::shared_ptr<DeviceCopy>> pending_;
  std::vector<std::unique_ptr<kernels::Buffer>> buffers_;
  int64_t device_bytes_ = 0;
};

// An f32 vector parameter (a bias, a norm's weights, a position table):
// data() is its device address. Move-only, so the host bytes a Placement
// copies from stay where they were registered.
class Param {
 public:
  Param() = default;
  Param(std::vector<float> v, Placement& placement);
  Param(Param&&) = default;
  Param& operator=(Param&&) = default;
  Param(const Param&) = delete;
  Param& operator=(const Param&) = delete;
  bool empty() const { return host_.empty(); }
  size_t size() const { return host_.size(); }
  const float* data() const;
  const std::vector<float>& host() const { return host_; }
  // These are a conv's F32 weights [c_out][c_in][k][k]: placed in the
  // device's layout order.
  void mark_conv(int64_t c_out, int64_t c_in, int64_t k);

 private:
  std::vector<float> host_;
  std::shared_ptr<DeviceCopy> dev_;
};

// A matrix for kernels::matmul / conv2d: `rows` outputs of `cols` inputs
// (a conv's [c_out][c_in][kh][kw] is rows = c_out, cols = c_in * kh * kw).
// Move-only, as Param.
struct Weight {
  Weight() = default;
  Weight(Weight&&) = default;
  Weight& operator=(Weight&&) = default;
  Weight(const Weight&) = delete;
  Weight& operator=(const Weight&) = delete;
  kernels::DType type = kernels::DType::F32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;       // owned (converted or stacked), or empty
  const uint8_t* mapped = nullptr;  // else in place in the WeightStore's mapping
  std::shared_ptr<DeviceCopy> dev;  // its device copy, where there is one
  const void* host() const { return mapped ? mapped : bytes.data(); }
  // The device address the ops read.
  const void* data() const { return dev && dev->device ? dev->device : host(); }
  int64_t nbytes() const { return rows * kernels::dtype_row_bytes(type, cols); }
  kernels::WeightView view() const;
  bool empty() const { return rows == 0; }
};

// Byte ranges of mapped tensors (sorted, merged) that a network reads in place.
struct PageSpans {
  std::vector<std::pair<const uint8_t*, uint64_t>> spans;
  uint64_t bytes() const;
};

class WeightStore {
 public:
  // A .safetensors file, a PyTorch .ckpt/.pth archive, or a diffusers folder
  // (unet/, vae/, text_encoder/ each with diffusion_pytorch_model.safetensors,
  // model.safetensors or the .bin equivalents). Throws Error naming the path.
  static std::unique_ptr<WeightStore> open(const std::string& path, WeightPrecision precision);
  ~WeightStore();

  const std::string& path() const { return path_; }
  bool is_diffusers() const { return diffusers_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorRef* find(const std::string& name) const;
  // Throws Error("PATH: tensor NAME is missing") naming what it was needed for.
  const TensorRef& get(const std::string& name) const;
  // Names that start with `prefix`.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const;

  // The matrix `name` checked to hold rows x (cols...) elements: its shape
  // must be [rows, cols] or [rows, c, kh, kw] with c*kh*kw = cols (a 1x1 conv
  // and a linear layer are the same matrix; diffusers stores the VAE's
  // attention projections as linears, the original layout as 1x1 convs).
  Weight matrix(const std::string& name, int64_t rows, int64_t cols) const;
  // The same rows of several tensors stacked (separate q/k/v -> one qkv).
  Weight stacked(const std::vector<std::string>& names, int64_t rows_each, int64_t cols) const;
  // A 1-D tensor of n elements (bias, norm) widened to f32.
  Param vec(const std::string& name, int64_t n) const;
  // A 1-D tensor if present, else empty.
  Param vec_or_empty(const std::string& name, int64_t n) const;
  // A vector made from the file's tensors some other way, placed with them.
  Param param(std::vector<float> v) const { return Param(std::move(v), placement_); }
  // Every matrix and vector handed out since the last call, onto `be` (a
  // copy on a device that does not read host memory; nothing on the CPU).
  int64_t place(kernels::Backend& be) { return placement_.place(be); }
  // Rows [r0, r0 + nr) of a 2-D tensor widened to f32 (embeddings).
  void rows_f32(const std::string& name, int64_t r0, int64_t nr, float* out) const;

  // safetensors __metadata__ (single file), or keys read from the diffusers
  // configs ("diffusers.unet.attention_head_dim", "diffusers.text.hidden_act",
  // "diffusers.text.num_attention_heads", "diffusers.prediction_type").
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::optional<std::string> meta(const std::string& key) const;

  static std::string shape_str(const std::vector<int64_t>& s);

  // The mapped ranges handed out in place (Weight::mapped) since the last
  // call: what the network just loaded keeps reading from the file.
  PageSpans take_in_place();
  // Drops this process's pages of `spans` (whole pages only; see
  // MappedFile::release). They fault back in when read again. Returns the
  // bytes released. Safe while another thread reads them (it refaults).
  uint64_t release(const PageSpans& spans) const;

  struct Source;  // sd_weights.cpp

 private:
  WeightStore() = default;
  void add_file(const std::string& file, const std::string& component);
  Weight make_weight(formats::ElemType src, int64_t rows, int64_t cols) const;
  // Releases the pages of a tensor that was copied out (read once).
  void release_copied(const TensorRef& t) const;

  std::string path_;
  bool diffusers_ = false;
  WeightPrecision precision_ = WeightPrecision::keep;
  std::vector<std::unique_ptr<Source>> sources_;
  std::map<std::string, TensorRef> tensors_;
  std::map<std::string, std::string> metadata_;
  mutable std::vector<std::pair<const uint8_t*, uint64_t>> in_place_;
  mutable Placement placement_;
};

// ---- building blocks the networks share (activations of the backend's type and layout)

// PyTorch Conv2d, square kernel, "same"-style symmetric padding.
struct Conv2d {
  Weight w;
  Param b;  // empty: no bias
  int64_t c_in = 0, c_out = 0, k = 3, stride = 1, pad = 1;
  // PREFIX.weight [c_out][c_in][k][k] (PREFIX.bias when present); pad = k / 2.
  static Conv2d load(const WeightStore& ws, const std::string& prefix, int64_t c_in, int64_t c_out, int64_t k,
                     int64_t stride = 1);
  // x: n images of c_in x h x w -> y: n of c_out x h' x w', in the
  // backend's layout (y has room for out_elems); h and w become h', w'.
  void run(kernels::Backend& be, kernels::Act x, kernels::Act y, int64_t n, int64_t& h, int64_t& w) const;
  int64_t out_elems(int64_t n, int64_t h, int64_t w) const;
};

// nn.Linear (or a 1x1 conv used as one) on token-major rows.
struct Linear {
  Weight w;
  Param b;
  static Linear load(const WeightStore& ws, const std::string& prefix, int64_t out, int64_t in, bool bias = true);
  // x: rows x in -> y: rows x out on a backend: matmul, then the bias.
  void run(kernels::Backend& be, kernels::Act x, kernels::Act y, int64_t rows) const;
};

struct Norm {
  Param g, b;
  static Norm load(const WeightStore& ws, const std::string& prefix, int64_t c);
};

// The original-layout name of a diffusers tensor of `component` ("unet",
// "vae", "text_encoder"), or "" for a name this mapping does not know.
// UNet block indices assume SD 1.x/2.x's 4 levels of 2 res blocks;
// up_attention[i]: whether diffusers' up block i has attentions (which moves
// its upsampler from index 1 to 2 in the original layout).
std::string diffusers_to_original(const std::string& component, const std::string& name,
                                  const std::vector<bool>& up_attention = {false, true, true, true});

// A metadata value that must be a positive integer (head counts, head
// widths); throws Error("WHAT: 'S' is not a positive integer") otherwise.
int parse_positive(const std::string& s, const std::string& what);

}  // namespace atelier::image
