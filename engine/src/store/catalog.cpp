#include "store/catalog.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "store/blob_store.h"

namespace atelier::store {

using nlohmann::json;

namespace {

std::string str(const json& j, const char* key, const std::string& where, bool required) {
  if (!j.contains(key)) {
    if (required) throw IoError(where + ": \"" + key + "\" is missing");
    return "";
  }
  if (!j[key].is_string()) throw IoError(where + ": \"" + key + "\" must be a string");
  return j[key].get<std::string>();
}

}  // namespace

std::vector<CatalogEntry> parse_catalog(const std::string& text, const std::string& path) {
  const json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded()) throw IoError(path + ": not valid JSON; fix the file or point --catalog at another one");
  const json* models = &doc;
  if (doc.is_object()) {
    if (!doc.contains("models")) throw IoError(path + ": no \"models\" list");
    models = &doc["models"];
  }
  if (!models->is_array()) throw IoError(path + ": \"models\" must be a list");
  std::vector<CatalogEntry> out;
  std::set<std::string> names;
  for (size_t i = 0; i < models->size(); ++i) {
    const json& m = (*models)[i];
    std::string where = path + ": model " + std::to_string(i + 1);
    if (!m.is_object()) throw IoError(where + " is not an object");
    CatalogEntry e;
    e.name = str(m, "name", where, true);
    where = path + ": model \"" + e.name + "\"";
    if (!names.insert(e.name).second) throw IoError(where + " appears twice");
    e.kind = str(m, "kind", where, true);
    if (e.kind != "text" && e.kind != "image") throw IoError(where + ": kind must be \"text\" or \"image\"");
    e.architecture = str(m, "architecture", where, false);
    e.licence = str(m, "licence", where, false);
    e.description = str(m, "description", where, false);
    if (m.contains("verified")) {
      if (!m["verified"].is_boolean()) throw IoError(where + ": \"verified\" must be true or false");
      e.verified = m["verified"].get<bool>();
    }
    if (!m.contains("files") || !m["files"].is_array() || m["files"].empty())
      throw IoError(where + ": \"files\" must be a non-empty list");
    std::set<std::string> roles;
    for (const json& f : m["files"]) {
      if (!f.is_object()) throw IoError(where + ": a file is not an object");
      CatalogFile cf;
      cf.name = str(f, "name", where, true);
      const std::string fw = where + " file " + cf.name;
      if (f.contains("role")) cf.role = str(f, "role", fw, true);
      if (!roles.insert(cf.role).second) throw IoError(fw + ": role \"" + cf.role + "\" appears twice");
      if (f.contains("size")) {
        if (!f["size"].is_number_integer() || f["size"].get<int64_t>() < 0) throw IoError(fw + ": size must be a byte count");
        cf.size = f["size"].get<int64_t>();
      }
      cf.sha256 = str(f, "sha256", fw, false);
      std::transform(cf.sha256.begin(), cf.sha256.end(), cf.sha256.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      if (!cf.sha256.empty() && !is_hex_digest(cf.sha256)) throw IoError(fw + ": sha256 must be 64 hex digits or empty");
      cf.mirror = str(f, "mirror", fw, false);
      if (cf.mirror.find("..") != std::string::npos || (!cf.mirror.empty() && cf.mirror.front() == '/'))
        throw IoError(fw + ": mirror must be a path inside the mirror folder");
      if (f.contains("urls")) {
        if (!f["urls"].is_array()) throw IoError(fw + ": urls must be a list of strings");
        for (const json& u : f["urls"]) {
          if (!u.is_string()) throw IoError(fw + ": urls must be a list of strings");
          cf.urls.push_back(u.get<std::string>());
        }
      }
      if (cf.mirror.empty() && cf.urls.empty()) throw IoError(fw + ": give a mirror path or at least one URL");
      if (e.verified && (cf.sha256.empty() || cf.size == 0))
        throw IoError(fw + ": a verified entry needs every file's size and sha256 (or mark it \"verified\": false)");
      e.files.push_back(std::move(cf));
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<CatalogEntry> read_catalog(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read the model catalog " + path + "; pass --catalog FILE or set ATELIER_CATALOG");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_catalog(ss.str(), path);
}

const CatalogEntry& find_entry(const std::vector<CatalogEntry>& catalog, const std::string& name, const std::string& path) {
  for (const auto& e : catalog)
    if (e.name == name) return e;
  std::string names;
  for (const auto& e : catalog) names.append(names.empty() ? "" : ", ").append(e.name);
  throw NotFoundError("the catalog " + path + " has no model \"" + name + "\"; it has: " + names +
              " (a file of your own goes in with `atelier models import FILE --name NAME`)");
}

}  // namespace atelier::store
