#include "store/pull.h"

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "store/blob_store.h"
#include "store/download.h"

namespace atelier::store {

namespace fs = std::filesystem;

namespace {

std::string safe_component(const std::string& s) {
  std::string r;
  for (char c : s) r += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  return r;
}

// The version of ENTRY's model whose files are exactly the catalog's (role
// and sha256), or 0.
int identical_version(const ModelStore& store, const CatalogEntry& entry) {
  for (const auto& f : entry.files)
    if (f.sha256.empty()) return 0;
  for (const auto& m : store.list()) {
    if (m.name != entry.name) continue;
    for (const auto& v : m.versions) {
      if (v.files.size() != entry.files.size()) continue;
      std::map<std::string, std::string> have;
      for (const auto& f : v.files) have[f.role] = f.digest;
      bool same = true;
      for (const auto& f : entry.files) same = same && have.count(f.role) && have[f.role] == f.sha256;
      if (same) return v.number;
    }
  }
  return 0;
}

// True when every file of ENTRY is in the blob folder with its catalog
// sha256 (re-hashed: a damaged blob must be fetched again, not reported as installed).
bool blobs_intact(const ModelStore& store, const CatalogEntry& entry) {
  for (const auto& f : entry.files) {
    const std::string path = store.blob_path(f.sha256);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return false;
    try {
      if (sha256_file(path, nullptr) != f.sha256) return false;
    } catch (const Error&) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string partial_path(const ModelStore& store, const CatalogEntry& entry, const CatalogFile& file) {
  // Keyed by the expected digest when known, so a partial file is never
  // resumed against different bytes.
  const std::string key = file.sha256.empty() ? safe_component(entry.name + "-" + file.role + "-" + file.name) : file.sha256;
  return store.root() + "/downloads/" + key + ".part";
}

PullResult pull(ModelStore& store, const CatalogEntry& entry, const PullOptions& options) {
  auto note = [&](const std::string& s) {
    if (options.on_note) options.on_note(s);
  };
  PullResult result;
  result.model = entry.name;
  const int damaged = identical_version(store, entry);
  if (damaged && !blobs_intact(store, entry))
    note(entry.name + "@" + std::to_string(damaged) + " is installed but its files are damaged on disk; fetching them again to repair it");
  else if (const int v = damaged) {
    result.version = v;
    result.already_installed = true;
    result.digest = store.resolve(entry.name + "@" + std::to_string(v)).primary().digest;
    return result;
  }

  std::vector<ImportFile> files;
  std::vector<std::string> partials;  // removed once the version is recorded
  const bool mirror_given = !options.mirror.empty();
  if (mirror_given && !fs::is_directory(options.mirror))
    throw NotFoundError("the mirror folder " + options.mirror + " does not exist; pass --mirror DIR (or ATELIER_MODEL_MIRROR) naming a folder of model files");
  for (const auto& f : entry.files) {
    ImportFile in;
    in.role = f.role;
    in.expected_sha256 = f.sha256;
    const std::string mirrored = mirror_given && !f.mirror.empty() ? (fs::path(options.mirror) / f.mirror).string() : "";
    std::error_code ec;
    if (!mirrored.empty() && fs::is_regular_file(mirrored, ec)) {
      const int64_t size = static_cast<int64_t>(fs::file_size(mirrored, ec));
      if (entry.verified && f.size > 0 && size != f.size)
        throw Error("refusing " + mirrored + ": " + std::to_string(size) + " bytes, but the catalog says " + std::to_string(f.size) + " bytes" +
                    "; nothing was recorded (the mirror holds another file)");
      in.path = mirrored;
      result.bytes += size;
      if (result.source.empty()) result.source = options.mirror;
      files.push_back(in);
      continue;
    }
    if (f.urls.empty()) {
      if (mirror_given)
        throw NotFoundError("the mirror " + options.mirror + " has no " + f.mirror + ", and the catalog gives no download address for " +
                    entry.name + " (" + f.name + ")");
      throw NotFoundError(entry.name + " (" + f.name + ") has no download address; install it from a folder of model files with "
                  "--mirror DIR (or ATELIER_MODEL_MIRROR), where it is " + f.mirror);
    }
    if (mirror_given) note("the mirror " + options.mirror + " has no " + f.mirror + "; downloading it");
    std::error_code mk;
    fs::create_directories(store.root() + "/downloads", mk);
    if (mk) throw IoError("cannot create " + store.root() + "/downloads: " + mk.message());
    const std::string part = partial_path(store, entry, f);
    DownloadOptions d;
    d.retries = options.retries;
    d.retry_delay_ms = options.retry_delay_ms;
    d.should_stop = options.should_stop;
    if (options.on_progress) {
      d.progress = [&](int64_t done, int64_t total, double rate) {
        PullProgress p;
        p.model = entry.name;
        p.role = f.role;
        p.file = f.name;
        p.bytes_done = done;
        p.bytes_total = total > 0 ? total : f.size;
        p.bytes_per_s = rate;
        p.done = total > 0 && done == total && rate == 0;
        options.on_progress(p);
      };
    }
    std::string errors;
    bool got = false;
    bool all_unreachable = true;
    for (const auto& url : f.urls) {
      std::error_code pe;
      const auto have = fs::exists(part, pe) ? fs::file_size(part, pe) : 0;
      note((have > 0 ? "resuming " : "downloading ") + f.name + " from " + url +
           (have > 0 ? " at byte " + std::to_string(have) : ""));
      try {
        download(url, part, !f.sha256.empty() ? f.size : 0, d);
        got = true;
        if (result.source.empty()) result.source = url;
        break;
      } catch (const NetworkError& e) {
        errors.append(errors.empty() ? "" : "; ").append(e.what());
      } catch (const Error& e) {
        if (e.code() == StatusCode::Cancelled) throw;  // paused: the partial file stays for the next pull
        all_unreachable = false;
        errors.append(errors.empty() ? "" : "; ").append(e.what());
      }
    }
    if (!got) {
      if (all_unreachable)
        throw NetworkError(errors + "; no network? To install without one, use a folder of model files: --mirror DIR (or "
                           "ATELIER_MODEL_MIRROR) holding " + (f.mirror.empty() ? f.name : f.mirror));
      throw IoError(errors);
    }
    // Check the whole file before it goes near the store; a wrong one is
    // deleted so that the next attempt starts afresh instead of resuming it.
    if (!f.sha256.empty()) {
      int64_t size = 0;
      const std::string digest = sha256_file(part, &size);
      if (digest != f.sha256) {
        fs::remove(part, ec);
        throw Error("the download of " + f.name + " hashes to " + digest + ", not " + f.sha256 +
                    " as the catalog says; nothing was recorded and the partial file was deleted (run the command again)");
      }
    } else {
      int64_t size = 0;
      in.expected_sha256 = sha256_file(part, &size);
      note(f.name + ": the catalog has no sha256 for it (unverified entry); recording what arrived, sha256:" + in.expected_sha256);
    }
    in.path = part;
    std::error_code se;
    result.bytes += static_cast<int64_t>(fs::file_size(part, se));
    partials.push_back(part);
    files.push_back(in);
  }

  // An unverified entry may turn out identical to an installed version.
  CatalogEntry got = entry;
  for (size_t i = 0; i < files.size(); ++i) got.files[i].sha256 = files[i].expected_sha256;
  if (const int v = identical_version(store, got)) {
    const bool repair = !blobs_intact(store, got);
    if (repair) {
      // The same bytes again: each put() renames over the damaged blob.
      BlobStore blobs(store.root());
      BlobStore::Lock lock(store.root(), BlobStore::Lock::kShared);
      for (const auto& f : files) blobs.put(f.path, {});
    }
    for (const auto& p : partials) {
      std::error_code ec;
      fs::remove(p, ec);
    }
    result.version = v;
    result.already_installed = !repair;
    result.repaired = repair;
    result.digest = store.resolve(entry.name + "@" + std::to_string(v)).primary().digest;
    return result;
  }

  ImportOptions io;
  io.kind = entry.kind;
  io.licence = entry.licence;
  io.description = entry.description;
  io.label = "catalog";
  io.notes = "pulled from " + result.source + (entry.verified ? "" : " (unverified catalog entry)");
  if (options.should_stop) io.on_progress = [&](int64_t, int64_t) { return !options.should_stop(); };  // a pause records nothing
  const int version = store.import(files, entry.name, io);
  for (const auto& p : partials) {
    std::error_code ec;
    fs::remove(p, ec);
  }
  result.version = version;
  result.digest = store.resolve(entry.name + "@" + std::to_string(version)).primary().digest;
  return result;
}

}  // namespace atelier::store
