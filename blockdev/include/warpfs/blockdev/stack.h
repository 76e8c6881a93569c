// The device stack: everything under a DEVICE name, assembled in one place, so that the
// daemon and the tools ask one object for a block device and for its statistics:
//
//   transport (emulated controller or VFIO) -> Controller (admin, identify, queues)
//     -> IoEngine (I/O queue pairs, virtual queues, queue mapper, watchdog)
//     -> NamespaceIo (one namespace in blocks: MDTS splits, PRPs, DMA buffers, timing)
//     -> [Cache over it, sized from cache_mb] -> BlockDevice
//
// Without a cache (cache_mb 0: the offline tools, which read each block once) device() is
// the namespace itself.
//
// Thread-safety: open() and the destructor by one thread; device() and stats() from any
// number of threads once open() has returned.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "warpfs/blockdev/devices.h"
#include "warpfs/blockdev/raid.h"
#include "warpfs/cache/backend.h"
#include "warpfs/cache/cache.h"
#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/device.h"
#include "warpfs/nvme/io_engine.h"
#include "warpfs/nvme/namespace_io.h"
#include "warpfs/nvme/vfio.h"

namespace warpfs::blockdev {

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
  uint32_t block_bytes = 4096;  // the unit of every transfer (the filesystem's block)
  // The software cache: 0, no cache; else its size in MiB (8 ways, sets a power of two).
  uint64_t cache_mb = 0;
  // false: every command in the bulk class (a benchmark baseline; see NamespaceIo::Options).
  bool priorities = true;
};

// Everything the live view shows of the stack, read at one moment (each counter on its own:
// the set is not a snapshot of one instant).
struct StackStats {
  std::string transport;  // "emulated", "vfio", ...
  uint32_t nsid = 0, lba_bytes = 0;
  uint16_t io_queues = 0;  // granted by the controller
  uint32_t max_transfer = 0;
  nvme::EngineCounters engine;
  bool vfio = false;  // the next two are set when it is
  int iommu_group = -1;
  nvme::VfioCounters vfio_counters;
  uint32_t metadata_queues = 0, bulk_queues = 0;
  uint64_t remaps = 0;
  std::vector<nvme::IoEngine::QueueLoad> pairs;
  nvme::NamespaceIo::ClassStats commands[nvme::NamespaceIo::kClasses];
  bool cached = false;  // cache is set when it is
  cache::CacheStats cache;
  // A RAID set (DEV,DEV,...): the fields above are member 0's, raid the set's.
  bool is_raid = false;
  RaidBlockDevice::Stats raid;
};

// The members of a DEVICE list: comma-separated DEVICEs, where a piece of the form
// key=value (ns=2) belongs to the DEVICE before it. One element for a plain DEVICE.
std::vector<std::string> split_device_list(const std::string& list);

// The DEVICE (or list) with each emulated image named by its absolute path, as the daemon
// names its mount: what warpfs_mount_of_image finds.
std::string absolute_device_name(const std::string& list);

// What mkfs.warpfs --raid asks for.
struct RaidCreate {
  uint32_t level = 0;
  uint32_t stripe_blocks = 0;  // 0: RaidLabel::kDefaultStripeBlocks, lowered to the MDTS
};

// Makes a new set of the DEVICEs (in that order): opens each (creating a missing emulated
// image of o.create_bytes), writes each member's label (fs/FORMAT.md) and zeroes the rest of
// its label area, flushes. Refuses a device that holds a filesystem or a label of another
// set unless `force`. Then DeviceStack::open of the list opens the set. False with a message
// naming the device on failure.
bool create_raid_set(const std::vector<std::string>& devices, const RaidCreate& rc,
                     const StackOptions& o, bool force, std::string* error);

// Opens each DEVICE of `list` on its own (no cache) and rebuilds the set's failed members
// and blank replacements from their mirrors (resync_raid_set, fs/FORMAT.md "Resync"). False
// with a message naming the device or position on failure; the set then opens degraded as
// before.
bool resync_raid_devices(const std::string& list, const StackOptions& o,
                         const std::function<void(uint64_t, uint64_t)>& progress,
                         RaidResyncReport* report, std::string* error, bool replace = false);

// A field of /proc/self/mountinfo with its octal escapes (\040 for a space, \134 for a
// backslash, ...) undone.
std::string unescape_mountinfo(const std::string& s);

// The mountpoint of a warpfs mount of the emulated image `path` (/proc/self/mountinfo,
// whose sources the daemon writes as emu:ABSOLUTE-PATH), or "".
std::string warpfs_mount_of_image(const std::string& path);

// The cache options for a cache of `mb` MiB: 8 ways, the largest power-of-two number of sets
// that fits.
cache::CacheOptions cache_of_size(uint64_t mb, uint32_t block_bytes);

class DeviceStack {
 public:
  // Brings everything up; a message naming DEVICE and the cause on failure. A list
  // (split_device_list) opens one stack per member and the RAID set over them, checking the
  // members' labels (check_raid_set).
  static std::unique_ptr<DeviceStack> open(const std::string& device, const StackOptions& o,
                                           std::string* error);
  // The same stack over an emulated controller on `store`, which the caller opened (and
  // locked) itself: another controller in this process may share the store, as the GPU's
  // does under gpu::Volume (gpu/README.md). `name` is for messages; the first namespace is
  // used. With o.emulated.cache_in_store, each controller's writes reach the store at once,
  // so each sees the other's.
  static std::unique_ptr<DeviceStack> open_store(const std::string& name,
                                                 std::shared_ptr<nvme::BackingStore> store,
                                                 const StackOptions& o, std::string* error);
  // Shuts the controller down (its write cache becomes durable). Does not write the software
  // cache back: the filesystem flushes it at unmount.
  ~DeviceStack();
  BlockDevice& device() {
    if (raid_) return *raid_;
    return cached_ ? static_cast<BlockDevice&>(*cached_) : *raw_;
  }
  // The namespace the block device sits on (a set's: member 0's).
  uint32_t nsid() const { return members_.empty() ? ns_->nsid() : members_[0]->nsid(); }
  const std::string& name() const { return name_; }
  StackStats stats() const;
  // The namespace's NVMe identity (NGUID, else EUI64; kind kNone when it reports neither).
  const RaidIdentity& identity() const { return identity_; }
  // A set's members, in position order (empty for one DEVICE), and the set's device.
  const std::vector<std::unique_ptr<DeviceStack>>& members() const { return members_; }
  RaidBlockDevice* raid() { return raid_.get(); }
  uint32_t max_transfer_bytes() const;
  // Whether every namespace below completes a command in the thread that submits it, at once
  // (nvme::IoEngine::prompt; a set: every member's). Where not, a caller that waits out each
  // command on a thread of its own needs more threads to overlap them.
  bool prompt() const;

 private:
  DeviceStack() = default;
  bool build(uint32_t nsid_asked, const StackOptions& o, std::string* error);
  static std::unique_ptr<DeviceStack> open_set(const std::vector<std::string>& names,
                                               const StackOptions& o, std::string* error);
  std::string name_;
  bool vfio_ = false;
  std::unique_ptr<nvme::Transport> transport_;
  std::unique_ptr<nvme::Controller> ctrl_;
  std::unique_ptr<nvme::IoEngine> engine_;
  std::unique_ptr<nvme::NamespaceIo> ns_;
  std::unique_ptr<NvmeBlockDevice> raw_;
  std::unique_ptr<cache::NamespaceBackend> backend_;  // with the cache only
  std::unique_ptr<CachedBlockDevice> cached_;         // likewise
  RaidIdentity identity_;
  std::vector<std::unique_ptr<DeviceStack>> members_;  // a set only: then nothing above is set
  std::unique_ptr<RaidBlockDevice> raid_;              // likewise
};

}  // namespace warpfs::blockdev
