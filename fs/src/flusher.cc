#include "flusher.h"

namespace warpfs::fs {

blockdev::Status Flusher::send(bool device_only) {
  const uint64_t mine = started_.load(std::memory_order_relaxed) + 1;
  started_.store(mine, std::memory_order_seq_cst);
  blockdev::Status s = device_only ? dev_.flush_device() : dev_.flush();
  if (s.is_ok()) done_.store(mine, std::memory_order_release);
  return s;
}

blockdev::Status Flusher::run(bool device_only, const blockdev::BlockDevice::Range* r, size_t n) {
  if (device_only && n > 0) {
    // Outside mu_: a write-back is writes, which need no number.
    if (blockdev::Status s = dev_.write_back(r, n); !s.is_ok()) return s;
  }
  std::lock_guard<std::mutex> g(mu_);
  return send(device_only);
}

blockdev::Status Flusher::flush_to(uint64_t gen) {
  if (durable(gen)) return blockdev::Status::ok();
  std::lock_guard<std::mutex> g(mu_);
  // A flush that began after the caller's writes and returned while it waited covers them.
  if (durable(gen)) return blockdev::Status::ok();
  return send(true);
}

}  // namespace warpfs::fs
