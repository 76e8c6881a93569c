#include "warpfs/gpu/file_map.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "warpfs/fs/format.h"

namespace warpfs::gpu {

int resolve_path(fs::Filesystem& f, std::string_view path, fs::Attr* out, std::string* error) {
  if (path.empty() || path.front() != '/') {
    *error = "'" + std::string(path) + "': not an absolute path inside the filesystem";
    return EINVAL;
  }
  fs::Attr a;
  if (int rc = f.getattr(fs::kRootInode, &a); rc) {
    *error = "/: " + std::string(std::strerror(rc));
    return rc;
  }
  std::string walked;
  size_t at = 0;
  while (at < path.size()) {
    while (at < path.size() && path[at] == '/') ++at;
    if (at == path.size()) break;
    const size_t end = std::min(path.find('/', at), path.size());
    const std::string_view name = path.substr(at, end - at);
    if (!S_ISDIR(a.mode)) {
      *error = (walked.empty() ? "/" : walked) + ": not a directory";
      return ENOTDIR;
    }
    walked += "/" + std::string(name);
    fs::Attr next;
    if (int rc = f.lookup(a.ino, name, &next); rc) {
      *error = walked + ": " + std::strerror(rc);
      return rc;
    }
    f.forget(next.ino, 1);  // the lookup's reference: nothing here holds the inode
    if (S_ISLNK(next.mode)) {
      *error = walked + ": a symbolic link (not followed)";
      return ELOOP;
    }
    a = next;
    at = end;
  }
  *out = a;
  return 0;
}

int build_file_map(fs::Filesystem& f, fs::Ino ino, uint64_t device_blocks, FileMap* out,
                   std::string* error) {
  fs::InodeReport r;
  if (int rc = f.inspect(ino, &r); rc) {
    *error = "inode " + std::to_string(ino) + ": " + std::strerror(rc);
    return rc;
  }
  if (!S_ISREG(r.disk.mode)) {
    *error = "inode " + std::to_string(ino) + ": not a regular file";
    return S_ISDIR(r.disk.mode) ? EISDIR : EINVAL;
  }
  FileMap m;
  m.ino = ino;
  m.size = r.disk.size;
  m.block_bytes = fs::kBlockSize;
  const uint64_t n = (m.size + m.block_bytes - 1) / m.block_bytes;
  m.blocks.assign(n, kHoleBlock);
  for (const fs::Extent& e : r.extents) {
    if (e.unwritten()) continue;  // reads as zeros: a hole to the GPU
    if (e.physical >= device_blocks || e.blocks() > device_blocks - e.physical) {
      *error = "inode " + std::to_string(ino) + ": extent at file block " +
               std::to_string(e.logical) + " lies outside the device (run fsck.warpfs)";
      return EIO;
    }
    for (uint64_t k = 0; k < e.blocks() && e.logical + k < n; ++k)
      m.blocks[e.logical + k] = e.physical + k;
  }
  for (uint64_t b : m.blocks) m.holes += b == kHoleBlock;
  *out = std::move(m);
  return 0;
}

int unshare_blocks(fs::Filesystem& f, const FileMap& m, uint64_t* copied, std::string* error) {
  *copied = 0;
  std::vector<char> buf;
  for (uint64_t i = 0; i < m.blocks.size();) {
    if (m.blocks[i] == kHoleBlock || f.block_refs(m.blocks[i]) < 2) {
      ++i;
      continue;
    }
    uint64_t n = 1;  // a run of shared blocks, up to 1 MiB
    while (i + n < m.blocks.size() && n < 256 && m.blocks[i + n] != kHoleBlock &&
           f.block_refs(m.blocks[i + n]) >= 2) {
      ++n;
    }
    const uint64_t off = i * m.block_bytes;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(n * m.block_bytes, m.size - off));
    buf.resize(len);
    size_t got = 0, put = 0;
    int rc = f.read(m.ino, off, len, buf.data(), &got);
    // The same bytes again, as the page cache's write-back would (no times, no privileges).
    if (rc == 0 && got == len)
      rc = f.write(m.ino, off, len, buf.data(), &put, nullptr, fs::WriteFrom::kPageCache);
    if (rc == 0 && put != len) rc = EIO;
    if (rc) {
      *error = "copying shared block " + std::to_string(i) + ": " + std::strerror(rc);
      return rc;
    }
    *copied += n;
    i += n;
  }
  return 0;
}

}  // namespace warpfs::gpu
