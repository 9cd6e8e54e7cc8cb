#include "api/image_job.h"

#include <atelier/backend.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include <sys/resource.h>
#include <unistd.h>

#include "api/text_model_impl.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "core/utf8.h"
#include "formats/safetensors.h"
#include "formats/sniff.h"
#include "image/quickdraw.h"
#include "image/image_io.h"
#include "image/sd_model.h"
#include "image/taesd.h"

namespace atelier {

namespace {

// A1111's sampler names, as its infotext writes them.
std::string a1111_sampler_name(image::SamplerKind k) {
  switch (k) {
    case image::SamplerKind::euler: return "Euler";
    case image::SamplerKind::euler_ancestral: return "Euler a";
    case image::SamplerKind::heun: return "Heun";
    case image::SamplerKind::dpmpp_2m: return "DPM++ 2M";
    case image::SamplerKind::ddim: return "DDIM";
    case image::SamplerKind::lcm: return "LCM";
  }
  return "Euler";
}

// The pipeline's view of a loaded SD checkpoint.
class SdDiffusion final : public image::DiffusionModel {
 public:
  SdDiffusion(std::unique_ptr<image::SdModel> m, std::unique_ptr<image::TaesdNet> taesd, kernels::Executor* pool)
      : m_(std::move(m)),
        taesd_(std::move(taesd)),
        be_(kernels::cpu_device().make_backend(pool)),
        schedule_(image::NoiseSchedule::scaled_linear()) {}
  int latent_channels() const override { return m_->latent_channels(); }
  int context_dim() const override { return m_->context_dim(); }
  image::Prediction prediction() const override { return m_->prediction(); }
  int32_t pad_id() const override { return m_->pad_token(); }
  const image::NoiseSchedule& schedule() const override { return schedule_; }
  void encode_text(const tok::PromptChunk& chunk, float* out) override {
    const std::vector<float> v = m_->encode_prompt(chunk.ids.data(), chunk.weights.data(), tok::ClipTokenizer::kContext, *be_);
    std::copy(v.begin(), v.end(), out);
  }
  void unet(int n, int h, int w, const float* x, const float* t, int ctx_tokens, const float* ctx, float* out) override {
    image::UnetBatch b;
    b.batch = n;
    b.height = h;
    b.width = w;
    b.x = x;
    b.timesteps = t;
    const size_t per = static_cast<size_t>(ctx_tokens) * static_cast<size_t>(m_->context_dim());
    for (int i = 0; i < n; ++i) b.context.emplace_back(ctx + i * per, per);
    m_->unet(b, out, *be_);
  }
  std::vector<float> decode(const float* latent, int h, int w) override { return m_->vae_decode(latent, h, w, *be_); }
  std::vector<float> encode(const float* rgb, int height, int width) override {
    return m_->vae_encode(rgb, height, width, *be_);
  }
  const image::TaesdNet* preview_decoder() const override { return taesd_.get(); }
  int64_t working_bytes(int rows, int h, int w, bool encode) const override { return m_->working_bytes(rows, h, w, encode); }
  int64_t weight_bytes() const override { return m_->weight_bytes(); }
  const image::SdModel& model() const { return *m_; }

 private:
  std::unique_ptr<image::SdModel> m_;
  std::unique_ptr<image::TaesdNet> taesd_;
  std::unique_ptr<kernels::Backend> be_;  // the image lane's backend (its threads: the job's pool)
  image::NoiseSchedule schedule_;
};

// CLIP's vocabulary for an SD model: the request's, the store version's
// "tokenizer" file, or one beside the model (single file: its folder;
// diffusers: tokenizer/merges.txt, the same merges as plain text); last, the
// copy installed with the program: share/atelier/clip beside the running
// binary's bin/ folder, then the build tree's and the install prefix's (set
// at configure time; see assets/CMakeLists.txt).
std::string find_clip_vocab(const ImageRequest& r, const ResolvedModel& m, const std::string& model_path) {
  if (!r.tokenizer.empty()) return r.tokenizer;
  if (std::string f = m.file("tokenizer"); !f.empty()) return f;
  namespace fs = std::filesystem;
  const fs::path p(model_path);
  std::error_code ec;
  std::vector<fs::path> candidates;
  if (fs::is_directory(p, ec)) candidates.push_back(p / "tokenizer" / "merges.txt");
  else candidates = {p.parent_path() / "bpe_simple_vocab_16e6.txt.gz", p.parent_path() / "tokenizer" / "merges.txt"};
  const fs::path shipped = fs::path("share") / "atelier" / "clip" / "bpe_simple_vocab_16e6.txt.gz";
  if (const fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec && exe.has_parent_path())
    candidates.push_back(exe.parent_path().parent_path() / shipped);
#ifdef ATELIER_BUILD_CLIP_VOCAB
  candidates.emplace_back(ATELIER_BUILD_CLIP_VOCAB);
#endif
#ifdef ATELIER_INSTALL_CLIP_VOCAB
  candidates.emplace_back(ATELIER_INSTALL_CLIP_VOCAB);
#endif
  std::string looked;
  std::vector<fs::path> seen;
  for (const fs::path& c : candidates) {
    if (fs::is_regular_file(c, ec)) return c.string();
    const fs::path n = c.lexically_normal();
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;  // the build tree is beside the binary too
    seen.push_back(n);
    looked += "\n  " + n.string();
  }
  throw NotFoundError(model_path + ": the Stable Diffusion text encoder needs CLIP's vocabulary (bpe_simple_vocab_16e6.txt.gz); "
              "pass it with --tokenizer FILE, put it beside the model, or reinstall Atelier (it ships one). Looked in:" +
              looked);
}

image::RgbImage load_resized(const std::string& path, int w, int h) {
  image::RgbImage img = image::read_rgb_file(path);
  if (img.width != w || img.height != h) img = image::resize_rgb(img, w, h);
  return img;
}

}  // namespace

Status validate_image_request(const ImageRequest& r) {
  auto bad = [](std::string m) { return Status::error(StatusCode::InvalidArgument, std::move(m)); };
  if (r.model.empty()) return bad("no model given: pass a model file (-m)");
  for (auto [name, text] : {std::pair{"prompt", &r.prompt}, std::pair{"negative prompt", &r.negative_prompt}})
    if (const size_t at = first_bad_utf8(*text); at != std::string_view::npos)
      return bad(std::string("the ") + name + " is not valid UTF-8 (byte " + std::to_string(at) + "): pass text in UTF-8");
  for (auto [name, v] : {std::pair{"width", r.width}, std::pair{"height", r.height}})
    if (v < 8 || v > 4096 || v % 8 != 0)
      return bad(std::string(name) + " " + std::to_string(v) +
                 " is not allowed: use a multiple of 8 between 8 and 4096 (e.g. " +
                 std::to_string(std::clamp((v + 4) / 8 * 8, 8, 4096)) + ")");
  if (r.batch_count < 1 || r.batch_count > 100)
    return bad("batch count " + std::to_string(r.batch_count) + " is out of range: use 1..100");
  if (r.steps < 1 || r.steps > 1000) return bad("steps " + std::to_string(r.steps) + " is out of range: use 1..1000");
  if (!std::isfinite(r.cfg_scale) || r.cfg_scale < 0 || r.cfg_scale > 100)
    return bad("CFG scale must be a number between 0 and 100");
  if (r.rng != "cuda" && r.rng != "cpu") return bad("rng \"" + r.rng + "\" is unknown: use cuda or cpu");
  if (r.batch_size < 1 || r.batch_size > 16)
    return bad("batch size " + std::to_string(r.batch_size) + " is out of range: use 1..16");
  image::SamplerKind kind;
  if (!image::parse_sampler(r.sampler, &kind))
    return bad("sampler \"" + r.sampler + "\" is unknown: use euler, euler_a, heun, dpmpp_2m, ddim or lcm");
  if (r.scheduler != "discrete" && r.scheduler != "karras")
    return bad("scheduler \"" + r.scheduler + "\" is unknown: use discrete or karras");
  if (r.prediction != "auto" && r.prediction != "eps" && r.prediction != "v")
    return bad("prediction \"" + r.prediction + "\" is unknown: use auto, eps or v");
  if (!r.init_image.empty() && !(r.strength > 0.0f && r.strength <= 1.0f))
    return bad("strength must be in (0, 1] (the share of the steps that repaint the init image)");
  if (!r.mask.empty() && r.init_image.empty()) return bad("a mask needs an init image (--init) to inpaint");
  for (const std::string* f : {&r.init_image, &r.mask, &r.tokenizer, &r.preview_decoder}) {
    if (f->empty()) continue;
    std::error_code ec;
    const auto st = std::filesystem::status(*f, ec);
    if (!std::filesystem::exists(st)) return Status::error(StatusCode::NotFound, *f + ": no such file");
    // A FIFO or a device would block the reader (or never end): only files (and folders where a folder is meant).
    const bool folder_ok = f == &r.preview_decoder || f == &r.tokenizer;
    if (!std::filesystem::is_regular_file(st) && !(folder_ok && std::filesystem::is_directory(st)))
      return bad(*f + " is not a regular file (a folder, FIFO or device): pass a picture or model file");
  }
  // A picture that does not decode is the request's fault, told now rather than as a failed render.
  for (auto [what, f] : {std::pair{"init image", &r.init_image}, std::pair{"mask", &r.mask}}) {
    if (f->empty()) continue;
    try {
      image::read_rgb_file(*f);
    } catch (const std::exception& e) {
      return bad(std::string("the ") + what + " " + e.what());
    }
  }
  return {};
}

std::string format_scale(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

std::string a1111_parameters(const std::string& prompt, const std::string& negative, int steps, const std::string& sampler,
                             float cfg, uint64_t seed, int w, int h, const std::string& hash, const std::string& model,
                             const std::string& schedule, const std::string& extra) {
  std::string s = prompt + "\n";
  if (!negative.empty()) s += "Negative prompt: " + negative + "\n";
  s += "Steps: " + std::to_string(steps) + ", Sampler: " + sampler;
  if (!schedule.empty()) s += ", Schedule type: " + schedule;
  s += ", CFG scale: " + format_scale(cfg) + ", Seed: " + std::to_string(seed) + ", Size: " + std::to_string(w) + "x" +
       std::to_string(h);
  if (!hash.empty()) s += ", Model hash: " + hash;
  s += ", Model: " + model;
  if (!extra.empty()) s += ", " + extra;
  return s;
}

uint64_t pick_image_seed() {
  std::random_device rd;
  return rd();  // 32 bits, like A1111's random seeds
}

Result<ResolvedModel> resolve_image_model(const std::string& ref, const std::string& store_dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(ref, ec)) {
    ResolvedModel folder;
    folder.path = folder.display = ref;
    return folder;
  }
  ResolveOptions ro;
  ro.check_digest = true;
  return resolve_model(ref, store_dir, ro);
}

bool is_one_pass_image_model(const ResolvedModel&, const std::string& path) {
  // By content: store blobs have no extension, and a renamed file is still what it holds.
  return formats::sniff_model_file(path).kind == formats::FileKind::safetensors &&
         image::QuickDrawModel::is_quickdraw(*formats::SafetensorsFile::open(path));
}

std::unique_ptr<LoadedDiffusion> load_diffusion(const ImageRequest& request, const ResolvedModel& resolved,
                                                const std::string& path, kernels::Executor* pool) {
  image::SdOptions so;
  if (request.prediction == "eps") so.prediction = image::Prediction::epsilon;
  if (request.prediction == "v") so.prediction = image::Prediction::v;
  std::unique_ptr<image::TaesdNet> taesd;
  if (!request.preview_decoder.empty())
    taesd = image::TaesdNet::open(request.preview_decoder, image::TaesdNet::Kind::decoder);
  auto out = std::make_unique<LoadedDiffusion>();
  out->model = std::make_unique<SdDiffusion>(image::SdModel::open(path, so), std::move(taesd), pool);
  out->tokenizer = tok::ClipTokenizer::open(find_clip_vocab(request, resolved, path));
  out->hash = resolved.digest.size() > 7 ? resolved.digest.substr(7, 10) : "";
  out->name = resolved.in_store ? resolved.display : std::filesystem::path(path).stem().string();
  return out;
}

uint64_t memory_limit_bytes(std::string* what) {
  uint64_t limit = 0;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) {
    limit = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    *what = "this machine has";
  }
  for (auto [res, name] : {std::pair{RLIMIT_AS, "ulimit -v"}, std::pair{RLIMIT_DATA, "ulimit -d"}}) {
    rlimit rl{};
    if (::getrlimit(res, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (limit == 0 || rl.rlim_cur < limit)) {
      limit = rl.rlim_cur;
      *what = std::string("this process may use (") + name + ")";
    }
  }
  return limit;
}

namespace {

std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// The memory half of an estimate: R's working memory beside MODEL's weights
// against what this machine (or the process's ulimit) offers, and when it
// does not fit, the largest size of the same shape that does.
void estimate_memory(const image::DiffusionModel& model, const ImageRequest& r, int64_t cap_bytes, ImageEstimate& e) {
  // Classifier-free guidance evaluates every image twice (with and without the prompt).
  const auto work = [&](int w, int h) { return model.working_bytes(2 * r.batch_size, h / 8, w / 8, !r.init_image.empty()); };
  e.working_bytes = work(r.width, r.height);
  e.weight_bytes = model.weight_bytes();
  e.limit_bytes = static_cast<int64_t>(memory_limit_bytes(&e.limit_source));
  if (cap_bytes > 0 && (e.limit_bytes == 0 || cap_bytes < e.limit_bytes)) {
    e.limit_bytes = cap_bytes;
    e.limit_source = "the engine allows an image job";
  }
  const auto fits = [&](int64_t work_bytes) { return work_bytes <= 0 || e.limit_bytes == 0 || work_bytes + e.weight_bytes <= e.limit_bytes; };
  if (fits(e.working_bytes)) return;
  e.fits = false;
  // Widths in steps of 8 pixels, the height keeping the shape (a multiple of 8, at least 8).
  const auto height_for = [&](int w) {
    return std::max(8, static_cast<int>(std::lround(static_cast<double>(r.height) * w / r.width / 8.0)) * 8);
  };
  int lo = 0, hi = r.width / 8 - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (fits(work(8 * mid, height_for(8 * mid)))) lo = mid;
    else hi = mid - 1;
  }
  if (lo > 0 && fits(work(8 * lo, height_for(8 * lo)))) {
    e.fit_width = 8 * lo;
    e.fit_height = height_for(8 * lo);
  }
  e.message = "a " + std::to_string(r.width) + "x" + std::to_string(r.height) + " image with batch size " +
              std::to_string(r.batch_size) + " needs about " + gib(static_cast<double>(e.working_bytes)) +
              " of working memory beside " + gib(static_cast<double>(e.weight_bytes)) + " of weights, more than the " +
              gib(static_cast<double>(e.limit_bytes)) + " " + e.limit_source + ": use a smaller width and height or batch size" +
              (e.fit_width ? " (at most " + std::to_string(e.fit_width) + "x" + std::to_string(e.fit_height) + " fits)" : "");
}

// This machine's measured FMA peak over every core, once per process (~0.1 s).
double peak_gflop_per_s() {
  static const double peak = [] {
    ThreadPool pool(0);
    return kernels::measure_peak_gflop_per_s(&pool);
  }();
  return peak;
}

// The time half: every UNet evaluation's FLOPs over a quarter of the peak
// (the UNet reached 53% of it at 256x256 and its attention ~8% at 512x512:
// a quarter is right within a few times, enough to tell minutes from hours).
void estimate_time(const image::SdModel& model, const ImageRequest& r, ImageEstimate& e) {
  const double rows = r.batch_size * (r.cfg_scale == 1.0f ? 1.0 : 2.0);
  const double evals = r.steps * (r.sampler == "heun" ? 2.0 : 1.0) * (r.init_image.empty() ? 1.0 : r.strength);
  e.unet_flops = image::unet_flops(model.info().unet, r.height / 8, r.width / 8) * rows * evals * r.batch_count;
  const double rate = 0.25 * peak_gflop_per_s() * 1e9;
  if (rate <= 0) return;
  e.seconds = e.unet_flops / rate;
  if (e.seconds < kImageWarnSeconds) return;
  char buf[64];
  if (e.seconds < 2 * 3600) std::snprintf(buf, sizeof buf, "about %.0f minutes", e.seconds / 60);
  else std::snprintf(buf, sizeof buf, "about %.0f hours", e.seconds / 3600);
  e.warning = "this " + std::to_string(r.width) + "x" + std::to_string(r.height) + " image would take " + buf +
              " on this machine (estimated): a smaller size or fewer steps is much faster";
}

}  // namespace

Status check_image_memory(const image::DiffusionModel& model, const ImageRequest& r, int64_t cap_bytes) {
  ImageEstimate e;
  estimate_memory(model, r, cap_bytes, e);
  return e.fits ? Status{} : Status::error(StatusCode::InvalidArgument, e.message);
}

Result<ImageEstimate> estimate_image(const ImageRequest& r, const std::string& store_dir, int64_t limit_bytes) {
  if (Status st = validate_image_request(r); !st.ok()) return st;
  ResolvedModel resolved;
  std::error_code ec;
  if (std::filesystem::is_directory(r.model, ec)) {
    resolved.path = resolved.display = r.model;
  } else {
    auto found = resolve_model(r.model, store_dir, {});  // no hashing: cheap at submission
    if (!found.ok()) return found.status();
    resolved = found.value();
  }
  return guarded([&]() -> Result<ImageEstimate> {
    if (!std::filesystem::is_directory(resolved.path, ec) && is_one_pass_image_model(resolved, resolved.path))
      return ImageEstimate{};
    // The numbers depend on the file and the request's shape only: a repeated
    // submission does not open the model again (opening a full-size SD 1.5 takes ~1.5 s).
    const auto t = std::filesystem::last_write_time(resolved.path, ec);
    const std::string key = resolved.path + "|" + std::to_string(std::filesystem::is_regular_file(resolved.path, ec) ? std::filesystem::file_size(resolved.path, ec) : 0) + "|" +
                            std::to_string(t.time_since_epoch().count()) + "|" + std::to_string(r.width) + "x" +
                            std::to_string(r.height) + "|" + std::to_string(r.batch_size) + "|" +
                            std::to_string(r.batch_count) + "|" + std::to_string(r.steps) + "|" + r.sampler + "|" +
                            std::to_string(r.cfg_scale) + "|" + std::to_string(r.strength) + "|" + (r.init_image.empty() ? "" : "i") + "|" + std::to_string(limit_bytes);
    static std::mutex mu;
    static std::map<std::string, ImageEstimate> cache;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = cache.find(key); it != cache.end()) return it->second;
    }
    SdDiffusion model(image::SdModel::open(resolved.path), nullptr, nullptr);
    ImageEstimate e;
    estimate_memory(model, r, limit_bytes, e);
    estimate_time(model.model(), r, e);
    std::lock_guard<std::mutex> lock(mu);
    if (cache.size() > 256) cache.clear();
    cache[key] = e;
    return e;
  });
}

ImageRun::ImageRun(LoadedDiffusion& m, const ImageRequest& request, int64_t memory_cap_bytes) : m_(m), request_(request) {
  image::DiffusionModel& model = *m_.model;
  // Refused before any work, with the limit named, rather than failing to allocate mid-render.
  if (Status st = check_image_memory(model, request, memory_cap_bytes); !st.ok()) throw InvalidArgumentError(st.message);
  auto [cond, uncond] = image::encode_prompts(model, *m_.tokenizer, request.prompt, request.negative_prompt);
  cond_ = std::make_shared<const image::Conditioning>(std::move(cond));
  uncond_ = std::make_shared<const image::Conditioning>(std::move(uncond));
  base_.width = request.width;
  base_.height = request.height;
  base_.steps = request.steps;
  base_.cfg_scale = request.cfg_scale;
  image::parse_sampler(request.sampler, &base_.sampler);
  base_.karras = request.scheduler == "karras";
  base_.rng = request.rng == "cpu" ? image::RngKind::Cpu : image::RngKind::Cuda;
  if (!request.init_image.empty()) {
    const auto rgb = image::to_planar(load_resized(request.init_image, request.width, request.height));
    base_.init_latent = model.encode(rgb.data(), request.height, request.width);
    base_.strength = request.strength;
    if (!request.mask.empty()) {
      // White repaints; averaged over each 8x8 latent cell.
      const image::RgbImage mk = load_resized(request.mask, request.width / 8, request.height / 8);
      base_.latent_mask.resize(static_cast<size_t>(mk.width) * mk.height);
      for (size_t i = 0; i < base_.latent_mask.size(); ++i)
        base_.latent_mask[i] = (mk.pixels[3 * i] + mk.pixels[3 * i + 1] + mk.pixels[3 * i + 2]) / (3.0f * 255.0f);
    }
  }
  seed0_ = request.seed == SamplingParams::kRandomSeed ? pick_image_seed() : request.seed;
  start_round();
}

void ImageRun::start_round() {
  tasks_.clear();
  if (done()) return;
  for (int k = 0; k < request_.batch_size; ++k) {
    image::TaskOptions o = base_;
    o.seed = seed0_ + static_cast<uint64_t>(round_ * request_.batch_size + k);
    tasks_.push_back(std::make_unique<image::ImageTask>(o, m_.model->latent_channels(), m_.model->schedule(), cond_,
                                                        request_.cfg_scale == 1.0f ? nullptr : uncond_));
  }
}

std::vector<image::ImageTask*> ImageRun::live() {
  std::vector<image::ImageTask*> out;
  for (auto& t : tasks_)
    if (!t->done()) out.push_back(t.get());
  return out;
}

std::vector<ImageProgress> ImageRun::progress(double seconds, bool previews) {
  std::vector<ImageProgress> out;
  for (size_t k = 0; k < tasks_.size(); ++k) {
    const image::ImageTask& t = *tasks_[k];
    ImageProgress p;
    p.image = round_ * request_.batch_size + static_cast<int>(k);
    p.images = images();
    p.step = t.step_index();
    p.steps = t.steps();
    p.seconds = seconds;
    if (previews && !t.last_x0().empty()) {
      const image::Preview pv = image::make_preview(*m_.model, t.last_x0(), t.latent_h(), t.latent_w());
      p.preview_width = pv.width;
      p.preview_height = pv.height;
      p.preview_rgb = pv.rgb;
    }
    out.push_back(std::move(p));
  }
  return out;
}

bool ImageRun::advance() {
  if (done()) return true;
  for (const auto& t : tasks_)
    if (!t->done()) return false;
  image::SamplerKind kind = base_.sampler;
  const std::string extra = request_.init_image.empty() ? "" : "Denoising strength: " + format_scale(request_.strength);
  for (const auto& t : tasks_) {
    const std::vector<float> lat = t->result_latent();
    const std::vector<float> rgb = m_.model->decode(lat.data(), t->latent_h(), t->latent_w());
    const image::RgbImage img = image::from_planar(rgb.data(), request_.width, request_.height);
    ImageResult r;
    r.width = img.width;
    r.height = img.height;
    r.channels = 3;
    r.pixels = img.pixels;
    r.seed = t->seed();
    r.parameters = a1111_parameters(request_.prompt, request_.negative_prompt, request_.steps, a1111_sampler_name(kind),
                                    request_.cfg_scale, r.seed, request_.width, request_.height, m_.hash, m_.name,
                                    base_.karras ? "Karras" : "", extra);
    results_.push_back(std::move(r));
  }
  ++round_;
  start_round();
  return done();
}

}  // namespace atelier
