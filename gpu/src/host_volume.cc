#include "warpfs/gpu/host_volume.h"

#include <linux/fs.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/gpu/file_map.h"
#include "warpfs/nvme/emulated.h"

namespace warpfs::gpu {

struct HostVolume::Impl {
  std::string image;
  std::shared_ptr<nvme::BackingStore> store;
  std::unique_ptr<blockdev::DeviceStack> stack;
  std::unique_ptr<fs::Filesystem> fs;
  std::vector<fs::Ino> writable_files;  // to touch at close
  bool closed = false;
};

HostVolume::HostVolume() : impl_(new Impl) {}

HostVolume::~HostVolume() {
  std::string error;
  if (!close(false, &error)) std::fprintf(stderr, "warpfs gpu volume: %s\n", error.c_str());
}

std::unique_ptr<HostVolume> HostVolume::open(const std::string& image, bool writable,
                                             std::string* error) {
  if (blockdev::split_device_list(image).size() > 1) {
    *error = image + ": a RAID set; a GPU volume opens one emulated image";
    return nullptr;
  }
  if (std::string where = blockdev::warpfs_mount_of_image(image); !where.empty()) {
    *error = image + ": mounted on " + where + " (unmount it first)";
    return nullptr;
  }
  std::unique_ptr<HostVolume> v(new HostVolume());
  v->writable_ = writable;
  Impl& m = *v->impl_;
  m.image = image;
  // The daemon's lock: a write lock for a writer, a read lock for a reader.
  m.store = nvme::BackingStore::open_file(image, 0, error, !writable);
  if (!m.store) return nullptr;  // names the image and, when held, who holds it
  blockdev::StackOptions so;
  so.io_queues = 1;
  so.cache_mb = 0;  // the core reads metadata once; data is the GPU's
  so.emulated.cache_in_store = true;
  so.emulated.read_only = !writable;
  so.wait_for_release_s = 0;
  if (!(m.stack = blockdev::DeviceStack::open_store(image, m.store, so, error))) return nullptr;
  fs::MountOptions mo;
  mo.read_only = !writable;
  mo.log = [](const std::string& s) { std::fprintf(stderr, "warpfs gpu volume: %s\n", s.c_str()); };
  if (!(m.fs = fs::Filesystem::mount(m.stack->device(), mo, error))) {
    *error = image + ": " + *error;
    return nullptr;
  }
  return v;
}

std::shared_ptr<nvme::BackingStore> HostVolume::store() const {
  return impl_->store;
}

uint64_t HostVolume::device_blocks() const {
  return impl_->stack->device().block_count();
}

int HostVolume::map(const std::string& path, bool writable, MappedFile* out, std::string* error) {
  Impl& m = *impl_;
  if (m.closed) {
    *error = "the volume is closed";
    return EBADF;
  }
  if (writable && !writable_) {
    *error = path + ": the volume was opened read-only";
    return EROFS;
  }
  fs::Attr a;
  if (int rc = resolve_path(*m.fs, path, &a, error); rc) return rc;
  if (writable) {
    uint32_t flags = 0;
    if (int rc = m.fs->get_flags(a.ino, &flags); rc) {
      *error = path + ": " + std::strerror(rc);
      return rc;
    }
    if (flags & (FS_IMMUTABLE_FL | FS_APPEND_FL)) {
      *error = path + ": immutable or append-only";
      return EPERM;
    }
  }
  FileMap fm;
  if (int rc = build_file_map(*m.fs, a.ino, device_blocks(), &fm, error); rc) {
    *error = path + ": " + *error;
    return rc;
  }
  if (writable) {
    // GPU threads write straight into the mapped device blocks: a block another file shares
    // (a clone, deduplication: fs/FORMAT.md "Shared blocks") is copied first, by rewriting it
    // through the core, whose copy-on-write gives this file a block of its own.
    uint64_t copied = 0;
    if (int rc = unshare_blocks(*m.fs, fm, &copied, error); rc) {
      *error = path + ": " + *error;
      return rc;
    }
    if (copied > 0) {
      if (int rc = build_file_map(*m.fs, a.ino, device_blocks(), &fm, error); rc) {
        *error = path + ": " + *error;
        return rc;
      }
    }
  }
  out->path = path;
  out->ino = fm.ino;
  out->size = fm.size;
  out->blocks = std::move(fm.blocks);
  out->holes = fm.holes;
  out->writable = writable;
  if (writable) m.writable_files.push_back(a.ino);
  return 0;
}

bool HostVolume::close(bool data_written, std::string* error) {
  Impl& m = *impl_;
  if (m.closed) return true;
  m.closed = true;
  if (!m.fs) {  // a failed open: nothing mounted
    m.stack.reset();
    return true;
  }
  bool ok = true;
  if (data_written) {
    for (fs::Ino ino : m.writable_files) {
      fs::SetAttr s;
      s.mtime = s.mtime_now = true;  // ctime follows any change
      fs::Attr ignored;
      if (int rc = m.fs->setattr(ino, s, &ignored); rc && ok) {
        *error = m.image + ": inode " + std::to_string(ino) + ": times: " + std::strerror(rc);
        ok = false;
      }
    }
  }
  if (int rc = m.fs->unmount(); rc && ok) {
    *error = m.image + ": unmount: " + std::strerror(rc);
    ok = false;
  }
  m.fs.reset();
  m.stack.reset();
  return ok;
}

}  // namespace warpfs::gpu
