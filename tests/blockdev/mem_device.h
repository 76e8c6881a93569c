// A block device in RAM for RAID tests and the RAID fuzz target: counts its calls and fails
// what a test asks it to.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "warpfs/blockdev/block_device.h"

namespace warpfs::blockdev::test {

// A member in RAM that counts its calls and fails what a test asks it to. Blocks of distinct
// callers are distinct (callers order conflicting accesses), so data needs no lock.
class MemDevice final : public BlockDevice {
 public:
  static constexpr uint32_t kBytes = 4096;
  explicit MemDevice(uint64_t blocks) : data_(blocks * kBytes), blocks_(blocks) {}
  uint32_t block_bytes() const override { return kBytes; }
  uint64_t block_count() const override { return blocks_; }
  Status read(uint64_t b, uint32_t n, void* buf) override {
    if (Status s = check(b, n); !s.is_ok()) return s;
    reads.fetch_add(1);
    if (dead.load() || (b < bad_read_end.load() && b + n > bad_read_begin.load()))
      return Status::error(Code::kIoError, "injected read error");
    std::memcpy(buf, data_.data() + b * kBytes, size_t{n} * kBytes);
    return Status::ok();
  }
  // As read(), counted apart too (a device with a cache of its own takes no line here).
  Status read_uncached(uint64_t b, uint32_t n, void* buf) override {
    uncached_reads.fetch_add(1);
    return read(b, n, buf);
  }
  // With `hold_started` set, a read into this device's own memory (alloc_io_buffer) left in
  // flight until the test clears it: the read happens (and an injected error is chosen) at
  // the poll that finds it released. Into other memory it is read at once, as a driver
  // bounces a buffer that is not its DMA memory.
  Status read_uncached_start(uint64_t b, uint32_t n, void* buf,
                             std::unique_ptr<PendingRead>* pending) override {
    pending->reset();
    if (!hold_started.load() || !owns(buf)) return read_uncached(b, n, buf);
    started_reads.fetch_add(1);
    *pending = std::make_unique<Held>(this, b, n, buf);
    return Status::ok();
  }
  Status write(uint64_t b, uint32_t n, const void* buf) override {
    if (Status s = check(b, n); !s.is_ok()) return s;
    if (gate) gate();
    writes.fetch_add(1);
    if (dead.load() || fail_writes.load())
      return Status::error(Code::kIoError, "injected write error");
    std::memcpy(data_.data() + b * kBytes, buf, size_t{n} * kBytes);
    return Status::ok();
  }
  Status flush() override {
    flushes.fetch_add(1);
    return dead.load() ? Status::error(Code::kIoError, "injected flush error") : Status::ok();
  }
  Status trim(uint64_t b, uint64_t n) override {
    if (Status s = check(b, n); !s.is_ok()) return s;
    trims.fetch_add(1);
    std::memset(data_.data() + b * kBytes, 0, n * kBytes);
    return Status::ok();
  }
  // Its own I/O memory, as a driver's DMA memory is.
  Status alloc_io_buffer(size_t bytes, void** out) override {
    *out = ::operator new (bytes, std::align_val_t{kBytes});
    std::lock_guard<std::mutex> g(mu_);
    owned_[*out] = bytes;
    return Status::ok();
  }
  void free_io_buffer(void* p, size_t) override {
    {
      std::lock_guard<std::mutex> g(mu_);
      owned_.erase(p);
    }
    ::operator delete (p, std::align_val_t{kBytes});
  }
  bool owns(const void* buf) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = owned_.upper_bound(const_cast<void*>(buf));
    if (it == owned_.begin()) return false;
    --it;
    return reinterpret_cast<uintptr_t>(buf) < reinterpret_cast<uintptr_t>(it->first) + it->second;
  }
  uint8_t* at(uint64_t b) { return data_.data() + b * kBytes; }
  std::atomic<uint64_t> reads{0}, writes{0}, flushes{0}, trims{0};
  std::atomic<uint64_t> uncached_reads{0};  // of `reads`, those through read_uncached
  std::atomic<bool> hold_started{false};    // read_uncached_start leaves reads in flight
  std::atomic<uint64_t> started_reads{0};   // reads it left in flight
  std::atomic<bool> dead{false}, fail_writes{false};
  std::atomic<uint64_t> bad_read_begin{0}, bad_read_end{0};
  std::function<void()> gate;  // set before the device is used; runs in write()

 private:
  class Held final : public PendingRead {
   public:
    Held(MemDevice* d, uint64_t b, uint32_t n, void* buf) : d_(d), b_(b), n_(n), buf_(buf) {}
    bool poll() override {
      if (done_) return true;
      if (d_->hold_started.load()) return false;
      status_ = d_->read_uncached(b_, n_, buf_);
      done_ = true;
      return true;
    }
    void idle(port::Backoff& b) override { b.pause(); }
    Status status() const override { return status_; }

   private:
    MemDevice* const d_;
    const uint64_t b_;
    const uint32_t n_;
    void* const buf_;
    bool done_ = false;
    Status status_;
  };

  std::vector<uint8_t> data_;
  uint64_t blocks_;
  std::mutex mu_;
  std::map<void*, size_t> owned_;  // under mu_: alloc_io_buffer's, by start
};

}  // namespace warpfs::blockdev::test
