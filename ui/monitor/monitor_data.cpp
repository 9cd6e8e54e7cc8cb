#include "monitor/monitor_data.h"

#include <algorithm>
#include <cmath>

namespace atelier::ui {

void MonitorData::add(const EngineMetrics& m, double t_s, int queued_text, int queued_image, int running, double process_bytes) {
  MonitorSample s;
  s.t_s = t_s;
  s.tokens_per_s = m.tokens_per_s;
  s.recent_tokens_per_s = m.recent_tokens_per_s;
  s.queued_text = queued_text;
  s.queued_image = queued_image;
  s.running = running >= 0 ? running : m.running;
  s.process_bytes = process_bytes;
  const auto quantum = [](int64_t bytes) { return std::round(static_cast<double>(std::max<int64_t>(0, bytes)) / kDeviceQuantumBytes) * kDeviceQuantumBytes; };
  s.device_total_bytes = quantum(m.device_memory_total_bytes);
  s.device_used_bytes = quantum(m.device_memory_total_bytes - m.device_memory_free_bytes);
  s.ttft_p50_ms = m.time_to_first_token_ms.p50;
  s.ttft_p99_ms = m.time_to_first_token_ms.p99;
  s.itl_p50_ms = m.inter_token_ms.p50;
  s.itl_p99_ms = m.inter_token_ms.p99;
  s.kv_used = m.kv_blocks_used;
  s.kv_cached = m.kv_blocks_cached;
  s.kv_free = m.kv_blocks_free;
  const int kv_all = m.kv_blocks_used + m.kv_blocks_free;
  s.memory_fraction = kv_all > 0 ? static_cast<double>(m.kv_blocks_used) / kv_all : 0;
  s.busy_fraction = m.busy_fraction;
  s.gpu = m.telemetry_available;
  if (s.gpu) {
    s.gpu_utilization = m.device_utilization_percent / 100;
    s.gpu_temperature_c = m.device_temperature_c;
    s.gpu_memory_fraction = m.device_memory_total_bytes > 0
                                ? static_cast<double>(m.device_memory_used_bytes) / static_cast<double>(m.device_memory_total_bytes)
                                : 0;
  }
  if (have_previous_ && t_s > previous_t_s_) {
    const double dt = t_s - previous_t_s_;
    // Counters restart when the engine does (or reset_metrics): no negative rates.
    s.image_steps_per_s = std::max<double>(0, static_cast<double>(m.image_steps - previous_.image_steps)) / dt;
    int64_t steps = 0, sequences = 0;
    for (size_t k = 0; k < m.batch_size_histogram.size(); ++k) {
      const int64_t before = k < previous_.batch_size_histogram.size() ? previous_.batch_size_histogram[k] : 0;
      const int64_t d = std::max<int64_t>(0, m.batch_size_histogram[k] - before);
      steps += d;
      sequences += d * static_cast<int64_t>(k);
    }
    s.batch_mean = steps > 0 ? static_cast<double>(sequences) / static_cast<double>(steps) : 0;
    const int64_t failed = std::max<int64_t>(0, m.failed - previous_.failed);
    const int64_t finished = failed + std::max<int64_t>(0, m.completed - previous_.completed);
    s.error_rate = finished > 0 ? static_cast<double>(failed) / static_cast<double>(finished) : 0;
  }
  for (const std::string& a : m.active_alerts)
    if (std::find(active_.begin(), active_.end(), a) == active_.end()) alerts_.push_back({t_s, a});
  active_ = m.active_alerts;
  samples_.push_back(s);
  while (samples_.size() > kCapacity) samples_.pop_front();
  previous_ = m;
  previous_t_s_ = t_s;
  have_previous_ = true;
}

std::vector<float> MonitorData::series(double MonitorSample::*field) const {
  std::vector<float> out;
  out.reserve(samples_.size());
  for (const MonitorSample& s : samples_) out.push_back(static_cast<float>(s.*field));
  return out;
}

std::vector<float> MonitorData::series(int MonitorSample::*field) const {
  std::vector<float> out;
  out.reserve(samples_.size());
  for (const MonitorSample& s : samples_) out.push_back(static_cast<float>(s.*field));
  return out;
}

}  // namespace atelier::ui
