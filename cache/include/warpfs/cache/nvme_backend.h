// NvmeBackend: cache lines on an NVMe namespace, through the IoEngine's queue mapper. A
// warp's ops go out as one IoBatch (up to 32 commands in flight from one thread); transfers
// longer than MDTS are split; PRP lists come from a per-thread pool. Lines are read and
// written as LBA ranges: line b is LBAs [b * L, (b + 1) * L) with L = line_bytes / lba_bytes.
//
// Thread-safety: everything may be called from any number of threads.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "warpfs/cache/backend.h"
#include "warpfs/nvme/io_engine.h"
#include "warpfs/nvme/port.h"
#include "warpfs/nvme/transport.h"

namespace warpfs::cache {

namespace port = warpfs::port;

class NvmeBackend final : public Backend {
 public:
  // REQUIRES: line_bytes is a multiple of the namespace's LBA size and of 512, <= 64 KiB.
  static std::unique_ptr<NvmeBackend> create(nvme::IoEngine& engine, uint32_t nsid,
                                             uint32_t line_bytes, std::string* error);
  ~NvmeBackend() override;

  uint32_t line_bytes() const override { return line_bytes_; }
  uint64_t line_count() const override { return line_count_; }
  Status alloc(size_t bytes, void** out) override;
  void free(void* p, size_t bytes) override;
  void io(Op* ops, int n) override;
  Status flush() override;
  Status trim(uint64_t block, uint64_t lines) override;

 private:
  NvmeBackend(nvme::IoEngine& e, uint32_t nsid);  // in the .cc: ScratchPool is complete there
  // The bus address of [p, p + len) if it lies inside memory from alloc(), else 0.
  uint64_t iova_of(const void* p, size_t len);

  class ScratchPool;  // DMA scratch (PRP lists, bounce buffers) reused across calls
  std::unique_ptr<ScratchPool> pool_;
  nvme::IoEngine& e_;
  nvme::Transport& t_;
  uint32_t nsid_;
  uint32_t line_bytes_ = 0;
  uint32_t lba_shift_ = 0;
  uint64_t line_count_ = 0;
  uint32_t max_transfer_ = 0;
  // Memory from alloc(): written under mu_ (rare), read lock-free by io() on every miss.
  // A slot is live while `bytes` is non-zero; published with release, read with acquire.
  struct Region {
    port::Atomic<uint64_t> vaddr, iova, bytes;
  };
  static constexpr uint32_t kMaxRegions = 256;
  std::mutex mu_;
  Region regions_[kMaxRegions] = {};
  port::Atomic<uint32_t> nregions_ = {};
  std::vector<nvme::DmaRegion> owned_;  // under mu_, for free() and the destructor
};

}  // namespace warpfs::cache
