// gpu::Volume and file_array<T>: GPU threads read and write warpfs files (GPU4FS's promise:
// files GPU threads read directly from NVMe, GPU4FS thesis §1 and §4; BaM's bam::array over
// files instead of raw LBA ranges, BaM §7.1).
//
//   Volume::open(image, options)  host: the image lock, the filesystem core (HostVolume,
//                                 host_volume.h), the GPU's controller and queue pairs over
//                                 the same image (Rig) and the GPU cache (GpuCache).
//   Volume::open_array<T>(path, writable)  host: resolves the path, builds the file's block
//                                 map (file_map.h) and copies it into GPU memory.
//   file_array<T>::read(i) / write(i, v)  device: element i lives in file block
//                                 i / (4096 / sizeof(T)); one load from the map gives its
//                                 device block, which the warp-coalesced cache (cache.cuh)
//                                 acquires, filling it with a GPU-initiated NVMe Read on a
//                                 miss. No CPU code on the per-access path.
//   Volume::close()               host: write-back of every dirty line and an NVMe Flush
//                                 (GpuCache::flush), the controller's shutdown, then the core
//                                 sets the written files' mtime/ctime and unmounts clean.
//
// Holes and unwritten (preallocated) extents read as zeros and are never written: a write
// there (or beyond the file's size, or through a read-only array) is dropped and counted
// (Volume::dropped_writes), as a GPU kernel has no errno to return. The map is a snapshot
// taken at open_array: nothing else may change the file while the volume is open, which the
// image lock guarantees for the daemon and the tools.
//
// Thread-safety: file_array's device methods may be called by any number of GPU threads (the
// cache's rules: every lane of a warp that reaches an access takes part in it). Volume's host
// methods: one host thread, and no kernel using its arrays running during close().
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "warpfs/gpu/cache.cuh"
#include "warpfs/gpu/host_volume.h"

namespace warpfs::gpu {

inline constexpr uint64_t kFileHole = ~0ull;  // file_map.h's kHoleBlock

template <typename T>
class file_array {
 public:
  file_array() = default;
  file_array(const CacheView& c, const uint64_t* map, uint64_t n, bool writable,
             DevAtomic64* dropped)
      : c_(c),
        map_(map),
        n_(n),
        per_line_(c.line_bytes / sizeof(T)),
        writable_(writable),
        dropped_(dropped) {}

  __host__ __device__ uint64_t size() const { return n_; }
  // The device block that holds element i, or kFileHole (a hole, or i past the end).
  __device__ uint64_t block_of(uint64_t i) const {
    return i < n_ ? map_[i / per_line_] : kFileHole;
  }
  __device__ uint32_t offset_of(uint64_t i) const {
    return static_cast<uint32_t>(i % per_line_ * sizeof(T));
  }

  // The lanes reading a hole leave the warp's coalescing before it (they acquire nothing);
  // the others coalesce among themselves (__activemask).
  __device__ T read(uint64_t i) const {
    uint32_t unused = 0;
    return read(i, &unused);
  }
  // read(i), adding to *lookups the line acquisitions this lane made (as array<T>::read).
  __device__ T read(uint64_t i, uint32_t* lookups) const {
    T v{};
    const uint64_t b = block_of(i);
    if (b == kFileHole) return v;
    Group g;
    const uint8_t* d = warp_acquire(c_, b, &g);
    if (static_cast<int>(threadIdx.x % 32) == g.leader) ++*lookups;
    if (d != nullptr) std::memcpy(&v, d + offset_of(i), sizeof(T));
    warp_release(c_, g, false);
    return v;
  }
  __device__ T operator[](uint64_t i) const { return read(i); }

  // False (and counted) where the write was dropped: a hole, past the end, a read-only
  // array, or an I/O error filling the line (then also counted in the cache's kErrors).
  __device__ bool write(uint64_t i, const T& v) const {
    const uint64_t b = writable_ ? block_of(i) : kFileHole;
    if (b == kFileHole) {
      dropped_->fetch_add(1, port::Order::kRelaxed);
      return false;
    }
    Group g;
    uint8_t* d = warp_acquire(c_, b, &g);
    if (d != nullptr) std::memcpy(d + offset_of(i), &v, sizeof(T));
    warp_release(c_, g, d != nullptr);
    if (d == nullptr) dropped_->fetch_add(1, port::Order::kRelaxed);
    return d != nullptr;
  }

 private:
  template <typename U>
  friend class file_array_ref;
  CacheView c_;
  const uint64_t* map_ = nullptr;  // GPU memory: device block per file block
  uint64_t n_ = 0;
  uint64_t per_line_ = 1;
  bool writable_ = false;
  DevAtomic64* dropped_ = nullptr;
};

// array_ref's cursor (array.cuh; BaM §7.2.2) over a file_array: a lane keeps its line while
// consecutive reads stay in one file block. A hole holds nothing and reads as zeros. The same
// rules as array_ref: one per thread, and a warp resets all its cursors when any lane would
// leave its line (holds()).
template <typename T>
class file_array_ref {
 public:
  __device__ explicit file_array_ref(const file_array<T>& a) : a_(a) {}
  __device__ ~file_array_ref() { reset(); }
  file_array_ref(const file_array_ref&) = delete;
  file_array_ref& operator=(const file_array_ref&) = delete;

  __device__ T read(uint64_t i) {
    uint32_t unused = 0;
    return read(i, &unused);
  }
  // read(i), adding to *lookups the line acquisitions this lane made.
  __device__ T read(uint64_t i, uint32_t* lookups) {
    T v{};
    const uint8_t* d = get(a_.block_of(i), lookups);
    if (d != nullptr) std::memcpy(&v, d + a_.offset_of(i), sizeof(T));
    return v;
  }
  __device__ bool holds(uint64_t i) const {
    const uint64_t b = a_.block_of(i);
    return b == block_ || (b == kFileHole && line_ == kNoLine);
  }
  __device__ void reset() {
    cursor_release(a_.c_, line_, false);
    line_ = kNoLine;
    block_ = kFileHole;
  }

 private:
  __device__ const uint8_t* get(uint64_t block, uint32_t* lookups) {
    if (block != block_ || line_ == kNoLine) {
      reset();
      if (block == kFileHole) return nullptr;
      line_ = cursor_acquire(a_.c_, block, lookups);
      block_ = line_ == kNoLine ? kFileHole : block;
      if (line_ == kNoLine) return nullptr;
    }
    return a_.c_.data + uint64_t{line_} * a_.c_.line_bytes;
  }

  const file_array<T>& a_;
  uint64_t block_ = kFileHole;
  uint32_t line_ = kNoLine;
};

struct VolumeOptions {
  bool writable = false;
  RigOptions rig;         // queue pairs, depth, controller threads (cache_in_store is set)
  GpuCacheOptions cache;  // line_bytes must be 4096: one filesystem block per line
};

class Volume {
 public:
  static std::unique_ptr<Volume> open(const std::string& image, const VolumeOptions& o,
                                      std::string* error);
  ~Volume();  // close() if not closed (errors to stderr)
  Volume(const Volume&) = delete;
  Volume& operator=(const Volume&) = delete;

  // An array over regular file `path` (absolute inside the filesystem) of size / sizeof(T)
  // elements. sizeof(T) must divide 4096. 0 or an errno value with a message.
  template <typename T>
  int open_array(const std::string& path, bool writable, file_array<T>* out, std::string* error) {
    static_assert(4096 % sizeof(T) == 0, "elements never straddle a block");
    const MappedFile* f = nullptr;
    const uint64_t* map = nullptr;
    if (int rc = map_file(path, writable, &f, &map, error); rc) return rc;
    *out = file_array<T>(cache_->view(), map, f->size / sizeof(T), writable, dropped_);
    return 0;
  }

  // Flushes and closes (see the header comment). False with a message if any step failed;
  // idempotent.
  bool close(std::string* error);

  uint64_t dropped_writes() const;
  GpuCache& cache() { return *cache_; }
  Rig& rig() { return *rig_; }
  HostVolume& host() { return *host_; }
  const std::vector<std::unique_ptr<MappedFile>>& files() const { return files_; }

 private:
  Volume() = default;
  int map_file(const std::string& path, bool writable, const MappedFile** f, const uint64_t** map,
               std::string* error);

  std::unique_ptr<HostVolume> host_;
  std::unique_ptr<Rig> rig_;
  std::unique_ptr<GpuCache> cache_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<uint64_t*> maps_;  // cudaMalloc'd, one per file
  DevAtomic64* dropped_ = nullptr;
  uint64_t dropped_at_close_ = 0;
  bool any_writable_ = false;
  bool closed_ = false;
};

}  // namespace warpfs::gpu
