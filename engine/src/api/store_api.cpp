// The model store's public face (atelier/store.h) and resolve_model, the one
// place where a model reference becomes a file to load. Exceptions from the
// store room stop here and become a Status.
#include <atelier/models.h>
#include <atelier/store.h>

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/error.h"
#include "store/blob_store.h"
#include "store/catalog.h"
#include "store/download.h"
#include "store/pull.h"
#include "store/store.h"

#ifndef ATELIER_SOURCE_CATALOG
#define ATELIER_SOURCE_CATALOG "models/catalog.json"
#endif

namespace atelier {

namespace fs = std::filesystem;

namespace {

template <class F>
auto store_call(F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {  // the throw site says which kind (NetworkError: Io)
    return Status::error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return Status::error(StatusCode::Io, "out of memory");
  } catch (const std::exception& e) {
    return Status::error(StatusCode::Internal, std::string("internal error: ") + e.what());
  }
}

StoreVersion to_public(const store::VersionInfo& v, const std::string& root) {
  StoreVersion o;
  o.model = v.model;
  o.kind = v.kind;
  o.number = v.number;
  o.label = v.label;
  o.created_ms = v.created_ms;
  o.notes = v.notes;
  o.format = v.format;
  o.architecture = v.architecture;
  o.parameters = v.parameters;
  o.context_length = v.context_length;
  o.embedding_length = v.embedding_length;
  o.vocab_size = v.vocab_size;
  o.quantization = v.quantization;
  o.native_resolution = v.native_resolution;
  for (const auto& f : v.files)
    o.files.push_back({f.role, f.digest, f.size, f.blob_path.empty() ? root + "/blobs/sha256/" + f.digest : f.blob_path});
  o.channels = v.channels;
  if (!v.files.empty()) o.digest = v.primary().digest;
  return o;
}

// Which version NAME alone names: prod, else stable, else the newest.
int default_version(const store::ModelInfo& m) {
  for (const char* c : {"prod", "stable"})
    if (auto it = m.channels.find(c); it != m.channels.end()) return it->second;
  return m.versions.empty() ? 0 : m.versions.back().number;
}

// Files whose digest this process has checked, by path, with the size and
// modification time seen then. Blobs are immutable once named (read-only,
// renamed into place), so unchanged size and mtime mean the bytes were
// checked already; hashing a multi-GB model for every job would cost seconds.
struct DigestCache {
  struct Entry {
    int64_t size = 0, mtime_ns = 0;
    std::string digest;
  };
  std::mutex mu;
  std::map<std::string, Entry> entries;
};
DigestCache& digest_cache() {
  static DigestCache cache;
  return cache;
}

bool stat_file(const std::string& path, int64_t& size, int64_t& mtime_ns) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  size = st.st_size;
  mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return true;
}

// The sha256 of PATH, hashed at most once per process while it is unchanged.
std::string cached_sha256(const std::string& path) {
  int64_t size = 0, mtime = 0;
  if (!stat_file(path, size, mtime)) throw Error(errno_code(errno), "cannot read " + path + ": " + std::strerror(errno));
  auto& c = digest_cache();
  {
    std::lock_guard lock(c.mu);
    auto it = c.entries.find(path);
    if (it != c.entries.end() && it->second.size == size && it->second.mtime_ns == mtime) return it->second.digest;
  }
  int64_t hashed = 0;
  const std::string d = store::sha256_file(path, &hashed);
  std::lock_guard lock(c.mu);
  c.entries[path] = {hashed, mtime, d};
  return d;
}

}  // namespace

std::string default_store_dir() {
  if (const char* home = std::getenv("ATELIER_HOME"); home && *home) return home;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg) return std::string(xdg) + "/atelier";
  const char* user_home = std::getenv("HOME");
  return std::string(user_home && *user_home ? user_home : ".") + "/.local/share/atelier";
}

std::string ResolvedModel::file(const std::string& role) const {
  for (const auto& [r, p] : files)
    if (r == role) return p;
  return "";
}

bool model_ref_is_path(const std::string& ref) {
  if (ref.find('/') != std::string::npos) return true;
  const std::string ext = fs::path(ref).extension().string();
  for (const char* e : {".gguf", ".bin", ".safetensors", ".pth", ".pt", ".ckpt", ".json"})
    if (ext == e) return true;
  return false;
}

Result<ResolvedModel> resolve_model(const std::string& ref, const std::string& store_dir, const ResolveOptions& options) {
  if (ref.empty())
    return Status::error(StatusCode::InvalidArgument,
                         "no model given: name a store model (see `atelier models list`) or a model file");
  if (is_synth_model_ref(ref)) {
    // Made on the runner's device when it loads: nothing to find or hash; its
    // digest names the spec (SynthModelRef::digest), so a job records what ran.
    auto spec = parse_synth_model_ref(ref);
    if (!spec.ok()) return spec.status();
    ResolvedModel r;
    r.path = r.display = spec->canonical();
    r.digest = spec->digest();
    r.kind = "text";
    r.format = "synthetic";
    r.files = {{"model", r.path}};
    return r;
  }
  return store_call([&]() -> Result<ResolvedModel> {
    ResolvedModel r;
    std::error_code ec;
    if (fs::is_regular_file(ref, ec)) {
      // A plain file: used as it is, without a store entry.
      r.path = ref;
      r.display = ref;
      r.files = {{"model", ref}};
      if (options.check_digest) r.digest = "sha256:" + cached_sha256(ref);
      return r;
    }
    if (model_ref_is_path(ref)) {
      if (fs::exists(ref, ec))  // bad usage, as a folder or FIFO anywhere a file goes (exit 2)
        return Status::error(StatusCode::InvalidArgument, ref + " is not a regular file (a folder, FIFO or device); name a model file");
      return Status::error(StatusCode::NotFound, ref + ": no such model file");
    }
    const std::string root = store_dir.empty() ? default_store_dir() : store_dir;
    if (!fs::exists(fs::path(root) / "store.db", ec)) {
      const bool named = ref.rfind("sha256:", 0) != 0;
      const std::string name = named ? ref.substr(0, ref.find_first_of("@:")) : ref;
      return Status::error(StatusCode::NotFound,
                           "no model \"" + ref + "\": the model store " + root + " has no models yet" +
                               (named ? "; install it with `atelier models pull " + name +
                                            "` (from a folder: add --mirror DIR) or `atelier models import FILE --name " +
                                            name + "`"
                                      : "") +
                               ", or give a model file's path");
    }
    auto st = store::ModelStore::open(root);
    const store::VersionInfo v = st->resolve(ref);
    const auto& primary = v.primary();
    r.path = st->blob_path(primary.digest);
    r.digest = "sha256:" + primary.digest;
    r.display = v.model + "@" + std::to_string(v.number);
    r.name = v.model;
    r.version = v.number;
    r.kind = v.kind;
    r.format = v.format;
    r.in_store = true;
    for (const auto& f : v.files) r.files.emplace_back(f.role, st->blob_path(f.digest));
    if (options.check_digest) {
      // Refuse a damaged blob before anything reads it as a model.
      for (const auto& f : v.files) {
        const std::string p = st->blob_path(f.digest);
        int64_t size = 0, mtime = 0;
        if (!stat_file(p, size, mtime))
          return Status::error(StatusCode::NotFound, r.display + ": its " + f.role + " blob " + p +
                                                         " is missing; run `atelier models verify`, then pull or import it again");
        const std::string got = size == f.size ? cached_sha256(p) : std::string();
        if (got != f.digest)
          return Status::error(StatusCode::InvalidModel,
                               r.display + " is corrupted: its " + f.role + " blob " + p +
                                   (got.empty() ? " has " + std::to_string(size) + " bytes, not " + std::to_string(f.size)
                                                : " hashes to " + got + ", not its name") +
                                   "; refusing to load it. Run `atelier models verify`, then pull or import the model again");
      }
    }
    return r;
  });
}

// ---------------------------------------------------------------- Store

struct Store::Impl {
  std::unique_ptr<store::ModelStore> st;
};

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

Result<std::unique_ptr<Store>> Store::open(const std::string& root_in, bool create) {
  const std::string root = root_in.empty() ? default_store_dir() : root_in;
  std::error_code ec;
  if (!create && !fs::exists(fs::path(root) / "store.db", ec))
    return Status::error(StatusCode::NotFound, "the model store " + root +
                                                   " has no models yet; install one with `atelier models pull NAME` "
                                                   "or `atelier models import FILE --name NAME`");
  return store_call([&]() -> Result<std::unique_ptr<Store>> {
    auto impl = std::make_unique<Impl>();
    impl->st = store::ModelStore::open(root);
    return std::unique_ptr<Store>(new Store(std::move(impl)));
  });
}

const std::string& Store::root() const { return impl_->st->root(); }

Result<std::vector<StoreModel>> Store::list() const {
  return store_call([&]() -> Result<std::vector<StoreModel>> {
    std::vector<StoreModel> out;
    for (const auto& m : impl_->st->list()) {
      StoreModel o;
      o.name = m.name;
      o.kind = m.kind;
      o.architecture = m.architecture;
      o.licence = m.licence;
      o.description = m.description;
      for (const auto& v : m.versions) o.versions.push_back(to_public(v, root()));
      o.channels = m.channels;
      o.default_version = default_version(m);
      out.push_back(std::move(o));
    }
    return out;
  });
}

Result<StoreVersion> Store::resolve(const std::string& ref) const {
  return store_call([&]() -> Result<StoreVersion> { return to_public(impl_->st->resolve(ref), root()); });
}

Result<int> Store::import(const std::vector<StoreImportFile>& files, const std::string& name, const StoreImportOptions& options) {
  return store_call([&]() -> Result<int> {
    std::vector<store::ImportFile> in;
    for (const auto& f : files) in.push_back({f.path, f.role});
    store::ImportOptions o;
    o.label = options.label;
    o.kind = options.kind;
    o.notes = options.notes;
    o.licence = options.licence;
    o.description = options.description;
    o.on_progress = options.on_progress;
    return impl_->st->import(in, name, o);
  });
}

Result<PullResult> Store::pull(const CatalogEntry& entry, const PullOptions& options) {
  return store_call([&]() -> Result<PullResult> { return store::pull(*impl_->st, entry, options); });
}

Result<int> Store::promote(const std::string& ref, const std::string& channel) {
  return store_call([&]() -> Result<int> { return impl_->st->promote(ref, channel); });
}

Result<int> Store::rollback(const std::string& name, const std::string& channel) {
  return store_call([&]() -> Result<int> { return impl_->st->rollback(name, channel); });
}

Status Store::remove(const std::string& ref, bool force) {
  return store_call([&]() -> Status {
    impl_->st->remove(ref, force);
    return Status{};
  });
}

Result<StoreRepairReport> Store::repair(const std::string& root_in) {
  const std::string root = root_in.empty() ? default_store_dir() : root_in;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return Status::error(StatusCode::NotFound, "no model store at " + root);
  return store_call([&]() -> Result<StoreRepairReport> {
    const auto r = store::ModelStore::repair(root);
    return StoreRepairReport{r.damaged, r.backup, r.rows, r.recovered_models, r.unreferenced};
  });
}

Result<StoreGcReport> Store::gc() {
  return store_call([&]() -> Result<StoreGcReport> {
    const auto r = impl_->st->gc();
    return StoreGcReport{r.blobs_removed, r.bytes_freed, r.tmp_removed};
  });
}

Result<StoreVerifyReport> Store::verify(const std::string& ref, const StoreProgressFn& on_progress) const {
  return store_call([&]() -> Result<StoreVerifyReport> {
    const auto r = impl_->st->verify(ref, on_progress);
    StoreVerifyReport o;
    o.blobs_checked = r.blobs_checked;
    o.bytes_checked = r.bytes_checked;
    for (const auto& p : r.problems) o.problems.push_back({p.digest, p.path, p.problem});
    return o;
  });
}

Result<std::vector<StoreAuditEntry>> Store::history(const std::string& name) const {
  return store_call([&]() -> Result<std::vector<StoreAuditEntry>> {
    std::vector<StoreAuditEntry> out;
    for (const auto& a : impl_->st->history(name))
      out.push_back({a.id, a.time_ms, a.action, a.model, a.version, a.channel, a.previous_version, a.detail});
    return out;
  });
}

// ---------------------------------------------------------------- the catalog

// $ATELIER_CATALOG, else the copy installed with the program
// (<dir of the binary>/../share/atelier/catalog.json: a package has no source
// tree), else the source tree's this binary was built from.
std::string default_catalog_path() {
  if (const char* c = std::getenv("ATELIER_CATALOG"); c && *c) return c;
  std::error_code ec;
  if (const fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec && exe.has_parent_path())
    if (const fs::path installed = exe.parent_path().parent_path() / "share" / "atelier" / "catalog.json"; fs::is_regular_file(installed, ec))
      return installed.string();
  return ATELIER_SOURCE_CATALOG;
}

Result<std::vector<CatalogEntry>> load_catalog(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return Status::error(StatusCode::NotFound,
                         "the model catalog " + path + " does not exist; pass --catalog FILE or set ATELIER_CATALOG");
  return store_call([&]() -> Result<std::vector<CatalogEntry>> { return store::read_catalog(path); });
}

}  // namespace atelier
