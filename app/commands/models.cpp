// `atelier models ...`: the model store (list, info, import, pull, verify,
// promote, rollback, remove, gc, history, catalog), quantize and compare, synthetic models for
// benchmarks, and a folder scan. Tables for people, --json (JSON Lines) for
// scripts; errors are one line on stderr (exit 1, or 2 for bad usage).
#include <atelier/engine.h>
#include <atelier/models.h>
#include <atelier/tools.h>
#include <atelier/store.h>

#include <CLI/CLI.hpp>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <ctime>
#include <map>
#include <memory>

#include "commands/commands.h"
#include "commands/output.h"
#include "commands/request_options.h"

namespace atelier::app {

namespace {

using nlohmann::json;

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else if (b >= 1e3) std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::string human_count(int64_t n) {
  char buf[32];
  if (n >= 1000000000) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1000000) std::snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
  else if (n >= 1000) std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

std::string local_time(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string r;
  for (const auto& s : v) r.append(r.empty() ? "" : sep).append(s);
  return r;
}

int64_t version_bytes(const StoreVersion& v) {
  int64_t n = 0;
  for (const auto& f : v.files) n += f.size;
  return n;
}

// Left-aligned columns as wide as their widest cell.
void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line.append(r[i]);
      if (i + 1 < r.size()) line.append(width[i] - r[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    write_stdout(line + "\n");
  }
}

json version_json(const StoreVersion& v) {
  json files = json::array();
  for (const auto& f : v.files) files.push_back({{"role", f.role}, {"digest", "sha256:" + f.digest}, {"size", f.size}, {"path", f.path}});
  return {{"model", v.model},
          {"version", v.number},
          {"ref", v.model + "@" + std::to_string(v.number)},
          {"kind", v.kind},
          {"label", v.label},
          {"created_ms", v.created_ms},
          {"notes", v.notes},
          {"format", v.format},
          {"architecture", v.architecture},
          {"parameters", v.parameters},
          {"context_length", v.context_length},
          {"embedding_length", v.embedding_length},
          {"vocab_size", v.vocab_size},
          {"quantization", v.quantization},
          {"native_resolution", v.native_resolution},
          {"digest", "sha256:" + v.digest},
          {"bytes", version_bytes(v)},
          {"channels", v.channels},
          {"files", files}};
}

// Options every store command shares.
struct StoreOptions {
  std::string store;  // "" = default_store_dir()
  bool json = false;
};

void add_store_option(CLI::App& cmd, StoreOptions& o, bool json = true) {
  cmd.add_option("--store", o.store, "Model store folder (default: $ATELIER_HOME, else $XDG_DATA_HOME/atelier, else ~/.local/share/atelier)");
  if (json) cmd.add_flag("--json", o.json, "JSON Lines for scripts");
}

// ---- pull progress on stderr

class ProgressBar {
 public:
  ProgressBar() : tty_(::isatty(STDERR_FILENO)) {}
  void update(const PullProgress& p) {
    const int64_t total = p.bytes_total;
    const int decile = total > 0 ? static_cast<int>(10 * p.bytes_done / total) : -1;
    // Without a terminal, one line per tenth (logs stay short).
    if (!tty_ && decile == last_decile_ && !p.done) return;
    last_decile_ = decile;
    const int width = 24;
    const int filled = total > 0 ? static_cast<int>(width * std::min<int64_t>(p.bytes_done, total) / total) : 0;
    std::string eta = "--:--";
    if (total > 0 && p.bytes_per_s > 0) {
      const int s = static_cast<int>(static_cast<double>(total - p.bytes_done) / p.bytes_per_s + 0.5);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
      eta = buf;
    }
    std::string line = "  " + p.file + " [" + std::string(static_cast<size_t>(filled), '#') +
                       std::string(static_cast<size_t>(width - filled), '.') + "] " + human_bytes(static_cast<double>(p.bytes_done));
    line.append(" / ").append(total > 0 ? human_bytes(static_cast<double>(total)) : std::string("?"));
    char rate[48];
    std::snprintf(rate, sizeof rate, "  %.1f MB/s  ETA %s", p.bytes_per_s / 1e6, eta.c_str());
    line.append(rate);
    if (tty_) std::fprintf(stderr, "\r%-90s", line.c_str());
    else std::fprintf(stderr, "%s\n", line.c_str());
    open_ = tty_;
  }
  void end_line() {
    if (open_) std::fprintf(stderr, "\n");
    open_ = false;
  }

 private:
  bool tty_;
  bool open_ = false;
  int last_decile_ = -2;
};

Result<std::unique_ptr<Store>> open_store(const StoreOptions& o, bool create) { return Store::open(o.store, create); }

// Refuses to remove NAME@NUMBER while a queued or running job of DATA_DIR's
// queue resolves to it (the job would fail when it starts).
Status check_no_job_needs(const std::string& data_dir, const std::string& store, const std::string& name, int number) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(data_dir) / "jobs.db", ec)) return {};
  EngineConfig c;
  c.data_dir = data_dir;
  c.store_dir = store;
  c.execute = false;
  auto e = Engine::open(c);
  if (!e.ok()) return e.status();
  std::string ids;
  int n = 0;
  for (JobState state : {JobState::Queued, JobState::Running}) {
    JobFilter f;
    f.state = state;
    f.limit = 0;
    for (const JobInfo& j : e.value()->list(f)) {
      const std::string& ref = j.kind == "image" ? j.image_request.model : j.request.model;
      auto r = resolve_model(ref, store);
      if (!r.ok() || !r->in_store || r->name != name || r->version != number) continue;
      if (n++ < 10) ids += (ids.empty() ? "" : " ") + std::to_string(j.id);
    }
  }
  if (n == 0) return {};
  return Status::error(StatusCode::InvalidArgument,
                       std::to_string(n) + " queued or running job(s) need " + name + "@" + std::to_string(number) + " (jobs " + ids +
                           (n > 10 ? " ..." : "") + "): let them finish, cancel them (`atelier queue cancel " + ids +
                           "`), or pass --force to remove it anyway (they will fail)");
}

int run_list(const StoreOptions& o) {
  auto st = open_store(o, false);
  if (!st.ok()) {
    if (st.status().code != StatusCode::NotFound) return fail(st.status());
    std::fprintf(stderr, "%s\n", st.status().message.c_str());  // an empty store is not an error
    return 0;
  }
  auto models = st.value()->list();
  if (!models.ok()) return fail(models.status());
  if (o.json) {
    for (const auto& m : models.value()) {
      json versions = json::array();
      for (const auto& v : m.versions) versions.push_back(version_json(v));
      print_json_line({{"name", m.name},
                       {"kind", m.kind},
                       {"architecture", m.architecture},
                       {"licence", m.licence},
                       {"description", m.description},
                       {"default_version", m.default_version},
                       {"channels", m.channels},
                       {"versions", versions}});
    }
    return 0;
  }
  if (models.value().empty()) {
    std::fprintf(stderr, "no models in %s; install one with `atelier models pull NAME` (see `atelier models catalog`)\n",
                 st.value()->root().c_str());
    return 0;
  }
  // One row per version; * marks what the plain name resolves to.
  std::vector<std::vector<std::string>> rows = {{"MODEL", "KIND", "FORMAT", "ARCH", "PARAMS", "QUANT", "SIZE", "CHANNELS", "DIGEST", "LABEL"}};
  for (const auto& m : models.value())
    for (const auto& v : m.versions)
      rows.push_back({m.name + "@" + std::to_string(v.number) + (v.number == m.default_version ? " *" : ""), v.kind, v.format,
                      v.architecture.empty() ? "-" : v.architecture, human_count(v.parameters), v.quantization,
                      human_bytes(static_cast<double>(version_bytes(v))), v.channels.empty() ? "-" : join(v.channels),
                      "sha256:" + v.digest.substr(0, 12), v.label.empty() ? "-" : v.label});
  print_table(rows);
  return 0;
}

int run_info(const StoreOptions& o, const std::string& ref) {
  auto st = open_store(o, false);
  if (!st.ok()) return fail(st.status());
  auto v = st.value()->resolve(ref);
  if (!v.ok()) return fail(v.status());
  // Resolved once more through resolve_model, the path the engine takes, so
  // `info` shows exactly what a job would load.
  auto r = resolve_model(ref, st.value()->root());
  if (!r.ok()) return fail(r.status());
  const StoreVersion& s = v.value();
  if (o.json) {
    json j = version_json(s);
    j["reference"] = ref;
    j["resolved"] = {{"path", r->path}, {"digest", r->digest}, {"display", r->display}};
    print_json_line(j);
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"reference", ref + " -> " + r->display},
      {"kind", s.kind},
      {"format", s.format},
      {"architecture", s.architecture.empty() ? "-" : s.architecture},
      {"parameters", std::to_string(s.parameters) + " (" + human_count(s.parameters) + ")"},
      {"quantization", s.quantization},
      {"channels", s.channels.empty() ? "-" : join(s.channels, ", ")},
      {"label", s.label.empty() ? "-" : s.label},
      {"created", local_time(s.created_ms)},
      {"notes", s.notes.empty() ? "-" : s.notes},
      {"digest", r->digest}};
  if (s.context_length) rows.push_back({"context length", std::to_string(s.context_length)});
  if (s.embedding_length) rows.push_back({"embedding length", std::to_string(s.embedding_length)});
  if (s.vocab_size) rows.push_back({"vocabulary", std::to_string(s.vocab_size)});
  if (s.native_resolution) rows.push_back({"native resolution", std::to_string(s.native_resolution)});
  for (const auto& f : s.files)
    rows.push_back({"file " + f.role, "sha256:" + f.digest + "  " + human_bytes(static_cast<double>(f.size)) + "  " + f.path});
  for (auto& r2 : rows) r2[0] += ":";
  print_table(rows);
  return 0;
}

struct ImportOptionsCli {
  StoreOptions store;
  std::vector<std::string> files, roles;
  std::string name;
  StoreImportOptions options;
};

int run_import(const ImportOptionsCli& o) {
  if (!o.roles.empty() && o.roles.size() != o.files.size())
    return fail(Status::error(StatusCode::InvalidArgument, "give one --role per file (" + std::to_string(o.files.size()) +
                                                               " files, " + std::to_string(o.roles.size()) + " roles), in the same order"));
  if (o.roles.empty() && o.files.size() > 1)
    return fail(Status::error(StatusCode::InvalidArgument,
                              "several files need a --role each, in the same order (e.g. --role model --role tokenizer)"));
  std::vector<StoreImportFile> files;
  for (size_t i = 0; i < o.files.size(); ++i) files.push_back({o.files[i], o.roles.empty() ? "model" : o.roles[i]});
  auto st = open_store(o.store, true);
  if (!st.ok()) return fail(st.status());
  auto n = st.value()->import(files, o.name, o.options);
  if (!n.ok()) return fail(n.status());
  auto v = st.value()->resolve(o.name + "@" + std::to_string(n.value()));
  if (!v.ok()) return fail(v.status());
  if (o.store.json) {
    print_json_line(version_json(v.value()));
  } else {
    write_stdout(o.name + "@" + std::to_string(n.value()) + "\n");
    std::fprintf(stderr, "imported %s@%d: %s %s, %s, sha256:%s\n", o.name.c_str(), n.value(), v->format.c_str(),
                 v->architecture.c_str(), human_bytes(static_cast<double>(version_bytes(v.value()))).c_str(),
                 v->digest.substr(0, 12).c_str());
  }
  return 0;
}

struct PullOptionsCli {
  StoreOptions store;
  std::vector<std::string> names;
  std::string mirror, catalog;
  int retries = 3;
};

int run_pull(const PullOptionsCli& o) {
  for (const auto& name : o.names)
    if (is_synth_model_ref(name))
      return fail(Status::error(StatusCode::InvalidArgument,
                                "\"" + name + "\" is a synthetic model, made on the device when it loads: there is nothing "
                                "to pull. Use it directly (e.g. `atelier text -m " + name + "`)"));
  const std::string catalog_path = o.catalog.empty() ? default_catalog_path() : o.catalog;
  auto catalog = load_catalog(catalog_path);
  if (!catalog.ok()) return fail(catalog.status());
  std::string mirror = o.mirror;
  if (mirror.empty())
    if (const char* m = std::getenv("ATELIER_MODEL_MIRROR"); m && *m) mirror = m;
  // Check every name before anything is fetched.
  std::vector<const CatalogEntry*> entries;
  for (const auto& name : o.names) {
    const CatalogEntry* found = nullptr;
    for (const auto& e : catalog.value())
      if (e.name == name) found = &e;
    if (!found) {
      std::string names;
      for (const auto& e : catalog.value()) names.append(names.empty() ? "" : ", ").append(e.name);
      return fail(Status::error(StatusCode::NotFound, "the catalog " + catalog_path + " has no model \"" + name +
                                                          "\"; it has: " + names +
                                                          " (a file of your own goes in with `atelier models import FILE --name NAME`)"));
    }
    entries.push_back(found);
  }
  auto st = open_store(o.store, true);
  if (!st.ok()) return fail(st.status());
  ProgressBar bar;
  PullOptions po;
  po.mirror = mirror;
  po.retries = o.retries;
  po.on_progress = [&bar](const PullProgress& p) { bar.update(p); };
  po.on_note = [&bar](const std::string& s) {
    bar.end_line();
    std::fprintf(stderr, "%s\n", s.c_str());
  };
  for (const CatalogEntry* e : entries) {
    auto r = st.value()->pull(*e, po);
    bar.end_line();
    if (!r.ok()) return fail(r.status());
    const std::string ref = r->model + "@" + std::to_string(r->version);
    if (o.store.json) {
      print_json_line({{"model", r->model}, {"version", r->version}, {"ref", ref}, {"already_installed", r->already_installed},
                       {"repaired", r->repaired}, {"source", r->source}, {"bytes", r->bytes}, {"digest", "sha256:" + r->digest}});
    } else if (r->repaired) {
      std::fprintf(stderr, "repaired %s: its damaged files were fetched again from %s (sha256:%s)\n", ref.c_str(), r->source.c_str(),
                   r->digest.substr(0, 12).c_str());
    } else if (r->already_installed) {
      std::fprintf(stderr, "%s is already installed (same sha256:%s); nothing to do\n", ref.c_str(), r->digest.substr(0, 12).c_str());
    } else {
      std::fprintf(stderr, "installed %s from %s (%s, sha256:%s%s)\n", ref.c_str(), r->source.c_str(),
                   human_bytes(static_cast<double>(r->bytes)).c_str(), r->digest.substr(0, 12).c_str(),
                   e->verified ? ", verified" : "; unverified catalog entry");
    }
  }
  return 0;
}

int run_catalog(const StoreOptions& o, const std::string& path_in) {
  const std::string path = path_in.empty() ? default_catalog_path() : path_in;
  auto catalog = load_catalog(path);
  if (!catalog.ok()) return fail(catalog.status());
  std::vector<std::vector<std::string>> rows = {{"NAME", "KIND", "ARCH", "SIZE", "VERIFIED", "LICENCE", "DESCRIPTION"}};
  for (const auto& e : catalog.value()) {
    int64_t bytes = 0;
    for (const auto& f : e.files) bytes += f.size;
    if (o.json) {
      json files = json::array();
      for (const auto& f : e.files)
        files.push_back({{"role", f.role}, {"name", f.name}, {"size", f.size}, {"sha256", f.sha256}, {"urls", f.urls}, {"mirror", f.mirror}});
      print_json_line({{"name", e.name}, {"kind", e.kind}, {"architecture", e.architecture}, {"licence", e.licence},
                       {"description", e.description}, {"verified", e.verified}, {"bytes", bytes}, {"files", files}});
    } else {
      rows.push_back({e.name, e.kind, e.architecture, human_bytes(static_cast<double>(bytes)), e.verified ? "yes" : "no",
                      e.licence, e.description.size() > 60 ? e.description.substr(0, 57) + "..." : e.description});
    }
  }
  if (!o.json) print_table(rows);
  return 0;
}

int run_verify(const StoreOptions& o, const std::string& ref) {
  auto st = open_store(o, false);
  if (!st.ok()) return fail(st.status());
  auto r = st.value()->verify(ref);
  if (!r.ok()) return fail(r.status());
  const StoreVerifyReport& v = r.value();
  if (o.json) {
    json problems = json::array();
    for (const auto& p : v.problems) problems.push_back({{"digest", "sha256:" + p.digest}, {"path", p.path}, {"problem", p.problem}});
    print_json_line({{"ok", v.ok()}, {"blobs_checked", v.blobs_checked}, {"bytes_checked", v.bytes_checked}, {"problems", problems}});
  } else {
    for (const auto& p : v.problems) std::fprintf(stderr, "atelier: error: blob sha256:%s (%s): %s\n", p.digest.c_str(), p.path.c_str(), p.problem.c_str());
    if (v.ok())
      std::fprintf(stderr, "ok: %lld blob(s), %s checked\n", static_cast<long long>(v.blobs_checked),
                   human_bytes(static_cast<double>(v.bytes_checked)).c_str());
    else
      std::fprintf(stderr, "atelier: %zu damaged or missing blob(s); pull or import those models again, then `atelier models gc`\n",
                   v.problems.size());
  }
  return v.ok() ? 0 : 1;
}

int run_history(const StoreOptions& o, const std::string& name) {
  auto st = open_store(o, false);
  if (!st.ok()) return fail(st.status());
  auto h = st.value()->history(name);
  if (!h.ok()) return fail(h.status());
  std::vector<std::vector<std::string>> rows = {{"TIME", "ACTION", "VERSION", "CHANNEL", "BEFORE", "DETAIL"}};
  for (const auto& a : h.value()) {
    if (o.json) {
      print_json_line({{"id", a.id}, {"time_ms", a.time_ms}, {"action", a.action}, {"model", a.model}, {"version", a.version},
                       {"channel", a.channel}, {"previous_version", a.previous_version}, {"detail", a.detail}});
      continue;
    }
    rows.push_back({local_time(a.time_ms), a.action, a.version ? "@" + std::to_string(a.version) : "-",
                    a.channel.empty() ? "-" : a.channel,
                    a.channel.empty() ? "-" : (a.previous_version ? "@" + std::to_string(a.previous_version) : "unset"),
                    a.detail.empty() ? "-" : a.detail});
  }
  if (!o.json) print_table(rows);
  return 0;
}

struct QuantizeCli {
  StoreOptions store;
  std::string ref;
  QuantizeSpec spec;
  bool no_quality = false;
};

nlohmann::json quality_json(const QualityReport& q) {
  return {{"text", q.text},
          {"tokens", q.tokens},
          {"positions", q.positions},
          {"perplexity_source", q.perplexity_reference},
          {"perplexity", q.perplexity_candidate},
          {"mean_kl", q.mean_kl},
          {"max_kl", q.max_kl},
          {"top1_agreement", q.top1_agreement}};
}

std::string quality_line(const QualityReport& q) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "perplexity %.4f -> %.4f (%+.2f%%), mean KL %.6f nats (max %.4f), top-1 agreement %.1f%%",
                q.perplexity_reference, q.perplexity_candidate,
                q.perplexity_reference > 0 ? 100.0 * (q.perplexity_candidate / q.perplexity_reference - 1) : 0.0, q.mean_kl,
                q.max_kl, 100.0 * q.top1_agreement);
  return buf;
}

// Bad usage, an unknown reference or text: exit 2; anything else 1.
int fail_usage(const Status& s) {
  const int code = fail(s);
  return s.code == StatusCode::NotFound ? 2 : code;
}

int run_quantize(QuantizeCli& o) {
  o.spec.store_dir = o.store.store;
  o.spec.quality = !o.no_quality;
  o.spec.on_note = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  auto r = quantize_model(o.ref, o.spec);
  if (!r.ok()) return fail_usage(r.status());
  const QuantizeResult& q = r.value();
  std::map<std::string, int> types;
  for (const auto& t : q.tensors) ++types[t.type];
  if (o.store.json) {
    json tensors = json::array();
    for (const auto& t : q.tensors) {
      json j = {{"name", t.name}, {"type", t.type}, {"cols", t.cols}, {"rows", t.rows}, {"bytes", t.bytes}};
      if (!t.wanted.empty()) j["wanted"] = t.wanted;
      tensors.push_back(j);
    }
    json j = {{"model", q.model},
              {"version", q.version},
              {"digest", q.digest},
              {"source", q.source},
              {"source_digest", q.source_digest},
              {"recipe", q.recipe},
              {"tool", q.tool},
              {"bytes", q.file_bytes},
              {"source_bytes", q.source_file_bytes},
              {"bytes_per_token", q.bytes_per_token},
              {"source_bytes_per_token", q.source_bytes_per_token},
              {"types", types},
              {"fallbacks", q.fallbacks},
              {"tensors", tensors}};
    if (q.has_quality) j["quality"] = quality_json(q.quality);
    print_json_line(j);
    return 0;
  }
  std::string type_list;
  for (const auto& [t, n] : types) type_list += (type_list.empty() ? "" : ", ") + t + " x" + std::to_string(n);
  std::vector<std::vector<std::string>> rows = {
      {"quantized", q.source + " -> " + q.model + " (" + q.recipe + ")"},
      {"size", human_bytes(static_cast<double>(q.source_file_bytes)) + " -> " + human_bytes(static_cast<double>(q.file_bytes))},
      {"bytes per token", human_bytes(static_cast<double>(q.source_bytes_per_token)) + " -> " +
                              human_bytes(static_cast<double>(q.bytes_per_token)) + " of weights read per generated token"},
      {"tensor types", type_list},
      {"fallbacks", q.fallbacks.empty() ? "none" : std::to_string(q.fallbacks.size()) + " tensor(s) (listed on stderr)"},
      {"lineage", "from " + q.source + " (" + q.source_digest + ") by " + q.tool},
      {"digest", q.digest}};
  if (q.has_quality)
    rows.push_back({"quality", quality_line(q.quality) + " on " + q.quality.text + " (" + std::to_string(q.quality.tokens) + " tokens)"});
  for (auto& r2 : rows) r2[0] += ":";
  print_table(rows);
  const std::string name = q.model.substr(0, q.model.rfind('@'));
  std::fprintf(stderr, "note: `%s` alone now resolves to its newest version unless a channel is set; pin one with "
               "`atelier models promote %s prod`\n", name.c_str(), q.source.rfind(name + "@", 0) == 0 ? q.source.c_str() : q.model.c_str());
  return 0;
}

struct CompareCli {
  StoreOptions store;
  std::string reference, candidate, text;
  int max_tokens = 512;
  int threads = 0;
  // Where each runs: --device / --precision the candidate's, --reference-*
  // the reference's (default: the candidate's device at auto precision).
  std::string device = "cpu", precision = "auto", reference_device, reference_precision = "auto";
};

int run_compare(const CompareCli& o) {
  // Each side's device and precision checked as every command checks them
  // (fp8 on a device without FP8 is refused here, naming what would run).
  auto cand_dev = select_device(o.device, o.precision, KvType::F16);
  if (!cand_dev.ok()) return fail_usage(cand_dev.status());
  const std::string ref_spec = o.reference_device.empty() ? o.device : o.reference_device;
  auto ref_dev = select_device(ref_spec, o.reference_precision, KvType::F16);
  if (!ref_dev.ok()) return fail_usage(ref_dev.status());
  auto a = resolve_model(o.reference, o.store.store);
  if (!a.ok()) return fail_usage(a.status());
  auto b = resolve_model(o.candidate, o.store.store);
  if (!b.ok()) return fail_usage(b.status());
  CompareDevices on;
  on.device = cand_dev->name;
  on.precision = o.precision;
  on.reference_device = ref_dev->name;
  on.reference_precision = o.reference_precision;
  auto q = compare_text_models(a->path, b->path, o.text, o.max_tokens, o.threads, on);
  if (!q.ok()) return fail_usage(q.status());
  const std::string ref_on = ref_dev->name + (ref_dev->precision.empty() ? "" : " " + ref_dev->precision);
  const std::string cand_on = cand_dev->name + (cand_dev->precision.empty() ? "" : " " + cand_dev->precision);
  if (o.store.json) {
    json j = quality_json(q.value());
    j["reference"] = a->display;
    j["candidate"] = b->display;
    j["reference_device"] = ref_dev->name;
    j["reference_precision"] = ref_dev->precision;
    j["device"] = cand_dev->name;
    j["precision"] = cand_dev->precision;
    print_json_line(j);
    return 0;
  }
  const bool same_place = ref_on == cand_on;
  write_stdout(a->display + (same_place ? "" : " [" + ref_on + "]") + " -> " + b->display +
               (same_place ? "" : " [" + cand_on + "]") + ": " + quality_line(q.value()) + " on " + q->text + " (" +
               std::to_string(q->tokens) + " tokens)\n");
  return 0;
}

}  // namespace

void add_models_commands(CLI::App& root, int& exit_code) {
  CLI::App* models = root.add_subcommand("models", "The model store, the catalog, and model files");
  models->require_subcommand(1);

  // ---- the store
  auto lo = std::make_shared<StoreOptions>();
  CLI::App* list = models->add_subcommand("list", "List the store's models, one row per version (* = what the name alone gives)");
  add_store_option(*list, *lo);
  list->callback([lo, &exit_code] { exit_code = run_list(*lo); });

  auto io = std::make_shared<StoreOptions>();
  auto iref = std::make_shared<std::string>();
  CLI::App* info = models->add_subcommand("info", "Show a model version: header facts, files, digests, channels");
  info->add_option("ref", *iref, "NAME, NAME@VERSION, NAME:CHANNEL or sha256:DIGEST")->required();
  add_store_option(*info, *io);
  info->callback([io, iref, &exit_code] { exit_code = run_info(*io, *iref); });

  auto im = std::make_shared<ImportOptionsCli>();
  CLI::App* imp = models->add_subcommand("import", "Store model files as a new version of NAME (header checked, sha256 recorded)");
  imp->add_option("files", im->files, "Model files (GGUF, safetensors, PyTorch .pth, llama2.c .bin) and auxiliary files")->required();
  imp->add_option("--name", im->name, "Model name (letters, digits, '.', '_', '-')")->required();
  imp->add_option("--role", im->roles, "Role of each file, in order (model, tokenizer, encoder, decoder, ...); default model");
  imp->add_option("--label", im->options.label, "A label for this version");
  imp->add_option("--kind", im->options.kind, "text or image (default: what the format suggests)")->check(CLI::IsMember({"text", "image"}));
  imp->add_option("--notes", im->options.notes, "Notes on this version");
  imp->add_option("--licence", im->options.licence, "Licence of the model");
  imp->add_option("--description", im->options.description, "What the model is");
  add_store_option(*imp, im->store);
  imp->callback([im, &exit_code] { exit_code = run_import(*im); });

  auto pu = std::make_shared<PullOptionsCli>();
  CLI::App* pull = models->add_subcommand("pull", "Install catalog models from a mirror folder or their download addresses (resumable, sha256 checked)");
  pull->add_option("names", pu->names, "Catalog names (see `atelier models catalog`)")->required();
  pull->add_option("--mirror", pu->mirror, "Folder holding the catalog's mirror paths (default: $ATELIER_MODEL_MIRROR; e.g. ../shared/fixtures)");
  pull->add_option("--catalog", pu->catalog, "Catalog file (default: $ATELIER_CATALOG, else the installed share/atelier/catalog.json, else models/catalog.json of the source tree)");
  pull->add_option("--retries", pu->retries, "Extra attempts when a download breaks off (each resumes)")->check(CLI::Range(0, 100))->capture_default_str();
  add_store_option(*pull, pu->store);
  pull->callback([pu, &exit_code] { exit_code = run_pull(*pu); });

  auto co = std::make_shared<StoreOptions>();
  auto cpath = std::make_shared<std::string>();
  CLI::App* cat = models->add_subcommand("catalog", "List the models `pull` knows");
  cat->add_option("--catalog", *cpath, "Catalog file (default: $ATELIER_CATALOG, else the installed share/atelier/catalog.json, else models/catalog.json of the source tree)");
  cat->add_flag("--json", co->json, "JSON Lines for scripts");
  cat->callback([co, cpath, &exit_code] { exit_code = run_catalog(*co, *cpath); });

  auto vo = std::make_shared<StoreOptions>();
  auto vref = std::make_shared<std::string>();
  CLI::App* verify = models->add_subcommand("verify", "Re-hash the blobs of REF's version (default: every blob); exit 1 when any is damaged");
  verify->add_option("ref", *vref, "NAME, NAME@VERSION, NAME:CHANNEL or sha256:DIGEST");
  add_store_option(*verify, *vo);
  verify->callback([vo, vref, &exit_code] { exit_code = run_verify(*vo, *vref); });

  struct ChannelArgs {
    StoreOptions store;
    std::string ref, channel;
    bool force = false;
  };
  auto pr = std::make_shared<ChannelArgs>();
  CLI::App* promote = models->add_subcommand("promote", "Point a channel (dev, stable, prod) at the version REF names");
  promote->add_option("ref", pr->ref, "NAME@VERSION (or any reference)")->required();
  promote->add_option("channel", pr->channel, "dev, stable or prod")->required()->check(CLI::IsMember({"dev", "stable", "prod"}));
  add_store_option(*promote, pr->store, false);
  promote->callback([pr, &exit_code] {
    auto st = open_store(pr->store, false);
    if (!st.ok()) return void(exit_code = fail(st.status()));
    auto before = st.value()->resolve(pr->ref);
    if (!before.ok()) return void(exit_code = fail(before.status()));
    auto n = st.value()->promote(pr->ref, pr->channel);
    if (!n.ok()) return void(exit_code = fail(n.status()));
    std::fprintf(stderr, "%s:%s -> %s@%d\n", before->model.c_str(), pr->channel.c_str(), before->model.c_str(), n.value());
    exit_code = 0;
  });

  auto rb = std::make_shared<ChannelArgs>();
  CLI::App* rollback = models->add_subcommand("rollback", "Move a channel back to where it pointed before its last promotion");
  rollback->add_option("name", rb->ref, "Model name")->required();
  rollback->add_option("channel", rb->channel, "dev, stable or prod")->required()->check(CLI::IsMember({"dev", "stable", "prod"}));
  add_store_option(*rollback, rb->store, false);
  rollback->callback([rb, &exit_code] {
    auto st = open_store(rb->store, false);
    if (!st.ok()) return void(exit_code = fail(st.status()));
    auto n = st.value()->rollback(rb->ref, rb->channel);
    if (!n.ok()) return void(exit_code = fail(n.status()));
    if (n.value() == 0) std::fprintf(stderr, "%s:%s is now unset\n", rb->ref.c_str(), rb->channel.c_str());
    else std::fprintf(stderr, "%s:%s -> %s@%d\n", rb->ref.c_str(), rb->channel.c_str(), rb->ref.c_str(), n.value());
    exit_code = 0;
  });

  auto rm = std::make_shared<ChannelArgs>();
  auto rm_data_dir = std::make_shared<std::string>();
  CLI::App* remove = models->add_subcommand("remove", "Remove the version REF names (its blobs go at the next gc)");
  remove->add_option("ref", rm->ref, "NAME@VERSION (or any reference)")->required();
  remove->add_flag("--force", rm->force, "Also when channels point at it (they are cleared) or queued jobs need it (they will fail)");
  remove->add_option("--data-dir", *rm_data_dir, "The queue whose waiting jobs must not lose their model (default: the --store folder, else the default data dir)");
  add_store_option(*remove, rm->store, false);
  remove->callback([rm, rm_data_dir, &exit_code] {
    auto st = open_store(rm->store, false);
    if (!st.ok()) return void(exit_code = fail(st.status()));
    auto v = st.value()->resolve(rm->ref);
    if (!v.ok()) return void(exit_code = fail(v.status()));
    if (!rm->force) {
      const std::string data = !rm_data_dir->empty() ? *rm_data_dir : !rm->store.store.empty() ? rm->store.store : default_data_dir();
      if (Status s = check_no_job_needs(data, rm->store.store, v->model, v->number); !s.ok()) return void(exit_code = fail(s));
    }
    if (Status s = st.value()->remove(rm->ref, rm->force); !s.ok()) return void(exit_code = fail(s));
    std::fprintf(stderr, "removed %s@%d; `atelier models gc` frees blobs no version uses\n", v->model.c_str(), v->number);
    exit_code = 0;
  });

  auto rp = std::make_shared<StoreOptions>();
  CLI::App* repair = models->add_subcommand("repair", "Rebuild a damaged store.db from what is readable and from the blobs (the damaged file is kept beside it)");
  add_store_option(*repair, *rp, false);
  repair->callback([rp, &exit_code] {
    auto r = Store::repair(rp->store);
    if (!r.ok()) return void(exit_code = fail(r.status()));
    const std::string root = rp->store.empty() ? default_store_dir() : rp->store;
    if (!r->damaged) {
      std::fprintf(stderr, "%s/store.db is not damaged; nothing to do\n", root.c_str());
    } else {
      std::fprintf(stderr, "rebuilt %s/store.db: %lld row(s) recovered, %d model file(s) with no record kept as recovered-<digest> models",
                   root.c_str(), static_cast<long long>(r->rows), r->recovered_models);
      if (r->unreferenced > 0) std::fprintf(stderr, ", %lld other file(s) left for gc", static_cast<long long>(r->unreferenced));
      if (!r->backup.empty()) std::fprintf(stderr, "; the damaged file is kept as %s", r->backup.c_str());
      std::fprintf(stderr, "\n");
    }
    exit_code = 0;
  });

  auto go = std::make_shared<StoreOptions>();
  CLI::App* gc = models->add_subcommand("gc", "Delete blobs no version references, and leftovers of interrupted imports");
  add_store_option(*gc, *go);
  gc->callback([go, &exit_code] {
    auto st = open_store(*go, false);
    if (!st.ok()) return void(exit_code = fail(st.status()));
    auto r = st.value()->gc();
    if (!r.ok()) return void(exit_code = fail(r.status()));
    if (go->json)
      print_json_line({{"blobs_removed", r->blobs_removed}, {"bytes_freed", r->bytes_freed}, {"tmp_removed", r->tmp_removed}});
    else
      std::fprintf(stderr, "removed %lld unused blob(s), %s freed; %lld leftover temporary file(s)\n",
                   static_cast<long long>(r->blobs_removed), human_bytes(static_cast<double>(r->bytes_freed)).c_str(),
                   static_cast<long long>(r->tmp_removed));
    exit_code = 0;
  });

  auto ho = std::make_shared<StoreOptions>();
  auto hname = std::make_shared<std::string>();
  CLI::App* history = models->add_subcommand("history", "The audit log of a model: imports, promotions, rollbacks, removals");
  history->add_option("name", *hname, "Model name")->required();
  add_store_option(*history, *ho);
  history->callback([ho, hname, &exit_code] { exit_code = run_history(*ho, *hname); });

  auto qz = std::make_shared<QuantizeCli>();
  CLI::App* quant = models->add_subcommand(
      "quantize", "Re-encode an F32/F16/BF16 GGUF version as a new version (a weight type or a recipe), then score it against the source");
  quant->add_option("ref", qz->ref, "The source: NAME, NAME@VERSION, NAME:CHANNEL, sha256:DIGEST or a GGUF file (then --name)")->required();
  quant->add_option("--type", qz->spec.type, "Weight type of every matrix: " + join(quantize_types(), ", "));
  quant->add_option("--recipe", qz->spec.recipe,
                    "q4_k_m (llama.cpp's Q4_K_M mix) or mixed (attention f16, feed-forward q8_0, embeddings 4-bit)");
  quant->add_option("--name", qz->spec.name, "Model name of the new version (default: the source's)");
  quant->add_option("--text", qz->spec.text_path, "Text for the quality report (default: a built-in TinyStories-style text)");
  quant->add_option("--max-tokens", qz->spec.max_tokens, "Tokens of the text to score")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  quant->add_flag("--no-quality", qz->no_quality, "Skip the quality report");
  quant->add_option("--threads", qz->spec.threads, "Threads (0: one per core)")->check(CLI::Range(0, 1024));
  add_store_option(*quant, qz->store);
  quant->callback([qz, &exit_code] { exit_code = run_quantize(*qz); });

  auto cmpo = std::make_shared<CompareCli>();
  CLI::App* cmp = models->add_subcommand(
      "compare", "Score a model against a reference on a text: perplexity of both, mean KL divergence, top-1 agreement");
  cmp->add_option("reference", cmpo->reference, "The reference model (e.g. the F32 source)")->required();
  cmp->add_option("candidate", cmpo->candidate, "The model to score (e.g. a quantized version, or any GGUF file)")->required();
  cmp->add_option("--text", cmpo->text, "Text to read (default: a built-in TinyStories-style text)");
  cmp->add_option("--max-tokens", cmpo->max_tokens, "Tokens of the text to score")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  cmp->add_option("--threads", cmpo->threads, "Threads (0: one per core)")->check(CLI::Range(0, 1024));
  cmp->add_option("--device", cmpo->device, "Where the candidate runs: cpu (default), cuda, cuda:N, auto")->capture_default_str();
  cmp->add_option("--precision", cmpo->precision, "The candidate's products on a GPU: auto, bf16, fp16, fp8")
      ->check(CLI::IsMember({"auto", "bf16", "fp16", "fp8"}))->capture_default_str();
  cmp->add_option("--reference-device", cmpo->reference_device, "Where the reference runs (default: --device)");
  cmp->add_option("--reference-precision", cmpo->reference_precision, "The reference's products on a GPU (fp8's cost: bf16 here, fp8 for the candidate)")
      ->check(CLI::IsMember({"auto", "bf16", "fp16", "fp8"}))->capture_default_str();
  add_store_option(*cmp, cmpo->store);
  cmp->callback([cmpo, &exit_code] { exit_code = run_compare(*cmpo); });

  // ---- model files
  struct SynthOptions {
    SynthTextSpec spec;
    SynthImageSpec image;
    std::string out, chat_template_file;
  };
  auto s = std::make_shared<SynthOptions>();
  CLI::App* synth = models->add_subcommand(
      "synth", "Write a model with deterministic random weights (for benchmarks and tests): a llama/qwen3/gemma3/phi3 or mixture-of-experts GGUF, or an SD 1.5/2.1-shaped .safetensors");
  synth->add_option("--arch", s->spec.arch,
                    "Architecture: llama, qwen3, gemma3, phi3 (text GGUF); mixtral, qwen3moe, gpt-oss (mixtures of experts); sd15, sd21 (Stable Diffusion checkpoints)")
      ->check(CLI::IsMember({"llama", "qwen3", "gemma3", "phi3", "mixtral", "qwen3moe", "gpt-oss", "sd15", "sd21"}))
      ->capture_default_str();
  synth->add_option("--params", s->spec.params,
                    "Size preset (llama, qwen3, gemma3, phi3: 260K..1B; mixtral, qwen3moe, gpt-oss: tiny; qwen3moe A3B-2L and gpt-oss 20B-2L: two layers of the real width)")->check(CLI::IsMember(synth_param_presets()))->capture_default_str();
  CLI::Option* type = synth->add_option("--type", s->spec.type, "Weight type of the matrices (images: f32, f16, bf16; default f16)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q6_K"}))
      ->capture_default_str();
  synth->add_option("--width-mult", s->image.width_mult, "sd15/sd21: channel width factor in (0, 1] (0.1: 32-channel UNet)")
      ->capture_default_str();
  synth->add_option("--heads", s->image.unet_heads, "sd15/sd21: UNet attention heads (0: 8 for sd15, 64-wide for sd21)");
  add_seed_option(*synth, s->spec.seed, "Seed of the weights, 0..18446744073709551614 (default: 1)");  // as every --seed: '' and -1 refused
  synth->add_option("--chat-template", s->chat_template_file, "Text models: a Jinja chat template file to embed (tokenizer.chat_template)")
      ->check(CLI::ExistingFile);
  synth->add_option("--special-token", s->spec.special_tokens,
                    "llama: a control token to add to the vocabulary (repeatable), e.g. a chat format's markers such as <|channel|>");
  synth->add_option("-o,--output", s->out, "Output file (.gguf or .safetensors)")->required();
  synth->callback([s, type, &exit_code] {
    Status st;
    if (s->spec.arch != "sd15" && s->spec.arch != "sd21") {
      if (!s->chat_template_file.empty()) {
        std::ifstream in(s->chat_template_file, std::ios::binary);
        s->spec.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      st = synth_text_model(s->spec, s->out);
    } else {
      s->image.arch = s->spec.arch;
      s->image.seed = s->spec.seed;
      if (type->count() > 0) s->image.type = s->spec.type;
      st = synth_image_model(s->image, s->out);
    }
    if (!st.ok()) {
      exit_code = fail(st);
      return;
    }
    std::fprintf(stderr, "wrote %s\n", s->out.c_str());
    exit_code = 0;
  });

  struct ScanOptions {
    std::vector<std::string> dirs;
    bool json = false;
  };
  auto sc = std::make_shared<ScanOptions>();
  CLI::App* scan = models->add_subcommand("scan", "List the model files in folders, reading only their headers");
  scan->add_option("dirs", sc->dirs, "Folders")->required()->check(CLI::ExistingDirectory);
  scan->add_flag("--json", sc->json, "JSON Lines output");
  scan->callback([sc, &exit_code] {
    for (const ModelFile& m : scan_model_folders(sc->dirs)) {
      if (sc->json)
        print_json_line({{"path", m.path}, {"kind", m.kind}, {"format", m.format}, {"bytes", m.bytes}, {"summary", m.summary}});
      else
        std::printf("%-60s %-8s %10.1f MB  %s\n", m.path.c_str(), m.format.c_str(), m.bytes / 1e6, m.summary.c_str());
    }
    exit_code = 0;
  });
}

}  // namespace atelier::app
