// Flush generations of the filesystem's device: what fsync needs to know whether data it
// wrote earlier is durable yet, and to share one device Flush among fsyncs that arrive
// together (group commit).
//
// Every flush the mounted filesystem sends (the journal's, fsync's, sync's) goes through a
// Flusher and is numbered 1, 2, ... as it starts; durable(g) says whether a flush numbered g
// or later has returned ok. A write that reached the device (write_back returned) before
// next() was read is durable once durable(next()) holds: the flush that gets that number
// starts after the read. The device's volatile write cache makes this necessary: a block a
// cache eviction wrote back is on the device, not durable.
//
// Thread-safety: every method from any thread. Flushes are sent one at a time (mu_), so a
// caller that waited for another's flush finds its own need met without sending one.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "warpfs/blockdev/block_device.h"

namespace warpfs::fs {

class Flusher {
 public:
  explicit Flusher(blockdev::BlockDevice& dev) : dev_(dev) {}
  // The number the next flush to start will have, at least.
  uint64_t next() const { return started_.load(std::memory_order_seq_cst) + 1; }
  bool durable(uint64_t gen) const { return done_.load(std::memory_order_acquire) >= gen; }
  // dev.flush(): the device's cache written back and flushed (a journal commit, sync).
  blockdev::Status flush_all() { return run(false, nullptr, 0); }
  // The ranges written back, then the device's Flush alone (a journal commit's own blocks).
  blockdev::Status flush_ranges(const blockdev::BlockDevice::Range* r, size_t n) {
    return run(true, r, n);
  }
  // Returns once a flush numbered `gen` or later has returned ok: at once if one has, after
  // the flush in flight if that is enough, else after one device Flush of its own.
  blockdev::Status flush_to(uint64_t gen);
  // Device Flush commands sent through here.
  uint64_t flushes() const { return started_.load(std::memory_order_relaxed); }

 private:
  blockdev::Status run(bool device_only, const blockdev::BlockDevice::Range* r, size_t n);
  blockdev::Status send(bool device_only);  // numbers and sends one flush; REQUIRES: mu_
  blockdev::BlockDevice& dev_;
  std::mutex mu_;  // one flush at a time; leaf (held across the device's flush, nothing else)
  std::atomic<uint64_t> started_{0};  // written under mu_
  std::atomic<uint64_t> done_{0};     // written under mu_: the last flush that returned ok
};

}  // namespace warpfs::fs
