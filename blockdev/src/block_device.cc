#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "warpfs/blockdev/devices.h"

namespace warpfs::blockdev {

void BlockDevice::submit(Io* ios, int n) {
  for (int i = 0; i < n; ++i) {
    ios[i].status = ios[i].write ? write(ios[i].block, ios[i].lines, ios[i].data)
                                 : read(ios[i].block, ios[i].lines, ios[i].data);
  }
}

Status BlockDevice::alloc_io_buffer(size_t bytes, void** out) {
  *out = std::aligned_alloc(4096, (bytes + 4095) & ~size_t{4095});
  return *out ? Status::ok() : Status::error(Code::kNoMemory, "out of memory");
}

void BlockDevice::free_io_buffer(void* p, size_t) {
  std::free(p);
}

// --- NvmeBlockDevice --------------------------------------------------------------------

std::unique_ptr<NvmeBlockDevice> NvmeBlockDevice::create(nvme::IoEngine& engine, uint32_t nsid,
                                                         uint32_t block_bytes, std::string* error) {
  auto b = cache::NvmeBackend::create(engine, nsid, block_bytes, error);
  if (!b) return nullptr;
  std::unique_ptr<NvmeBlockDevice> d(new NvmeBlockDevice());
  d->b_ = std::move(b);
  return d;
}

Status NvmeBlockDevice::read(uint64_t block, uint32_t count, void* buf) {
  Io io{block, count, false, static_cast<uint8_t*>(buf), {}};
  submit(&io, 1);
  return io.status;
}

Status NvmeBlockDevice::write(uint64_t block, uint32_t count, const void* buf) {
  Io io{block, count, true, static_cast<uint8_t*>(const_cast<void*>(buf)), {}};
  submit(&io, 1);
  return io.status;
}

void NvmeBlockDevice::submit(Io* ios, int n) {
  for (int at = 0; at < n; at += cache::Backend::kMaxOps) {
    b_->io(ios + at, std::min(n - at, cache::Backend::kMaxOps));
  }
}

Status NvmeBlockDevice::trim(uint64_t block, uint64_t count) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  return b_->trim(block, count);
}

// --- FileBlockDevice --------------------------------------------------------------------

std::unique_ptr<FileBlockDevice> FileBlockDevice::open(const std::string& path,
                                                       uint32_t block_bytes, std::string* error) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *error = path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < block_bytes || block_bytes == 0) {
    *error = path + ": too small for one block";
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<FileBlockDevice>(
      new FileBlockDevice(fd, block_bytes, static_cast<uint64_t>(st.st_size) / block_bytes));
}

FileBlockDevice::~FileBlockDevice() {
  ::close(fd_);
}

Status FileBlockDevice::read(uint64_t block, uint32_t count, void* buf) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  size_t left = size_t{count} * block_bytes_;
  auto* p = static_cast<uint8_t*>(buf);
  off_t off = static_cast<off_t>(block * block_bytes_);
  while (left > 0) {
    const ssize_t n = pread(fd_, p, left, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::error(Code::kIoError, "pread failed");
    p += n, off += n, left -= static_cast<size_t>(n);
  }
  return Status::ok();
}

Status FileBlockDevice::write(uint64_t block, uint32_t count, const void* buf) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  size_t left = size_t{count} * block_bytes_;
  const auto* p = static_cast<const uint8_t*>(buf);
  off_t off = static_cast<off_t>(block * block_bytes_);
  while (left > 0) {
    const ssize_t n = pwrite(fd_, p, left, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::error(Code::kIoError, "pwrite failed");
    p += n, off += n, left -= static_cast<size_t>(n);
  }
  return Status::ok();
}

Status FileBlockDevice::flush() {
  return fdatasync(fd_) == 0 ? Status::ok() : Status::error(Code::kIoError, "fdatasync failed");
}

Status FileBlockDevice::trim(uint64_t block, uint64_t count) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(block * block_bytes_),
                static_cast<off_t>(count * block_bytes_)) != 0) {
    return Status::error(Code::kIoError, "hole punch failed");
  }
  return Status::ok();
}

// --- CachedBlockDevice ------------------------------------------------------------------

// The cache's backend over any block device: lines are blocks.
class CachedBlockDevice::Adapter final : public cache::Backend {
 public:
  explicit Adapter(BlockDevice& d) : d_(d) {}
  uint32_t line_bytes() const override { return d_.block_bytes(); }
  uint64_t line_count() const override { return d_.block_count(); }
  Status alloc(size_t bytes, void** out) override { return d_.alloc_io_buffer(bytes, out); }
  void free(void* p, size_t bytes) override { d_.free_io_buffer(p, bytes); }
  void io(Op* ops, int n) override { d_.submit(ops, n); }
  Status flush() override { return d_.flush(); }
  Status trim(uint64_t block, uint64_t lines) override { return d_.trim(block, lines); }

 private:
  BlockDevice& d_;
};

CachedBlockDevice::CachedBlockDevice(BlockDevice& inner) : inner_(inner) {}
CachedBlockDevice::~CachedBlockDevice() {
  cache_.reset();
}

std::unique_ptr<CachedBlockDevice> CachedBlockDevice::create(BlockDevice& inner,
                                                             const cache::CacheOptions& o,
                                                             std::string* error) {
  std::unique_ptr<CachedBlockDevice> d(new CachedBlockDevice(inner));
  d->adapter_ = std::make_unique<Adapter>(inner);
  d->cache_ = cache::Cache::create(*d->adapter_, o, error);
  if (!d->cache_) return nullptr;
  d->bypass_lines_ = std::max<uint32_t>(o.bypass_lines, 1);
  return d;
}

// Moves up to 32 blocks per warp through the cache; lanes whose set is full of referenced
// lines go straight to the device (their blocks are not cached, so that is consistent).
Status CachedBlockDevice::through_cache(uint64_t block, uint32_t count, void* buf, bool write) {
  const uint32_t bb = block_bytes();
  auto* p = static_cast<uint8_t*>(buf);
  for (uint32_t at = 0; at < count; at += cache::Cache::kWarp) {
    const int n = static_cast<int>(std::min<uint32_t>(cache::Cache::kWarp, count - at));
    cache::Lane lanes[cache::Cache::kWarp];
    cache::LineRef refs[cache::Cache::kWarp];
    bool wrote[cache::Cache::kWarp] = {};
    for (int i = 0; i < n; ++i) {
      uint8_t* mine = p + (uint64_t{at} + static_cast<uint64_t>(i)) * bb;
      lanes[i] = write ? cache::Lane{block + at + i, cache::Intent::kWriteFull, mine}
                       : cache::Lane{block + at + i, cache::Intent::kRead, nullptr};
    }
    cache_->acquire(lanes, n, refs);
    Status result;
    for (int i = 0; i < n; ++i) {
      uint8_t* mine = p + (uint64_t{at} + static_cast<uint64_t>(i)) * bb;
      if (refs[i].status.is_ok()) {
        if (write) {
          std::memcpy(refs[i].data, mine, bb);
          wrote[i] = true;
        } else {
          std::memcpy(mine, refs[i].data, bb);
        }
      } else if (refs[i].status.code() == Code::kQueueFull) {
        // Set full: this block is not cached; go to the device through the cache's bypass,
        // which keeps any copy a concurrent fill brings in consistent.
        Status s = write ? cache_->write_direct(lanes[i].block, 1, mine)
                         : cache_->read_direct(lanes[i].block, 1, mine);
        if (!s.is_ok() && result.is_ok()) result = s;
      } else if (result.is_ok()) {
        result = refs[i].status;
      }
    }
    cache_->release(lanes, n, refs, wrote);
    if (!result.is_ok()) return result;
  }
  return Status::ok();
}

Status CachedBlockDevice::read(uint64_t block, uint32_t count, void* buf) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  if (count >= bypass_lines_) return cache_->read_direct(block, count, buf);
  return through_cache(block, count, buf, false);
}

Status CachedBlockDevice::read(cache::ReadStream* stream, uint64_t block, uint32_t count,
                               void* buf) {
  Status s = read(block, count, buf);
  if (s.is_ok()) cache_->note_read(stream, block, count);
  return s;
}

Status CachedBlockDevice::write(uint64_t block, uint32_t count, const void* buf) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  if (count >= bypass_lines_) return cache_->write_direct(block, count, buf);
  return through_cache(block, count, const_cast<void*>(buf), true);
}

Status CachedBlockDevice::flush() {
  return cache_->flush_all();
}

Status CachedBlockDevice::trim(uint64_t block, uint64_t count) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  (void)cache_->invalidate_range(block, count);  // lines in use keep their (stale) data
  return inner_.trim(block, count);
}

}  // namespace warpfs::blockdev
