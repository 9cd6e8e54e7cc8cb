// Engine-wide metrics and alert rules: throughput over sliding windows,
// P50/P99 time to first token and inter-token latency, batch sizes, busy
// fraction, outcomes. Thread-safe; the executor records, the API reads.
#pragma once

#include <atelier/engine.h>

#include <deque>
#include <mutex>
#include <set>
#include <vector>

namespace atelier {

class MetricsRecorder {
 public:
  explicit MetricsRecorder(int max_batch);
  void reset();
  // One executor step that decoded `decoded` sequences (batch size) and generated `tokens` new tokens.
  void on_step(int64_t now_ms, int decoded, int tokens, double step_ms);
  void on_first_token(double ttft_ms);
  void on_inter_token(double ms, bool interactive);
  void on_prompt(int prompt_tokens, int cached_tokens);
  void on_finish(JobState state, int64_t now_ms);
  void on_preempt();
  // One image-lane step (a UNet call over `images` images): its duration's percentiles.
  void on_image_step(int images, double step_ms);
  // The image lane entered (BUSY) or left a model call (prompt encoding, a UNet step, a preview, the decode,
  // a one-pass model) at NOW_US (microseconds since the epoch: a QuickDraw image takes about a millisecond);
  // busy_fraction counts the lane's calls, the open one up to now.
  void on_image_lane(bool busy, int64_t now_us);
  double interactive_p99_inter_token_ms() const;

  // Fills the recorder's part of m (queue and KV figures are the caller's).
  void fill(EngineMetrics& m, int64_t now_ms) const;
  // Alerts that became active now (edge-triggered); `m` must be filled.
  std::vector<std::string> check_alerts(const AlertRules& rules, EngineMetrics& m);

 private:
  static Percentiles percentiles(const std::deque<double>& samples);
  double tokens_per_s(int64_t now_ms, int64_t window_ms) const;

  mutable std::mutex mu_;
  std::deque<std::pair<int64_t, int>> tokens_;      // (time, tokens) of recent steps, last 60 s
  std::deque<std::pair<int64_t, double>> busy_;     // (time, step ms), last 10 s
  std::deque<double> ttft_, itl_, itl_interactive_; // last kSamples samples
  std::deque<double> image_step_ms_;
  int64_t image_steps_ = 0;
  std::vector<int64_t> batch_hist_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0;
  int64_t completed_ = 0, failed_ = 0, cancelled_ = 0, preemptions_ = 0;
  std::deque<bool> recent_failures_;                // last 100 finished jobs
  int64_t first_step_ms_ = 0;
  std::deque<std::pair<int64_t, int64_t>> image_busy_;  // (start, end) in us of the image lane's recent calls, last 10 s
  int64_t image_busy_since_us_ = 0;                     // the call in progress began (0: none)
  std::set<std::string> active_;
};

}  // namespace atelier
