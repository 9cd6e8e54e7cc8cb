#include "store/blob_store.h"

#include "core/unique_fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/sha256.h"

namespace atelier::store {

namespace {

namespace fs = std::filesystem;

std::string sys_error(const std::string& what, const std::string& path, int err) {
  return what + " " + path + ": " + std::strerror(err);
}

using Fd = UniqueFd;

constexpr size_t kChunk = 1u << 20;

ssize_t read_some(int fd, void* buf, size_t n) {
  for (;;) {
    const ssize_t r = ::read(fd, buf, n);
    if (r >= 0 || errno != EINTR) return r;
  }
}

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError(sys_error("cannot write", path, errno) + " (is the disk full?)");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_dir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw IoError(sys_error("cannot open the folder", dir, errno));
  if (::fsync(fd.get()) != 0) throw IoError(sys_error("cannot sync the folder", dir, errno));
}

}  // namespace

bool is_hex_digest(const std::string& s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string sha256_file(const std::string& path, int64_t* size, const std::function<bool(int64_t)>& on_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw IoError(sys_error("cannot open", path, errno));
  Sha256 sha;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kChunk]);
  int64_t total = 0;
  for (;;) {
    const ssize_t r = read_some(fd.get(), buf.get(), kChunk);
    if (r < 0) throw IoError(sys_error("cannot read", path, errno));
    if (r == 0) break;
    sha.update(buf.get(), static_cast<size_t>(r));
    total += r;
    if (on_bytes && !on_bytes(total)) throw Error(StatusCode::Cancelled, "hashing " + path + " was cancelled");
  }
  if (size) *size = total;
  return sha.hex();
}

BlobStore::BlobStore(std::string root) : root_(std::move(root)) {
  std::error_code ec;
  fs::create_directories(root_ + "/blobs/sha256", ec);
  if (ec) throw IoError("model store " + root_ + ": cannot create " + root_ + "/blobs/sha256: " + ec.message());
}

BlobStore::Stored BlobStore::put(const std::string& src,
                                 const std::function<void(const std::string&)>& after_hash,
                                 const std::function<bool(int64_t)>& on_bytes) const {
  Fd in(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) throw IoError(sys_error("cannot open", src, errno));
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) throw IoError(sys_error("cannot stat", src, errno));
  if (!S_ISREG(st.st_mode)) throw IoError(src + " is not a regular file; import a model file");

  std::string tmp = blobs_dir() + "/tmp-XXXXXX";
  Fd out(::mkostemp(tmp.data(), O_CLOEXEC));
  if (out.get() < 0) throw IoError(sys_error("cannot create a temporary blob in", blobs_dir(), errno));
  // Removes the tmp file on any failure before the rename.
  struct TmpGuard {
    std::string path;
    bool armed = true;
    ~TmpGuard() {
      if (armed) ::unlink(path.c_str());
    }
  } guard{tmp};

  Sha256 sha;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kChunk]);
  int64_t total = 0;
  for (;;) {
    const ssize_t r = read_some(in.get(), buf.get(), kChunk);
    if (r < 0) throw IoError(sys_error("cannot read", src, errno));
    if (r == 0) break;
    sha.update(buf.get(), static_cast<size_t>(r));
    write_all(out.get(), buf.get(), static_cast<size_t>(r), tmp);
    total += r;
    if (on_bytes && !on_bytes(total))
      throw Error(StatusCode::Cancelled, "the import of " + src + " was cancelled; nothing was recorded");
  }
  if (::fchmod(out.get(), 0444) != 0) throw IoError(sys_error("cannot set the mode of", tmp, errno));
  if (::fsync(out.get()) != 0) throw IoError(sys_error("cannot sync", tmp, errno) + " (is the disk full?)");
  if (::close(out.release()) != 0) throw IoError(sys_error("cannot close", tmp, errno));
  const std::string digest = sha.hex();

  if (after_hash) after_hash(tmp);

  // Renaming over an existing blob replaces it with the same (just hashed)
  // bytes atomically, which also repairs a blob that was damaged on disk.
  const std::string final_path = path(digest);
  if (::rename(tmp.c_str(), final_path.c_str()) != 0)
    throw IoError(sys_error("cannot rename " + tmp + " to", final_path, errno));
  guard.armed = false;
  fsync_dir(root_ + "/blobs/sha256");
  return {digest, total};
}

std::vector<std::string> BlobStore::list() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(root_ + "/blobs/sha256", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_hex_digest(name)) out.push_back(name);
  }
  if (ec) throw IoError("model store " + root_ + ": cannot list " + root_ + "/blobs/sha256: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

int64_t BlobStore::remove_tmp() const {
  int64_t n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(blobs_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("tmp-", 0) == 0 && ::unlink(it->path().c_str()) == 0) ++n;
  }
  return n;
}

BlobStore::Lock::Lock(const std::string& root, Mode mode) {
  const std::string p = root + "/store.lock";
  fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(sys_error("cannot open the store lock", p, errno));
  const int op = mode == kShared ? LOCK_SH : mode == kExclusive ? LOCK_EX : (LOCK_EX | LOCK_NB);
  int rc;
  do {
    rc = ::flock(fd_, op);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) {
    held_ = true;
  } else if (!(mode == kTryExclusive && errno == EWOULDBLOCK)) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw IoError(sys_error("cannot lock the store lock", p, err));
  }
}

BlobStore::Lock::~Lock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace atelier::store
