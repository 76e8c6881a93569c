#include "warpfs/nvme/vfio.h"

#include <fcntl.h>
#include <linux/vfio.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "sysfs.h"
#include "warpfs/nvme/spec.h"

namespace warpfs::nvme {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kHugePage = 2ull << 20;
constexpr uint64_t kDoorbellBase = 0x1000;  // Base §3.1.4: doorbells follow the registers

std::string errno_text(int e) {
  return std::string(std::strerror(e));
}

// ---- Signal-time teardown -----------------------------------------------------------------
// A terminating or crash signal must not leave a controller running DMA into memory the
// kernel is about to unpin. The handler only does async-signal-safe things: MMIO stores and
// loads on the registered BAR0 mappings, clock_gettime, then re-raising the signal.

struct SignalSlot {
  std::atomic<bool> used{false};                  // claimed by a transport
  std::atomic<volatile uint32_t*> regs{nullptr};  // BAR0 base (CC and CSTS live there)
  std::atomic<uint64_t> timeout_ns{0};            // CAP.TO
  std::atomic<pid_t> owner{0};                    // a forked child must not stop our device
};
constexpr int kSlots = 8;  // transports beyond this many are not covered (none in practice)
SignalSlot g_slots[kSlots];
// Handlers between taking a BAR pointer and finishing with it: teardown() waits for zero
// before it unmaps the BAR, and a handler that finds nothing to do waits for the others.
std::atomic<int> g_in_handler{0};

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Disables the controller whose registers start at `regs` and waits (bounded) for it to
// stop. Safe in a signal handler.
void disable_controller(volatile uint32_t* regs, uint64_t timeout_ns) {
  uint32_t cc = regs[reg::kCc / 4];
  if (cc == 0xffffffffu || (cc & cc::kEn) == 0) return;
  uint64_t deadline = monotonic_ns() + timeout_ns;
  // EN=1 with RDY=0 (enabling still in progress): clearing EN now has undefined results
  // (Base §3.1.4.5); let the enable finish first.
  while ((regs[reg::kCsts / 4] & csts::kRdy) == 0 && monotonic_ns() < deadline) {
  }
  cc = regs[reg::kCc / 4];
  regs[reg::kCc / 4] = cc & ~cc::kEn;
  deadline = monotonic_ns() + timeout_ns;
  while (monotonic_ns() < deadline) {
    const uint32_t csts = regs[reg::kCsts / 4];
    if (csts == 0xffffffffu || (csts & csts::kRdy) == 0) return;
  }
}

void teardown_signal_handler(int sig) {
  const int saved_errno = errno;
  g_in_handler.fetch_add(1);
  const pid_t self = getpid();
  for (SignalSlot& s : g_slots) {
    if (s.owner.load() != self) continue;
    volatile uint32_t* regs = s.regs.exchange(nullptr);
    if (regs != nullptr) disable_controller(regs, s.timeout_ns.load());
  }
  g_in_handler.fetch_sub(1);
  // Another thread's handler may still be stopping a controller: let it finish (bounded).
  const uint64_t deadline = monotonic_ns() + 2'000'000'000ull;
  while (g_in_handler.load() != 0 && monotonic_ns() < deadline) {
  }
  errno = saved_errno;
  // SA_RESETHAND restored the default action. The signal is blocked while its handler runs,
  // so this raise stays pending and is delivered with the default action on return: the
  // process ends as it would have without us (a fault also re-executes and faults again).
  raise(sig);
}

void install_handler_if_default(int sig) {
  struct sigaction old {};
  if (sigaction(sig, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;  // someone's own
  struct sigaction sa {};
  sa.sa_handler = teardown_signal_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(sig, &sa, nullptr);
}

void install_signal_teardown(bool terminating) {
  static std::once_flag crash_once, term_once;
  std::call_once(crash_once, [] {
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) install_handler_if_default(sig);
  });
  if (!terminating) return;
  std::call_once(term_once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) install_handler_if_default(sig);
  });
}

int register_signal_slot(volatile uint32_t* regs, uint64_t timeout_ns) {
  for (int i = 0; i < kSlots; ++i) {
    if (g_slots[i].used.exchange(true)) continue;
    g_slots[i].timeout_ns.store(timeout_ns);
    g_slots[i].owner.store(getpid());
    g_slots[i].regs.store(regs);  // published last: a handler sees a complete slot
    return i;
  }
  return -1;
}

// Takes the slot back; returns once no handler can still be using the BAR it named.
void release_signal_slot(int i) {
  g_slots[i].regs.store(nullptr);
  const uint64_t deadline = monotonic_ns() + 2'000'000'000ull;
  while (g_in_handler.load() != 0 && monotonic_ns() < deadline) {
  }
  g_slots[i].owner.store(0);
  g_slots[i].used.store(false);
}

// ---- IOVA allocation ----------------------------------------------------------------------
// Bus addresses for DMA mappings, handed out inside the ranges the IOMMU reports as valid
// (VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE: the MSI window at 0xfee00000 and reserved regions
// are holes between them). Freed ranges of the same size are reused; the rest is bumped.
class IovaSpace {
 public:
  void set_ranges(std::vector<std::pair<uint64_t, uint64_t>> r) {  // inclusive [start, end]
    ranges_ = std::move(r);
    range_ = 0;
    next_ = ranges_.empty() ? 0 : ranges_[0].first;
  }
  bool alloc(uint64_t bytes, uint64_t align, uint64_t* iova) {
    for (auto [it, end] = free_.equal_range(bytes); it != end; ++it) {
      if (it->second % align == 0) {
        *iova = it->second;
        free_.erase(it);
        return true;
      }
    }
    while (range_ < ranges_.size()) {
      const uint64_t start = std::max<uint64_t>(
          (next_ + align - 1) / align * align, (ranges_[range_].first + align - 1) / align * align);
      const uint64_t end = ranges_[range_].second;
      if (start >= next_ && start <= end && end - start >= bytes - 1) {
        *iova = start;
        next_ = start + bytes;
        return true;
      }
      if (++range_ < ranges_.size()) next_ = ranges_[range_].first;
    }
    return false;
  }
  void release(uint64_t iova, uint64_t bytes) { free_.emplace(bytes, iova); }

 private:
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
  size_t range_ = 0;
  uint64_t next_ = 0;
  std::multimap<uint64_t, uint64_t> free_;  // bytes -> iova
};

struct Mapping {
  void* vaddr;
  uint64_t bytes;  // mapped length (rounded up to the page or hugepage)
  bool huge;
};

}  // namespace

struct VfioTransport::Impl {
  std::string bdf;
  VfioOptions o;
  int group_no = -1;
  int container = -1, group = -1, device = -1;

  // BAR0: the mmap'ed prefix [0, bar_mapped) plus its file offset for pread/pwrite beyond it.
  uint8_t* bar = nullptr;
  uint64_t bar_mapped = 0;
  uint64_t bar_map_len = 0;  // what to munmap
  uint64_t bar_offset = 0, bar_size = 0;
  uint64_t config_offset = 0;
  uint32_t stride = 4;  // 4 << CAP.DSTRD
  uint64_t cap_timeout_ns = 500'000'000;
  bool bus_master_set = false;

  std::mutex dma_mu;
  IovaSpace iova;
  std::map<uint64_t, Mapping> mappings;  // iova -> mapping
  uint64_t dma_bytes = 0, huge_bytes = 0;
  bool hugepages_missing = false;  // the first hugepage mmap failed: stop trying

  std::vector<int> irq_fds;
  int stop_fd = -1;
  int epoll_fd = -1;
  std::unique_ptr<InterruptLine[]> lines;
  std::thread irq_thread;
  std::atomic<uint64_t> interrupts{0};
  int signal_slot = -1;

  ~Impl() { teardown(); }

  std::string where() const { return "vfio:" + bdf; }

  volatile uint32_t* reg32(uint32_t off) const {
    return reinterpret_cast<volatile uint32_t*>(bar + off);
  }

  uint32_t read32(uint32_t off) {
    if (off + 4 <= bar_mapped) {
      const uint32_t v = *reg32(off);
      asm volatile("" ::: "memory");  // later accesses stay after the register read
      return v;
    }
    uint32_t v = 0xffffffffu;
    if (pread(device, &v, 4, static_cast<off_t>(bar_offset + off)) != 4) return 0xffffffffu;
    return v;
  }
  void write32(uint32_t off, uint32_t v) {
    if (off + 4 <= bar_mapped) {
      port::mmio_write32(const_cast<uint32_t*>(reg32(off)), v);
      return;
    }
    (void)!pwrite(device, &v, 4, static_cast<off_t>(bar_offset + off));
  }

  bool config_rw(bool write, void* buf, size_t len, uint64_t off) {
    const ssize_t n = write ? pwrite(device, buf, len, static_cast<off_t>(config_offset + off))
                            : pread(device, buf, len, static_cast<off_t>(config_offset + off));
    return n == static_cast<ssize_t>(len);
  }

  bool fail(std::string* error, const std::string& what) {
    *error = where() + ": " + what;
    return false;
  }

  bool open_container_and_group(std::string* error);
  bool read_iova_ranges(std::string* error);
  bool map_bar0(std::string* error);
  bool enable_bus_master(std::string* error);
  bool setup_interrupts(std::string* error);
  void irq_loop();
  void teardown();
};

int vfio_precheck(const std::string& sysfs, const std::string& bdf, std::string* error) {
  const std::string where = "vfio:" + bdf + ": ";
  const std::string dir = sysfs + "/bus/pci/devices/" + bdf;
  if (access(dir.c_str(), F_OK) != 0) {
    *error = where + "no PCI device " + bdf + " (list NVMe controllers with `warpfs-pci list`)";
    return -1;
  }
  std::string cls;
  sysfs::read_text(dir + "/class", &cls);
  if (cls != "0x010802") {
    *error = where + "not an NVMe controller (PCI class " + (cls.empty() ? "unknown" : cls) +
             ", expected 0x010802)";
    return -1;
  }
  const std::string driver = sysfs::link_name(dir + "/driver");
  if (driver != "vfio-pci") {
    *error = where +
             (driver.empty() ? "not bound to any driver"
                             : "bound to the '" + driver + "' driver, not vfio-pci") +
             "; run `warpfs-pci bind " + bdf +
             " vfio-pci` (it refuses while filesystems on "
             "the device are mounted)";
    return -1;
  }
  const int group = sysfs::iommu_group_of(dir);
  if (group < 0) {
    *error = where +
             "the device has no IOMMU group: the IOMMU is off. Enable VT-d / AMD-Vi "
             "in the firmware and boot with intel_iommu=on (or amd_iommu=on)";
    return -1;
  }
  return group;
}

bool VfioTransport::Impl::open_container_and_group(std::string* error) {
  container = ::open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
  if (container < 0) {
    const int e = errno;
    return fail(error, "cannot open /dev/vfio/vfio: " + errno_text(e) +
                           (e == ENOENT ? " (load the module: modprobe vfio-pci)" : ""));
  }
  if (ioctl(container, VFIO_GET_API_VERSION) != VFIO_API_VERSION)
    return fail(error, "the kernel's VFIO API version is not the one this build knows");
  unsigned long type = VFIO_TYPE1v2_IOMMU;
  if (ioctl(container, VFIO_CHECK_EXTENSION, type) != 1) {
    type = VFIO_TYPE1_IOMMU;
    if (ioctl(container, VFIO_CHECK_EXTENSION, type) != 1)
      return fail(error,
                  "the kernel's VFIO has no type1 IOMMU backend (modprobe vfio_iommu_type1)");
  }
  const std::string gpath = "/dev/vfio/" + std::to_string(group_no);
  group = ::open(gpath.c_str(), O_RDWR | O_CLOEXEC);
  if (group < 0) {
    const int e = errno;
    if (e == EBUSY)
      return fail(error, gpath +
                             " is in use by another process (another warpfs, mkfs.warpfs "
                             "or fsck.warpfs on this device?)");
    if (e == EACCES || e == EPERM)
      return fail(error, "permission denied opening " + gpath +
                             ": run as root or give this user access to " + gpath);
    return fail(error, "cannot open " + gpath + ": " + errno_text(e));
  }
  vfio_group_status st{};
  st.argsz = sizeof st;
  if (ioctl(group, VFIO_GROUP_GET_STATUS, &st) != 0)
    return fail(error, "VFIO_GROUP_GET_STATUS: " + errno_text(errno));
  if (!(st.flags & VFIO_GROUP_FLAGS_VIABLE)) {
    std::string others;
    for (const std::string& b : sysfs::group_blockers(o.sysfs, group_no, bdf))
      others += (others.empty() ? "" : ", ") + b;
    return fail(error, "IOMMU group " + std::to_string(group_no) +
                           " is not viable: every device in it must be bound to vfio-pci or to "
                           "no driver" +
                           (others.empty() ? "" : "; still bound: " + others));
  }
  if (ioctl(group, VFIO_GROUP_SET_CONTAINER, &container) != 0)
    return fail(error, "VFIO_GROUP_SET_CONTAINER: " + errno_text(errno));
  if (ioctl(container, VFIO_SET_IOMMU, type) != 0)
    return fail(error, "VFIO_SET_IOMMU: " + errno_text(errno));
  return true;
}

// The IOMMU's valid IOVA ranges (kernel 5.4+), or a conservative default: [4 GiB, 512 GiB),
// above the 32-bit MSI window and inside a 39-bit address width.
bool VfioTransport::Impl::read_iova_ranges(std::string* error) {
  std::vector<uint64_t> buf(64);
  auto* info = reinterpret_cast<vfio_iommu_type1_info*>(buf.data());
  info->argsz = sizeof *info;
  if (ioctl(container, VFIO_IOMMU_GET_INFO, info) != 0)
    return fail(error, "VFIO_IOMMU_GET_INFO: " + errno_text(errno));
  if (!(info->iova_pgsizes & kPage)) return fail(error, "the IOMMU cannot map 4 KiB pages");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  if (info->argsz > sizeof *info) {
    buf.assign((info->argsz + 7) / 8, 0);
    info = reinterpret_cast<vfio_iommu_type1_info*>(buf.data());
    info->argsz = static_cast<uint32_t>(buf.size() * 8);
    if (ioctl(container, VFIO_IOMMU_GET_INFO, info) != 0)
      return fail(error, "VFIO_IOMMU_GET_INFO: " + errno_text(errno));
    if (info->flags & VFIO_IOMMU_INFO_CAPS) {
      const auto* base = reinterpret_cast<const uint8_t*>(info);
      for (uint32_t off = info->cap_offset; off != 0 && off < info->argsz;) {
        const auto* h = reinterpret_cast<const vfio_info_cap_header*>(base + off);
        if (h->id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE) {
          const auto* c = reinterpret_cast<const vfio_iommu_type1_info_cap_iova_range*>(h);
          for (uint32_t i = 0; i < c->nr_iovas; ++i)
            ranges.emplace_back(c->iova_ranges[i].start, c->iova_ranges[i].end);
        }
        off = h->next;
      }
    }
  }
  if (ranges.empty()) ranges.emplace_back(4ull << 30, (512ull << 30) - 1);
  // Never hand out bus address 0 or the first megabyte: a zero PRP is a driver bug to catch.
  // ...nor the top of the address space, where start + size would wrap.
  for (auto& r : ranges) {
    r.first = std::max<uint64_t>(r.first, 1ull << 20);
    r.second = std::min<uint64_t>(r.second, (1ull << 63) - 1);
  }
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [](const auto& r) { return r.first > r.second; }),
               ranges.end());
  iova.set_ranges(std::move(ranges));
  return true;
}

bool VfioTransport::Impl::map_bar0(std::string* error) {
  device = ioctl(group, VFIO_GROUP_GET_DEVICE_FD, bdf.c_str());
  if (device < 0) return fail(error, "VFIO_GROUP_GET_DEVICE_FD: " + errno_text(errno));
  vfio_device_info dinfo{};
  dinfo.argsz = sizeof dinfo;
  if (ioctl(device, VFIO_DEVICE_GET_INFO, &dinfo) != 0)
    return fail(error, "VFIO_DEVICE_GET_INFO: " + errno_text(errno));
  if (!(dinfo.flags & VFIO_DEVICE_FLAGS_PCI)) return fail(error, "not a PCI device");

  vfio_region_info cfg{};
  cfg.argsz = sizeof cfg;
  cfg.index = VFIO_PCI_CONFIG_REGION_INDEX;
  if (ioctl(device, VFIO_DEVICE_GET_REGION_INFO, &cfg) != 0)
    return fail(error, "config space region: " + errno_text(errno));
  config_offset = cfg.offset;

  std::vector<uint64_t> buf(64);
  auto* r = reinterpret_cast<vfio_region_info*>(buf.data());
  r->argsz = static_cast<uint32_t>(buf.size() * 8);
  r->index = VFIO_PCI_BAR0_REGION_INDEX;
  if (ioctl(device, VFIO_DEVICE_GET_REGION_INFO, r) != 0)
    return fail(error, "BAR0 region: " + errno_text(errno));
  if (r->argsz > buf.size() * 8) {  // capabilities did not fit: ask again with room
    buf.assign((r->argsz + 7) / 8, 0);
    r = reinterpret_cast<vfio_region_info*>(buf.data());
    r->argsz = static_cast<uint32_t>(buf.size() * 8);
    r->index = VFIO_PCI_BAR0_REGION_INDEX;
    if (ioctl(device, VFIO_DEVICE_GET_REGION_INFO, r) != 0)
      return fail(error, "BAR0 region: " + errno_text(errno));
  }
  bar_offset = r->offset;
  bar_size = r->size;
  if (bar_size < 0x2000) return fail(error, "BAR0 is too small for an NVMe controller");
  if (!(r->flags & VFIO_REGION_INFO_FLAG_MMAP))
    return fail(error, "BAR0 cannot be memory-mapped through VFIO");

  // The whole BAR if the kernel allows it (MSI-X table mappable), else the sparse area that
  // starts at 0 (registers and doorbells; the MSI-X table comes after them).
  void* p = mmap(nullptr, bar_size, PROT_READ | PROT_WRITE, MAP_SHARED, device,
                 static_cast<off_t>(bar_offset));
  if (p != MAP_FAILED) {
    bar_mapped = bar_map_len = bar_size;
  } else if (r->flags & VFIO_REGION_INFO_FLAG_CAPS) {
    const auto* base = reinterpret_cast<const uint8_t*>(r);
    for (uint32_t off = r->cap_offset; off != 0 && off < r->argsz;) {
      const auto* h = reinterpret_cast<const vfio_info_cap_header*>(base + off);
      if (h->id == VFIO_REGION_INFO_CAP_SPARSE_MMAP) {
        const auto* s = reinterpret_cast<const vfio_region_info_cap_sparse_mmap*>(h);
        for (uint32_t i = 0; i < s->nr_areas; ++i) {
          if (s->areas[i].offset == 0 && s->areas[i].size >= 0x2000) {
            p = mmap(nullptr, s->areas[i].size, PROT_READ | PROT_WRITE, MAP_SHARED, device,
                     static_cast<off_t>(bar_offset));
            if (p != MAP_FAILED) bar_mapped = bar_map_len = s->areas[i].size;
          }
        }
      }
      off = h->next;
    }
  }
  if (p == MAP_FAILED || bar_mapped == 0)
    return fail(error, "cannot mmap BAR0: " + errno_text(errno));
  bar = static_cast<uint8_t*>(p);
  madvise(bar, bar_map_len, MADV_DONTFORK);  // a forked child gets no view of the registers
  // Memory decoding on before the first register access (vfio-pci raises SIGBUS on a BAR
  // access with it off); bus mastering stays off until the controller is known stopped.
  uint16_t cmd = 0;
  if (!config_rw(false, &cmd, 2, 4)) return fail(error, "cannot read the PCI command register");
  if (!(cmd & 0x2)) {
    cmd = static_cast<uint16_t>(cmd | 0x2);
    if (!config_rw(true, &cmd, 2, 4)) return fail(error, "cannot enable memory decoding");
  }
  const uint64_t cap = uint64_t{read32(reg::kCap)} | (uint64_t{read32(reg::kCap + 4)} << 32);
  if (cap == ~0ull) return fail(error, "BAR0 reads all ones: the device is not responding");
  stride = 4u << Cap{cap}.dstrd();
  cap_timeout_ns = std::max<uint64_t>(Cap{cap}.to_500ms(), 1) * 500'000'000ull;
  // A controller left running by an earlier user (killed before it could stop it) stops
  // here, before bus mastering lets it reach memory again.
  disable_controller(reg32(0), cap_timeout_ns);
  return true;
}

// Memory Space and Bus Master on (vfio-pci hands the device over with bus mastering off),
// legacy INTx off (MSI-X is used).
bool VfioTransport::Impl::enable_bus_master(std::string* error) {
  uint16_t cmd = 0;
  if (!config_rw(false, &cmd, 2, 4)) return fail(error, "cannot read the PCI command register");
  const uint16_t want = static_cast<uint16_t>(cmd | 0x2 /* memory */ | 0x4 /* bus master */ |
                                              0x400 /* INTx disable */);
  if (want != cmd && !config_rw(true, const_cast<uint16_t*>(&want), 2, 4))
    return fail(error, "cannot enable bus mastering in PCI config space");
  bus_master_set = true;
  return true;
}

bool VfioTransport::Impl::setup_interrupts(std::string* error) {
  vfio_irq_info irq{};
  irq.argsz = sizeof irq;
  irq.index = VFIO_PCI_MSIX_IRQ_INDEX;
  if (ioctl(device, VFIO_DEVICE_GET_IRQ_INFO, &irq) != 0 || irq.count == 0 ||
      !(irq.flags & VFIO_IRQ_INFO_EVENTFD)) {
    return true;  // no MSI-X: the driver polls
  }
  uint32_t n = std::min<uint32_t>(irq.count, std::max<uint16_t>(o.max_vectors, 1));
  for (uint32_t i = 0; i < n; ++i) {
    const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return fail(error, "eventfd: " + errno_text(errno));
    irq_fds.push_back(fd);
  }
  // The host may grant fewer vectors than asked for: SET_IRQS then returns the number it
  // could allocate (a positive value), and asking again for that many succeeds.
  for (int attempt = 0;; ++attempt) {
    std::vector<uint8_t> buf(sizeof(vfio_irq_set) + n * sizeof(int32_t));
    auto* set = reinterpret_cast<vfio_irq_set*>(buf.data());
    set->argsz = static_cast<uint32_t>(buf.size());
    set->flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    set->index = VFIO_PCI_MSIX_IRQ_INDEX;
    set->start = 0;
    set->count = n;
    std::memcpy(set->data, irq_fds.data(), n * sizeof(int32_t));
    const int r = ioctl(device, VFIO_DEVICE_SET_IRQS, set);
    if (r == 0) break;
    if (r > 0 && static_cast<uint32_t>(r) < n && attempt == 0) {
      for (uint32_t i = static_cast<uint32_t>(r); i < n; ++i) close(irq_fds[i]);
      irq_fds.resize(static_cast<uint32_t>(r));
      n = static_cast<uint32_t>(r);
      continue;
    }
    return fail(error, "VFIO_DEVICE_SET_IRQS (MSI-X): " +
                           (r < 0 ? errno_text(errno) : "the host granted too few vectors"));
  }
  lines = std::make_unique<InterruptLine[]>(n);
  stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop_fd < 0) return fail(error, "eventfd: " + errno_text(errno));
  // The epoll set is built here, so that a failure is an error of open(), not a thread that
  // silently never delivers.
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return fail(error, "epoll_create1: " + errno_text(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = UINT32_MAX;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, stop_fd, &ev) != 0)
    return fail(error, "epoll_ctl: " + errno_text(errno));
  for (uint32_t i = 0; i < n; ++i) {
    ev.data.u32 = i;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, irq_fds[i], &ev) != 0)
      return fail(error, "epoll_ctl: " + errno_text(errno));
  }
  irq_thread = std::thread([this] { irq_loop(); });
  return true;
}

// Turns eventfd signals into InterruptLine raises. Sleeps in epoll_wait when the device is
// idle: no interrupts, no CPU.
void VfioTransport::Impl::irq_loop() {
  // Stop signals belong to the application's threads; faults stay deliverable here so that
  // the crash teardown still runs if this thread faults.
  sigset_t mask;
  sigfillset(&mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) sigdelset(&mask, sig);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  epoll_event events[16];
  for (;;) {
    const int n = epoll_wait(epoll_fd, events, 16, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    bool stop = false;
    for (int i = 0; i < n; ++i) {
      const uint32_t v = events[i].data.u32;
      if (v == UINT32_MAX) {
        stop = true;
        continue;
      }
      uint64_t count = 0;
      (void)!read(irq_fds[v], &count, sizeof count);
      interrupts.fetch_add(1, std::memory_order_relaxed);
      lines[v].raise();
    }
    if (stop) break;
  }
}

void VfioTransport::Impl::teardown() {
  // 1. Stop the device before anything it may DMA to goes away.
  if (signal_slot >= 0) {
    release_signal_slot(signal_slot);
    signal_slot = -1;
  }
  if (bar != nullptr) disable_controller(reg32(0), cap_timeout_ns);
  // 2. Interrupts off, then their thread.
  if (device >= 0 && !irq_fds.empty()) {
    vfio_irq_set set{};
    set.argsz = sizeof set;
    set.flags = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
    set.index = VFIO_PCI_MSIX_IRQ_INDEX;
    set.start = 0;
    set.count = 0;
    ioctl(device, VFIO_DEVICE_SET_IRQS, &set);
  }
  if (irq_thread.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd, &one, sizeof one);
    irq_thread.join();
  }
  for (int fd : irq_fds) close(fd);
  irq_fds.clear();
  if (stop_fd >= 0) close(stop_fd);
  stop_fd = -1;
  if (epoll_fd >= 0) close(epoll_fd);
  epoll_fd = -1;
  // 3. Bus mastering off: the device can no longer reach memory at all.
  if (bus_master_set) {
    uint16_t cmd = 0;
    if (config_rw(false, &cmd, 2, 4)) {
      cmd = static_cast<uint16_t>(cmd & ~0x4);
      config_rw(true, &cmd, 2, 4);
    }
    bus_master_set = false;
  }
  // 4. DMA mappings, BAR, file descriptors.
  for (auto& [iova_addr, m] : mappings) {
    vfio_iommu_type1_dma_unmap u{};
    u.argsz = sizeof u;
    u.iova = iova_addr;
    u.size = m.bytes;
    // If the unmap fails the pages stay pinned by the IOMMU until the container closes
    // below; munmap only drops our view of them.
    (void)ioctl(container, VFIO_IOMMU_UNMAP_DMA, &u);
    munmap(m.vaddr, m.bytes);
  }
  mappings.clear();
  if (bar != nullptr) munmap(bar, bar_map_len);
  bar = nullptr;
  if (device >= 0) close(device);
  if (group >= 0) {
    ioctl(group, VFIO_GROUP_UNSET_CONTAINER);
    close(group);
  }
  if (container >= 0) close(container);
  device = group = container = -1;
}

std::unique_ptr<VfioTransport> VfioTransport::open(const std::string& bdf, const VfioOptions& o,
                                                   std::string* error) {
  auto impl = std::make_unique<Impl>();
  impl->bdf = bdf;
  impl->o = o;
  impl->group_no = vfio_precheck(o.sysfs, bdf, error);
  if (impl->group_no < 0) return nullptr;
  if (!impl->open_container_and_group(error) || !impl->read_iova_ranges(error) ||
      !impl->map_bar0(error) || !impl->enable_bus_master(error)) {
    return nullptr;
  }
  if (o.interrupts && !impl->setup_interrupts(error)) return nullptr;
  impl->signal_slot = register_signal_slot(impl->reg32(0), impl->cap_timeout_ns);
  install_signal_teardown(o.teardown_on_signal);
  return std::unique_ptr<VfioTransport>(new VfioTransport(std::move(impl)));
}

VfioTransport::VfioTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VfioTransport::~VfioTransport() = default;

std::string VfioTransport::name() const {
  return impl_->where();
}
uint32_t VfioTransport::read32(uint32_t offset) {
  return impl_->read32(offset);
}
void VfioTransport::write32(uint32_t offset, uint32_t value) {
  impl_->write32(offset, value);
}
// 64-bit registers as two 32-bit accesses, low dword first (Base §3.1.4 allows it, and not
// every device or platform supports 8-byte MMIO).
uint64_t VfioTransport::read64(uint32_t offset) {
  const uint32_t lo = impl_->read32(offset);
  const uint32_t hi = impl_->read32(offset + 4);
  return uint64_t{lo} | (uint64_t{hi} << 32);
}
void VfioTransport::write64(uint32_t offset, uint64_t value) {
  impl_->write32(offset, static_cast<uint32_t>(value));
  impl_->write32(offset + 4, static_cast<uint32_t>(value >> 32));
}

Doorbell VfioTransport::doorbell(uint16_t qid, bool cq) {
  Doorbell d;
  const uint64_t off = kDoorbellBase + (2ull * qid + (cq ? 1 : 0)) * impl_->stride;
  if (off + 4 > impl_->bar_mapped) return d;  // reg stays null: the driver reports it
  d.reg = reinterpret_cast<port::Atomic<uint32_t>*>(impl_->bar + off);
  d.mmio = true;
  return d;
}

InterruptLine* VfioTransport::interrupt(uint16_t vector) {
  if (vector >= impl_->irq_fds.size() || !impl_->lines) return nullptr;
  return &impl_->lines[vector];
}

uint16_t VfioTransport::interrupt_vectors() const {
  return static_cast<uint16_t>(impl_->irq_fds.size());
}

Status VfioTransport::dma_alloc(size_t bytes, DmaRegion* out) {
  if (bytes == 0) return Status::error(Code::kInvalidArgument, "zero-byte DMA allocation");
  Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.dma_mu);
  bool huge = m.o.hugepages && !m.hugepages_missing && bytes >= (1u << 20);
  uint64_t len =
      huge ? (bytes + kHugePage - 1) / kHugePage * kHugePage : (bytes + kPage - 1) / kPage * kPage;
  void* p = MAP_FAILED;
  if (huge) {
    p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (21 << MAP_HUGE_SHIFT), -1, 0);
    if (p == MAP_FAILED) {  // no hugepages reserved (vm.nr_hugepages): plain pages
      m.hugepages_missing = true;
      huge = false;
      len = (bytes + kPage - 1) / kPage * kPage;
    }
  }
  if (p == MAP_FAILED)
    p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::error(Code::kNoMemory, "DMA memory: mmap failed");
  // A child of fork() must not get copy-on-write views of pinned pages.
  if (madvise(p, len, MADV_DONTFORK) != 0) {
    munmap(p, len);
    return Status::error(Code::kNoMemory, "DMA memory: madvise(MADV_DONTFORK) failed");
  }
  uint64_t iova = 0;
  if (!m.iova.alloc(len, huge ? kHugePage : kPage, &iova)) {
    munmap(p, len);
    return Status::error(Code::kNoMemory, "no IOVA space left for a DMA mapping");
  }
  vfio_iommu_type1_dma_map map{};
  map.argsz = sizeof map;
  map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
  map.vaddr = reinterpret_cast<uint64_t>(p);
  map.iova = iova;
  map.size = len;
  if (ioctl(m.container, VFIO_IOMMU_MAP_DMA, &map) != 0) {
    const int e = errno;
    munmap(p, len);
    m.iova.release(iova, len);
    if (e == ENOMEM) {
      return Status::error(Code::kNoMemory,
                           "VFIO_IOMMU_MAP_DMA: cannot pin the pages; the locked-memory limit "
                           "is too low: raise it (ulimit -l, LimitMEMLOCK=) or run as root "
                           "(as root: the system is out of memory)");
    }
    if (e == ENOSPC) {
      return Status::error(Code::kNoMemory,
                           "VFIO_IOMMU_MAP_DMA: too many DMA mappings (vfio_iommu_type1 "
                           "dma_entry_limit)");
    }
    return Status::error(Code::kIoError, "VFIO_IOMMU_MAP_DMA failed");
  }
  m.mappings.emplace(iova, Mapping{p, len, huge});
  m.dma_bytes += len;
  if (huge) m.huge_bytes += len;
  out->vaddr = p;
  out->iova = iova;
  out->bytes = bytes;
  return Status::ok();
}

void VfioTransport::dma_free(const DmaRegion& region) {
  if (region.vaddr == nullptr) return;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.dma_mu);
  auto it = m.mappings.find(region.iova);
  if (it == m.mappings.end()) return;
  vfio_iommu_type1_dma_unmap u{};
  u.argsz = sizeof u;
  u.iova = it->first;
  u.size = it->second.bytes;
  const bool unmapped =
      ioctl(m.container, VFIO_IOMMU_UNMAP_DMA, &u) == 0 && u.size == it->second.bytes;
  munmap(it->second.vaddr, it->second.bytes);
  m.dma_bytes -= it->second.bytes;
  if (it->second.huge) m.huge_bytes -= it->second.bytes;
  // An IOVA whose mapping could not be removed is never handed out again.
  if (unmapped) m.iova.release(it->first, it->second.bytes);
  m.mappings.erase(it);
}

VfioCounters VfioTransport::counters() const {
  VfioCounters c;
  c.interrupts = impl_->interrupts.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(impl_->dma_mu);
  c.dma_bytes = impl_->dma_bytes;
  c.dma_mappings = impl_->mappings.size();
  c.hugepage_bytes = impl_->huge_bytes;
  return c;
}

int VfioTransport::iommu_group() const {
  return impl_->group_no;
}

}  // namespace warpfs::nvme
