// Who may call the server and which files a call may name: the Host header
// (DNS rebinding), a JSON body's Content-Type (cross-site "simple" requests),
// the API key compared in constant time, and the folders a client may name
// files in (the models the user shared, the output folder).
#include <atelier/models.h>
#include <atelier/store.h>

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "server/context.h"

namespace atelier::server {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

ApiError forbidden(const std::string& field, const std::string& message) {
  return ApiError(403, message, field, "invalid_request_error", "path_not_allowed");
}

fs::path normal(const fs::path& p) {
  fs::path n = fs::absolute(p).lexically_normal();
  if (n.has_filename() || n == n.root_path()) return n;
  return n.parent_path();  // "/a/b/" -> "/a/b"
}

bool inside(const fs::path& p, const fs::path& root) {
  const fs::path rel = p.lexically_relative(root);
  return !rel.empty() && *rel.begin() != ".." && rel != ".";
}

// The folders a model file may be named in: --models-dir, and the store's
// blobs (the paths /props and /sdapi/v1/sd-models show). Each as written and
// as its links resolve, so either spelling of a path matches.
std::vector<fs::path> model_roots(const ApiServerOptions& o) {
  std::vector<std::string> dirs = o.models_dirs;
  dirs.push_back((fs::path(o.store_dir.empty() ? default_store_dir() : o.store_dir) / "blobs").string());
  std::vector<fs::path> roots;
  for (const auto& d : dirs) {
    if (d.empty()) continue;
    roots.push_back(normal(d));
    std::error_code ec;
    if (fs::path c = fs::weakly_canonical(d, ec); !ec && c != roots.back()) roots.push_back(normal(c));
  }
  return roots;
}

void check_plain(const std::string& field, const std::string& value) {
  if (value.find('\0') != std::string::npos) throw bad_field(field, "holds a NUL byte");
}

std::string shared_path(const Context& ctx, const std::string& field, const std::string& value) {
  const fs::path p(value);
  const std::string allow = "pass --models-dir FOLDER to `atelier serve` to let clients name model files under FOLDER";
  for (const auto& part : p)
    if (part == "..")
      throw forbidden(field, "'" + field + "' may not leave a folder (a \"..\" part): name a store model (GET /v1/models) or a "
                             "file under a --models-dir folder by a path without \"..\"");
  if (p.is_absolute()) {
    const fs::path n = normal(p);
    for (const auto& root : model_roots(ctx.options))
      if (inside(n, root)) return n.string();
    throw forbidden(field, "'" + field + "' names a file outside the folders this server shares: name a store model "
                           "(GET /v1/models), or " + allow);
  }
  // Relative: under the first --models-dir that has it (or the first one, for the 404).
  if (ctx.options.models_dirs.empty())
    throw forbidden(field, "'" + field + "' names a file by a relative path, and this server shares no model folder: " + allow +
                               " (a relative path is looked up there)");
  std::string first;
  for (const auto& dir : ctx.options.models_dirs) {
    const fs::path candidate = normal(fs::path(dir) / p);
    if (first.empty()) first = candidate.string();
    std::error_code ec;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  return first;
}

// The file names the engine writes for COUNT images (numbered_output_path).
void check_new_file(const std::string& field, const std::string& path, const std::string& shown) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISLNK(st.st_mode))
    throw forbidden(field, "'" + field + "': '" + shown + "' in the output folder is a symbolic link, which is never written through; "
                           "name another file");
  throw ApiError(409, "'" + field + "': '" + shown + "' already exists in the output folder, and the server never replaces a file: "
                      "name another one (or delete it first)", field, "invalid_request_error", "output_exists");
}

}  // namespace

std::string shared_model_ref(const Context& ctx, const std::string& field, const std::string& ref) {
  check_plain(field, ref);
  if (model_ref_is_path(ref)) return shared_path(ctx, field, ref);
  // A store reference. The engine reads a file of that name in the server's
  // working folder first; the server shares no such file.
  std::error_code ec;
  if (fs::exists(fs::path(ref), ec)) {
    auto store = Store::open(ctx.options.store_dir, false);
    if (store.ok() && store.value()->resolve(ref).ok())
      throw ApiError(409, "'" + ref + "' names a store model and also a file in the server's working folder, which is read "
                          "first: name the model as NAME@VERSION (GET /v1/models), or start the server in another folder",
                     field, "invalid_request_error", "ambiguous_model");
    throw ApiError(404, "The model '" + ref + "' does not exist in the model store (GET /v1/models lists them)", field,
                   "invalid_request_error", "model_not_found");
  }
  return ref;
}

std::string shared_model_file(const Context& ctx, const std::string& field, const std::string& path) {
  check_plain(field, path);
  return shared_path(ctx, field, path);
}

static std::string in_output_folder(const Context& ctx, const std::string& field, const std::string& name, const char* what) {
  check_plain(field, name);
  const std::string& dir = ctx.options.output_dir;
  if (dir.empty()) throw forbidden(field, "'" + field + "': this server has no output folder, so no file may be named");
  auto path = file_inside(dir, name);
  if (!path.ok())
    throw forbidden(field, "'" + field + "' must name " + what + " in the server's output folder by a relative name: " +
                               path.status().message + " (the folder is DATA_DIR/images: --data-dir moves it)");
  return path.value();
}

std::string output_file(const Context& ctx, const std::string& field, const std::string& name, int count) {
  const std::string path = in_output_folder(ctx, field, name, "a file");
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw bad_field(field, "names a folder ('" + name + "'): name a file in the output folder");
  for (const auto& part : fs::path(name))
    if (part.string().size() > 200)  // the numbered names of a batch and the engine's .tmp must fit NAME_MAX (255)
      throw bad_field(field, "has a name part longer than 200 bytes: use a shorter name");
  const fs::path parent = fs::path(path).parent_path();
  if (!fs::is_directory(parent, ec))
    throw ApiError(404, "'" + field + "': the folder '" + fs::path(name).parent_path().string() +
                            "' does not exist in the output folder: create it, or name a file directly in the output folder",
                   field, "invalid_request_error", "output_folder_not_found");
  for (int i = 0; i < count; ++i) {
    const std::string f = numbered_output_path(path, i, count);
    check_new_file(field, f, fs::path(f).lexically_relative(ctx.options.output_dir).string());
  }
  return path;
}

std::string output_picture(const Context& ctx, const std::string& field, const std::string& name) {
  const std::string path = in_output_folder(ctx, field, name, "a picture");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    throw ApiError(404, "'" + field + "': there is no picture '" + name +
                            "' in the output folder; send it as base64 to /sdapi/v1/img2img instead",
                   field, "invalid_request_error", "picture_not_found");
  return path;
}

// ---------------------------------------------------------------- requests

bool host_allowed(const ApiServerOptions& o, int port, const std::string& header) {
  if (header.empty()) return true;  // HTTP/1.0 without Host: no browser sends that, so no rebinding
  std::string name, port_text;
  if (header[0] == '[') {
    const auto close = header.find(']');
    if (close == std::string::npos) return false;
    name = header.substr(1, close - 1);
    if (close + 1 < header.size()) {
      if (header[close + 1] != ':') return false;
      port_text = header.substr(close + 2);
    }
  } else if (const auto colon = header.find(':'); colon != std::string::npos) {
    name = header.substr(0, colon);
    port_text = header.substr(colon + 1);
  } else {
    name = header;
  }
  name = lower(name);
  if (port_text.empty()) {
    if (header.back() == ':') return false;
    if (port != 80 && port != 0) return false;  // a browser leaves out only the default port (0: handle_raw, no socket)
  } else {
    if (port_text.size() > 5 || !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoi(port_text) != port)
      return false;
  }
  std::string bound = lower(o.host);
  if (bound.size() > 2 && bound.front() == '[' && bound.back() == ']') bound = bound.substr(1, bound.size() - 2);
  if (name == "localhost" || name == "127.0.0.1" || name == "::1" || name == bound) return true;
  for (const auto& a : o.allowed_hosts) {
    const std::string allowed = lower(a);
    if (allowed == name || allowed == lower(header)) return true;
  }
  // Listening on every address: any address literal names it (a rebinding page has a host name, never a literal).
  if (bound == "0.0.0.0" || bound == "::" || bound.empty()) {
    unsigned char buf[16];
    if (inet_pton(AF_INET, name.c_str(), buf) == 1 || inet_pton(AF_INET6, name.c_str(), buf) == 1) return true;
  }
  return false;
}

bool json_body_or_none(const httplib::Request& req) {
  const bool body = req.has_header("Transfer-Encoding") ||
                    (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
  if (!body) return true;
  std::string type = lower(req.get_header_value("Content-Type"));
  type = type.substr(0, type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.erase(0, 1);
  return type == "application/json";
}

bool same_secret(const std::string& key, const std::string& given) {
  // Hashed first: equal-length digests compared with CRYPTO_memcmp leak neither the key's bytes nor its length.
  unsigned char a[EVP_MAX_MD_SIZE], b[EVP_MAX_MD_SIZE];
  unsigned int na = 0, nb = 0;
  if (EVP_Digest(key.data(), key.size(), a, &na, EVP_sha256(), nullptr) != 1 ||
      EVP_Digest(given.data(), given.size(), b, &nb, EVP_sha256(), nullptr) != 1 || na != nb)
    return false;
  return CRYPTO_memcmp(a, b, na) == 0;
}

}  // namespace atelier::server
