// models/catalog.json: the models `atelier models pull` knows, with their
// files' sizes, sha256, download addresses and paths in a mirror folder.
#pragma once

#include <atelier/store.h>

#include <string>
#include <vector>

namespace atelier::store {

// Parses and checks a catalog file. Throws atelier::Error naming the file and
// the entry at fault.
std::vector<CatalogEntry> parse_catalog(const std::string& json_text, const std::string& path);
std::vector<CatalogEntry> read_catalog(const std::string& path);
// The entry named NAME; the error lists the names the catalog has.
const CatalogEntry& find_entry(const std::vector<CatalogEntry>& catalog, const std::string& name, const std::string& path);

}  // namespace atelier::store
