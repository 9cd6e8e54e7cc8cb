// A kernels::Device that is not the host, without a GPU (issue 33): its
// backends are FakeDevices (fake_device.h: host memory, every pointer
// checked to be the device's), its memory and sensors are what the test
// sets, and its free memory drops by what its buffers hold, as a GPU's
// cudaMemGetInfo does. fail() makes every later matrix product throw the
// CUDA module's sticky error ("CUDA device lost: ..."). Register it with
// kernels::register_device("fake:0", &gpu) to reach it by name.
#pragma once

#include <atelier/backend.h>
#include <atelier/devices.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fake_device.h"

namespace atelier::test {

class FakeGpu final : public kernels::Device {
 public:
  explicit FakeGpu(int64_t total_bytes = int64_t{8} << 30, int compute_capability = 90)
      : shared_(std::make_shared<FakeDevice::Shared>()), cc_(compute_capability) {
    mem_.total_bytes = mem_.free_bytes = total_bytes;
  }
  ~FakeGpu() override { kernels::register_device(name_, nullptr); }
  // Reachable as open_device(name) until destroyed.
  void register_as(const std::string& name) {
    name_ = name;
    kernels::register_device(name, this);
  }

  // Free memory before any of this device's buffers (they are subtracted).
  void set_memory(int64_t total, int64_t free, int64_t reserved = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    mem_ = {total, free, reserved};
  }
  void set_telemetry(const kernels::DeviceTelemetry& t) {
    std::lock_guard<std::mutex> lock(mu_);
    tel_ = t;
  }
  void fail(const std::string& message) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->fail = message;
  }
  int64_t held_bytes() const { return shared_->bytes.load(); }
  // The precisions its live backends prepared matrices at (fake_device.h), in order.
  std::vector<kernels::WeightPrecision> prepared_precisions() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::lock_guard<std::mutex> live(shared_->mu);  // only backends that still exist (a failed load's is gone)
    std::vector<kernels::WeightPrecision> v;
    for (const FakeDevice* b : backends_)
      if (FakeDevice::alive(*shared_, b))
        for (kernels::WeightPrecision p : b->prepared_precisions()) v.push_back(p);
    return v;
  }
  int backends_made() const { return made_; }
  // Backend::sample calls its live backends saw (sampling on the device).
  int64_t sample_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::lock_guard<std::mutex> live(shared_->mu);
    int64_t n = 0;
    for (const FakeDevice* b : backends_)
      if (FakeDevice::alive(*shared_, b)) n += b->sample_calls();
    return n;
  }
  // What the backends it made saw (only while they live: a loaded model's).
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::lock_guard<std::mutex> live(shared_->mu);
    std::vector<std::string> v;
    for (const FakeDevice* b : backends_)
      if (FakeDevice::alive(*shared_, b))
        for (const std::string& s : b->violations()) v.push_back(s);
    return v;
  }

  kernels::DeviceInfo info() const override {
    kernels::DeviceInfo d = FakeDevice().device();
    d.name = name_;
    d.compute_capability = cc_;
    return d;
  }
  kernels::DeviceMemory memory() const override {
    std::lock_guard<std::mutex> lock(mu_);
    kernels::DeviceMemory m = mem_;
    m.free_bytes -= shared_->bytes.load();
    return m;
  }
  std::unique_ptr<kernels::Backend> make_backend(kernels::Executor* ex, int) override {
    ++made_;
    auto b = std::make_unique<FakeDevice>(ex);
    b->share(shared_);
    b->set_compute_capability(cc_);
    std::lock_guard<std::mutex> lock(mu_);
    backends_.push_back(b.get());
    return b;
  }
  kernels::DeviceTelemetry telemetry() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return tel_;
  }

 private:
  std::shared_ptr<FakeDevice::Shared> shared_;
  int cc_;
  std::string name_ = "fake:0";
  mutable std::mutex mu_;
  kernels::DeviceMemory mem_;
  kernels::DeviceTelemetry tel_;
  std::atomic<int> made_{0};
  std::vector<FakeDevice*> backends_;
};

}  // namespace atelier::test
