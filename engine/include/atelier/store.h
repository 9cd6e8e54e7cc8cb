// atelier/store.h — the model store and the model catalog, for the command
// line and the window. Model references are resolved by resolve_model in
// atelier/models.h; this header manages what they resolve to.
//
// A store is a folder: store.db (SQLite, WAL) plus content-addressed blobs
// (blobs/sha256/<digest>) and partial downloads (downloads/). A model has
// numbered versions (never reused); channels dev, stable and prod point at
// versions; every change is written to an audit log. Nothing here throws:
// each call returns a Status or a Result whose message says what to do.
#pragma once

#include <atelier/models.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace atelier {

// SHA-256 of BYTES as 64 lower-case hex digits (OpenSSL's libcrypto, opened
// on first use; Io when it cannot be loaded).
Result<std::string> sha256_hex(std::string_view bytes);

struct StoreFile {
  std::string role;    // "model", "tokenizer", "encoder", "decoder", ...
  std::string digest;  // 64 lower-case hex digits
  int64_t size = 0;
  std::string path;    // the blob
};

struct StoreVersion {
  std::string model, kind;
  int number = 0;
  std::string label;
  int64_t created_ms = 0;
  std::string notes;
  // What the model file's header says.
  std::string format, architecture;
  int64_t parameters = 0, context_length = 0, embedding_length = 0, vocab_size = 0;
  std::string quantization;  // distinct tensor types, comma-separated
  int64_t native_resolution = 0;
  std::vector<StoreFile> files;        // ordered by role
  std::vector<std::string> channels;   // channels pointing here
  std::string digest;                  // the primary file's digest (what a job records)
};

struct StoreModel {
  std::string name, kind, architecture, licence, description;
  std::vector<StoreVersion> versions;  // ascending
  std::map<std::string, int> channels; // channel -> version number
  int default_version = 0;             // what NAME alone resolves to (0: no versions)
};

struct StoreAuditEntry {
  int64_t id = 0, time_ms = 0;
  std::string action;  // import, promote, rollback, remove, gc
  std::string model;
  int version = 0;
  std::string channel;
  int previous_version = 0;
  std::string detail;
};

struct StoreVerifyReport {
  int64_t blobs_checked = 0, bytes_checked = 0;
  struct Problem {
    std::string digest, path, problem;
  };
  std::vector<Problem> problems;
  bool ok() const { return problems.empty(); }
};

struct StoreGcReport {
  int64_t blobs_removed = 0, bytes_freed = 0, tmp_removed = 0;
};

// `atelier models repair` (Store::repair).
struct StoreRepairReport {
  bool damaged = false;       // false: store.db was fine; nothing was done
  std::string backup;         // where the damaged store.db was moved ("" when there was none)
  int64_t rows = 0;           // rows salvaged from it
  int recovered_models = 0;   // unreferenced model blobs recorded as models "recovered-<12 hex>"
  int64_t unreferenced = 0;   // blobs left unreferenced (not model files on their own)
};

struct StoreImportFile {
  std::string path;
  std::string role = "model";
};

// Called as bytes are hashed (import: copied and hashed; verify: hashed) with
// the bytes done so far and in all of the call; returning false stops the
// work with Cancelled (an import then records nothing).
using StoreProgressFn = std::function<bool(int64_t bytes_done, int64_t bytes_total)>;

struct StoreImportOptions {
  std::string label, kind, notes, licence, description;
  StoreProgressFn on_progress;  // may be empty
};

// ---------------------------------------------------------------- the catalog

// One file of a catalog entry. size and sha256 are checked before a version
// is recorded when the entry is verified; an unverified entry's size is what
// its source says (for progress) and its sha256 may be empty.
struct CatalogFile {
  std::string role = "model";
  std::string name;                // the original file name
  int64_t size = 0;
  std::string sha256;              // 64 hex digits, or "" when not known
  std::vector<std::string> urls;   // public download addresses, tried in order
  std::string mirror;              // path relative to a mirror folder, e.g. "text/stories260K.gguf"
};

struct CatalogEntry {
  std::string name, kind, architecture, licence, description;
  bool verified = false;           // every file's size and sha256 checked against the real file
  std::vector<CatalogFile> files;
};

// $ATELIER_CATALOG, else share/atelier/catalog.json installed with the program (beside its
// bin/), else models/catalog.json of the source tree this binary was built from.
std::string default_catalog_path();
// NotFound / InvalidArgument (naming the line's problem) when the file does not parse.
Result<std::vector<CatalogEntry>> load_catalog(const std::string& path);

struct PullProgress {
  std::string model, role, file;
  int64_t bytes_done = 0, bytes_total = 0;  // bytes_total 0: unknown
  double bytes_per_s = 0;
  bool done = false;                        // the last call for this file
};

struct PullOptions {
  std::string mirror;        // a folder holding the catalog's mirror paths ("" = none)
  int retries = 3;           // extra attempts after a dropped connection (each resumes where it stopped)
  int retry_delay_ms = 1000; // before the first retry; doubled for each further one
  std::function<void(const PullProgress&)> on_progress;
  std::function<void(const std::string&)> on_note;  // one line for people ("downloading ...")
  // Polled while a file downloads or is recorded; true pauses the pull: it
  // ends with Cancelled at once, recording nothing, and a download keeps its
  // bytes in the store's downloads/ folder, so the next pull of the model
  // (in this process or after a restart) resumes where it stopped.
  std::function<bool()> should_stop;
};

struct PullResult {
  std::string model;
  int version = 0;
  bool already_installed = false;  // an identical version was there, its files intact; nothing was done
  bool repaired = false;           // an identical version was there with damaged files: they were fetched again
  std::string source;              // the mirror folder or the first URL used
  int64_t bytes = 0;
  std::string digest;              // the primary file's
};

class Store {
 public:
  // Opens (creating when CREATE) the store at ROOT ("" = default_store_dir()).
  // NotFound when it does not exist and !CREATE.
  static Result<std::unique_ptr<Store>> open(const std::string& root = "", bool create = true);
  // Rebuilds a damaged (truncated, overwritten, emptied) store.db: the bad
  // file is kept as store.db.damaged-<ms>, every readable row is copied into
  // a fresh one, and blobs no version references become "recovered-<12 hex>"
  // models. A healthy store is left alone (damaged = false). Io on failure.
  static Result<StoreRepairReport> repair(const std::string& root = "");
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& root() const;
  Result<std::vector<StoreModel>> list() const;
  Result<StoreVersion> resolve(const std::string& ref) const;
  Result<int> import(const std::vector<StoreImportFile>& files, const std::string& name,
                     const StoreImportOptions& options = {});
  // Installs catalog entry ENTRY from options.mirror or its URLs (libcurl:
  // resumable, partial file kept in ROOT/downloads). Every file's sha256 is
  // checked before the version is recorded; a mismatch records nothing.
  Result<PullResult> pull(const CatalogEntry& entry, const PullOptions& options = {});
  Result<int> promote(const std::string& ref, const std::string& channel);
  Result<int> rollback(const std::string& name, const std::string& channel);  // 0: the channel is now unset
  Status remove(const std::string& ref, bool force = false);
  Result<StoreGcReport> gc();
  Result<StoreVerifyReport> verify(const std::string& ref = "", const StoreProgressFn& on_progress = {}) const;  // "" = every blob
  Result<std::vector<StoreAuditEntry>> history(const std::string& name) const;

  struct Impl;

 private:
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atelier
