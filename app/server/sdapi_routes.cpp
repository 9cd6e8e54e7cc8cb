// AUTOMATIC1111's /sdapi/v1 routes, with the fields SillyTavern, Open WebUI
// and the webuiapi scripts send; what we do not implement (hires fix, face
// restoration, scripts, ...) is accepted and ignored, as A1111 itself ignores
// fields it does not know.
#include <atelier/store.h>
#include <atelier/tools.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/context.h"

namespace atelier::server {

namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The "parameters" text of a PNG (tEXt, or uncompressed iTXt): what A1111 calls its infotext.
std::string png_parameters(const std::string& png) {
  static const char sig[] = "\x89PNG\r\n\x1a\n";
  if (png.size() < 8 || png.compare(0, 8, sig, 8) != 0) return "";
  size_t at = 8;
  while (at + 12 <= png.size()) {
    const auto* p = reinterpret_cast<const unsigned char*>(png.data() + at);
    const size_t len = (size_t{p[0]} << 24) | (size_t{p[1]} << 16) | (size_t{p[2]} << 8) | p[3];
    if (len > png.size() - at - 12) break;
    const std::string type = png.substr(at + 4, 4);
    const std::string data = png.substr(at + 8, len);
    const size_t nul = data.find('\0');
    if (nul != std::string::npos && data.substr(0, nul) == "parameters") {
      if (type == "tEXt") return data.substr(nul + 1);
      if (type == "iTXt" && nul + 2 < data.size() && data[nul + 1] == 0) {  // uncompressed
        size_t lang = data.find('\0', nul + 3);
        size_t translated = lang == std::string::npos ? lang : data.find('\0', lang + 1);
        if (translated != std::string::npos) return data.substr(translated + 1);
      }
    }
    if (type == "IEND") break;
    at += 12 + len;
  }
  return "";
}

// A1111's sampler name (maybe with the schedule in it, as before 1.9) -> ours.
void apply_sampler(const std::string& a1111, ImageRequest& r) {
  std::string name = a1111;
  for (const char* suffix : {" Karras", " karras"})
    if (name.size() > 7 && name.compare(name.size() - 7, 7, suffix) == 0) {
      name.resize(name.size() - 7);
      r.scheduler = "karras";
    }
  r.sampler = name;
}

void apply_scheduler(const std::string& s, ImageRequest& r) {
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "karras") r.scheduler = "karras";
  else if (lower.empty() || lower == "automatic" || lower == "normal" || lower == "discrete" || lower == "uniform")
    r.scheduler = r.scheduler == "karras" && lower == "automatic" ? "karras" : "discrete";
  else
    throw bad_field("scheduler", "'" + s + "' is not one this server has: use Automatic, Uniform or Karras (GET /sdapi/v1/schedulers)");
}

// "name [hash]" (A1111's title) or "name.safetensors" -> the store reference;
// a path stays a path (a file under --models-dir).
std::string checkpoint_ref(const Context& ctx, std::string title) {
  if (auto b = title.rfind(" ["); b != std::string::npos && title.back() == ']') title.resize(b);
  if (title.find('/') != std::string::npos) return title;
  for (const char* ext : {".safetensors", ".ckpt"})
    if (title.size() > std::strlen(ext) && title.compare(title.size() - std::strlen(ext), std::strlen(ext), ext) == 0) {
      bool file = false;  // a file of that name in a shared folder, else the store model of that stem
      for (const auto& dir : ctx.options.models_dirs) {
        std::error_code ec;
        file = file || fs::exists(fs::path(dir) / title, ec);
      }
      if (!file) title.resize(title.size() - std::strlen(ext));
    }
  return title;
}

// sd_model_checkpoint (the global option or a request's override): a store
// reference or a shared file that is an image model, else 403/404/400 naming
// the field; the checked reference.
std::string image_checkpoint(Context& ctx, const std::string& field, const std::string& value) {
  const std::string ref = checkpoint_ref(ctx, value);
  ModelEntry m = ctx.model(ref, field);  // 403 outside the shared folders, 404 for a model we do not have
  const auto not_image = [&](const std::string& what) {
    return ApiError(400, "'" + field + "' names '" + ref + "', which is " + what +
                             ": pick an image model (GET /sdapi/v1/sd-models)", field, "invalid_request_error", "wrong_model_kind");
  };
  if (m.resolved.in_store) {
    if (m.resolved.kind != "image") throw not_image("a text model");
  } else {
    auto file = inspect_model_file(m.resolved.path);
    if (!file.ok()) throw not_image(file.status().code == StatusCode::InvalidModel ? "a model file that cannot load" : "not a model file");
    if (file->kind != "image") throw not_image("a text model");
  }
  return ref;
}

std::vector<StoreModel> image_models(Context& ctx) {
  std::vector<StoreModel> out;
  auto store = Store::open(ctx.options.store_dir, false);
  if (!store.ok()) return out;
  auto models = store.value()->list();
  if (!models.ok()) return out;
  for (auto& m : models.value())
    if (m.kind == "image" && !m.versions.empty()) out.push_back(m);
  return out;
}

std::string current_checkpoint(Context& ctx) {
  {
    std::lock_guard lock(ctx.mu);
    if (!ctx.sd_model.empty()) return ctx.sd_model;
  }
  auto models = image_models(ctx);
  if (!models.empty()) return models.front().name;
  return ctx.options.default_model;
}

std::string short_hash(const std::string& digest) {
  std::string hex = digest.rfind("sha256:", 0) == 0 ? digest.substr(7) : digest;
  return hex.substr(0, 10);
}

// An init image or mask, raw base64 or a data URL, written where the job can read it.
class TempPictures {
 public:
  ~TempPictures() {
    std::error_code ec;
    for (const auto& p : paths_) fs::remove(p, ec);
  }
  std::string write(const std::string& field, const std::string& value) {
    std::string b64 = value;
    if (b64.rfind("data:", 0) == 0) {
      auto comma = b64.find(',');
      if (comma == std::string::npos) throw bad_field(field, "is a data URL without data");
      b64 = b64.substr(comma + 1);
    }
    std::erase_if(b64, [](char c) { return c == '\n' || c == '\r' || c == ' '; });
    std::string bytes = base64_decode(b64);
    if (bytes.empty()) throw bad_field(field, "must be a base64 picture (PNG, JPEG, WebP) or a data URL");
    // mkstemp: a fresh file of our own (O_EXCL), never one a link planted in the temp folder points at.
    std::string path = (fs::temp_directory_path() / "atelier-sdapi-XXXXXX").string();
    const int fd = ::mkstemp(path.data());
    if (fd < 0) throw ApiError(500, std::string("cannot write the picture to a temporary file: ") + std::strerror(errno));
    paths_.push_back(path);
    fields_.push_back(field);
    bool written = true;
    for (size_t done = 0; done < bytes.size() && written;) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      written = n > 0;
      if (written) done += static_cast<size_t>(n);
    }
    const int err = errno;
    ::close(fd);
    if (!written) throw ApiError(507, std::string("cannot write the picture to a temporary file: ") + std::strerror(err));
    return path;
  }
  // The engine's error about a picture names its temporary file: name the field instead.
  ApiError error(const Status& s) const {
    for (size_t i = 0; i < paths_.size(); ++i)
      if (auto at = s.message.find(paths_[i]); at != std::string::npos) {
        std::string m = s.message;
        m.replace(at, paths_[i].size(), "'" + fields_[i] + "'");
        return ApiError(400, m, fields_[i], "invalid_request_error", "invalid_picture");
      }
    return from_status(s);
  }

 private:
  std::vector<std::string> paths_, fields_;
};

void generate(Context& ctx, const httplib::Request& req, httplib::Response& res, bool img2img) {
  json body = parse_body(req);
  ImageRequest r;
  r.prompt = opt_string(body, "prompt").value_or("");
  r.negative_prompt = opt_string(body, "negative_prompt").value_or("");
  if (auto v = opt_int(body, "steps", 1, 1000)) r.steps = static_cast<int>(*v);
  if (auto v = opt_number(body, "cfg_scale", 0, 100)) r.cfg_scale = static_cast<float>(*v);
  if (auto v = opt_int(body, "width", 8, 4096)) r.width = static_cast<int>(*v);
  if (auto v = opt_int(body, "height", 8, 4096)) r.height = static_cast<int>(*v);
  if (auto v = opt_int(body, "batch_size", 1, 16)) r.batch_size = static_cast<int>(*v);
  if (auto v = opt_int(body, "n_iter", 1, 100)) r.batch_count = static_cast<int>(*v);
  if (auto v = opt_int(body, "seed", INT64_MIN, INT64_MAX)) r.seed = *v < 0 ? SamplingParams::kRandomSeed : static_cast<uint64_t>(*v);
  if (auto v = opt_string(body, "sampler_name")) apply_sampler(*v, r);
  else if (auto v = opt_string(body, "sampler_index")) apply_sampler(*v, r);
  if (auto v = opt_string(body, "scheduler")) apply_scheduler(*v, r);
  if (r.width % 8 || r.height % 8) throw bad_field(r.width % 8 ? "width" : "height", "must be a multiple of 8");
  if (int64_t{r.width} * r.height > ctx.options.max_image_pixels)
    throw bad_field("width", "x height must be at most " + std::to_string(ctx.options.max_image_pixels) + " pixels (--max-image-pixels)");
  if (r.batch_size * r.batch_count > ctx.options.max_images)
    throw bad_field("batch_size", "x n_iter must be at most " + std::to_string(ctx.options.max_images) + " (--max-images)");

  std::string checkpoint = current_checkpoint(ctx);
  if (auto it = body.find("override_settings"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_field("override_settings", "must be an object");
    if (auto v = opt_string(*it, "sd_model_checkpoint"); v && !v->empty())
      checkpoint = image_checkpoint(ctx, "override_settings.sd_model_checkpoint", *v);
  }
  if (checkpoint.empty())
    throw ApiError(400, "no image model: import one (atelier models import FILE --kind image) or set sd_model_checkpoint",
                   "override_settings.sd_model_checkpoint", "invalid_request_error", "model_required");
  ModelEntry m = ctx.model(checkpoint);
  if (m.resolved.kind == "text")
    throw ApiError(400, "'" + checkpoint + "' is a text model; pick an image model (GET /sdapi/v1/sd-models)",
                   "sd_model_checkpoint", "invalid_request_error", "wrong_model_kind");
  r.model = m.resolved.in_store ? m.resolved.display : m.resolved.path;

  TempPictures pictures;
  if (img2img) {
    auto it = body.find("init_images");
    if (it == body.end() || !it->is_array() || it->empty() || !(*it)[0].is_string())
      throw bad_field("init_images", "must be a list holding one base64 picture");
    r.init_image = pictures.write("init_images", (*it)[0].get<std::string>());
    if (auto v = opt_number(body, "denoising_strength", 0, 1)) {
      if (*v <= 0) throw bad_field("denoising_strength", "must be above 0");
      r.strength = static_cast<float>(*v);
    }
    if (auto v = opt_string(body, "mask"); v && !v->empty()) r.mask = pictures.write("mask", *v);
  }
  r.interactive = true;

  auto queue = std::make_shared<EventQueue>();
  ClientWatch watch(req);
  auto id = ctx.events.submit([&] { return ctx.engine.submit(r); }, queue);
  if (!id.ok()) throw pictures.error(id.status());
  struct Unwatch {
    Context& ctx;
    JobId id;
    ~Unwatch() { ctx.events.unwatch(id); }
  } unwatch{ctx, id.value()};

  std::vector<std::string> files;
  bool interrupted = false;
  for (bool done = false; !done;) {
    if (watch.gone()) {
      ctx.engine.cancel(id.value());
      return;
    }
    Event e;
    if (!queue->pop(e, 200)) continue;
    if (e.type == EventType::Completed) {
      files = e.files;
      done = true;
    } else if (e.type == EventType::Failed) {
      throw from_status(Status::error(e.code, e.message));
    } else if (e.type == EventType::Cancelled) {
      interrupted = done = true;
    }
  }
  auto job = ctx.engine.job(id.value());
  const uint64_t seed = job.ok() ? job->seed : r.seed;

  json images = json::array(), infotexts = json::array(), all_seeds = json::array(), all_prompts = json::array(),
       all_negative = json::array();
  for (const auto& f : files) {
    std::string png = read_file(f);
    images.push_back(base64_encode(png));
    infotexts.push_back(png_parameters(png));
  }
  const int count = r.batch_size * r.batch_count;
  for (int i = 0; i < count; ++i) {
    all_seeds.push_back(seed + static_cast<uint64_t>(i));
    all_prompts.push_back(r.prompt);
    all_negative.push_back(r.negative_prompt);
  }
  json info = {{"prompt", r.prompt}, {"all_prompts", all_prompts}, {"negative_prompt", r.negative_prompt},
               {"all_negative_prompts", all_negative}, {"seed", seed}, {"all_seeds", all_seeds}, {"subseed", seed},
               {"all_subseeds", all_seeds}, {"subseed_strength", 0}, {"width", r.width}, {"height", r.height},
               {"sampler_name", body.value("sampler_name", json("Euler a"))}, {"scheduler", r.scheduler == "karras" ? "Karras" : "Automatic"},
               {"cfg_scale", r.cfg_scale}, {"steps", r.steps}, {"batch_size", r.batch_size}, {"restore_faces", false},
               {"face_restoration_model", nullptr}, {"sd_model_name", m.resolved.name.empty() ? m.resolved.display : m.resolved.name},
               {"sd_model_hash", short_hash(m.resolved.digest)}, {"sd_vae_name", nullptr}, {"sd_vae_hash", nullptr},
               {"seed_resize_from_w", -1}, {"seed_resize_from_h", -1},
               {"denoising_strength", img2img ? json(r.strength) : json(nullptr)}, {"extra_generation_params", json::object()},
               {"index_of_first_image", 0}, {"infotexts", infotexts}, {"styles", json::array()},
               {"job_timestamp", std::to_string(unix_seconds())}, {"clip_skip", 1}, {"is_using_inpainting_conditioning", false},
               {"version", "atelier 0.1.0"}, {"interrupted", interrupted}};
  json parameters = body;
  if (img2img) parameters["init_images"] = nullptr;  // A1111 does not echo the pictures back either
  if (parameters.contains("mask")) parameters["mask"] = nullptr;
  for (auto [k, v] : {std::pair<const char*, json>{"prompt", r.prompt}, {"steps", r.steps}, {"width", r.width},
                      {"height", r.height}, {"cfg_scale", r.cfg_scale}, {"seed", seed}, {"batch_size", r.batch_size},
                      {"n_iter", r.batch_count}})
    if (!parameters.contains(k)) parameters[k] = v;
  if (!opt_bool(body, "send_images").value_or(true)) images = json::array();
  send_json(res, {{"images", images}, {"parameters", parameters}, {"info", info.dump()}});
}

json options_json(Context& ctx) {
  std::string ckpt = current_checkpoint(ctx);
  std::string hash;
  if (!ckpt.empty()) {
    try {
      hash = short_hash(ctx.model(ckpt).resolved.digest);
    } catch (const ApiError&) {
    }
  }
  return {{"sd_model_checkpoint", hash.empty() ? ckpt : ckpt + " [" + hash + "]"}, {"sd_checkpoint_hash", hash},
          {"sd_vae", "Automatic"}, {"samples_format", "png"}, {"CLIP_stop_at_last_layers", 1},
          {"eta_noise_seed_delta", 0}, {"randn_source", "GPU"}};
}

std::vector<JobInfo> image_jobs(Context& ctx, JobState state) {
  JobFilter f;
  f.state = state;
  f.limit = 100000;
  std::vector<JobInfo> out;
  for (auto& j : ctx.engine.list(f))
    if (j.kind == "image") out.push_back(std::move(j));
  return out;
}

}  // namespace

void add_sdapi_routes(httplib::Server& http, Context& ctx) {
  http.Post("/sdapi/v1/txt2img", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) { generate(ctx, req, res, false); }));
  http.Post("/sdapi/v1/img2img", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) { generate(ctx, req, res, true); }));

  http.Get("/sdapi/v1/progress", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
             const size_t running = image_jobs(ctx, JobState::Running).size(), queued = image_jobs(ctx, JobState::Queued).size();
             json state = {{"skipped", false}, {"interrupted", false}, {"job", ""}, {"job_count", running + queued},
                           {"job_timestamp", "0"}, {"job_no", 0}, {"sampling_step", 0}, {"sampling_steps", 0}};
             double progress = 0, eta = 0;
             json current = nullptr;
             auto preview = running ? ctx.events.latest_preview() : std::nullopt;
             if (preview) {
               const ImageProgress& p = preview->image;
               state["job"] = "job-" + std::to_string(preview->job);
               state["job_no"] = p.image;
               state["sampling_step"] = p.step;
               state["sampling_steps"] = p.steps;
               progress = (p.image * p.steps + p.step) / static_cast<double>(std::max(1, p.images * p.steps));
               if (progress > 0) eta = p.seconds / progress - p.seconds;
               if (req.get_param_value("skip_current_image") != "true") {
                 std::string png = preview_png(p);
                 if (!png.empty()) current = base64_encode(png);
               }
             }
             send_json(res, {{"progress", progress}, {"eta_relative", eta}, {"state", state}, {"current_image", current},
                             {"textinfo", nullptr}});
           }));

  // Skipping one image of a batch is not implemented: skip stops the job, as interrupt does.
  auto interrupt = [&ctx](const httplib::Request&, httplib::Response& res) {
    for (const JobInfo& j : image_jobs(ctx, JobState::Running)) ctx.engine.cancel(j.id);
    send_json(res, json::object());
  };
  http.Post("/sdapi/v1/interrupt", guarded(ctx, interrupt));
  http.Post("/sdapi/v1/skip", guarded(ctx, interrupt));

  http.Get("/sdapi/v1/sd-models", guarded(ctx, [&ctx](const httplib::Request&, httplib::Response& res) {
             json list = json::array();
             for (const StoreModel& m : image_models(ctx)) {
               const StoreVersion* v = &m.versions.back();
               for (const auto& x : m.versions)
                 if (x.number == m.default_version) v = &x;
               std::string file;
               for (const auto& f : v->files)
                 if (f.role == "model") file = f.path;
               list.push_back({{"title", m.name + " [" + short_hash(v->digest) + "]"}, {"model_name", m.name},
                               {"hash", short_hash(v->digest)}, {"sha256", v->digest}, {"filename", file}, {"config", nullptr}});
             }
             send_json(res, list);
           }));

  http.Get("/sdapi/v1/samplers", guarded(ctx, [](const httplib::Request&, httplib::Response& res) {
             json list = json::array();
             for (auto [name, alias] : {std::pair{"Euler a", "k_euler_a"}, {"Euler", "k_euler"}, {"Heun", "k_heun"},
                                        {"DPM++ 2M", "k_dpmpp_2m"}, {"DDIM", "ddim"}, {"LCM", "k_lcm"}})
               list.push_back({{"name", name}, {"aliases", {alias}}, {"options", json::object()}});
             send_json(res, list);
           }));

  http.Get("/sdapi/v1/schedulers", guarded(ctx, [](const httplib::Request&, httplib::Response& res) {
             send_json(res, json::array({{{"name", "automatic"}, {"label", "Automatic"}, {"aliases", nullptr},
                                          {"default_rho", -1}, {"need_inner_model", false}},
                                         {{"name", "uniform"}, {"label", "Uniform"}, {"aliases", nullptr},
                                          {"default_rho", -1}, {"need_inner_model", true}},
                                         {{"name", "karras"}, {"label", "Karras"}, {"aliases", nullptr},
                                          {"default_rho", 7.0}, {"need_inner_model", false}}}));
           }));

  http.Get("/sdapi/v1/sd-vae", guarded(ctx, [](const httplib::Request&, httplib::Response& res) { send_json(res, json::array()); }));
  http.Get("/sdapi/v1/upscalers", guarded(ctx, [](const httplib::Request&, httplib::Response& res) {
             send_json(res, json::array({{{"name", "None"}, {"model_name", nullptr}, {"model_path", nullptr},
                                          {"model_url", nullptr}, {"scale", 4}}}));
           }));

  http.Get("/sdapi/v1/options", guarded(ctx, [&ctx](const httplib::Request&, httplib::Response& res) { send_json(res, options_json(ctx)); }));
  http.Post("/sdapi/v1/options", guarded(ctx, [&ctx](const httplib::Request& req, httplib::Response& res) {
              json body = parse_body(req);
              if (auto v = opt_string(body, "sd_model_checkpoint"); v && !v->empty()) {
                // Checked before it is kept: one client's bad value must not break every later request.
                std::string ref = image_checkpoint(ctx, "sd_model_checkpoint", *v);
                std::lock_guard lock(ctx.mu);
                ctx.sd_model = ref;
              }
              send_json(res, nullptr);  // the rest of A1111's options have no counterpart here and are kept as they are
            }));
}

}  // namespace atelier::server
