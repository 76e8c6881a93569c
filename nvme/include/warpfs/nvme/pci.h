// NVMe controller discovery and driver binding: the job of SPDK's scripts/setup.sh and of
// libvfn's vfntool, for the VFIO transport (vfio.h).
//
// list_nvme() finds the PCI functions of class 01h/08h/02h (mass storage / non-volatile
// memory / NVM Express, PCI Code and ID Assignment §1.2) with libpci over sysfs, names them
// from pci.ids, and reads each one's driver, IOMMU group and namespaces' block devices.
// bind_driver() moves a function between the kernel's nvme driver and vfio-pci the way
// setup.sh does (driver_override, unbind, drivers_probe, then a look at the `driver` link);
// unbind_driver() detaches it. Both refuse, changing nothing, while the device is in use:
// under nvme, a namespace, a partition or a holder (dm, md) of one mounted, used as swap or
// open in a process; under vfio-pci, its /dev/vfio/<group> (or /dev/vfio/devices/vfioN)
// open in a process. A move to vfio-pci is also refused when the IOMMU is off or the
// device's IOMMU group holds devices bound to other drivers (VFIO would not open the group).
//
// Everything is read from and written to the trees named in Roots, so tests use fake trees.
// Errors are values: false and a message that names the device and says what to do.
// Thread-safety: no shared state; calls may run concurrently (two binds of one device race
// in the kernel, as two shells running setup.sh would).
//
// Built only where libpci is found (CMake target warpfs_pci, WARPFS_HAVE_LIBPCI).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace warpfs::nvme::pci {

// Where the kernel's trees are. Tests point them at fake trees and stand in for the kernel.
struct Roots {
  std::string sysfs = "/sys";
  std::string proc = "/proc";
  std::string dev = "/dev";
  // Called after each successful write to a sysfs attribute (driver_override, unbind,
  // drivers_probe), where the kernel would react: a fake tree's "kernel" flips the `driver`
  // link here. Null for the real system.
  std::function<void(const std::string& path, const std::string& value)> after_write;
};

// One NVMe controller function.
struct NvmeFunction {
  std::string bdf;  // DDDD:BB:DD.F
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::string vendor;  // from pci.ids through libpci; "" when unknown
  std::string device;
  std::string driver;                      // "" when unbound
  int iommu_group = -1;                    // -1: no IOMMU group (IOMMU off)
  std::vector<std::string> block_devices;  // namespaces (nvme0n1...) while bound to nvme
};

// Every NVMe function in the system, sorted by address. False with a message when sysfs
// cannot be read (an empty list is not an error).
bool list_nvme(const Roots& roots, std::vector<NvmeFunction>* out, std::string* error);

// Moves `bdf` (DDDD:BB:DD.F, or BB:DD.F in domain 0) to `driver`, "vfio-pci" or "nvme";
// loads the driver's module if it is missing (real /sys only). True at once when the device
// is already there. Needs root for the real system: not a precondition but an error
// (EACCES/EPERM from sysfs, reported with "run as root").
bool bind_driver(const Roots& roots, const std::string& bdf, const std::string& driver,
                 std::string* error);

// Detaches `bdf` from its driver (true at once when it has none), with bind_driver()'s
// refusals.
bool unbind_driver(const Roots& roots, const std::string& bdf, std::string* error);

// The list as a table (one header line, one line per function; a line saying there are none
// for an empty list) and as one JSON object per function (no newline), for `warpfs-pci list
// [--json]` and `warpfs --list-devices`.
std::string format_table(const std::vector<NvmeFunction>& functions);
std::string format_json(const NvmeFunction& f);

}  // namespace warpfs::nvme::pci
