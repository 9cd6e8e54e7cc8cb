// llama-server's extras: /health, /tokenize, /detokenize, /apply-template,
// /props, and /metrics in Prometheus' text format.
#include <sstream>

#include "server/context.h"

namespace atelier::server {

namespace {

// Prometheus text exposition: base units (seconds, ratios), counters end in _total.
class PromText {
 public:
  void family(const std::string& name, const std::string& type, const std::string& help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& name, double value, const std::string& labels = "") {
    out_ << name;
    if (!labels.empty()) out_ << '{' << labels << '}';
    out_ << ' ' << value << '\n';
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

std::string metrics_text(Context& ctx) {
  const EngineMetrics m = ctx.engine.metrics();
  PromText p;
  p.family("atelier_generated_tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.");
  p.sample("atelier_generated_tokens_per_second", m.tokens_per_s);
  p.family("atelier_time_to_first_token_seconds", "summary", "Time from submission to the first token of text jobs.");
  p.sample("atelier_time_to_first_token_seconds", m.time_to_first_token_ms.p50 / 1000, "quantile=\"0.5\"");
  p.sample("atelier_time_to_first_token_seconds", m.time_to_first_token_ms.p99 / 1000, "quantile=\"0.99\"");
  p.family("atelier_inter_token_seconds", "summary", "Gaps between consecutive tokens of a text job.");
  p.sample("atelier_inter_token_seconds", m.inter_token_ms.p50 / 1000, "quantile=\"0.5\"");
  p.sample("atelier_inter_token_seconds", m.inter_token_ms.p99 / 1000, "quantile=\"0.99\"");

  p.family("atelier_batch_size", "histogram", "Sequences decoded together per text step.");
  int64_t cumulative = 0, steps = 0;
  double sum = 0;
  for (size_t k = 0; k < m.batch_size_histogram.size(); ++k) {
    cumulative += m.batch_size_histogram[k];
    sum += static_cast<double>(k) * static_cast<double>(m.batch_size_histogram[k]);
    p.sample("atelier_batch_size_bucket", static_cast<double>(cumulative), "le=\"" + std::to_string(k) + "\"");
  }
  steps = cumulative;
  p.sample("atelier_batch_size_bucket", static_cast<double>(steps), "le=\"+Inf\"");
  p.sample("atelier_batch_size_sum", sum);
  p.sample("atelier_batch_size_count", static_cast<double>(steps));

  int queued_text = 0, queued_image = 0;
  JobFilter f;
  f.state = JobState::Queued;
  f.limit = 100000;
  for (const JobInfo& j : ctx.engine.list(f)) (j.kind == "image" ? queued_image : queued_text)++;
  p.family("atelier_queue_depth", "gauge", "Jobs waiting in the queue, by kind.");
  p.sample("atelier_queue_depth", queued_text, "kind=\"text\"");
  p.sample("atelier_queue_depth", queued_image, "kind=\"image\"");
  p.family("atelier_jobs_running", "gauge", "Jobs running now.");
  p.sample("atelier_jobs_running", m.running);
  p.family("atelier_jobs_finished_total", "counter", "Jobs finished since the metrics were reset, by final state.");
  p.sample("atelier_jobs_finished_total", static_cast<double>(m.completed), "state=\"completed\"");
  p.sample("atelier_jobs_finished_total", static_cast<double>(m.failed), "state=\"failed\"");
  p.sample("atelier_jobs_finished_total", static_cast<double>(m.cancelled), "state=\"cancelled\"");
  p.family("atelier_preemptions_total", "counter", "Sequences whose KV memory was taken back (recomputed later).");
  p.sample("atelier_preemptions_total", static_cast<double>(m.preemptions));
  p.family("atelier_kv_blocks", "gauge", "Paged KV cache blocks, by state.");
  p.sample("atelier_kv_blocks", m.kv_blocks_used, "state=\"used\"");
  p.sample("atelier_kv_blocks", m.kv_blocks_free, "state=\"free\"");
  p.sample("atelier_kv_blocks", m.kv_blocks_cached, "state=\"cached\"");
  const int kv_total = m.kv_blocks_used + m.kv_blocks_free;
  p.family("atelier_kv_usage_ratio", "gauge", "KV blocks in use over all KV blocks.");
  p.sample("atelier_kv_usage_ratio", kv_total ? static_cast<double>(m.kv_blocks_used) / kv_total : 0.0);
  p.family("atelier_prefix_cache_hit_ratio", "gauge", "Prompt tokens served from shared KV blocks over prompt tokens.");
  p.sample("atelier_prefix_cache_hit_ratio", m.prefix_cache_hit_rate);
  p.family("atelier_busy_ratio", "gauge", "Executor time spent in model steps over the last 10 s.");
  p.sample("atelier_busy_ratio", m.busy_fraction);
  p.family("atelier_image_steps_total", "counter", "Image-lane steps (one network evaluation of every image it advanced).");
  p.sample("atelier_image_steps_total", static_cast<double>(m.image_steps));
  p.family("atelier_image_step_seconds", "summary", "Durations of image-lane steps.");
  p.sample("atelier_image_step_seconds", m.image_step_ms.p50 / 1000, "quantile=\"0.5\"");
  p.sample("atelier_image_step_seconds", m.image_step_ms.p99 / 1000, "quantile=\"0.99\"");
  // The device (issue 33): its memory, and NVML's sensors where it has them.
  const std::string dev = "device=\"" + m.device + "\"";
  p.family("atelier_device_info", "gauge", "The device text jobs run on (1), by name.");
  p.sample("atelier_device_info", 1, dev);
  p.family("atelier_device_memory_total_bytes", "gauge", "The device's memory (the machine's RAM for the CPU).");
  p.sample("atelier_device_memory_total_bytes", static_cast<double>(m.device_memory_total_bytes), dev);
  p.family("atelier_device_memory_free_bytes", "gauge", "The device's free memory.");
  p.sample("atelier_device_memory_free_bytes", static_cast<double>(m.device_memory_free_bytes), dev);
  if (m.telemetry_available) {
    p.family("atelier_gpu_memory_used_bytes", "gauge", "GPU memory in use by every process (NVML).");
    p.sample("atelier_gpu_memory_used_bytes", static_cast<double>(m.device_memory_used_bytes), dev);
    p.family("atelier_gpu_utilization_ratio", "gauge", "Share of the last sample period a kernel ran on the GPU (NVML).");
    p.sample("atelier_gpu_utilization_ratio", m.device_utilization_percent / 100, dev);
    p.family("atelier_gpu_temperature_celsius", "gauge", "GPU temperature (NVML).");
    p.sample("atelier_gpu_temperature_celsius", m.device_temperature_c, dev);
  }
  p.family("atelier_device_losses_total", "counter", "GPUs lost while running (their jobs requeued, the CPU took over).");
  p.sample("atelier_device_losses_total", static_cast<double>(m.device_losses));
  p.family("atelier_alerts_active", "gauge", "Engine alerts now active.");
  p.sample("atelier_alerts_active", static_cast<double>(m.active_alerts.size()));
  p.family("atelier_http_requests_total", "counter", "HTTP requests this server answered.");
  p.sample("atelier_http_requests_total", static_cast<double>(ctx.requests.load()));
  p.family("atelier_http_errors_total", "counter", "HTTP requests answered with an error.");
  p.sample("atelier_http_errors_total", static_cast<double>(ctx.errors.load()));
  return p.str();
}

std::vector<int32_t> token_list(const json& body) {
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw bad_field("tokens", "must be a list of token ids");
  std::vector<int32_t> ids;
  for (const auto& t : *it) {
    if (!t.is_number_integer()) throw bad_field("tokens", "must hold integers only");
    ids.push_back(t.get<int32_t>());
  }
  return ids;
}

}  // namespace

void add_llama_routes(httplib::Server& http, Context& ctx) {
  http.Get("/health", guarded(ctx, [&ctx](const httplib::Request&, httplib::Response& res) {
             if (!ctx.ready) throw ApiError(503, "Loading model", "", "unavailable_error", "loading");
             send_json(res, {{"status", "ok"}});
           }));

  http.Post("/tokenize", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
              json body = parse_body(req);
              auto content = opt_string(body, "content");
              if (!content) throw bad_field("content", "is required (a string)");
              const bool add_special = opt_bool(body, "add_special").value_or(false);
              const bool with_pieces = opt_bool(body, "with_pieces").value_or(false);
              ModelEntry m = ctx.model(opt_string(body, "model").value_or(""));
              auto vocab = ctx.vocabulary(m);
              auto ids = vocab->tokenize(*content, add_special, true);
              if (!ids.ok()) throw from_status(ids.status(), "content");
              json tokens = json::array();
              for (int32_t id : ids.value()) {
                if (with_pieces) tokens.push_back({{"id", id}, {"piece", vocab->token_piece(id)}});
                else tokens.push_back(id);
              }
              send_json(res, {{"tokens", tokens}});
            }));

  http.Post("/detokenize", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
              json body = parse_body(req);
              auto ids = token_list(body);
              ModelEntry m = ctx.model(opt_string(body, "model").value_or(""));
              auto vocab = ctx.vocabulary(m);
              std::string text;
              for (int32_t id : ids) {
                if (id < 0 || id >= vocab->n_vocab())
                  throw bad_field("tokens", "holds " + std::to_string(id) + ", outside the vocabulary (0.." +
                                                std::to_string(vocab->n_vocab() - 1) + ")");
                text += vocab->token_piece(id);
              }
              send_json(res, {{"content", text}});
            }));

  http.Post("/apply-template", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
              json body = parse_body(req);
              auto messages = chat_messages(body);
              ModelEntry m = ctx.model(opt_string(body, "model").value_or(""));
              auto prompt = format_chat_prompt(m.info, messages, true);
              if (!prompt.ok()) throw ApiError(400, prompt.status().message, "messages", "invalid_request_error", "template_error");
              send_json(res, {{"prompt", prompt.value()}});
            }));

  http.Get("/props", guarded(ctx, [&ctx](const httplib::Request&, httplib::Response& res) {
             const DeviceSelection d = ctx.engine.device();
             json props = {{"build_info", engine_build()},
                           {"total_slots", ctx.options.max_connections},
                           {"device", {{"name", d.name}, {"description", d.description}, {"automatic", d.automatic},
                                       {"why", d.why}, {"precision", d.precision}}}};
             if (!ctx.options.default_model.empty()) {
               ModelEntry m = ctx.model("");
               props["model_path"] = m.resolved.path;
               props["model_alias"] = m.resolved.display;
               props["chat_template"] = m.info.chat_template;
               props["bos_token"] = m.info.bos_token;
               props["eos_token"] = m.info.eos_token;
               props["system_fingerprint"] = m.fingerprint;
               const SamplingParams s;
               props["default_generation_settings"] = {
                   {"n_ctx", m.info.n_ctx_train},
                   {"params", {{"temperature", s.temperature}, {"top_k", s.top_k}, {"top_p", s.top_p}, {"min_p", s.min_p},
                               {"repeat_penalty", s.repeat_penalty}, {"n_predict", ctx.options.max_tokens}}}};
             }
             send_json(res, props);
           }));

  http.Get("/metrics", guarded(ctx, [&ctx](const httplib::Request&, httplib::Response& res) {
             res.set_content(metrics_text(ctx), "text/plain; version=0.0.4");
           }));
}

}  // namespace atelier::server
