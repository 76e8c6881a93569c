// The block devices. See block_device.h for the contract; stack.h builds them for a DEVICE.
#pragma once

#include <memory>
#include <string>

#include "warpfs/blockdev/block_device.h"
#include "warpfs/cache/backend.h"
#include "warpfs/cache/cache.h"
#include "warpfs/nvme/namespace_io.h"

namespace warpfs::blockdev {

// An NVMe namespace, uncached: every call is device I/O through the namespace I/O unit.
// Buffers from alloc_io_buffer() move without a copy; others are bounced.
class NvmeBlockDevice final : public BlockDevice {
 public:
  // Over a namespace the caller keeps alive (the device stack's).
  explicit NvmeBlockDevice(nvme::NamespaceIo& ns) : ns_(ns) {}
  // Opens namespace `nsid` in blocks of `block_bytes` and owns it (tests, tools).
  static std::unique_ptr<NvmeBlockDevice> create(nvme::IoEngine& engine, uint32_t nsid,
                                                 uint32_t block_bytes, std::string* error);
  uint32_t block_bytes() const override { return ns_.block_bytes(); }
  uint64_t block_count() const override { return ns_.block_count(); }
  Status read(uint64_t block, uint32_t count, void* buf) override;
  Status write(uint64_t block, uint32_t count, const void* buf) override;
  Status read_uncached_start(uint64_t block, uint32_t count, void* buf,
                             std::unique_ptr<PendingRead>* pending) override;
  Status flush() override { return ns_.flush(); }
  Status trim(uint64_t block, uint64_t count) override;
  void submit(Io* ios, int n) override;
  Status alloc_io_buffer(size_t bytes, void** out) override { return ns_.alloc(bytes, out); }
  void free_io_buffer(void* p, size_t bytes) override { ns_.free(p, bytes); }

 private:
  NvmeBlockDevice(std::unique_ptr<nvme::NamespaceIo> owned)
      : owned_(std::move(owned)), ns_(*owned_) {}
  std::unique_ptr<nvme::NamespaceIo> owned_;  // null when the caller keeps the namespace
  nvme::NamespaceIo& ns_;
};

// A plain file through pread/pwrite/fdatasync: the baseline the benchmarks compare with.
class FileBlockDevice final : public BlockDevice {
 public:
  static std::unique_ptr<FileBlockDevice> open(const std::string& path, uint32_t block_bytes,
                                               std::string* error);
  ~FileBlockDevice() override;
  uint32_t block_bytes() const override { return block_bytes_; }
  uint64_t block_count() const override { return blocks_; }
  Status read(uint64_t block, uint32_t count, void* buf) override;
  Status write(uint64_t block, uint32_t count, const void* buf) override;
  Status flush() override;
  Status trim(uint64_t block, uint64_t count) override;

 private:
  FileBlockDevice(int fd, uint32_t bb, uint64_t blocks)
      : fd_(fd), block_bytes_(bb), blocks_(blocks) {}
  int fd_;
  uint32_t block_bytes_;
  uint64_t blocks_;
};

// The warp-coalesced cache (cache.h) over the cache's backend: the layer below, called
// directly. Transfers of fewer than bypass_lines blocks go through the cache, 32 lanes (one
// warp) at a time, whatever transfer each lane belongs to: a batch of single-block writes
// (a journal checkpoint) is one acquire per 32 blocks. Larger transfers bypass the cache
// (consistent with dirty cached lines). A block whose cache set is full of referenced lines
// goes straight to the device. Each transfer's priority class reaches the device with its
// fills, write-backs and bypasses. flush() writes every dirty line back, then flushes the
// device; write_back() writes back only the named blocks' lines (no scan of the cache), and
// flush_device() is the device's Flush alone (fsync: FsImpl::fsync).
class CachedBlockDevice final : public BlockDevice {
 public:
  static std::unique_ptr<CachedBlockDevice> create(cache::Backend& below,
                                                   const cache::CacheOptions& o,
                                                   std::string* error);
  ~CachedBlockDevice() override;
  uint32_t block_bytes() const override { return below_.line_bytes(); }
  uint64_t block_count() const override { return below_.line_count(); }
  Status read(uint64_t block, uint32_t count, void* buf) override;
  Status write(uint64_t block, uint32_t count, const void* buf) override;
  Status read_uncached(uint64_t block, uint32_t count, void* buf) override;
  Status read_uncached_start(uint64_t block, uint32_t count, void* buf,
                             std::unique_ptr<PendingRead>* pending) override;
  Status flush() override;
  Status write_back(const Range* ranges, size_t n) override;
  Status flush_device() override;
  Status trim(uint64_t block, uint64_t count) override;
  void submit(Io* ios, int n) override;
  Status alloc_io_buffer(size_t bytes, void** out) override { return below_.alloc(bytes, out); }
  void free_io_buffer(void* p, size_t bytes) override { below_.free(p, bytes); }
  cache::Cache& cache() { return *cache_; }

 private:
  // Which transfer a lane serves, and its block's place in it.
  struct LaneOf {
    int io;
    uint32_t at;
  };
  explicit CachedBlockDevice(cache::Backend& below) : below_(below) {}
  void run_warp(Io* ios, const cache::Lane* lanes, const LaneOf* of, int n);
  // [block, block + count) of `io`, whose data is at `data`, around the cache, in its class.
  Status bypass(const Io& io, uint64_t block, uint64_t count, uint8_t* data);
  cache::Backend& below_;
  std::unique_ptr<cache::Cache> cache_;
  uint32_t bypass_lines_ = 32;
};

}  // namespace warpfs::blockdev
