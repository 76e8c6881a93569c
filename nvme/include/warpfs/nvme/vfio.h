// The VFIO transport: a real PCIe NVMe controller bound to vfio-pci, driven from user space
// with the IOMMU on (the way SPDK and libvfn do it; BaM instead turns the IOMMU off and uses
// a kernel module of its own, BaM §4).
//
//   container (/dev/vfio/vfio, type1 IOMMU) ← group (/dev/vfio/N) → device fd
//   BAR0      mmap'ed: registers (32/64-bit accesses) and doorbells (CAP.DSTRD honoured)
//   config    Memory Space + Bus Master enabled (vfio-pci leaves bus mastering off)
//   DMA       hugepages where the system has them, locked 4 KiB pages otherwise, mapped with
//             VFIO_IOMMU_MAP_DMA at IOVAs this transport allocates inside the IOMMU's valid
//             ranges (the MSI window and reserved regions are never handed out)
//   MSI-X     one eventfd per vector (VFIO_DEVICE_SET_IRQS); a thread turns them into the
//             InterruptLine counters the driver sleeps on, so an idle device costs no CPU
//
// Teardown (destructor, or a fatal/terminating signal while the default action is in
// place): the controller is disabled (CC.EN = 0, wait CSTS.RDY = 0) before any DMA mapping
// goes away, so the device never writes into memory the process no longer owns.
//
// Thread-safety: as Transport. open() and the destructor are not concurrent with anything.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "warpfs/nvme/transport.h"

namespace warpfs::nvme {

struct VfioOptions {
  bool hugepages = true;      // back allocations of >= 1 MiB with 2 MiB hugepages if available
  bool interrupts = true;     // MSI-X through eventfds; false: the driver polls with back-off
  uint16_t max_vectors = 65;  // admin + one per I/O queue, capped by the device's MSI-X count
  // Disable the controller on SIGINT/SIGTERM/SIGHUP/SIGQUIT, for those whose disposition is
  // still the default when the device is opened. A program that stops cleanly on those
  // signals itself (the FUSE daemon unmounts) turns this off. Crash signals (SIGSEGV,
  // SIGBUS, SIGILL, SIGFPE, SIGABRT) with the default disposition are always covered.
  bool teardown_on_signal = true;
  std::string sysfs = "/sys";  // where the PCI device is looked up (tests use fake trees)
};

struct VfioCounters {
  uint64_t interrupts = 0;      // eventfd wake-ups delivered to InterruptLines
  uint64_t dma_bytes = 0;       // mapped right now
  uint64_t dma_mappings = 0;    // VFIO_IOMMU_MAP_DMA calls live right now
  uint64_t hugepage_bytes = 0;  // of dma_bytes, backed by hugepages
};

class VfioTransport final : public Transport {
 public:
  // `bdf` is DDDD:BB:DD.F. On failure returns null and a message that says what to do.
  static std::unique_ptr<VfioTransport> open(const std::string& bdf, const VfioOptions& o,
                                             std::string* error);
  ~VfioTransport() override;
  VfioTransport(const VfioTransport&) = delete;
  VfioTransport& operator=(const VfioTransport&) = delete;

  std::string name() const override;
  uint32_t read32(uint32_t offset) override;
  void write32(uint32_t offset, uint32_t value) override;
  uint64_t read64(uint32_t offset) override;
  void write64(uint32_t offset, uint64_t value) override;
  Doorbell doorbell(uint16_t qid, bool cq) override;
  InterruptLine* interrupt(uint16_t vector) override;
  uint16_t interrupt_vectors() const override;
  Status dma_alloc(size_t bytes, DmaRegion* out) override;
  void dma_free(const DmaRegion& region) override;

  VfioCounters counters() const;
  int iommu_group() const;

  struct Impl;

 private:
  explicit VfioTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Checks what open() would check in sysfs, without opening anything: that `bdf` exists, is
// an NVMe controller, is bound to vfio-pci and sits in an IOMMU group. Returns the group
// number, or -1 and a message that says what to do.
int vfio_precheck(const std::string& sysfs, const std::string& bdf, std::string* error);

}  // namespace warpfs::nvme
