// What the cache reads lines from and writes them back to. The cache sits above nvme/ and
// below blockdev/: NvmeBackend (here) drives a namespace through the queue mapper with one
// IoBatch per warp; blockdev/ adapts any BlockDevice to this interface.
//
// Thread-safety: io() and flush() may be called from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "warpfs/nvme/status.h"

namespace warpfs::cache {

using nvme::Code;
using nvme::Status;

class Backend {
 public:
  // One transfer of `lines` whole lines starting at line `block`.
  struct Op {
    uint64_t block = 0;
    uint32_t lines = 1;
    bool write = false;
    uint8_t* data = nullptr;
    Status status;
  };
  static constexpr int kMaxOps = 32;  // one warp

  virtual ~Backend() = default;
  virtual uint32_t line_bytes() const = 0;
  virtual uint64_t line_count() const = 0;
  // Memory the backend moves data to and from without copying (DMA memory for NVMe).
  virtual Status alloc(size_t bytes, void** out) = 0;
  virtual void free(void* p, size_t bytes) = 0;
  // Performs every op (at most kMaxOps), all in flight together where the device allows;
  // sets each op's status. Data outside alloc()'d memory is bounced through a copy.
  virtual void io(Op* ops, int n) = 0;
  // Makes everything written so far durable (NVMe Flush).
  virtual Status flush() = 0;
  // Tells the device the lines no longer hold data (NVMe Dataset Management, deallocate).
  virtual Status trim(uint64_t block, uint64_t lines) = 0;
};

}  // namespace warpfs::cache
