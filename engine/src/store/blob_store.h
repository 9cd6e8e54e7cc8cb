// The store's blob folder: ROOT/blobs/sha256/<digest>, written through
// ROOT/blobs/tmp-XXXXXX (hash while copying, fsync, rename, fsync the folder),
// plus the flock on ROOT/store.lock that keeps gc away from running imports.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace atelier::store {

// Lower-case hex SHA-256 of a file's bytes; SIZE receives its length.
// Throws atelier::Error naming the file. ON_BYTES (may be empty) gets the bytes
// hashed so far after every chunk; returning false throws Error(Cancelled).
std::string sha256_file(const std::string& path, int64_t* size,
                        const std::function<bool(int64_t bytes_done)>& on_bytes = {});

bool is_hex_digest(const std::string& s);  // 64 lower-case hex digits

class BlobStore {
 public:
  explicit BlobStore(std::string root);  // creates ROOT/blobs/sha256

  const std::string& root() const { return root_; }
  std::string blobs_dir() const { return root_ + "/blobs"; }
  std::string path(const std::string& digest) const { return root_ + "/blobs/sha256/" + digest; }

  struct Stored {
    std::string digest;
    int64_t size = 0;
  };
  // Copies SRC into the folder (see above); identical content ends up in one
  // blob. AFTER_HASH (test hook) runs with the tmp path before the rename.
  // ON_BYTES as for sha256_file (a cancel leaves no tmp file behind).
  // The caller holds a shared lock (Lock below).
  Stored put(const std::string& src, const std::function<void(const std::string&)>& after_hash,
             const std::function<bool(int64_t bytes_done)>& on_bytes = {}) const;

  // Digests of the blobs present, sorted.
  std::vector<std::string> list() const;
  // Removes tmp-* files; the caller holds the lock exclusively. Returns how many.
  int64_t remove_tmp() const;

  // flock on ROOT/store.lock: shared for imports, exclusive for gc/cleanup.
  class Lock {
   public:
    enum Mode { kShared, kExclusive, kTryExclusive };
    Lock(const std::string& root, Mode mode);
    ~Lock();
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    bool held() const { return held_; }

   private:
    int fd_ = -1;
    bool held_ = false;
  };

 private:
  std::string root_;
};

}  // namespace atelier::store
