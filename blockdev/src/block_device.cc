#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "warpfs/blockdev/devices.h"

namespace warpfs::blockdev {

void BlockDevice::submit(Io* ios, int n) {
  for (int i = 0; i < n; ++i) {
    ios[i].status = ios[i].write ? write(ios[i].block, ios[i].count, ios[i].data)
                                 : read(ios[i].block, ios[i].count, ios[i].data);
  }
}

Status BlockDevice::write_back(const Range*, size_t) {
  return Status::ok();
}

Status BlockDevice::alloc_io_buffer(size_t bytes, void** out) {
  *out = std::aligned_alloc(4096, (bytes + 4095) & ~size_t{4095});
  return *out ? Status::ok() : Status::error(Code::kNoMemory, "out of memory");
}

void BlockDevice::free_io_buffer(void* p, size_t) {
  std::free(p);
}

void IoBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  release();
  void* p = nullptr;
  from_device_ = dev_ != nullptr && dev_->alloc_io_buffer(bytes, &p).is_ok() && p != nullptr;
  p_ = from_device_ ? static_cast<uint8_t*>(p) : new uint8_t[bytes];
  bytes_ = bytes;
}

void IoBuffer::release() {
  if (p_ == nullptr) return;
  if (from_device_) {
    dev_->free_io_buffer(p_, bytes_);
  } else {
    delete[] p_;
  }
  p_ = nullptr;
  bytes_ = 0;
}

Status BlockDevice::submit_one(uint64_t block, uint32_t count, void* buf, bool write) {
  Io io{block, count, write, static_cast<uint8_t*>(buf), {}};
  submit(&io, 1);
  return io.status;
}

// --- NvmeBlockDevice --------------------------------------------------------------------

std::unique_ptr<NvmeBlockDevice> NvmeBlockDevice::create(nvme::IoEngine& engine, uint32_t nsid,
                                                         uint32_t block_bytes, std::string* error) {
  auto ns = nvme::NamespaceIo::create(engine, nsid, block_bytes, error);
  if (!ns) return nullptr;
  return std::unique_ptr<NvmeBlockDevice>(new NvmeBlockDevice(std::move(ns)));
}

Status NvmeBlockDevice::read(uint64_t block, uint32_t count, void* buf) {
  return submit_one(block, count, buf, false);
}

Status NvmeBlockDevice::write(uint64_t block, uint32_t count, const void* buf) {
  return submit_one(block, count, const_cast<void*>(buf), true);
}

void NvmeBlockDevice::submit(Io* ios, int n) {
  for (int at = 0; at < n; at += kMaxSubmit) ns_.io(ios + at, std::min(n - at, kMaxSubmit));
}

Status NvmeBlockDevice::trim(uint64_t block, uint64_t count) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  return ns_.trim(block, count);
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

CachedBlockDevice::~CachedBlockDevice() {
  cache_.reset();
}

std::unique_ptr<CachedBlockDevice> CachedBlockDevice::create(cache::Backend& below,
                                                             const cache::CacheOptions& o,
                                                             std::string* error) {
  std::unique_ptr<CachedBlockDevice> d(new CachedBlockDevice(below));
  d->cache_ = cache::Cache::create(below, o, error);
  if (!d->cache_) return nullptr;
  d->bypass_lines_ = std::max<uint32_t>(o.bypass_lines, 1);
  return d;
}

Status CachedBlockDevice::read(uint64_t block, uint32_t count, void* buf) {
  return submit_one(block, count, buf, false);
}

Status CachedBlockDevice::write(uint64_t block, uint32_t count, const void* buf) {
  return submit_one(block, count, const_cast<void*>(buf), true);
}

// Cache::read_direct: no line taken, the cached ones read from (a 4 KiB O_DIRECT read that
// misses costs one device read into the request's buffer instead of a victim, a fill and a
// copy out of the line).
Status CachedBlockDevice::read_uncached(uint64_t block, uint32_t count, void* buf) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  return cache_->read_direct(block, count, buf, nvme::Priority::kBulk);
}

namespace {

class CachePendingRead final : public BlockDevice::PendingRead {
 public:
  explicit CachePendingRead(std::unique_ptr<cache::Cache::DirectRead> r) : r_(std::move(r)) {}
  bool poll() override { return r_->poll(); }
  void idle(port::Backoff& b) override { r_->idle(b); }
  Status status() const override { return r_->status(); }

 private:
  std::unique_ptr<cache::Cache::DirectRead> r_;
};

class NvmePendingRead final : public BlockDevice::PendingRead {
 public:
  explicit NvmePendingRead(nvme::NamespaceIo& ns) : s(ns) {}
  bool poll() override { return s.poll(); }
  void idle(port::Backoff& b) override { s.idle(b); }
  Status status() const override { return io.status; }
  nvme::BlockIo io;
  nvme::NamespaceIo::Started s;
};

}  // namespace

Status CachedBlockDevice::read_uncached_start(uint64_t block, uint32_t count, void* buf,
                                              std::unique_ptr<PendingRead>* pending) {
  pending->reset();
  if (Status s = check(block, count); !s.is_ok()) return s;
  std::unique_ptr<cache::Cache::DirectRead> r;
  const Status s = cache_->read_direct_start(block, count, buf, nvme::Priority::kBulk, &r);
  if (r != nullptr) *pending = std::make_unique<CachePendingRead>(std::move(r));
  return s;
}

Status NvmeBlockDevice::read_uncached_start(uint64_t block, uint32_t count, void* buf,
                                            std::unique_ptr<PendingRead>* pending) {
  pending->reset();
  if (Status s = check(block, count); !s.is_ok()) return s;
  auto r = std::make_unique<NvmePendingRead>(ns_);
  r->io.block = block;
  r->io.count = count;
  r->io.data = static_cast<uint8_t*>(buf);
  ns_.start(&r->io, 1, &r->s);
  if (r->s.poll()) return r->io.status;
  *pending = std::move(r);
  return Status::ok();
}

// Large transfers go around the cache at once; the blocks of the others are gathered into
// warps of 32 lanes, whichever transfer each belongs to.
void CachedBlockDevice::submit(Io* ios, int n) {
  cache::Lane lanes[cache::Cache::kWarp];
  LaneOf of[cache::Cache::kWarp];
  int nl = 0;
  for (int i = 0; i < n; ++i) {
    Io& io = ios[i];
    io.status = check(io.block, io.count);
    if (!io.status.is_ok()) continue;
    if (io.count >= bypass_lines_) {
      io.status = bypass(io, io.block, io.count, io.data);
      continue;
    }
    for (uint32_t at = 0; at < io.count; ++at) {
      const uint8_t* mine = io.data + uint64_t{at} * block_bytes();
      lanes[nl] = io.write
                      ? cache::Lane{io.block + at, cache::Intent::kWriteFull, mine, io.priority}
                      : cache::Lane{io.block + at, cache::Intent::kRead, nullptr, io.priority};
      of[nl++] = LaneOf{i, at};
      if (nl == cache::Cache::kWarp) {
        run_warp(ios, lanes, of, nl);
        nl = 0;
      }
    }
  }
  if (nl > 0) run_warp(ios, lanes, of, nl);
}

// One warp through the cache. A lane whose set is full of referenced lines goes to the device
// through the cache's bypass, which keeps any copy a concurrent fill brings in consistent
// (the block is not cached, so that is all consistency needs). A transfer keeps its first
// error.
void CachedBlockDevice::run_warp(Io* ios, const cache::Lane* lanes, const LaneOf* of, int n) {
  const uint32_t bb = block_bytes();
  cache::LineRef refs[cache::Cache::kWarp];
  bool wrote[cache::Cache::kWarp] = {};
  cache_->acquire(lanes, n, refs);
  for (int i = 0; i < n; ++i) {
    Io& io = ios[of[i].io];
    uint8_t* mine = io.data + uint64_t{of[i].at} * bb;
    Status s = refs[i].status;
    if (s.is_ok() && io.write) {
      if (!refs[i].holds_src) cache_->copy_in(refs[i], 0, mine, bb);
      wrote[i] = true;
    } else if (s.is_ok()) {
      cache_->copy_out(refs[i], 0, mine, bb);
    } else if (s.code() == Code::kSetFull) {
      s = bypass(io, lanes[i].block, 1, mine);
    }
    if (!s.is_ok() && io.status.is_ok()) io.status = s;
  }
  cache_->release(lanes, n, refs, wrote);
}

Status CachedBlockDevice::bypass(const Io& io, uint64_t block, uint64_t count, uint8_t* data) {
  return io.write ? cache_->write_direct(block, count, data, io.priority)
                  : cache_->read_direct(block, count, data, io.priority);
}

Status CachedBlockDevice::flush() {
  return cache_->flush_all();
}

Status CachedBlockDevice::write_back(const Range* ranges, size_t n) {
  std::vector<cache::Cache::Range> rs(n);
  for (size_t i = 0; i < n; ++i) {
    if (Status s = check(ranges[i].block, ranges[i].count); !s.is_ok()) return s;
    rs[i] = cache::Cache::Range{ranges[i].block, ranges[i].count};
  }
  return cache_->write_back(rs.data(), rs.size());
}

Status CachedBlockDevice::flush_device() {
  return below_.flush();
}

Status CachedBlockDevice::trim(uint64_t block, uint64_t count) {
  if (Status s = check(block, count); !s.is_ok()) return s;
  (void)cache_->invalidate_range(block, count);  // lines in use keep their (stale) data
  return below_.trim(block, count);
}

}  // namespace warpfs::blockdev
