#include "store/store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "core/sqlite.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/pickle.h"
#include "formats/safetensors.h"
#include "formats/sniff.h"
#include "formats/tensor_types.h"
#include "store/blob_store.h"

namespace atelier::store {

namespace {

namespace fs = std::filesystem;

// Ordered migrations: entry i takes the schema from version i to i + 1. Never
// edit a shipped entry; append a new one and bump ModelStore::kSchemaVersion.
constexpr const char* kMigrations[] = {
    // 1: models, versions, files, channels, audit.
    R"sql(
CREATE TABLE models (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  name         TEXT    NOT NULL UNIQUE,
  kind         TEXT    NOT NULL CHECK (kind IN ('text', 'image')),
  architecture TEXT    NOT NULL DEFAULT '',
  licence      TEXT    NOT NULL DEFAULT '',
  description  TEXT    NOT NULL DEFAULT '',
  next_version INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE versions (
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  model_id          INTEGER NOT NULL REFERENCES models (id) ON DELETE CASCADE,
  number            INTEGER NOT NULL CHECK (number >= 1),
  label             TEXT    NOT NULL DEFAULT '',
  created_ms        INTEGER NOT NULL,
  notes             TEXT    NOT NULL DEFAULT '',
  format            TEXT    NOT NULL,
  architecture      TEXT    NOT NULL DEFAULT '',
  parameters        INTEGER NOT NULL DEFAULT 0,
  context_length    INTEGER NOT NULL DEFAULT 0,
  embedding_length  INTEGER NOT NULL DEFAULT 0,
  vocab_size        INTEGER NOT NULL DEFAULT 0,
  quantization      TEXT    NOT NULL DEFAULT '',
  native_resolution INTEGER NOT NULL DEFAULT 0,
  UNIQUE (model_id, number)
);
CREATE TABLE files (
  version_id INTEGER NOT NULL REFERENCES versions (id) ON DELETE CASCADE,
  role       TEXT    NOT NULL,
  digest     TEXT    NOT NULL,
  size       INTEGER NOT NULL,
  PRIMARY KEY (version_id, role)
);
CREATE INDEX files_digest ON files (digest);
CREATE TABLE channels (
  model_id   INTEGER NOT NULL REFERENCES models (id) ON DELETE CASCADE,
  name       TEXT    NOT NULL CHECK (name IN ('dev', 'stable', 'prod')),
  version_id INTEGER NOT NULL REFERENCES versions (id),
  PRIMARY KEY (model_id, name)
);
CREATE TABLE audit (
  id               INTEGER PRIMARY KEY AUTOINCREMENT,
  time_ms          INTEGER NOT NULL,
  action           TEXT    NOT NULL CHECK (action IN ('import', 'promote', 'rollback', 'remove', 'gc')),
  model            TEXT    NOT NULL DEFAULT '',
  version          INTEGER NOT NULL DEFAULT 0,
  channel          TEXT    NOT NULL DEFAULT '',
  previous_version INTEGER NOT NULL DEFAULT 0,
  detail           TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX audit_model ON audit (model, id);
)sql",
};
static_assert(std::size(kMigrations) == ModelStore::kSchemaVersion, "one migration per schema version");

constexpr int kBusyTimeoutMs = 10000;

constexpr char kNoun[] = "model store database";
using Stmt = sql::Stmt<kNoun>;
using Txn = sql::Txn<kNoun>;
void exec(sqlite3* db, const std::string& path, const char* sql) { sql::exec<kNoun>(db, path, sql); }
constexpr size_t kMinDigestPrefix = 12;

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}





// Read transactions: one consistent snapshot for multi-statement reads.
class ReadTxn {
 public:
  ReadTxn(sqlite3* db, const std::string& path) : db_(db) { exec(db, path, "BEGIN"); }
  ~ReadTxn() { sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr); }
  ReadTxn(const ReadTxn&) = delete;
  ReadTxn& operator=(const ReadTxn&) = delete;

 private:
  sqlite3* db_;
};

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 128) return false;
  if (n.rfind("sha256", 0) == 0) return false;
  // "..", "-" or "_" alone name nothing a person would recognise.
  if (!std::any_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; })) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

bool valid_channel(const std::string& c) { return c == "dev" || c == "stable" || c == "prod"; }

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) {
    if (!out.empty()) out += ",";
    out += x;
  }
  return out;
}

// ---- header inspection ---------------------------------------------------

HeaderFacts inspect_gguf(const std::string& path) {
  auto g = formats::GgufFile::open(path);
  HeaderFacts f;
  f.format = "gguf";
  f.kind = "text";
  f.architecture = g->get_string("general.architecture", "");
  std::set<std::string> types;
  for (const auto& t : g->tensors()) {
    f.parameters += t.elements();
    types.insert(std::string(kernels::dtype_name(t.type)));
  }
  f.quantization = join(types);
  if (!f.architecture.empty()) {
    f.context_length = g->get_int(f.architecture + ".context_length", 0);
    f.embedding_length = g->get_int(f.architecture + ".embedding_length", 0);
    f.vocab_size = g->get_int(f.architecture + ".vocab_size", 0);
  }
  if (f.vocab_size == 0) {
    if (const auto* v = g->find("tokenizer.ggml.tokens")) {
      if (const auto* a = std::get_if<std::vector<std::string>>(&v->value)) f.vocab_size = static_cast<int64_t>(a->size());
    }
  }
  return f;
}

// An image checkpoint's architecture from its tensor names where its
// metadata names none (the files A1111 and ComfyUI load carry no such key):
// "sdxl" (its conditioner or label embedding), "sd2" (the OpenCLIP text
// encoder, or a 1024-wide cross-attention), "sd1" (a UNet laid out as SD's
// otherwise), or "". Names may sit under a prefix (a .ckpt's state_dict).
template <class Tensors>
std::string image_architecture(const Tensors& tensors) {
  bool unet = false, xl = false, open_clip = false;
  int64_t context = 0;
  auto has = [](const std::string& name, const char* part) { return name.find(part) != std::string::npos; };
  for (const auto& t : tensors) {
    unet = unet || has(t.name, "model.diffusion_model.input_blocks.0.0.weight");
    xl = xl || has(t.name, "conditioner.embedders.") || has(t.name, "model.diffusion_model.label_emb.");
    open_clip = open_clip || has(t.name, "cond_stage_model.model.transformer.");
    if (has(t.name, "model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_k.weight") && t.shape.size() == 2)
      context = t.shape[1];
  }
  if (xl) return "sdxl";
  if (!unet) return "";
  return open_clip || context == 1024 ? "sd2" : "sd1";
}

HeaderFacts inspect_safetensors(const std::string& path) {
  auto s = formats::SafetensorsFile::open(path);
  HeaderFacts f;
  f.format = "safetensors";
  f.kind = "image";
  const auto& md = s->metadata();
  if (auto it = md.find("architecture"); it != md.end()) f.architecture = it->second;
  if (f.architecture.empty()) f.architecture = image_architecture(s->tensors());
  for (const char* key : {"native_resolution", "resolution"}) {
    if (auto it = md.find(key); it != md.end() && f.native_resolution == 0) {
      try {
        f.native_resolution = std::stoll(it->second);
      } catch (const std::exception&) {
      }
    }
  }
  std::set<std::string> types;
  for (const auto& t : s->tensors()) {
    f.parameters += t.elements();
    types.insert(std::string(formats::elem_name(t.dtype)));
  }
  f.quantization = join(types);
  return f;
}

HeaderFacts inspect_pytorch(const std::string& path) {
  auto c = formats::TorchCheckpoint::open(path);
  HeaderFacts f;
  f.format = "pytorch";
  f.kind = "image";
  f.architecture = image_architecture(c->tensors());
  std::set<std::string> types;
  for (const auto& t : c->tensors()) {
    f.parameters += t.elements();
    types.insert(std::string(formats::elem_name(t.dtype)));
  }
  f.quantization = join(types);
  return f;
}

HeaderFacts inspect_llama2c(const std::string& path) {
  const formats::Llama2cModel m = formats::load_llama2c(path);
  const auto& c = m.config;
  HeaderFacts f;
  f.format = "llama2c";
  f.kind = "text";
  f.architecture = "llama";
  const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, vocab = c.vocab_size;
  const int64_t kv_dim = c.n_heads > 0 ? dim * c.n_kv_heads / c.n_heads : 0;
  f.parameters = vocab * dim + layers * (2 * dim + 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden) + dim +
                 (c.shared_classifier ? 0 : vocab * dim);
  f.context_length = c.seq_len;
  f.embedding_length = dim;
  f.vocab_size = vocab;
  f.quantization = "f32";
  return f;
}

}  // namespace

HeaderFacts inspect_header(const std::string& path) {
  // What the file is comes from its bytes (formats/sniff.h): import paths and blobs alike.
  const formats::Sniffed kind = formats::sniff_model_file(path);
  if (kind.kind == formats::FileKind::missing) {
    // A folder or FIFO where a file goes is bad usage (exit 2); a missing file is not found.
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
      throw InvalidArgumentError(path + " is not a regular file (a folder, FIFO or device): import a model file");
    throw NotFoundError(path + ": no such file");
  }
  if (kind.io) throw IoError(path + ": cannot read its header: " + kind.detail);
  try {
    switch (kind.kind) {
      case formats::FileKind::gguf: return inspect_gguf(path);
      case formats::FileKind::pytorch_zip: return inspect_pytorch(path);
      case formats::FileKind::safetensors: return inspect_safetensors(path);
      case formats::FileKind::llama2c: return inspect_llama2c(path);
      default: break;
    }
  } catch (const Error& e) {
    throw Error(e.code(), std::string("refusing ") + path + ": its header does not parse: " + e.what());
  }
  const std::string what = kind.kind == formats::FileKind::unknown
                               ? kind.detail
                               : path + " is a " + formats::file_kind_name(kind.kind) + " file";
  throw Error("refusing " + path +
              ": not a model file this store knows (GGUF, safetensors, PyTorch .pth, llama2.c .bin); "
              "import model files, or give auxiliary files a role such as \"tokenizer\" (" + what + ")");
}

bool is_auxiliary_role(const std::string& role) {
  return role == "tokenizer" || role == "vocab" || role == "config" || role == "readme" || role == "licence";
}

const FileEntry& VersionInfo::primary() const {
  for (const auto& f : files)
    if (f.role == "model") return f;
  if (files.empty()) throw IoError("model " + model + "@" + std::to_string(number) + " has no files");
  return files.front();
}

// ---- ModelStore ----------------------------------------------------------

namespace {

struct Ref {
  enum Kind { kName, kVersion, kChannel, kDigest } kind = kName;
  std::string name;
  int version = 0;
  std::string channel;
  std::string digest;  // full or prefix
};

Ref parse_ref(const std::string& ref) {
  Ref r;
  if (ref.rfind("synth:", 0) == 0)  // atelier/models.h SynthModelRef
    throw InvalidArgumentError("\"" + ref +
                               "\" is a synthetic model, made on the device when a job loads it: the store holds no "
                               "version of it to show, verify, promote or remove. Use it directly (-m " + ref +
                               "), or write it as a file with `atelier models synth` and import that");
  if (ref.rfind("sha256:", 0) == 0) {
    r.kind = Ref::kDigest;
    r.digest = ref.substr(7);
    for (char& ch : r.digest) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const bool hex = std::all_of(r.digest.begin(), r.digest.end(),
                                 [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
    if (!hex || r.digest.size() < kMinDigestPrefix || r.digest.size() > 64)
      throw InvalidArgumentError("bad model reference \"" + ref + "\": after sha256: give the digest's hex digits (at least " +
                  std::to_string(kMinDigestPrefix) + ", at most 64)");
    return r;
  }
  if (const auto at = ref.find('@'); at != std::string::npos) {
    r.kind = Ref::kVersion;
    r.name = ref.substr(0, at);
    const std::string num = ref.substr(at + 1);
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (num.empty() || used != num.size() || v < 1 || v > 1000000000 || !std::isdigit(static_cast<unsigned char>(num[0])))
      throw InvalidArgumentError("bad model reference \"" + ref + "\": after @ give a version number (1, 2, ...)");
    r.version = static_cast<int>(v);
  } else if (const auto colon = ref.find(':'); colon != std::string::npos) {
    r.kind = Ref::kChannel;
    r.name = ref.substr(0, colon);
    r.channel = ref.substr(colon + 1);
    if (!valid_channel(r.channel))
      throw InvalidArgumentError("bad model reference \"" + ref + "\": unknown channel \"" + r.channel +
                  "\"; channels are dev, stable and prod");
  } else {
    r.name = ref;
  }
  if (!valid_name(r.name))
    throw InvalidArgumentError("bad model reference \"" + ref +
                "\": use NAME, NAME@VERSION, NAME:CHANNEL or sha256:DIGEST (names use letters, digits, '.', '_', '-')");
  return r;
}

constexpr const char* kVersionColumns =
    "v.id, m.name, m.kind, v.number, v.label, v.created_ms, v.notes, v.format, v.architecture, v.parameters, "
    "v.context_length, v.embedding_length, v.vocab_size, v.quantization, v.native_resolution";

VersionInfo read_version(const Stmt& s) {
  VersionInfo v;
  v.model = s.col_text(1);
  v.kind = s.col_text(2);
  v.number = static_cast<int>(s.col_i64(3));
  v.label = s.col_text(4);
  v.created_ms = s.col_i64(5);
  v.notes = s.col_text(6);
  v.format = s.col_text(7);
  v.architecture = s.col_text(8);
  v.parameters = s.col_i64(9);
  v.context_length = s.col_i64(10);
  v.embedding_length = s.col_i64(11);
  v.vocab_size = s.col_i64(12);
  v.quantization = s.col_text(13);
  v.native_resolution = s.col_i64(14);
  return v;
}

}  // namespace

// Everything below runs with mu_ held; these helpers take what they need.
struct StoreSql {
  sqlite3* db;
  const std::string& path;
  const BlobStore& blobs;

  int64_t model_id(const std::string& name) const {
    Stmt s(db, path, "SELECT id FROM models WHERE name = ?1");
    s.text(1, name);
    if (!s.step()) throw NotFoundError("no model named \"" + name + "\" in the store " + blobs.root() + "; see `atelier models list`");
    return s.col_i64(0);
  }

  // The version row id REF names.
  int64_t version_id(const std::string& ref_text) const {
    const Ref r = parse_ref(ref_text);
    if (r.kind == Ref::kDigest) {
      Stmt s(db, path, "SELECT DISTINCT digest FROM files WHERE substr(digest, 1, ?2) = ?1 LIMIT 3");
      s.text(1, r.digest).i64(2, static_cast<int64_t>(r.digest.size()));
      std::vector<std::string> found;
      while (s.step()) found.push_back(s.col_text(0));
      if (found.empty())
        throw NotFoundError("no model version holds a blob sha256:" + r.digest + " in the store " + blobs.root());
      if (found.size() > 1)
        throw NotFoundError("sha256:" + r.digest + " is ambiguous (matches " + found[0] + ", " + found[1] +
                    (found.size() > 2 ? ", ..." : "") + "); give more digits");
      Stmt v(db, path, "SELECT max(version_id) FROM files WHERE digest = ?1");
      v.text(1, found[0]);
      v.step();
      return v.col_i64(0);
    }
    const int64_t mid = model_id(r.name);
    if (r.kind == Ref::kVersion) {
      Stmt s(db, path, "SELECT id FROM versions WHERE model_id = ?1 AND number = ?2");
      s.i64(1, mid).i64(2, r.version);
      if (!s.step())
        throw NotFoundError("model \"" + r.name + "\" has no version " + std::to_string(r.version) + " (versions: " +
                    numbers(mid) + ")");
      return s.col_i64(0);
    }
    if (r.kind == Ref::kChannel) {
      Stmt s(db, path, "SELECT version_id FROM channels WHERE model_id = ?1 AND name = ?2");
      s.i64(1, mid).text(2, r.channel);
      if (!s.step())
        throw NotFoundError("channel " + r.channel + " of model \"" + r.name + "\" points at no version; use `atelier models promote " +
                    r.name + "@N " + r.channel + "`");
      return s.col_i64(0);
    }
    for (const char* ch : {"prod", "stable"}) {
      Stmt s(db, path, "SELECT version_id FROM channels WHERE model_id = ?1 AND name = ?2");
      s.i64(1, mid).text(2, ch);
      if (s.step()) return s.col_i64(0);
    }
    Stmt s(db, path, "SELECT id FROM versions WHERE model_id = ?1 ORDER BY number DESC LIMIT 1");
    s.i64(1, mid);
    if (!s.step()) throw NotFoundError("model \"" + r.name + "\" has no versions; import one");
    return s.col_i64(0);
  }

  std::string numbers(int64_t mid) const {
    Stmt s(db, path, "SELECT number FROM versions WHERE model_id = ?1 ORDER BY number");
    s.i64(1, mid);
    std::string out;
    while (s.step()) out += (out.empty() ? "" : ", ") + std::to_string(s.col_i64(0));
    return out.empty() ? "none" : out;
  }

  VersionInfo version(int64_t vid) const {
    Stmt s(db, path,
           std::string("SELECT ") + kVersionColumns + " FROM versions v JOIN models m ON m.id = v.model_id WHERE v.id = ?1");
    s.i64(1, vid);
    if (!s.step()) throw IoError("model store " + blobs.root() + ": version row " + std::to_string(vid) + " vanished");
    VersionInfo v = read_version(s);
    fill(vid, v);
    return v;
  }

  void fill(int64_t vid, VersionInfo& v) const {
    Stmt f(db, path, "SELECT role, digest, size FROM files WHERE version_id = ?1 ORDER BY role");
    f.i64(1, vid);
    while (f.step()) {
      FileEntry e;
      e.role = f.col_text(0);
      e.digest = f.col_text(1);
      e.size = f.col_i64(2);
      e.blob_path = blobs.path(e.digest);
      v.files.push_back(std::move(e));
    }
    Stmt c(db, path, "SELECT name FROM channels WHERE version_id = ?1 ORDER BY name");
    c.i64(1, vid);
    while (c.step()) v.channels.push_back(c.col_text(0));
  }

  void audit(const std::string& action, const std::string& model, int version, const std::string& channel,
             int previous, const std::string& detail) const {
    Stmt s(db, path,
           "INSERT INTO audit (time_ms, action, model, version, channel, previous_version, detail) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
    s.i64(1, now_ms()).text(2, action).text(3, model).i64(4, version).text(5, channel).i64(6, previous);
    s.text(7, detail).run();
  }
};

ModelStore::ModelStore(std::string root) : root_(std::move(root)) {}

ModelStore::~ModelStore() {
  sql::close(db_);  // not sqlite3_close_v2: see sql::open_without_shm
}

std::string ModelStore::blob_path(const std::string& digest) const { return root_ + "/blobs/sha256/" + digest; }

std::unique_ptr<ModelStore> ModelStore::open(const std::string& root) { return open_store(root, false); }

ModelStore::RepairReport ModelStore::repair(const std::string& root) {
  RepairReport r;
  try {
    open_store(root, false);
    return r;
  } catch (const DamagedError&) {
  }
  r.damaged = true;
  const std::string db = root + "/store.db";
  std::error_code ec;
  if (fs::exists(db, ec)) r.backup = sql::set_aside(db);
  auto st = open_store(root, true);
  if (!r.backup.empty()) {
    std::lock_guard lock(st->mu_);
    r.rows = sql::salvage_rows(st->db_, r.backup, {"models", "versions", "files", "channels", "audit"});
  }
  // Blobs the salvaged rows do not reach: recorded as models of their own, so nothing is lost to gc.
  std::set<std::string> referenced;
  {
    std::lock_guard lock(st->mu_);
    Stmt q(st->db_, st->db_path(), "SELECT DISTINCT digest FROM files");
    while (q.step()) referenced.insert(q.col_text(0));
  }
  BlobStore blobs(root);
  for (const std::string& digest : blobs.list()) {
    if (referenced.count(digest)) continue;
    ImportOptions o;
    o.label = "recovered";
    o.notes = "recovered by `atelier models repair` from blob sha256:" + digest + " (its name and history were lost)";
    try {
      st->import({{st->blob_path(digest), "model"}}, "recovered-" + digest.substr(0, 12), o);
      ++r.recovered_models;
    } catch (const Error&) {
      ++r.unreferenced;  // not a model file on its own (a tokenizer, a VAE, ...)
    }
  }
  return r;
}

std::unique_ptr<ModelStore> ModelStore::open_store(const std::string& root, bool allow_lost_db) {
  if (root.empty()) throw IoError("model store: no folder given; set ATELIER_HOME or pass --store DIR");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw IoError("model store " + root + ": cannot create the folder: " + ec.message());
  std::unique_ptr<ModelStore> st(new ModelStore(root));
  BlobStore blobs(root);
  const std::string path = st->db_path();
  // An empty or missing database beside blobs is a lost database, not a new
  // store: opening it as new would orphan every model silently.
  std::error_code se;
  const bool fresh = !fs::exists(path, se) || fs::file_size(path, se) == 0;
  if (fresh && !allow_lost_db && !fs::exists(path + "-wal", se)) {
    const size_t n = blobs.list().size();
    if (n > 0)
      throw DamagedError("model store database " + path + " is " + (fs::exists(path, se) ? "empty" : "missing") + " but " +
                         std::to_string(n) + " model file(s) are in " + root + "/blobs/sha256; run `atelier models repair --store " +
                         root + "` to rebuild it from them");
  }
  sql::open_wal<kNoun>(path, kBusyTimeoutMs, "put the store on a local file system", &st->db_,
                       "run `atelier models repair --store " + root +
                           "` to rebuild it from what is readable and from the blobs (the damaged file is kept beside it)");
  st->migrate();
  // Leftovers of interrupted imports; skipped while another import runs.
  BlobStore::Lock lock(root, BlobStore::Lock::kTryExclusive);
  if (lock.held()) blobs.remove_tmp();
  return st;
}

void ModelStore::migrate() {
  std::lock_guard lock(mu_);
  sql::migrate<kNoun>(db_, db_path(), kMigrations, kSchemaVersion, "an Atelier model store", "another store");
}

int ModelStore::schema_version() const {
  std::lock_guard lock(mu_);
  Stmt s(db_, db_path(), "SELECT value FROM meta WHERE key = 'schema_version'");
  return s.step() ? std::stoi(s.col_text(0)) : 0;
}

int ModelStore::import(const std::vector<ImportFile>& files, const std::string& name, const ImportOptions& options) {
  if (!valid_name(name))
    throw InvalidArgumentError("bad model name \"" + name + "\": use letters, digits, '.', '_' and '-' (not starting with sha256)");
  if (name == "synth")  // "synth:..." names a synthetic model (atelier/models.h), never a channel of a store model
    throw InvalidArgumentError("the model name \"synth\" is reserved for synthetic models (synth:PARAMS[:TYPE][:seed=N]); choose another name");
  if (files.empty()) throw InvalidArgumentError("import of \"" + name + "\": no files given");
  if (!options.kind.empty() && options.kind != "text" && options.kind != "image")
    throw InvalidArgumentError("import of \"" + name + "\": kind must be text or image, not \"" + options.kind + "\"");

  // Check every header before anything is written.
  std::set<std::string> roles;
  const HeaderFacts* primary = nullptr;
  std::vector<HeaderFacts> facts(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    if (f.role.empty() || !valid_name(f.role))
      throw InvalidArgumentError("import of \"" + name + "\": bad role \"" + f.role + "\" for " + f.path);
    if (!roles.insert(f.role).second)
      throw InvalidArgumentError("import of \"" + name + "\": role \"" + f.role + "\" given twice; each file needs its own role");
    if (is_auxiliary_role(f.role)) {
      std::error_code ec;
      if (!fs::is_regular_file(f.path, ec) || fs::file_size(f.path, ec) == 0)
        throw Error(fs::exists(f.path, ec) ? StatusCode::Io : StatusCode::NotFound,
                    "import of \"" + name + "\": " + f.path + " (" + f.role + ") is missing, empty or not a file");
      continue;
    }
    facts[i] = inspect_header(f.path);
    if (!primary || f.role == "model") primary = &facts[i];
  }
  if (!primary)
    throw IoError("import of \"" + name + "\": no model file among the files given (only auxiliary roles such as " +
                *roles.begin() + "); give the model file the role \"model\"");

  std::lock_guard lock(mu_);
  const std::string path = db_path();
  BlobStore blobs(root_);
  BlobStore::Lock flock(root_, BlobStore::Lock::kShared);  // keeps gc away until the commit
  std::vector<BlobStore::Stored> stored;
  int64_t bytes_total = 0, bytes_before = 0;
  if (options.on_progress) {
    std::error_code ec;
    for (const auto& f : files) bytes_total += static_cast<int64_t>(fs::file_size(f.path, ec));
  }
  for (const auto& f : files) {
    std::function<bool(int64_t)> on_bytes;
    if (options.on_progress)
      on_bytes = [&](int64_t done) { return options.on_progress(bytes_before + done, bytes_total); };
    stored.push_back(blobs.put(f.path, options.after_hash, on_bytes));
    bytes_before += stored.back().size;
    if (!f.expected_sha256.empty() && stored.back().digest != f.expected_sha256)
      throw Error("refusing " + f.path + ": its sha256 is " + stored.back().digest + ", not " + f.expected_sha256 +
                  " as expected; nothing was recorded (the file is damaged or not the one the catalog names)");
  }

  Txn txn(db_, path);
  StoreSql sql{db_, path, blobs};
  int64_t mid = 0;
  std::string kind;
  {
    Stmt s(db_, path, "SELECT id, kind FROM models WHERE name = ?1");
    s.text(1, name);
    if (s.step()) {
      mid = s.col_i64(0);
      kind = s.col_text(1);
    }
  }
  if (mid == 0) {
    kind = options.kind.empty() ? primary->kind : options.kind;
    Stmt s(db_, path, "INSERT INTO models (name, kind, architecture, licence, description) VALUES (?1, ?2, ?3, ?4, ?5)");
    s.text(1, name).text(2, kind).text(3, primary->architecture).text(4, options.licence).text(5, options.description);
    s.run();
    mid = sqlite3_last_insert_rowid(db_);
  } else {
    if (!options.kind.empty() && options.kind != kind)
      throw InvalidArgumentError("import of \"" + name + "\": the model is a " + kind + " model; a " + options.kind +
                  " version cannot be added (choose another name)");
    Stmt s(db_, path,
           "UPDATE models SET licence = CASE WHEN ?2 = '' THEN licence ELSE ?2 END, "
           "description = CASE WHEN ?3 = '' THEN description ELSE ?3 END, "
           "architecture = CASE WHEN architecture = '' THEN ?4 ELSE architecture END WHERE id = ?1");
    s.i64(1, mid).text(2, options.licence).text(3, options.description).text(4, primary->architecture).run();
  }
  int number = 0;
  {
    Stmt s(db_, path, "SELECT next_version FROM models WHERE id = ?1");
    s.i64(1, mid);
    s.step();
    number = static_cast<int>(s.col_i64(0));
    Stmt u(db_, path, "UPDATE models SET next_version = next_version + 1 WHERE id = ?1");
    u.i64(1, mid).run();
  }
  Stmt v(db_, path,
         "INSERT INTO versions (model_id, number, label, created_ms, notes, format, architecture, parameters, "
         "context_length, embedding_length, vocab_size, quantization, native_resolution) "
         "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)");
  v.i64(1, mid).i64(2, number).text(3, options.label).i64(4, now_ms()).text(5, options.notes);
  v.text(6, primary->format).text(7, primary->architecture).i64(8, primary->parameters);
  v.i64(9, primary->context_length).i64(10, primary->embedding_length).i64(11, primary->vocab_size);
  v.text(12, primary->quantization).i64(13, primary->native_resolution).run();
  const int64_t vid = sqlite3_last_insert_rowid(db_);
  std::string detail;
  for (size_t i = 0; i < files.size(); ++i) {
    Stmt s(db_, path, "INSERT INTO files (version_id, role, digest, size) VALUES (?1, ?2, ?3, ?4)");
    s.i64(1, vid).text(2, files[i].role).text(3, stored[i].digest).i64(4, stored[i].size).run();
    detail += (detail.empty() ? "" : " ") + files[i].role + "=sha256:" + stored[i].digest;
  }
  sql.audit("import", name, number, "", 0, detail);
  txn.commit();
  return number;
}

VersionInfo ModelStore::resolve(const std::string& ref) const {
  std::lock_guard lock(mu_);
  const std::string path = db_path();
  BlobStore blobs(root_);
  StoreSql sql{db_, path, blobs};
  ReadTxn txn(db_, path);
  return sql.version(sql.version_id(ref));
}

int ModelStore::promote(const std::string& ref, const std::string& channel) {
  if (!valid_channel(channel)) throw InvalidArgumentError("unknown channel \"" + channel + "\"; channels are dev, stable and prod");
  std::lock_guard lock(mu_);
  const std::string path = db_path();
  BlobStore blobs(root_);
  StoreSql sql{db_, path, blobs};
  Txn txn(db_, path);
  const int64_t vid = sql.version_id(ref);
  const VersionInfo v = sql.version(vid);
  const int64_t mid = sql.model_id(v.model);
  int previous = 0;
  {
    Stmt s(db_, path,
           "SELECT v.number FROM channels c JOIN versions v ON v.id = c.version_id WHERE c.model_id = ?1 AND c.name = ?2");
    s.i64(1, mid).text(2, channel);
    if (s.step()) previous = static_cast<int>(s.col_i64(0));
  }
  Stmt s(db_, path,
         "INSERT INTO channels (model_id, name, version_id) VALUES (?1, ?2, ?3) "
         "ON CONFLICT (model_id, name) DO UPDATE SET version_id = excluded.version_id");
  s.i64(1, mid).text(2, channel).i64(3, vid).run();
  sql.audit("promote", v.model, v.number, channel, previous, "from " + ref);
  txn.commit();
  return v.number;
}

int ModelStore::rollback(const std::string& name, const std::string& channel) {
  if (!valid_channel(channel)) throw InvalidArgumentError("unknown channel \"" + channel + "\"; channels are dev, stable and prod");
  std::lock_guard lock(mu_);
  const std::string path = db_path();
  BlobStore blobs(root_);
  StoreSql sql{db_, path, blobs};
  Txn txn(db_, path);
  const int64_t mid = sql.model_id(name);
  int current = 0;
  {
    Stmt s(db_, path,
           "SELECT v.number FROM channels c JOIN versions v ON v.id = c.version_id WHERE c.model_id = ?1 AND c.name = ?2");
    s.i64(1, mid).text(2, channel);
    if (s.step()) current = static_cast<int>(s.col_i64(0));
  }
  if (current == 0) throw NotFoundError("channel " + channel + " of model \"" + name + "\" points at no version; nothing to roll back");
  // Replay the channel's promotions (push the previous target) and rollbacks
  // (pop) from the audit log; the top is where the channel pointed before.
  std::vector<int> stack;
  {
    Stmt s(db_, path,
           "SELECT action, previous_version FROM audit WHERE model = ?1 AND channel = ?2 "
           "AND action IN ('promote', 'rollback') ORDER BY id");
    s.text(1, name).text(2, channel);
    while (s.step()) {
      if (s.col_text(0) == "promote") {
        stack.push_back(static_cast<int>(s.col_i64(1)));
      } else if (!stack.empty()) {
        stack.pop_back();
      }
    }
  }
  if (stack.empty())
    throw NotFoundError("channel " + channel + " of model \"" + name + "\" has no earlier version to roll back to");
  const int target = stack.back();
  if (target == 0) {
    Stmt d(db_, path, "DELETE FROM channels WHERE model_id = ?1 AND name = ?2");
    d.i64(1, mid).text(2, channel).run();
  } else {
    Stmt q(db_, path, "SELECT id FROM versions WHERE model_id = ?1 AND number = ?2");
    q.i64(1, mid).i64(2, target);
    if (!q.step())
      throw IoError("cannot roll back channel " + channel + " of model \"" + name + "\": the version it pointed at before (" +
                  std::to_string(target) + ") was removed; promote another version instead");
    Stmt u(db_, path, "UPDATE channels SET version_id = ?3 WHERE model_id = ?1 AND name = ?2");
    u.i64(1, mid).text(2, channel).i64(3, q.col_i64(0)).run();
  }
  sql.audit("rollback", name, target, channel, current, target == 0 ? "channel unset" : "");
  txn.commit();
  return target;
}

void ModelStore::remove(const std::string& ref, bool force) {
  std::lock_guard lock(mu_);
  const std::string path = db_path();
  BlobStore blobs(root_);
  StoreSql sql{db_, path, blobs};
  Txn txn(db_, path);
  const int64_t vid = sql.version_id(ref);
  const VersionInfo v = sql.version(vid);
  if (!v.channels.empty() && !force) {
    std::string chans;
    for (const auto& c : v.channels) chans += (chans.empty() ? "" : ", ") + c;
    throw Error("refusing to remove " + v.model + "@" + std::to_string(v.number) + ": channel(s) " + chans +
                " point at it; promote another version first, or force the removal");
  }
  {
    Stmt s(db_, path, "DELETE FROM channels WHERE version_id = ?1");
    s.i64(1, vid).run();
  }
  {
    Stmt s(db_, path, "DELETE FROM versions WHERE id = ?1");
    s.i64(1, vid).run();
  }
  std::string detail;
  if (!v.channels.empty()) {
    detail = "forced; cleared channels";
    for (const auto& c : v.channels) detail += " " + c;
  }
  sql.audit("remove", v.model, v.number, "", 0, detail);
  txn.commit();
}

GcReport ModelStore::gc() {
  std::lock_guard lock(mu_);
  const std::string path = db_path();
  BlobStore blobs(root_);
  StoreSql sql{db_, path, blobs};
  BlobStore::Lock flock(root_, BlobStore::Lock::kExclusive);  // no import is between rename and commit
  GcReport report;
  report.tmp_removed = blobs.remove_tmp();
  // The write transaction keeps a new reference from appearing meanwhile
  // (imports also wait on the flock, so none is in flight).
  Txn txn(db_, path);
  std::set<std::string> referenced;
  {
    Stmt s(db_, path, "SELECT DISTINCT digest FROM files");
    while (s.step()) referenced.insert(s.col_text(0));
  }
  for (const auto& d : blobs.list()) {
    if (referenced.count(d)) continue;
    const std::string p = blobs.path(d);
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (::unlink(p.c_str()) != 0)
      throw IoError("model store " + root_ + ": cannot delete the unused blob " + p + ": " + std::strerror(errno));
    ++report.blobs_removed;
    if (!ec) report.bytes_freed += static_cast<int64_t>(size);
  }
  sql.audit("gc", "", 0, "", 0,
            std::to_string(report.blobs_removed) + " blobs, " + std::to_string(report.bytes_freed) + " bytes freed");
  txn.commit();
  return report;
}

VerifyReport ModelStore::verify(const std::string& ref,
                                const std::function<bool(int64_t bytes_done, int64_t bytes_total)>& on_progress) const {
  std::vector<std::string> digests;
  {
    std::lock_guard lock(mu_);
    const std::string path = db_path();
    BlobStore blobs(root_);
    StoreSql sql{db_, path, blobs};
    ReadTxn txn(db_, path);
    if (ref.empty()) {
      Stmt s(db_, path, "SELECT DISTINCT digest FROM files ORDER BY digest");
      while (s.step()) digests.push_back(s.col_text(0));
    } else {
      for (const auto& f : sql.version(sql.version_id(ref)).files) digests.push_back(f.digest);
    }
  }
  // Hashing runs without the lock; blobs are immutable once named.
  VerifyReport report;
  int64_t bytes_total = 0, bytes_before = 0;
  if (on_progress) {
    std::error_code ec;
    for (const auto& d : digests) {
      const auto n = fs::file_size(blob_path(d), ec);
      if (!ec) bytes_total += static_cast<int64_t>(n);
    }
  }
  for (const auto& d : digests) {
    const std::string p = blob_path(d);
    std::error_code ec;
    std::function<bool(int64_t)> on_bytes;
    if (on_progress) on_bytes = [&](int64_t done) { return on_progress(bytes_before + done, bytes_total); };
    if (!fs::exists(p, ec)) {
      report.problems.push_back({d, p, "missing"});
      continue;
    }
    int64_t size = 0;
    std::string got;
    try {
      got = sha256_file(p, &size, on_bytes);
    } catch (const Error& e) {
      if (e.code() == StatusCode::Cancelled) throw;
      report.problems.push_back({d, p, std::string("unreadable: ") + e.what()});
      continue;
    }
    ++report.blobs_checked;
    report.bytes_checked += size;
    bytes_before += size;
    if (got != d) report.problems.push_back({d, p, "corrupted (hashes to " + got + "); re-import or pull the model again"});
  }
  return report;
}

std::vector<AuditRow> ModelStore::history(const std::string& name) const {
  std::lock_guard lock(mu_);
  const std::string path = db_path();
  Stmt s(db_, path,
         "SELECT id, time_ms, action, model, version, channel, previous_version, detail FROM audit "
         "WHERE model = ?1 ORDER BY id");
  s.text(1, name);
  std::vector<AuditRow> rows;
  while (s.step()) {
    AuditRow r;
    r.id = s.col_i64(0);
    r.time_ms = s.col_i64(1);
    r.action = s.col_text(2);
    r.model = s.col_text(3);
    r.version = static_cast<int>(s.col_i64(4));
    r.channel = s.col_text(5);
    r.previous_version = static_cast<int>(s.col_i64(6));
    r.detail = s.col_text(7);
    rows.push_back(std::move(r));
  }
  if (rows.empty()) {
    Stmt m(db_, path, "SELECT 1 FROM models WHERE name = ?1");
    m.text(1, name);
    if (!m.step()) throw NotFoundError("no model named \"" + name + "\" in the store " + root_ + "; see `atelier models list`");
  }
  return rows;
}

std::vector<ModelInfo> ModelStore::list() const {
  std::lock_guard lock(mu_);
  const std::string path = db_path();
  BlobStore blobs(root_);
  StoreSql sql{db_, path, blobs};
  ReadTxn txn(db_, path);
  std::vector<ModelInfo> out;
  Stmt m(db_, path, "SELECT id, name, kind, architecture, licence, description FROM models ORDER BY name");
  while (m.step()) {
    ModelInfo info;
    const int64_t mid = m.col_i64(0);
    info.name = m.col_text(1);
    info.kind = m.col_text(2);
    info.architecture = m.col_text(3);
    info.licence = m.col_text(4);
    info.description = m.col_text(5);
    Stmt v(db_, path,
           std::string("SELECT ") + kVersionColumns +
               " FROM versions v JOIN models m ON m.id = v.model_id WHERE v.model_id = ?1 ORDER BY v.number");
    v.i64(1, mid);
    while (v.step()) {
      VersionInfo vi = read_version(v);
      sql.fill(v.col_i64(0), vi);
      for (const auto& c : vi.channels) info.channels[c] = vi.number;
      info.versions.push_back(std::move(vi));
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace atelier::store
