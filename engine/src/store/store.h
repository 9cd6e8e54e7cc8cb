// The model store: one SQLite database (ROOT/store.db, WAL) and a
// content-addressed blob folder (ROOT/blobs/sha256/<digest>).
//
// A model (unique name, kind text|image) has numbered versions 1, 2, ...;
// numbers are never reused, even after a version is removed, so NAME@N always
// means the same bytes. A version holds one or more files, each with a role
// ("model", "tokenizer", ...) pointing at a blob, and the facts read from the
// model file's header. Channels dev, stable and prod point at versions; every
// import, promotion, rollback, removal and gc is written to an audit log.
//
// Blobs: import copies a file to blobs/tmp-XXXXXX while hashing it (SHA-256),
// fsyncs it, renames it to blobs/sha256/<digest> and fsyncs the folder, so a
// final path never holds a half-written blob; identical content is stored
// once. A crash before the rename leaves only a tmp file, which open() and
// gc() remove. Every database change is one transaction.
//
// Concurrency: several ModelStore objects, in one process or many, may use the
// same root. Imports hold a shared flock on ROOT/store.lock from the first
// tmp file to the commit; gc() holds it exclusively, so it never deletes a
// blob an import has renamed but not yet recorded. One ModelStore may be
// shared by threads (calls are serialized). Never carry an open ModelStore
// across fork(): open a new one in the child.
//
// References (resolve, promote, remove, verify):
//   NAME            prod, else stable, else the newest version
//   NAME@VERSION    a version number
//   NAME:CHANNEL    dev, stable or prod
//   sha256:DIGEST   a blob digest, full or a unique prefix of >= 12 hex
//                   digits; the newest version holding that blob
// Every failure throws atelier::Error naming the store or file and what to do.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct sqlite3;

namespace atelier::store {

// What a model file's header says. Throws atelier::Error naming the file when
// the header does not parse as a format this store knows (GGUF, safetensors,
// PyTorch zip checkpoint, llama2.c .bin).
struct HeaderFacts {
  std::string format;             // "gguf", "safetensors", "pytorch", "llama2c"
  std::string kind;               // the kind the format suggests: "text" or "image"
  std::string architecture;       // "" when the file does not say
  int64_t parameters = 0;         // sum of tensor element counts
  int64_t context_length = 0;     // text models; 0 when unknown
  int64_t embedding_length = 0;   // text models; 0 when unknown
  int64_t vocab_size = 0;         // text models; 0 when unknown
  std::string quantization;       // distinct tensor types, sorted, comma-separated ("f32", "q4_K,q6_K")
  int64_t native_resolution = 0;  // image models, from metadata; 0 when unknown
};
HeaderFacts inspect_header(const std::string& path);

// Roles whose files are stored as they are (no model header to check).
bool is_auxiliary_role(const std::string& role);

struct ImportFile {
  std::string path;
  std::string role = "model";
  // When set (64 hex digits), the bytes copied must hash to it, else nothing
  // is recorded (a pull checks the catalog's sha256 this way, in the same
  // pass that copies the file).
  std::string expected_sha256 = {};
};

struct ImportOptions {
  std::string label;
  std::string kind;         // "text" or "image"; "" = the model's, else what the format suggests
  std::string notes;
  std::string licence;      // set on the model when not empty
  std::string description;  // set on the model when not empty
  // Test hook: called with the tmp file's path after it is hashed and synced,
  // before the rename (a crash test kills the process here).
  std::function<void(const std::string& tmp_path)> after_hash;
  // Bytes copied so far and in all files; false cancels (StatusCode::Cancelled, nothing recorded).
  std::function<bool(int64_t bytes_done, int64_t bytes_total)> on_progress;
};

struct FileEntry {
  std::string role;
  std::string digest;     // 64 lower-case hex digits
  int64_t size = 0;
  std::string blob_path;  // ROOT/blobs/sha256/<digest>
};

struct VersionInfo {
  std::string model;
  std::string kind;
  int number = 0;
  std::string label;
  int64_t created_ms = 0;
  std::string notes;
  std::string format;
  std::string architecture;
  int64_t parameters = 0, context_length = 0, embedding_length = 0, vocab_size = 0;
  std::string quantization;
  int64_t native_resolution = 0;
  std::vector<FileEntry> files;        // ordered by role
  std::vector<std::string> channels;   // channels pointing here, sorted
  // The "model" file (else the first file); the digest a job records.
  const FileEntry& primary() const;
};

struct ModelInfo {
  std::string name, kind, architecture, licence, description;
  std::vector<VersionInfo> versions;     // ascending by number
  std::map<std::string, int> channels;   // channel -> version number
};

struct AuditRow {
  int64_t id = 0;
  int64_t time_ms = 0;
  std::string action;      // import, promote, rollback, remove, gc
  std::string model;       // "" for gc
  int version = 0;         // the version acted on (a channel's new target); 0 = none
  std::string channel;     // promote / rollback
  int previous_version = 0;  // promote / rollback: where the channel pointed before (0 = unset)
  std::string detail;
};

struct BlobProblem {
  std::string digest;
  std::string path;
  std::string problem;  // "missing" or "corrupted (hashes to ...)"
};

struct VerifyReport {
  int64_t blobs_checked = 0;
  int64_t bytes_checked = 0;
  std::vector<BlobProblem> problems;
  bool ok() const { return problems.empty(); }
};

struct GcReport {
  int64_t blobs_removed = 0;
  int64_t bytes_freed = 0;
  int64_t tmp_removed = 0;  // leftovers of interrupted imports
};

class ModelStore {
 public:
  static constexpr int kSchemaVersion = 1;

  // Creates ROOT, ROOT/blobs/sha256 and ROOT/store.db as needed, applies
  // migrations and removes tmp files left by interrupted imports (when no
  // import is running). Throws atelier::Error naming the path.
  static std::unique_ptr<ModelStore> open(const std::string& root);

  // `atelier models repair`: when ROOT/store.db is damaged (or empty or
  // missing beside blobs), moves it aside (store.db.damaged-<ms>), creates a
  // fresh one, copies every row still readable from the old file, then
  // records each blob no version references as a model "recovered-<12 hex>"
  // (blobs that are not model files, such as tokenizers, are left for gc).
  struct RepairReport {
    bool damaged = false;       // false: the database was fine; nothing was done
    std::string backup;         // the damaged file's new name ("" when there was none)
    int64_t rows = 0;           // rows salvaged from it
    int recovered_models = 0;   // blobs recorded as recovered-<digest> models
    int64_t unreferenced = 0;   // blobs left unreferenced (not model files)
  };
  static RepairReport repair(const std::string& root);
  ~ModelStore();
  ModelStore(const ModelStore&) = delete;
  ModelStore& operator=(const ModelStore&) = delete;

  const std::string& root() const { return root_; }
  std::string db_path() const { return root_ + "/store.db"; }
  std::string blob_path(const std::string& digest) const;
  int schema_version() const;

  // Stores FILES as a new version of NAME (created when new) and returns its
  // number. Every non-auxiliary file's header must parse; at least one must
  // be a model file; roles must be unique. Nothing is recorded when anything
  // fails (blobs already written are left for gc).
  int import(const std::vector<ImportFile>& files, const std::string& name, const ImportOptions& options = {});

  VersionInfo resolve(const std::string& ref) const;

  // Points CHANNEL of the model at the version REF names; returns its number.
  int promote(const std::string& ref, const std::string& channel);
  // Moves CHANNEL back to where it pointed before its last promotion (as the
  // audit log tells); returns that version, 0 when the channel is now unset.
  int rollback(const std::string& name, const std::string& channel);
  // Removes the version REF names (its blobs stay until gc). Refuses a version
  // a channel points at unless FORCE (which clears those channels).
  void remove(const std::string& ref, bool force = false);
  // Deletes blobs no version references, and tmp leftovers.
  GcReport gc();
  // Re-hashes the blobs of REF's version ("" = every referenced blob).
  VerifyReport verify(const std::string& ref = "",
                      const std::function<bool(int64_t bytes_done, int64_t bytes_total)>& on_progress = {}) const;

  std::vector<AuditRow> history(const std::string& name) const;
  std::vector<ModelInfo> list() const;

 private:
  explicit ModelStore(std::string root);
  // ALLOW_LOST_DB: open an empty or missing store.db beside blobs as new (repair only).
  static std::unique_ptr<ModelStore> open_store(const std::string& root, bool allow_lost_db);
  void migrate();

  std::string root_;
  sqlite3* db_ = nullptr;
  mutable std::mutex mu_;
};

}  // namespace atelier::store
