// Central-directory reader for stored zip entries. See zip_archive.h for why
// this is hand-written rather than libzip.
#include "formats/zip_archive.h"

#include "core/error.h"

namespace atelier::formats {

namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEocdSig = 0x06054b50,
                   kZip64LocatorSig = 0x07064b50, kZip64EocdSig = 0x06064b50;

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

bool looks_like_zip(const uint8_t* data, uint64_t size) { return size >= 4 && le(data, 4) == kLocalSig; }

ZipArchive::ZipArchive(const uint8_t* data, uint64_t size, const std::string& where)
    : data_(data), size_(size), where_(where) {
  const std::string bad = where + ": not a valid zip archive: ";
  const std::string hint = " (the file is truncated or corrupt; download it again)";
  auto need = [&](uint64_t off, uint64_t len, const char* what) {
    if (off > size_ || len > size_ - off) throw Error(bad + what + " runs past the end of the file" + hint);
  };

  // End of central directory: 22 bytes plus a comment of up to 65535 bytes.
  if (size < 22) throw Error(bad + "too small (" + std::to_string(size) + " bytes)" + hint);
  uint64_t eocd = UINT64_MAX;
  const uint64_t lowest = size > 22 + 65535 ? size - 22 - 65535 : 0;
  for (uint64_t p = size - 22 + 1; p-- > lowest;) {
    if (le(data + p, 4) == kEocdSig && p + 22 + le(data + p + 20, 2) == size) {
      eocd = p;
      break;
    }
  }
  if (eocd == UINT64_MAX) throw Error(bad + "no end-of-central-directory record" + hint);
  uint64_t count = le(data + eocd + 10, 2);
  uint64_t cd_size = le(data + eocd + 12, 4);
  uint64_t cd_off = le(data + eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {
    // ZIP64: the locator sits just before the classic record.
    if (eocd < 20 || le(data + eocd - 20, 4) != kZip64LocatorSig)
      throw Error(bad + "ZIP64 end-of-central-directory locator is missing" + hint);
    const uint64_t z = le(data + eocd - 20 + 8, 8);
    need(z, 56, "ZIP64 end-of-central-directory record");
    if (le(data + z, 4) != kZip64EocdSig) throw Error(bad + "bad ZIP64 end-of-central-directory signature" + hint);
    count = le(data + z + 32, 8);
    cd_size = le(data + z + 40, 8);
    cd_off = le(data + z + 48, 8);
  }
  need(cd_off, cd_size, "central directory");
  if (count > kMaxEntries) throw Error(bad + std::to_string(count) + " entries (at most " + std::to_string(kMaxEntries) + ")" + hint);
  if (count > cd_size / 46) throw Error(bad + "central directory too small for " + std::to_string(count) + " entries" + hint);
  entries_.reserve(count);

  uint64_t p = cd_off;
  const uint64_t end = cd_off + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (p > end || end - p < 46) throw Error(bad + "central directory entry " + std::to_string(i) + " runs past its end" + hint);
    const uint8_t* c = data + p;
    if (le(c, 4) != kCentralSig) throw Error(bad + "bad signature in central directory entry " + std::to_string(i) + hint);
    ZipEntry e;
    e.flags = uint16_t(le(c + 8, 2));
    e.method = uint16_t(le(c + 10, 2));
    e.compressed_size = le(c + 20, 4);
    e.size = le(c + 24, 4);
    const uint64_t name_len = le(c + 28, 2), extra_len = le(c + 30, 2), comment_len = le(c + 32, 2);
    e.local_header_offset = le(c + 42, 4);
    const uint64_t total = 46 + name_len + extra_len + comment_len;
    if (end - p < total) throw Error(bad + "central directory entry " + std::to_string(i) + " runs past its end" + hint);
    e.name.assign(reinterpret_cast<const char*>(c + 46), name_len);
    // ZIP64 extended information: the 64-bit values, in this order, of the
    // fields whose 32-bit slot holds 0xFFFFFFFF.
    const uint8_t* x = c + 46 + name_len;
    uint64_t xp = 0;
    while (xp + 4 <= extra_len) {
      const uint64_t id = le(x + xp, 2), len = le(x + xp + 2, 2);
      if (xp + 4 + len > extra_len) break;
      if (id == 0x0001) {
        uint64_t q = xp + 4;
        auto take = [&](uint64_t& field) {
          if (field != 0xFFFFFFFF) return;
          if (q + 8 > xp + 4 + len) throw Error(bad + "short ZIP64 field in entry '" + e.name + "'" + hint);
          field = le(x + q, 8);
          q += 8;
        };
        take(e.size);
        take(e.compressed_size);
        take(e.local_header_offset);
      }
      xp += 4 + len;
    }
    if (index_.count(e.name)) throw Error(bad + "entry '" + e.name + "' appears twice" + hint);
    index_[e.name] = entries_.size();
    entries_.push_back(std::move(e));
    p += total;
  }
}

const ZipEntry* ZipArchive::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

ZipArchive::Span ZipArchive::read(const std::string& name) const {
  const ZipEntry* e = find(name);
  const std::string w = where_ + ": archive entry '" + name + "'";
  if (!e) throw Error(w + " is missing (the checkpoint is incomplete; download it again)");
  if (e->flags & 1) throw Error(w + " is encrypted, which is not supported");
  if (e->method != 0)
    throw Error(w + " is compressed (method " + std::to_string(e->method) +
                "); PyTorch checkpoints store entries uncompressed: re-save it with torch.save or convert it to safetensors");
  if (e->compressed_size != e->size) throw Error(w + " is stored but its sizes disagree (corrupt archive)");
  const uint64_t lh = e->local_header_offset;
  if (lh > size_ || size_ - lh < 30 || le(data_ + lh, 4) != kLocalSig)
    throw Error(w + ": bad local header (the file is truncated or corrupt; download it again)");
  const uint64_t start = lh + 30 + le(data_ + lh + 26, 2) + le(data_ + lh + 28, 2);
  if (start > size_ || e->size > size_ - start)
    throw Error(w + " runs past the end of the file (the file is truncated; download it again)");
  return {data_ + start, e->size};
}

}  // namespace atelier::formats
