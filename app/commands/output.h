// Shared output helpers of the headless commands: unbuffered stdout writes
// for streaming, JSON Lines, and the one-line error format.
#pragma once

#include <atelier/engine.h>
#include <atelier/models.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace atelier::app {

inline void write_stdout(const std::string& s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// Invalid UTF-8 (a token that is half of a character) is replaced, not thrown on.
inline void print_json_line(const nlohmann::json& j) {
  write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

// Where the persistent queue lives: $ATELIER_HOME, else $XDG_DATA_HOME/atelier,
// else ~/.local/share/atelier.
// The same folder as the model store's default (one definition, in the engine).
inline std::string default_data_dir() { return default_store_dir(); }

inline nlohmann::json metrics_json(const EngineMetrics& m) {
  return {{"tokens_per_s", m.tokens_per_s},
          {"recent_tokens_per_s", m.recent_tokens_per_s},
          {"time_to_first_token_ms", {{"p50", m.time_to_first_token_ms.p50}, {"p99", m.time_to_first_token_ms.p99}}},
          {"inter_token_ms", {{"p50", m.inter_token_ms.p50}, {"p99", m.inter_token_ms.p99}}},
          {"batch_size_histogram", m.batch_size_histogram},
          {"queue_depth", m.queue_depth},
          {"running", m.running},
          {"completed", m.completed},
          {"failed", m.failed},
          {"cancelled", m.cancelled},
          {"preemptions", m.preemptions},
          {"kv_blocks_used", m.kv_blocks_used},
          {"kv_blocks_free", m.kv_blocks_free},
          {"kv_blocks_cached", m.kv_blocks_cached},
          {"prefix_cache_hit_rate", m.prefix_cache_hit_rate},
          {"busy_fraction", m.busy_fraction},
          {"device_memory_total_bytes", m.device_memory_total_bytes},
          {"device_memory_free_bytes", m.device_memory_free_bytes},
          {"device", m.device},
          {"device_losses", m.device_losses},
          {"gpu", m.telemetry_available ? nlohmann::json{{"utilization_percent", m.device_utilization_percent},
                                                         {"temperature_c", m.device_temperature_c},
                                                         {"memory_used_bytes", m.device_memory_used_bytes},
                                                         {"memory_total_bytes", m.device_memory_total_bytes}}
                                        : nlohmann::json(nullptr)},
          {"alerts", m.active_alerts}};
}

// Writes TEXT to PATH through a temporary file, fsync and rename (queue.cpp):
// PATH is whole or as it was, never half written.
Status write_file_atomically(const std::filesystem::path& path, const std::string& text);

inline int fail(const Status& s) {
  std::fprintf(stderr, "atelier: error: %s\n", s.message.c_str());
  return s.code == StatusCode::InvalidArgument ? 2 : 1;
}

}  // namespace atelier::app
