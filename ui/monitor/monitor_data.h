// What the engine monitor plots: one sample per poll of Engine::metrics(),
// with the rates the engine reports as running totals turned into per-interval
// figures (image steps/s from the image-step count, the mean batch size from
// the batch-size histogram, the error rate from the failed and completed
// counts), kept for the last kCapacity polls. Alerts are logged when they
// first fire. No Qt: plain values, so a test can feed it by hand.
#pragma once

#include <atelier/engine.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace atelier::ui {

inline constexpr double kDeviceQuantumBytes = 16.0 * 1024 * 1024;
inline constexpr int kDeviceRedrawMs = 5000;

struct MonitorSample {
  double t_s = 0;                 // seconds since the monitor started
  double tokens_per_s = 0, recent_tokens_per_s = 0;
  double image_steps_per_s = 0;   // image-lane steps since the previous sample / its interval
  double batch_mean = 0;          // sequences per decode step since the previous sample
  int queued_text = 0, queued_image = 0, running = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0, itl_p50_ms = 0, itl_p99_ms = 0;
  int kv_used = 0, kv_cached = 0, kv_free = 0;
  double memory_fraction = 0;     // KV blocks used / all
  double busy_fraction = 0;
  double error_rate = 0;          // failed / finished since the previous sample (0 when none finished)
  double process_bytes = 0;       // the process's resident memory (the engine's models and buffers are in it)
  // The engine's device (EngineMetrics::device_memory_*): in use (total - free) and total, in whole
  // kDeviceQuantumBytes, so the free figure's constant small drift does not redraw an idle panel.
  double device_used_bytes = 0, device_total_bytes = 0;
  // A GPU's sensors (EngineMetrics' NVML figures; issue 33), when it has them.
  bool gpu = false;
  double gpu_utilization = 0;     // 0..1 of the last sample period a kernel ran
  double gpu_temperature_c = 0;
  double gpu_memory_fraction = 0; // memory used (every process's) / total: the 90 % alert's figure
  bool operator==(const MonitorSample&) const = default;
  // The same figures, whenever they were taken (the panel redraws only when they differ).
  // The device's memory in use is not one of them: it is the machine's, moved by every
  // other program (EngineMonitor redraws for it alone at most every kDeviceRedrawMs).
  bool same_figures(MonitorSample other) const {
    other.t_s = t_s;
    other.device_used_bytes = device_used_bytes;
    return other == *this;
  }
};

struct MonitorAlert {
  double t_s = 0;
  std::string message;
};

class MonitorData {
 public:
  static constexpr size_t kCapacity = 600;  // 2.5 minutes at 4 polls a second

  // One poll: the engine's metrics at T_S, and the queue by kind (metrics count it as one).
  // RUNNING: jobs running of every kind (-1: the engine's count); PROCESS_BYTES: resident memory.
  void add(const EngineMetrics& metrics, double t_s, int queued_text, int queued_image, int running = -1, double process_bytes = 0);
  const std::deque<MonitorSample>& samples() const { return samples_; }
  const std::vector<MonitorAlert>& alerts() const { return alerts_; }  // oldest first
  const std::vector<std::string>& active_alerts() const { return active_; }
  void set_rules(const AlertRules& rules) { rules_ = rules; }
  const AlertRules& rules() const { return rules_; }
  // The series of one field, oldest first (for the plots).
  std::vector<float> series(double MonitorSample::*field) const;
  std::vector<float> series(int MonitorSample::*field) const;

 private:
  std::deque<MonitorSample> samples_;
  std::vector<MonitorAlert> alerts_;
  std::vector<std::string> active_;
  AlertRules rules_;
  bool have_previous_ = false;
  EngineMetrics previous_;
  double previous_t_s_ = 0;
};

}  // namespace atelier::ui
