#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>

namespace atelier {

namespace {
constexpr size_t kSamples = 2048;
constexpr int64_t kShortMs = 10'000, kLongMs = 60'000;

void push_sample(std::deque<double>& d, double v) {
  d.push_back(v);
  if (d.size() > kSamples) d.pop_front();
}
}  // namespace

MetricsRecorder::MetricsRecorder(int max_batch) : batch_hist_(static_cast<size_t>(max_batch) + 1, 0) {}

void MetricsRecorder::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t buckets = batch_hist_.size();
  tokens_.clear();
  busy_.clear();
  ttft_.clear();
  itl_.clear();
  itl_interactive_.clear();
  image_step_ms_.clear();
  image_steps_ = 0;
  batch_hist_.assign(buckets, 0);
  prompt_tokens_ = cached_tokens_ = completed_ = failed_ = cancelled_ = preemptions_ = 0;
  recent_failures_.clear();
  first_step_ms_ = 0;
  image_busy_.clear();
  image_busy_since_us_ = 0;
  active_.clear();
}

void MetricsRecorder::on_step(int64_t now_ms, int decoded, int tokens, double step_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_step_ms_ == 0) first_step_ms_ = now_ms;
  tokens_.emplace_back(now_ms, tokens);
  while (!tokens_.empty() && tokens_.front().first < now_ms - kLongMs) tokens_.pop_front();
  busy_.emplace_back(now_ms, step_ms);
  while (!busy_.empty() && busy_.front().first < now_ms - kShortMs) busy_.pop_front();
  const size_t k = std::min(static_cast<size_t>(std::max(decoded, 0)), batch_hist_.size() - 1);
  ++batch_hist_[k];
}

void MetricsRecorder::on_image_step(int images, double step_ms) {
  (void)images;
  std::lock_guard<std::mutex> lock(mu_);
  ++image_steps_;
  push_sample(image_step_ms_, step_ms);
}

void MetricsRecorder::on_image_lane(bool busy, int64_t now_us) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_step_ms_ == 0) first_step_ms_ = now_us / 1000;
  if (busy) {
    if (image_busy_since_us_ == 0) image_busy_since_us_ = now_us;
    return;
  }
  if (image_busy_since_us_ == 0) return;
  image_busy_.emplace_back(image_busy_since_us_, now_us);
  image_busy_since_us_ = 0;
  while (!image_busy_.empty() && image_busy_.front().second < now_us - kShortMs * 1000) image_busy_.pop_front();
}

void MetricsRecorder::on_first_token(double ttft_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  push_sample(ttft_, ttft_ms);
}

void MetricsRecorder::on_inter_token(double ms, bool interactive) {
  std::lock_guard<std::mutex> lock(mu_);
  push_sample(itl_, ms);
  if (interactive) push_sample(itl_interactive_, ms);
}

void MetricsRecorder::on_prompt(int prompt_tokens, int cached_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt_tokens;
  cached_tokens_ += cached_tokens;
}

void MetricsRecorder::on_finish(JobState state, int64_t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state == JobState::Completed) ++completed_;
  if (state == JobState::Failed) ++failed_;
  if (state == JobState::Cancelled) ++cancelled_;
  recent_failures_.push_back(state == JobState::Failed);
  if (recent_failures_.size() > 100) recent_failures_.pop_front();
}

void MetricsRecorder::on_preempt() {
  std::lock_guard<std::mutex> lock(mu_);
  ++preemptions_;
}

Percentiles MetricsRecorder::percentiles(const std::deque<double>& samples) {
  Percentiles p;
  if (samples.empty()) return p;
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))]; };
  p.p50 = at(0.50);
  p.p99 = at(0.99);
  return p;
}

double MetricsRecorder::interactive_p99_inter_token_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Only the recent past matters for the latency target.
  std::deque<double> recent(itl_interactive_.size() > 64 ? itl_interactive_.end() - 64 : itl_interactive_.begin(),
                            itl_interactive_.end());
  return percentiles(recent).p99;
}

double MetricsRecorder::tokens_per_s(int64_t now_ms, int64_t window_ms) const {
  const int64_t since = now_ms - window_ms;
  int64_t n = 0;
  for (const auto& [t, k] : tokens_)
    if (t >= since) n += k;
  const int64_t span = std::min<int64_t>(window_ms, now_ms - first_step_ms_);
  return span > 0 ? static_cast<double>(n) * 1000.0 / static_cast<double>(span) : 0.0;
}

void MetricsRecorder::fill(EngineMetrics& m, int64_t now_ms) const {
  std::lock_guard<std::mutex> lock(mu_);
  m.tokens_per_s = tokens_per_s(now_ms, kShortMs);
  m.recent_tokens_per_s = tokens_per_s(now_ms, kLongMs);
  m.time_to_first_token_ms = percentiles(ttft_);
  m.inter_token_ms = percentiles(itl_);
  m.batch_size_histogram = batch_hist_;
  m.completed = completed_;
  m.failed = failed_;
  m.cancelled = cancelled_;
  m.preemptions = preemptions_;
  m.image_steps = image_steps_;
  m.image_step_ms = percentiles(image_step_ms_);
  m.prefix_cache_hit_rate = prompt_tokens_ > 0 ? static_cast<double>(cached_tokens_) / static_cast<double>(prompt_tokens_) : 0.0;
  double busy_ms = 0;
  for (const auto& [t, ms] : busy_) busy_ms += ms;
  const int64_t span = std::min<int64_t>(kShortMs, std::max<int64_t>(1, now_ms - first_step_ms_));
  // The image lane's calls, clipped to the window (the open one up to now).
  const int64_t now_us = now_ms * 1000, since_us = now_us - span * 1000;
  double image_ms = 0;
  const auto overlap = [&](int64_t a, int64_t b) {
    image_ms += static_cast<double>(std::max<int64_t>(0, std::min(b, now_us) - std::max(a, since_us))) / 1000.0;
  };
  for (const auto& [a, b] : image_busy_) overlap(a, b);
  if (image_busy_since_us_) overlap(image_busy_since_us_, now_us);
  m.busy_fraction = first_step_ms_ ? std::min(1.0, std::max(busy_ms, image_ms) / static_cast<double>(span)) : 0.0;
  m.active_alerts.assign(active_.begin(), active_.end());
}

std::vector<std::string> MetricsRecorder::check_alerts(const AlertRules& rules, EngineMetrics& m) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, bool>> checks;
  char buf[256];
  // Throughput: only meaningful under load and with a minute of history.
  const bool loaded = m.running > 0 && m.recent_tokens_per_s > 0 && !tokens_.empty() &&
                      tokens_.back().first - first_step_ms_ >= kLongMs / 2;
  std::snprintf(buf, sizeof buf, "throughput %.1f tokens/s is more than %.0f%% below its recent average %.1f",
                m.tokens_per_s, rules.throughput_drop_fraction * 100, m.recent_tokens_per_s);
  checks.emplace_back(buf, loaded && m.tokens_per_s < (1.0 - rules.throughput_drop_fraction) * m.recent_tokens_per_s);
  const int total = m.kv_blocks_used + m.kv_blocks_free;
  const double mem = total > 0 ? static_cast<double>(m.kv_blocks_used) / total : 0.0;
  std::snprintf(buf, sizeof buf, "KV memory %.0f%% used (threshold %.0f%%)", mem * 100, rules.memory_fraction * 100);
  checks.emplace_back(buf, mem > rules.memory_fraction);
  // A GPU's memory (NVML: every process's use), where the device reports it.
  const double gpu = m.telemetry_available && m.device_memory_total_bytes > 0
                         ? static_cast<double>(m.device_memory_used_bytes) / static_cast<double>(m.device_memory_total_bytes)
                         : 0.0;
  std::snprintf(buf, sizeof buf, "GPU memory %.0f%% used on %s (threshold %.0f%%)", gpu * 100, m.device.c_str(),
                rules.memory_fraction * 100);
  checks.emplace_back(buf, gpu >= rules.memory_fraction);
  int fails = 0;
  for (bool f : recent_failures_) fails += f;
  const double rate = recent_failures_.empty() ? 0.0 : static_cast<double>(fails) / static_cast<double>(recent_failures_.size());
  std::snprintf(buf, sizeof buf, "error rate %.0f%% of the last %zu jobs (threshold %.0f%%)", rate * 100,
                recent_failures_.size(), rules.error_rate * 100);
  checks.emplace_back(buf, recent_failures_.size() >= 10 && rate > rules.error_rate);

  std::vector<std::string> raised;
  std::set<std::string> now;
  for (auto& [text, on] : checks) {
    const std::string kind = text.substr(0, text.find(' '));
    bool was = false;
    for (const auto& a : active_) was |= a.rfind(kind, 0) == 0;
    if (on) {
      now.insert(text);
      if (!was) raised.push_back(text);
    }
  }
  active_ = std::move(now);
  m.active_alerts.assign(active_.begin(), active_.end());
  return raised;
}

}  // namespace atelier
