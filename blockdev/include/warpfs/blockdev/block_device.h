// The block-device interface the filesystem reads and writes through: whole blocks, errors
// as values, a small vtable with one line of intent per entry (as ixy's device.h is).
// Implementations (devices.h): NvmeBlockDevice (an NVMe namespace, uncached),
// CachedBlockDevice (the warp-coalesced cache over a namespace) and FileBlockDevice
// (pread/pwrite on a file: a benchmark baseline only). stack.h assembles the one a DEVICE
// name stands for.
//
// Thread-safety: every method may be called from any number of threads. Concurrent writes
// to the same block, or a read racing a write of it, give one of the two contents of each
// block through the cache (a line is copied in and out whole: cache.h's copy_in/copy_out),
// and what the device gives where a transfer goes past it; a range of blocks is not one
// unit: callers (the filesystem) order conflicting accesses where they need more.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "warpfs/nvme/namespace_io.h"
#include "warpfs/nvme/port.h"
#include "warpfs/nvme/status.h"

namespace warpfs::blockdev {

using nvme::Code;
using nvme::Status;

class BlockDevice {
 public:
  // One transfer for submit(): `count` blocks from `block`, in the priority class it names
  // (the journal's and the metadata's I/O is nvme::Priority::kMetadata). The record the
  // namespace I/O unit takes, so nothing is translated on the way down.
  using Io = nvme::BlockIo;
  static constexpr int kMaxSubmit = nvme::NamespaceIo::kMaxIos;

  virtual ~BlockDevice() = default;
  virtual uint32_t block_bytes() const = 0;
  virtual uint64_t block_count() const = 0;
  // One transfer in the bulk class (file data).
  virtual Status read(uint64_t block, uint32_t count, void* buf) = 0;
  virtual Status write(uint64_t block, uint32_t count, const void* buf) = 0;
  // read() that brings nothing into a cache of the device's own: the blocks it holds come
  // from there, the others straight from the device into buf (for a reader that keeps its
  // own copy: an O_DIRECT reader, the kernel's page cache; as the kernel's direct reads leave
  // the page cache alone). Default: read().
  virtual Status read_uncached(uint64_t block, uint32_t count, void* buf) {
    return read(block, count, buf);
  }
  // A read in flight from read_uncached_start(), polled to its end by whoever holds it (one
  // thread at a time; it may pass between threads where a lock or a queue orders their
  // uses). Destroying one in flight waits for it.
  class PendingRead {
   public:
    virtual ~PendingRead() = default;
    // True once the read has ended; status() then says how.
    virtual bool poll() = 0;
    // Sleeps (bounded) or backs off until it may have ended: after a poll() that said no;
    // `b` is the caller's, reset by it when a poll succeeds.
    virtual void idle(port::Backoff& b) = 0;
    virtual Status status() const = 0;
  };
  // read_uncached() in two halves, for a caller that answers a request when its data is in
  // and meanwhile serves others (the FUSE daemon): where the read is still in flight on
  // return, `*pending` is set and `buf` must stay until its poll() returns true; otherwise the
  // read has ended, `*pending` is empty and the result is returned. Default: read_uncached().
  virtual Status read_uncached_start(uint64_t block, uint32_t count, void* buf,
                                     std::unique_ptr<PendingRead>* pending) {
    pending->reset();
    return read_uncached(block, count, buf);
  }
  // Everything written before is durable when this returns ok: what a cache of the device's
  // own holds is written back (write_back of every block), then flush_device().
  virtual Status flush() = 0;
  // A run of blocks, for write_back().
  struct Range {
    uint64_t block = 0;
    uint64_t count = 0;
  };
  // Every write of the ranges' blocks that returned before this call has reached the device
  // when it returns ok (a software cache writes those blocks' dirty lines back, and waits for
  // write-backs of them already in flight); nothing is flushed: the device may still hold
  // them in its volatile write cache. Default: nothing to do (writes go to the device).
  virtual Status write_back(const Range* ranges, size_t n);
  // The device's own flush alone: every write that reached the device before the call is
  // durable when it returns ok (NVMe Flush). A cache's dirty lines are not written back.
  // Default: flush() (a device with no cache of its own).
  virtual Status flush_device() { return flush(); }
  // The blocks' contents are no longer needed (reads return zeroes or old data).
  virtual Status trim(uint64_t block, uint64_t count) = 0;
  // Several transfers (any number), in flight together where the device can; sets each
  // one's status. Default: read() and write() in turn (no priorities).
  virtual void submit(Io* ios, int n);
  // Memory the device moves without a copy (DMA memory for NVMe). Default: aligned heap.
  virtual Status alloc_io_buffer(size_t bytes, void** out);
  virtual void free_io_buffer(void* p, size_t bytes);

  // Copies, for a checker that compares them (a mirrored RAID set keeps 2 or more of each
  // block; a plain device one). The defaults describe one copy: the device itself.
  virtual uint32_t copies() const { return 1; }
  // How many blocks from `block` (at most `count`) keep their copies on the same devices.
  virtual uint64_t copy_run(uint64_t, uint64_t count) const { return count; }
  // Who holds copy `c` of `block`, for reports ("member 1 (b.img)"); "" when that copy is
  // not kept (a failed member's): it is neither read nor written.
  virtual std::string copy_holder(uint64_t, uint32_t c) const { return c == 0 ? "the device" : ""; }
  // Copy `c` alone of blocks [block, block + count): no failover to another copy, and a
  // write reaches that copy only (flush() makes it durable as any write).
  virtual Status read_copy(uint64_t block, uint32_t count, uint32_t, void* buf) {
    return read(block, count, buf);
  }
  virtual Status write_copy(uint64_t block, uint32_t count, uint32_t, const void* buf) {
    return write(block, count, buf);
  }

 protected:
  // One bulk-class transfer through submit(): read() and write() of the devices whose
  // submit() is their real path. (Never from a submit() that calls read() or write().)
  Status submit_one(uint64_t block, uint32_t count, void* buf, bool write);
  // Range check shared by the implementations.
  Status check(uint64_t block, uint64_t count) const {
    if (count == 0 || block >= block_count() || count > block_count() - block) {
      return Status::error(Code::kInvalidArgument, "block range beyond the device");
    }
    return Status::ok();
  }
};

// Memory for transfers that grows: from the device's alloc_io_buffer (memory it moves without
// a copy: DMA memory on NVMe), heap memory where the device gives none (transfers from it are
// bounced) or where there is no device. Move-only; the device outlives it. Not thread-safe:
// one owner at a time.
class IoBuffer {
 public:
  explicit IoBuffer(BlockDevice* dev = nullptr) : dev_(dev) {}
  ~IoBuffer() { release(); }
  IoBuffer(IoBuffer&& o) noexcept { take(o); }
  IoBuffer& operator=(IoBuffer&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;
  // At least `bytes` long: a shorter buffer is given back and one of exactly `bytes` taken.
  // The contents are not kept.
  void reserve(size_t bytes);
  uint8_t* data() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  void release();
  void take(IoBuffer& o) {
    dev_ = o.dev_, p_ = o.p_, bytes_ = o.bytes_, from_device_ = o.from_device_;
    o.p_ = nullptr, o.bytes_ = 0;
  }
  BlockDevice* dev_;
  uint8_t* p_ = nullptr;
  size_t bytes_ = 0;
  bool from_device_ = false;  // p_ from dev_->alloc_io_buffer, else new[]
};

}  // namespace warpfs::blockdev
