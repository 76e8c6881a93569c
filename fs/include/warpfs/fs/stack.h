// Opens the whole storage stack under a DEVICE name as the tools and the daemon see it:
// transport (emulated controller or VFIO) -> NVMe driver -> I/O engine -> block device.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "warpfs/blockdev/devices.h"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/device.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::fs {

struct StackOptions {
  uint64_t create_bytes = 0;  // emulated: create a missing image of this size
  uint16_t io_queues = 4;
  nvme::EmulatedConfig emulated;  // latency model, worker threads, ...
  nvme::VfioOptions vfio;         // hugepages, interrupts, signal teardown
  // A busy queue with no completion for this long resets the controller (IoEngine); 0: never.
  uint64_t io_timeout_ns = 30'000'000'000ull;
  std::function<void(const std::string&)> log;  // the engine's recovery messages
};

class DeviceStack {
 public:
  // Brings everything up; a message naming DEVICE and the cause on failure.
  static std::unique_ptr<DeviceStack> open(const std::string& device, const StackOptions& o,
                                           std::string* error);
  ~DeviceStack();  // shuts the controller down (its write cache becomes durable)
  blockdev::BlockDevice& device() { return *dev_; }
  nvme::Controller& controller() { return *ctrl_; }
  nvme::IoEngine& engine() { return *engine_; }
  uint32_t nsid() const { return nsid_; }  // the namespace the block device sits on
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::unique_ptr<nvme::Transport> transport_;
  std::unique_ptr<nvme::Controller> ctrl_;
  std::unique_ptr<nvme::IoEngine> engine_;
  std::unique_ptr<blockdev::NvmeBlockDevice> dev_;
  uint32_t nsid_ = 0;
};

}  // namespace warpfs::fs
