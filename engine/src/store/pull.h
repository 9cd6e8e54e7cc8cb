// `atelier models pull`: installs a catalog entry into the store from a
// mirror folder or from its download addresses.
#pragma once

#include <atelier/store.h>

#include "store/store.h"

namespace atelier::store {

// The partial download of FILE (kept between attempts and processes).
std::string partial_path(const ModelStore& store, const CatalogEntry& entry, const CatalogFile& file);

// Throws atelier::Error (NetworkError when no source could be reached) with
// a message that says what to do. Nothing is recorded unless every file is
// present and matches its catalog sha256.
PullResult pull(ModelStore& store, const CatalogEntry& entry, const PullOptions& options);

}  // namespace atelier::store
