// What the cache reads lines from and writes them back to: its one seam downward. A line is
// one block of the backend. The product's backend is an NVMe namespace (NamespaceBackend
// below, over nvme::NamespaceIo); tests and benchmarks may put anything behind the seam.
//
// Thread-safety: every method may be called from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "warpfs/nvme/namespace_io.h"
#include "warpfs/nvme/port.h"
#include "warpfs/nvme/status.h"

namespace warpfs::cache {

using nvme::Code;
using nvme::Status;

class Backend {
 public:
  // One transfer of `count` whole lines from line `block`, in the priority class it names.
  using Op = nvme::BlockIo;
  static constexpr int kMaxOps = nvme::NamespaceIo::kMaxIos;  // one warp

  virtual ~Backend() = default;
  virtual uint32_t line_bytes() const = 0;
  virtual uint64_t line_count() const = 0;
  // Memory the backend moves data to and from without copying (DMA memory for NVMe).
  virtual Status alloc(size_t bytes, void** out) = 0;
  virtual void free(void* p, size_t bytes) = 0;
  // Performs every op (at most kMaxOps), all in flight together where the device allows;
  // sets each op's status. Data outside alloc()'d memory is bounced through a copy.
  virtual void io(Op* ops, int n) = 0;
  // An op in flight from start(), polled to its end by whoever holds it (one thread at a
  // time). Destroying one in flight waits for it.
  class Started {
   public:
    virtual ~Started() = default;
    // True once the op has ended (its status set).
    virtual bool poll() = 0;
    // Sleeps (bounded) or backs off until it may have ended: after a poll() that said no.
    virtual void idle(port::Backoff& b) = 0;
  };
  // io() of one op in two halves: returns with it in flight and `*out` set where the backend
  // can (the op and its memory stay until out's poll() returns true), else performs it and
  // leaves *out empty. Default: io().
  virtual void start(Op* op, std::unique_ptr<Started>* out) {
    out->reset();
    io(op, 1);
  }
  // Makes everything written so far durable (NVMe Flush).
  virtual Status flush() = 0;
  // Tells the device the lines no longer hold data (NVMe Dataset Management, deallocate).
  virtual Status trim(uint64_t block, uint64_t lines) = 0;
};

// Lines on an NVMe namespace: each call goes straight to the namespace I/O unit.
class NamespaceBackend final : public Backend {
 public:
  explicit NamespaceBackend(nvme::NamespaceIo& ns) : ns_(ns) {}
  uint32_t line_bytes() const override { return ns_.block_bytes(); }
  uint64_t line_count() const override { return ns_.block_count(); }
  Status alloc(size_t bytes, void** out) override { return ns_.alloc(bytes, out); }
  void free(void* p, size_t bytes) override { ns_.free(p, bytes); }
  void io(Op* ops, int n) override { ns_.io(ops, n); }
  void start(Op* op, std::unique_ptr<Started>* out) override;
  Status flush() override { return ns_.flush(); }
  Status trim(uint64_t block, uint64_t lines) override { return ns_.trim(block, lines); }
  nvme::NamespaceIo& ns() { return ns_; }

 private:
  nvme::NamespaceIo& ns_;
};

}  // namespace warpfs::cache
