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
  std::function<void(const std::string&)> log;  // the engine's recovery messages, notices
  // An emulated image that another process holds while no warpfs mount shows it (a daemon
  // finishing its unmount: `fusermount3 -u` returns before the daemon has written its last
  // blocks and exited) is waited for this long, saying so through `log`; one that is
  // mounted is refused at once. 0: refused at once too.
  unsigned wait_for_release_s = 10;
};

// The mountpoint of a warpfs mount of the emulated image `path` (/proc/self/mountinfo,
// whose sources the daemon writes as emu:ABSOLUTE-PATH), or "".
std::string warpfs_mount_of_image(const std::string& path);

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
