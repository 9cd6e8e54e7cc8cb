// The image networks' side of the backend seam: each network keeps one
// workspace buffer on the backend that runs it (activations of a call are
// carved from it), grown when a call needs more and otherwise reused, so a
// forward pass allocates nothing. Calls that pass an Executor run on a CPU
// backend over it, kept across calls.
//
// A network's const entry points may be called from several threads: a
// lease holds the workspace's lock for the whole call (calls of one network
// run one at a time; they would compete for the same cores anyway).
#pragma once

#include <atelier/backend.h>

#include <cstdint>
#include <cstring>
#include <algorithm>
#include <memory>
#include <mutex>

namespace atelier::image {

class Workspace {
 public:
  class Lease {
   public:
    kernels::Backend& be() { return *be_; }
    kernels::Buffer& buffer() { return *buf_; }
    // n activations of the backend's type, 64-byte aligned, from the buffer.
    kernels::Act take(int64_t n) { return kernels::Act(take_bytes(kernels::act_bytes(be_->act_dtype(), n)), be_->act_dtype()); }
    // n F32 elements: where a network meets the host (inputs uploaded,
    // outputs downloaded), converted to and from the activations on the device.
    kernels::Act take_f32(int64_t n) { return kernels::Act(take_bytes(n * 4), kernels::DType::F32); }
    float* take_floats(int64_t n) { return static_cast<float*>(take_bytes(n * 4)); }
    int32_t* take_i32(int64_t n) { return static_cast<int32_t*>(take_bytes(n * 4)); }
    int64_t offset_of(const void* p) { return static_cast<const uint8_t*>(p) - buf_->at<uint8_t>(0); }
    void upload(void* dst, const void* src, int64_t bytes) { be_->upload(*buf_, offset_of(dst), src, bytes); }
    void download(const void* src, void* dst, int64_t bytes) { be_->download(*buf_, offset_of(src), dst, bytes); }

   private:
    friend class Workspace;
    void* take_bytes(int64_t bytes) {
      void* p = buf_->at<uint8_t>(used_);
      used_ += (bytes + 63) / 64 * 64;
      return p;
    }
    std::unique_lock<std::mutex> lock_;
    kernels::Backend* be_ = nullptr;
    kernels::Buffer* buf_ = nullptr;
    int64_t used_ = 0;
  };

  // A workspace of at least `floats` floats on `be`.
  Lease acquire(kernels::Backend& be, int64_t floats) {
    Lease l;
    l.lock_ = std::unique_lock<std::mutex>(m_);
    grow(be, floats);
    l.be_ = &be;
    l.buf_ = buf_.get();
    return l;
  }
  // Frees the buffer once the call in flight (if any) ends; the next acquire
  // allocates again. For a network whose workspace is large and whose calls
  // are rare (the VAE: hundreds of MB at full resolution, once per image).
  void release() {
    std::lock_guard<std::mutex> g(m_);
    buf_.reset();
    buf_bytes_ = 0;
    owner_ = nullptr;
  }
  // The same on the CPU backend over `ex`.
  Lease acquire(kernels::Executor* ex, int64_t floats) {
    Lease l;
    l.lock_ = std::unique_lock<std::mutex>(m_);
    if (!cpu_ || cpu_ex_ != ex) {
      cpu_ = kernels::make_cpu_backend(ex);
      cpu_ex_ = ex;
    }
    grow(*cpu_, floats);
    l.be_ = cpu_.get();
    l.buf_ = buf_.get();
    return l;
  }

 private:
  void grow(kernels::Backend& be, int64_t floats) {
    // Sized in F32 elements (activations of another type take less), with
    // room for the per-array rounding of up to 64 arrays.
    const int64_t bytes = (floats + 64 * 16) * int64_t{sizeof(float)};
    // CPU backends share host memory; another backend needs its own buffer.
    if (buf_ && buf_->bytes() >= bytes && (owner_ == &be || (owner_host_ && be.device().host_memory))) return;
    buf_.reset();
    buf_ = be.alloc(std::max(bytes, buf_bytes_));
    buf_bytes_ = buf_->bytes();
    owner_ = &be;
    owner_host_ = be.device().host_memory;
  }

  std::mutex m_;
  std::unique_ptr<kernels::Backend> cpu_;
  kernels::Executor* cpu_ex_ = nullptr;
  std::unique_ptr<kernels::Buffer> buf_;
  int64_t buf_bytes_ = 0;
  kernels::Backend* owner_ = nullptr;
  bool owner_host_ = false;
};

}  // namespace atelier::image
