// HostVolume: the host side of gpu::Volume (volume.cuh). It opens a warpfs image the way the
// daemon does (the image lock decides: read-only under a read lock, which any number of
// readers share and a mounted daemon refuses; read-write under the write lock, refused while
// anyone else holds the image), mounts the filesystem core on it and turns paths into block
// maps (file_map.h). The GPU's emulated controller is then brought up over the same
// BackingStore (store()): one image, one lock, two controllers, as a CPU and a GPU would share
// one NVMe drive through separate queues. Both write through to the store
// (EmulatedConfig::cache_in_store), so neither reads stale data written by the other.
//
// Who writes what: the core writes metadata only (and only at close(), when it sets the times
// of the files mapped writable); GPU threads write only data blocks the maps name. Neither
// touches the other's blocks, so no coherence protocol is needed between them.
//
// This header keeps to standard types so that nvcc (C++17) can include it; the
// implementation (C++20) includes the filesystem core.
//
// Thread-safety: one host thread opens, maps and closes; the methods are not concurrent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace warpfs::nvme {
class BackingStore;
}

namespace warpfs::gpu {

struct MappedFile {
  std::string path;
  uint64_t ino = 0;
  uint64_t size = 0;             // bytes
  std::vector<uint64_t> blocks;  // file block -> device block, or kHoleBlock (file_map.h)
  uint64_t holes = 0;
  bool writable = false;
};

class HostVolume {
 public:
  // Opens `image` (an emulated warpfs image: a file). Refused with a message naming the image
  // and the holder when the lock says no, when it is a RAID list or not a warpfs image.
  static std::unique_ptr<HostVolume> open(const std::string& image, bool writable,
                                          std::string* error);
  ~HostVolume();  // close() if not closed (errors to stderr)
  HostVolume(const HostVolume&) = delete;
  HostVolume& operator=(const HostVolume&) = delete;

  std::shared_ptr<nvme::BackingStore> store() const;
  bool writable() const { return writable_; }
  uint64_t device_blocks() const;  // the filesystem's blocks (4096 bytes)

  // The block map of regular file `path` (absolute, inside the filesystem; symlinks are not
  // followed). writable: needs a volume opened writable and a file the image's owner may
  // write (not immutable or append-only: FS_IMMUTABLE_FL / FS_APPEND_FL). 0 or an errno value.
  int map(const std::string& path, bool writable, MappedFile* out, std::string* error);

  // `data_written`: GPU threads wrote data through a writable map; then every file mapped
  // writable gets mtime and ctime = now, as a writer's write would set them. Then the core
  // commits and unmounts (superblock clean). Idempotent. False with a message on an error.
  bool close(bool data_written, std::string* error);

 private:
  HostVolume();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool writable_ = false;
};

}  // namespace warpfs::gpu
