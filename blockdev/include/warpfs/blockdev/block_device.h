// The block-device interface the filesystem reads and writes through: whole blocks, errors
// as values. Implementations: NvmeBlockDevice (a namespace through the queue mapper),
// CachedBlockDevice (the warp-coalesced cache over any block device) and FileBlockDevice
// (pread/pwrite on a file: a benchmark baseline only).
//
// Thread-safety: every method may be called from any number of threads. Concurrent writes
// to the same block, or a read racing a write of it, give one of the two contents: callers
// (the filesystem) order conflicting accesses themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "warpfs/cache/backend.h"
#include "warpfs/nvme/status.h"

namespace warpfs::blockdev {

using nvme::Code;
using nvme::Status;

class BlockDevice {
 public:
  // One transfer for submit(): `lines` blocks from `block`. The same record the cache hands
  // its backend, so a cached device passes its fills and write-backs through unchanged.
  using Io = cache::Backend::Op;

  virtual ~BlockDevice() = default;
  virtual uint32_t block_bytes() const = 0;
  virtual uint64_t block_count() const = 0;
  virtual Status read(uint64_t block, uint32_t count, void* buf) = 0;
  virtual Status write(uint64_t block, uint32_t count, const void* buf) = 0;
  // Everything written before is durable when this returns ok.
  virtual Status flush() = 0;
  // The blocks' contents are no longer needed (reads return zeroes or old data).
  virtual Status trim(uint64_t block, uint64_t count) = 0;
  // Several transfers, in flight together where the device can (at most 32). Default: in turn.
  virtual void submit(Io* ios, int n);
  // Memory the device moves without a copy (DMA memory for NVMe). Default: aligned heap.
  virtual Status alloc_io_buffer(size_t bytes, void** out);
  virtual void free_io_buffer(void* p, size_t bytes);

 protected:
  // Range check shared by the implementations.
  Status check(uint64_t block, uint64_t count) const {
    if (count == 0 || block >= block_count() || count > block_count() - block) {
      return Status::error(Code::kInvalidArgument, "block range beyond the device");
    }
    return Status::ok();
  }
};

}  // namespace warpfs::blockdev
