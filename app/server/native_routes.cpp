// The native routes: any engine request in its JSON form (the job database's,
// `atelier batch`'s) as a job, its state, its cancellation and its events.
#include <atelier/models.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/context.h"

namespace atelier::server {

json job_json(const JobInfo& j) {
  json request = json::parse(j.kind == "image" ? image_request_to_json(j.image_request) : request_to_json(j.request), nullptr, false);
  json out = {{"id", j.id}, {"state", job_state_name(j.state)}, {"kind", j.kind}, {"request", request},
              {"priority", j.priority}, {"created_ms", j.created_ms}, {"started_ms", j.started_ms},
              {"finished_ms", j.finished_ms}, {"seed", j.seed}, {"model_version", j.model_version},
              {"model_name", j.model_name}, {"device", j.device}, {"precision", j.precision},
              {"engine_build", j.engine_build}, {"attempts", j.attempts}, {"text", j.text}, {"stop_reason", j.stop_reason},
              {"files", j.files}, {"error", j.error}, {"error_code", j.error_code}};
  out["stats"] = {{"queue_wait_ms", j.stats.queue_wait_ms}, {"time_to_first_token_ms", j.stats.time_to_first_token_ms},
                  {"total_ms", j.stats.total_ms}, {"tokens_per_s", j.stats.tokens_per_s},
                  {"prompt_tokens", j.stats.prompt_tokens}, {"new_tokens", j.stats.new_tokens},
                  {"cached_prompt_tokens", j.stats.cached_prompt_tokens}};
  return out;
}

// PNG bytes of a preview ("" when it has none), through the engine's PNG writer.
std::string preview_png(const ImageProgress& p) {
  if (p.preview_rgb.empty()) return "";
  static std::atomic<int> counter{0};
  auto path = std::filesystem::temp_directory_path() /
              ("atelier-preview-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".png");
  if (!write_preview_png(p, path.string()).ok()) return "";
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return ss.str();
}

namespace {

json event_json(const Event& e) {
  json out = {{"type", event_type_name(e.type)}, {"job", e.job}};
  switch (e.type) {
    case EventType::Token: out["index"] = e.index; out["token_id"] = e.token_id; out["text"] = e.text; break;
    case EventType::Segment: out["text"] = e.text; break;
    case EventType::Progress: out["progress"] = e.progress; break;
    case EventType::Preview: {
      out["image"] = e.image.image;
      out["images"] = e.image.images;
      out["step"] = e.image.step;
      out["steps"] = e.image.steps;
      std::string png = preview_png(e.image);
      if (!png.empty()) out["preview_png"] = base64_encode(png);
      break;
    }
    case EventType::Completed:
      out["text"] = e.result.text;
      out["ids"] = e.result.ids;
      out["stop_reason"] = e.result.stats.stop_reason;
      out["files"] = e.files;
      break;
    case EventType::Failed:
      out["code"] = status_code_name(e.code);
      out["message"] = e.message;
      break;
    default: break;
  }
  return out;
}

JobId job_id(const httplib::Request& req) {
  try {
    return std::stoll(req.matches[1]);
  } catch (...) {
    throw ApiError(400, "the job id in the path must be a number", "id");
  }
}

JobInfo find_job(Context& ctx, JobId id) {
  auto j = ctx.engine.job(id);
  if (!j.ok()) throw ApiError(404, "no job " + std::to_string(id) + " in the queue", "id", "invalid_request_error", "job_not_found");
  return j.value();
}

bool finished(JobState s) { return s == JobState::Completed || s == JobState::Failed || s == JobState::Cancelled; }

}  // namespace

void add_native_routes(httplib::Server& http, Context& ctx) {
  http.Post("/v1/jobs", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
              parse_body(req);  // a JSON object, or a 400 in OpenAI's shape
              Result<JobId> id = Status{};
              std::string warning;  // an image that would take unusually long (accepted, told)
              if (is_image_request_json(req.body)) {
                auto r = image_request_from_json(req.body);
                if (!r.ok()) throw from_status(r.status());
                // Files by what the server shares: models by reference or under --models-dir, pictures and the output by name in the output folder.
                if (r->model != ctx.options.default_model) r->model = shared_model_ref(ctx, "model", r->model);
                if (!r->tokenizer.empty()) r->tokenizer = shared_model_file(ctx, "tokenizer", r->tokenizer);
                if (!r->preview_decoder.empty()) r->preview_decoder = shared_model_file(ctx, "preview_decoder", r->preview_decoder);
                if (!r->init_image.empty()) r->init_image = output_picture(ctx, "init_image", r->init_image);
                if (!r->mask.empty()) r->mask = output_picture(ctx, "mask", r->mask);
                if (int64_t{r->width} * r->height > ctx.options.max_image_pixels)
                  throw bad_field("width", "x height must be at most " + std::to_string(ctx.options.max_image_pixels) + " pixels (--max-image-pixels)");
                if (r->batch_count * r->batch_size > ctx.options.max_images)
                  throw bad_field("batch_size", "x batch_count must be at most " + std::to_string(ctx.options.max_images) + " (--max-images)");
                if (!r->output.empty()) r->output = output_file(ctx, "output", r->output, r->batch_count * r->batch_size);
                if (auto est = ctx.engine.estimate(r.value()); est.ok()) warning = est->warning;
                id = ctx.engine.submit(r.value());
              } else {
                auto r = request_from_json(req.body);
                if (!r.ok()) throw from_status(r.status());
                // Resolved now: an unknown model is a 404 and a file that is no model a 400, not a job that fails later.
                const ModelEntry m = ctx.model(r->model);
                if (!m.resolved.in_store) r->model = m.resolved.path;
                if (r->max_new_tokens > ctx.options.max_tokens)
                  throw bad_field("max_new_tokens", "must be at most " + std::to_string(ctx.options.max_tokens) + " (--max-tokens)");
                id = ctx.engine.submit(r.value());
              }
              if (!id.ok()) throw from_status(id.status());
              json out = job_json(find_job(ctx, id.value()));
              if (!warning.empty()) out["warning"] = warning;
              send_json(res, out, 201);
            }));

  http.Get("/v1/jobs", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
             JobFilter f;
             f.newest_first = true;
             f.limit = 100;
             if (req.has_param("limit")) {
               const std::string v = req.get_param_value("limit");
               int64_t n = 0;
               const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
               if (ec == std::errc::invalid_argument || end != v.data() + v.size() || v.empty())
                 throw bad_field("limit", "must be a whole number from 1 to 10000, not '" + v + "'");
               if (ec == std::errc::result_out_of_range || n < 1 || n > 10000)
                 throw bad_field("limit", "must be from 1 to 10000, not " + v);
               f.limit = static_cast<int>(n);
             }
             json data = json::array();
             for (const JobInfo& j : ctx.engine.list(f)) data.push_back(job_json(j));
             send_json(res, {{"object", "list"}, {"data", data}});
           }));

  http.Get(R"(/v1/jobs/(\d+))", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
             send_json(res, job_json(find_job(ctx, job_id(req))));
           }));

  http.Delete(R"(/v1/jobs/(\d+))", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
                JobId id = job_id(req);
                JobInfo j = find_job(ctx, id);
                if (finished(j.state))
                  throw ApiError(409, "job " + std::to_string(id) + " has already finished (" +
                                          std::string(job_state_name(j.state)) + ")", "id", "invalid_request_error", "job_finished");
                Status s = ctx.engine.cancel(id);
                if (!s.ok()) throw from_status(s, "id");
                send_json(res, job_json(find_job(ctx, id)));
              }));

  http.Get(R"(/v1/jobs/(\d+)/events)", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
             JobId id = job_id(req);
             find_job(ctx, id);
             auto queue = std::make_shared<EventQueue>();
             const uint64_t sub = ctx.engine.subscribe(id, [queue](const Event& e) { queue->push(e); });
             ClientWatch watch(req);
             res.set_header("Cache-Control", "no-cache");
             res.set_chunked_content_provider(
                 "text/event-stream",
                 [&ctx, id, queue, watch](size_t, httplib::DataSink& sink) {
                   auto send = [&](const json& j) {
                     std::string s = sse_line(j);
                     return sink.write(s.data(), s.size());
                   };
                   // Subscribed first, then read: a job that had already finished
                   // is told from the database, one that finishes now from its event.
                   JobInfo j = find_job(ctx, id);
                   if (!send({{"type", "state"}, {"job", id}, {"state", job_state_name(j.state)}})) return false;
                   bool done = finished(j.state);
                   Event e;
                   while (!done) {
                     if (watch.gone()) return false;
                     if (!queue->pop(e, 500)) {
                       // Finished without an event reaching this stream: say how it ended.
                       if (auto again = ctx.engine.job(id); again.ok() && finished(again->state)) {
                         if (!send({{"type", "state"}, {"job", id}, {"state", job_state_name(again->state)}})) return false;
                         done = true;
                       }
                       continue;
                     }
                     if (!send(event_json(e))) return false;
                     done = e.type == EventType::Completed || e.type == EventType::Failed || e.type == EventType::Cancelled;
                   }
                   const std::string end = "data: [DONE]\n\n";
                   sink.write(end.data(), end.size());
                   sink.done();
                   return true;
                 },
                 [&ctx, sub](bool) { ctx.engine.unsubscribe(sub); });
           }));
}

}  // namespace atelier::server
