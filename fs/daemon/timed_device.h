// The device's side of the live view: a block device that forwards every call to the one
// below it (the NVMe namespace, under the software cache) and counts and times each by
// class: read, write, flush, trim. Latency is from the call to its return, so a batch
// (submit) counts each of its transfers with the batch's time, as each completes by then.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "latency.h"
#include "warpfs/blockdev/block_device.h"

namespace warpfs::daemon {

class TimedBlockDevice final : public blockdev::BlockDevice {
 public:
  enum Class : unsigned { kRead, kWrite, kFlush, kTrim, kClasses };
  static constexpr const char* kClassNames[kClasses] = {"read", "write", "flush", "trim"};

  explicit TimedBlockDevice(blockdev::BlockDevice& d) : d_(d) {}

  uint32_t block_bytes() const override { return d_.block_bytes(); }
  uint64_t block_count() const override { return d_.block_count(); }
  blockdev::Status read(uint64_t block, uint32_t count, void* buf) override {
    const uint64_t t0 = now();
    blockdev::Status s = d_.read(block, count, buf);
    note(kRead, t0, uint64_t{count} * d_.block_bytes());
    return s;
  }
  blockdev::Status write(uint64_t block, uint32_t count, const void* buf) override {
    const uint64_t t0 = now();
    blockdev::Status s = d_.write(block, count, buf);
    note(kWrite, t0, uint64_t{count} * d_.block_bytes());
    return s;
  }
  blockdev::Status flush() override {
    const uint64_t t0 = now();
    blockdev::Status s = d_.flush();
    note(kFlush, t0, 0);
    return s;
  }
  blockdev::Status trim(uint64_t block, uint64_t count) override {
    const uint64_t t0 = now();
    blockdev::Status s = d_.trim(block, count);
    note(kTrim, t0, 0);
    return s;
  }
  void submit(Io* ios, int n) override {
    const uint64_t t0 = now();
    d_.submit(ios, n);
    const uint64_t t1 = now();
    for (int i = 0; i < n; ++i) {
      const Class c = ios[i].write ? kWrite : kRead;
      latency_[c].add(t1 - t0);
      bytes_[c].fetch_add(uint64_t{ios[i].lines} * d_.block_bytes(), std::memory_order_relaxed);
    }
  }
  blockdev::Status alloc_io_buffer(size_t bytes, void** out) override {
    return d_.alloc_io_buffer(bytes, out);
  }
  void free_io_buffer(void* p, size_t bytes) override { d_.free_io_buffer(p, bytes); }

  // Thread-safe (relaxed atomics).
  LatencyHistogram::Snapshot latency(Class c) const { return latency_[c].snapshot(); }
  uint64_t bytes(Class c) const { return bytes_[c].load(std::memory_order_relaxed); }

 private:
  static uint64_t now() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  void note(Class c, uint64_t t0, uint64_t bytes) {
    latency_[c].add(now() - t0);
    if (bytes) bytes_[c].fetch_add(bytes, std::memory_order_relaxed);
  }

  blockdev::BlockDevice& d_;
  LatencyHistogram latency_[kClasses];          // relaxed atomics: every worker adds at once
  std::atomic<uint64_t> bytes_[kClasses] = {};  // likewise
};

}  // namespace warpfs::daemon
