// The block devices. See block_device.h for the contract.
#pragma once

#include <memory>
#include <string>

#include "warpfs/blockdev/block_device.h"
#include "warpfs/cache/cache.h"
#include "warpfs/cache/nvme_backend.h"

namespace warpfs::blockdev {

// An NVMe namespace through the IoEngine's queue mapper, in blocks of `block_bytes`.
// Buffers from alloc_io_buffer() move without a copy; others are bounced.
class NvmeBlockDevice final : public BlockDevice {
 public:
  static std::unique_ptr<NvmeBlockDevice> create(nvme::IoEngine& engine, uint32_t nsid,
                                                 uint32_t block_bytes, std::string* error);
  uint32_t block_bytes() const override { return b_->line_bytes(); }
  uint64_t block_count() const override { return b_->line_count(); }
  Status read(uint64_t block, uint32_t count, void* buf) override;
  Status write(uint64_t block, uint32_t count, const void* buf) override;
  Status flush() override { return b_->flush(); }
  Status trim(uint64_t block, uint64_t count) override;
  void submit(Io* ios, int n) override;
  Status alloc_io_buffer(size_t bytes, void** out) override { return b_->alloc(bytes, out); }
  void free_io_buffer(void* p, size_t bytes) override { b_->free(p, bytes); }

 private:
  std::unique_ptr<cache::NvmeBackend> b_;
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

// The warp-coalesced cache over any block device. Reads and writes of fewer than
// bypass_lines blocks go through the cache 32 lanes at a time; larger ones bypass it
// (consistent with dirty cached lines). A block whose cache set is full of referenced lines
// goes straight to the device. flush() writes dirty lines back, then flushes the device.
class CachedBlockDevice final : public BlockDevice {
 public:
  static std::unique_ptr<CachedBlockDevice> create(BlockDevice& inner, const cache::CacheOptions& o,
                                                   std::string* error);
  ~CachedBlockDevice() override;
  uint32_t block_bytes() const override { return inner_.block_bytes(); }
  uint64_t block_count() const override { return inner_.block_count(); }
  Status read(uint64_t block, uint32_t count, void* buf) override;
  Status write(uint64_t block, uint32_t count, const void* buf) override;
  Status flush() override;
  Status trim(uint64_t block, uint64_t count) override;
  Status alloc_io_buffer(size_t bytes, void** out) override {
    return inner_.alloc_io_buffer(bytes, out);
  }
  void free_io_buffer(void* p, size_t bytes) override { inner_.free_io_buffer(p, bytes); }
  // A read on a stream: sequential streams get read-ahead (SPIN's P-readahead).
  Status read(cache::ReadStream* stream, uint64_t block, uint32_t count, void* buf);
  cache::Cache& cache() { return *cache_; }

 private:
  class Adapter;
  CachedBlockDevice(BlockDevice& inner);
  Status through_cache(uint64_t block, uint32_t count, void* buf, bool write);
  BlockDevice& inner_;
  std::unique_ptr<Adapter> adapter_;
  std::unique_ptr<cache::Cache> cache_;
  uint32_t bypass_lines_ = 32;
};

}  // namespace warpfs::blockdev
