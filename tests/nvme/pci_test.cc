// NVMe discovery and binding (pci.h) on fake sysfs/proc/dev trees: listing through libpci
// (names from the system's pci.ids), the sysfs writes of a move and their order, the
// refusals (mounted, swap, open, IOMMU off, group not viable), the errors for wrong devices,
// and the warpfs-pci tool itself.
#include "warpfs/nvme/pci.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace warpfs::nvme::pci {
namespace {

namespace fs = std::filesystem;

constexpr const char* kQemu = "0000:01:00.0";   // 1b36:0010, nvme, group 12, nvme0n1/nvme0n2
constexpr const char* kIntel = "0000:02:00.0";  // 8086:0953, vfio-pci, group 13
constexpr const char* kLoose = "0000:03:00.0";  // 1b36:0010, no driver, no IOMMU group
constexpr const char* kVga = "0000:00:02.0";    // 1234:1111, a display controller

void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::trunc) << text;
}

std::string get(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A temporary sysfs/proc/dev, and a stand-in for the kernel: it records every write bind()
// makes and reacts to unbind and drivers_probe as the driver core would.
class FakeHost {
 public:
  FakeHost() {
    char tmpl[] = "/tmp/warpfs-pci-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    roots.sysfs = (root_ / "sys").string();
    roots.proc = (root_ / "proc").string();
    roots.dev = (root_ / "dev").string();
    fs::create_directories(sys() / "bus/pci/devices");
    fs::create_directories(root_ / "proc");
    fs::create_directories(root_ / "dev/vfio");
    put(sys() / "bus/pci/drivers_probe", "");
    roots.after_write = [this](const std::string& path, const std::string& value) {
      kernel(path, value);
    };
  }
  ~FakeHost() { fs::remove_all(root_); }
  FakeHost(const FakeHost&) = delete;
  FakeHost& operator=(const FakeHost&) = delete;

  fs::path sys() const { return root_ / "sys"; }
  fs::path dev_dir(const std::string& bdf) const { return sys() / "bus/pci/devices" / bdf; }

  void add_driver(const std::string& name) {
    put(sys() / "bus/pci/drivers" / name / "bind", "");
    put(sys() / "bus/pci/drivers" / name / "unbind", "");
  }

  // A PCI function with the files libpci's sysfs back end reads (vendor, device, class,
  // config) and those bind() uses (driver_override, driver and iommu_group links).
  void add_device(const std::string& bdf, uint16_t vendor, uint16_t device, uint32_t cls,
                  const std::string& driver, int group) {
    const fs::path d = dev_dir(bdf);
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%04x\n", vendor);
    put(d / "vendor", buf);
    std::snprintf(buf, sizeof buf, "0x%04x\n", device);
    put(d / "device", buf);
    std::snprintf(buf, sizeof buf, "0x%06x\n", cls);
    put(d / "class", buf);
    std::string config(64, '\0');  // PCI Local Bus §6.1: ids at 0, class code at 9
    config[0] = static_cast<char>(vendor & 0xff);
    config[1] = static_cast<char>(vendor >> 8);
    config[2] = static_cast<char>(device & 0xff);
    config[3] = static_cast<char>(device >> 8);
    config[9] = static_cast<char>(cls & 0xff);
    config[10] = static_cast<char>(cls >> 8 & 0xff);
    config[11] = static_cast<char>(cls >> 16);
    put(d / "config", config);
    put(d / "driver_override", "(null)\n");
    if (!driver.empty()) link_driver(bdf, driver);
    if (group >= 0) {
      const fs::path g = sys() / "kernel/iommu_groups" / std::to_string(group);
      fs::create_directories(g / "devices");
      fs::create_directory_symlink(d, g / "devices" / bdf);
      fs::create_directory_symlink("../../../kernel/iommu_groups/" + std::to_string(group),
                                   d / "iommu_group");
    }
  }

  void link_driver(const std::string& bdf, const std::string& driver) {
    add_driver(driver);
    fs::create_directory_symlink("../../drivers/" + driver, dev_dir(bdf) / "driver");
  }

  // A namespace's disk under controller `ctrl` of `bdf`, with partitions p1..pN.
  void add_namespace(const std::string& bdf, const std::string& ctrl, const std::string& ns,
                     int partitions) {
    const fs::path n = dev_dir(bdf) / "nvme" / ctrl / ns;
    fs::create_directories(n / "holders");
    put(n / "dev", "259:0\n");
    for (int p = 1; p <= partitions; ++p) {
      fs::create_directories(n / (ns + "p" + std::to_string(p)) / "holders");
    }
  }

  // Process `pid` named `comm` with descriptor `fd` open on `target`.
  void add_open(int pid, const std::string& comm, int fd, const std::string& target) {
    const fs::path p = root_ / "proc" / std::to_string(pid);
    put(p / "comm", comm + "\n");
    fs::create_directories(p / "fd");
    fs::create_symlink(target, p / "fd" / std::to_string(fd));
  }

  void set_proc(const std::string& name, const std::string& text) {
    put(root_ / "proc" / name, text);
  }

  std::string driver_of(const std::string& bdf) const {
    std::error_code ec;
    const fs::path t = fs::read_symlink(dev_dir(bdf) / "driver", ec);
    return ec ? "" : t.filename().string();
  }

  // The standard tree: the four functions above and the two drivers.
  void standard() {
    add_driver("nvme");
    add_driver("vfio-pci");
    add_device(kQemu, 0x1b36, 0x0010, 0x010802, "nvme", 12);
    add_namespace(kQemu, "nvme0", "nvme0n1", 3);
    add_namespace(kQemu, "nvme0", "nvme0n2", 0);
    add_device(kIntel, 0x8086, 0x0953, 0x010802, "vfio-pci", 13);
    add_device(kLoose, 0x1b36, 0x0010, 0x010802, "", -1);
    add_device(kVga, 0x1234, 0x1111, 0x030000, "", 14);
  }

  Roots roots;
  std::vector<std::pair<std::string, std::string>> writes;  // (path under the root, value)
  bool probes = true;  // false: drivers_probe binds nothing (a driver that refuses the device)

 private:
  void kernel(const std::string& path, const std::string& value) {
    const std::string rel = fs::path(path).lexically_relative(root_).string();
    writes.emplace_back(rel, value);
    if (rel.size() > 7 && rel.compare(rel.size() - 7, 7, "/unbind") == 0) {
      fs::remove(dev_dir(value) / "driver");
    } else if (rel == "sys/bus/pci/drivers_probe" && probes && driver_of(value).empty()) {
      std::string override = get(dev_dir(value) / "driver_override");
      while (!override.empty() && override.back() == '\n') override.pop_back();
      link_driver(value, override.empty() || override == "(null)" ? "nvme" : override);
    }
  }

  fs::path root_;
};

using Writes = std::vector<std::pair<std::string, std::string>>;

const NvmeFunction* find(const std::vector<NvmeFunction>& v, const std::string& bdf) {
  for (const NvmeFunction& f : v) {
    if (f.bdf == bdf) return &f;
  }
  return nullptr;
}

TEST(PciList, FindsNvmeFunctionsOnlyWithNamesDriversGroupsAndNamespaces) {
  FakeHost h;
  h.standard();
  std::vector<NvmeFunction> fns;
  std::string err;
  ASSERT_TRUE(list_nvme(h.roots, &fns, &err)) << err;
  ASSERT_EQ(fns.size(), 3u) << "the display controller is not an NVMe function";
  EXPECT_EQ(fns[0].bdf, kQemu) << "sorted by address";
  EXPECT_EQ(find(fns, kVga), nullptr);

  const NvmeFunction* q = find(fns, kQemu);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->vendor_id, 0x1b36);
  EXPECT_EQ(q->device_id, 0x0010);
  EXPECT_EQ(q->vendor, "Red Hat, Inc.");
  EXPECT_EQ(q->device, "QEMU NVM Express Controller");
  EXPECT_EQ(q->driver, "nvme");
  EXPECT_EQ(q->iommu_group, 12);
  EXPECT_EQ(q->block_devices, (std::vector<std::string>{"nvme0n1", "nvme0n2"}))
      << "namespaces, not their partitions";

  const NvmeFunction* i = find(fns, kIntel);
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(i->vendor, "Intel Corporation");
  EXPECT_EQ(i->device, "PCIe Data Center SSD");
  EXPECT_EQ(i->driver, "vfio-pci");
  EXPECT_EQ(i->iommu_group, 13);
  EXPECT_TRUE(i->block_devices.empty());

  const NvmeFunction* l = find(fns, kLoose);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->driver, "");
  EXPECT_EQ(l->iommu_group, -1);

  const std::string table = format_table(fns);
  EXPECT_NE(table.find("BDF"), std::string::npos);
  EXPECT_NE(table.find("0000:01:00.0  1b36:0010  Red Hat, Inc. QEMU NVM Express Controller"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("nvme0n1,nvme0n2"), std::string::npos) << table;
  EXPECT_EQ(format_json(*q),
            "{\"bdf\":\"0000:01:00.0\",\"vendor_id\":\"1b36\",\"device_id\":\"0010\","
            "\"vendor\":\"Red Hat, Inc.\",\"device\":\"QEMU NVM Express Controller\","
            "\"driver\":\"nvme\",\"iommu_group\":12,\"block_devices\":[\"nvme0n1\",\"nvme0n2\"]}");
  EXPECT_NE(format_json(*l).find("\"driver\":null,\"iommu_group\":null"), std::string::npos);
}

TEST(PciList, MultipathPathsNameTheirHeadDisk) {
  FakeHost h;
  h.add_device(kQemu, 0x1b36, 0x0010, 0x010802, "nvme", 12);
  h.add_namespace(kQemu, "nvme1", "nvme3c1n1", 0);  // subsystem 3, controller 1, namespace 1
  h.add_namespace(kQemu, "nvme1", "nvme3c1n2", 0);
  std::vector<NvmeFunction> fns;
  std::string err;
  ASSERT_TRUE(list_nvme(h.roots, &fns, &err)) << err;
  ASSERT_EQ(fns.size(), 1u);
  EXPECT_EQ(fns[0].block_devices, (std::vector<std::string>{"nvme3n1", "nvme3n2"}));
}

TEST(PciList, EmptyAndBrokenSysfs) {
  FakeHost h;
  std::vector<NvmeFunction> fns{NvmeFunction{}};
  std::string err;
  ASSERT_TRUE(list_nvme(h.roots, &fns, &err)) << err;
  EXPECT_TRUE(fns.empty());
  EXPECT_EQ(format_table(fns), "no NVMe controllers (PCI class 01h/08h/02h) found\n");

  // libpci dies on a tree it cannot read; the error comes back instead of an exit.
  h.roots.sysfs += "/missing";
  EXPECT_FALSE(list_nvme(h.roots, &fns, &err));
  EXPECT_NE(err.find("cannot list PCI devices"), std::string::npos) << err;
  EXPECT_NE(err.find(h.roots.sysfs + "/bus/pci/devices"), std::string::npos) << err;
  // And libpci works again afterwards (the jump left no state behind).
  h.roots.sysfs.resize(h.roots.sysfs.size() - 8);
  EXPECT_TRUE(list_nvme(h.roots, &fns, &err)) << err;
}

TEST(PciBind, ToVfioAndBackWritesWhatSetupShWrites) {
  FakeHost h;
  h.standard();
  std::string err;
  ASSERT_TRUE(bind_driver(h.roots, "01:00.0", "vfio-pci", &err)) << err;  // domain 0 implied
  EXPECT_EQ(h.writes, (Writes{{"sys/bus/pci/devices/0000:01:00.0/driver_override", "vfio-pci"},
                              {"sys/bus/pci/drivers/nvme/unbind", kQemu},
                              {"sys/bus/pci/drivers_probe", kQemu}}));
  EXPECT_EQ(get(h.dev_dir(kQemu) / "driver_override"), "vfio-pci");
  EXPECT_EQ(get(h.sys() / "bus/pci/drivers/nvme/unbind"), kQemu);
  EXPECT_EQ(get(h.sys() / "bus/pci/drivers_probe"), kQemu);
  EXPECT_EQ(h.driver_of(kQemu), "vfio-pci");

  h.writes.clear();
  ASSERT_TRUE(bind_driver(h.roots, kQemu, "nvme", &err)) << err;
  EXPECT_EQ(h.writes, (Writes{{"sys/bus/pci/devices/0000:01:00.0/driver_override", "\n"},
                              {"sys/bus/pci/drivers/vfio-pci/unbind", kQemu},
                              {"sys/bus/pci/drivers_probe", kQemu}}));
  EXPECT_EQ(h.driver_of(kQemu), "nvme");

  h.writes.clear();  // an unbound controller: nothing to unbind from
  ASSERT_TRUE(bind_driver(h.roots, kLoose, "nvme", &err)) << err;
  EXPECT_EQ(h.writes, (Writes{{"sys/bus/pci/devices/0000:03:00.0/driver_override", "\n"},
                              {"sys/bus/pci/drivers_probe", kLoose}}));
  EXPECT_EQ(h.driver_of(kLoose), "nvme");
}

TEST(PciBind, AlreadyThereWritesNothing) {
  FakeHost h;
  h.standard();
  std::string err;
  EXPECT_TRUE(bind_driver(h.roots, kIntel, "vfio-pci", &err)) << err;
  EXPECT_TRUE(bind_driver(h.roots, kQemu, "nvme", &err)) << err;
  EXPECT_TRUE(h.writes.empty());
}

TEST(PciBind, ReportsADeviceThatDidNotRebind) {
  FakeHost h;
  h.standard();
  h.probes = false;
  std::string err;
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("did not bind to vfio-pci"), std::string::npos) << err;
  EXPECT_NE(err.find("bound to no driver"), std::string::npos) << err;
}

TEST(PciUnbind, WritesTheDriversUnbindAndChecksTheLink) {
  FakeHost h;
  h.standard();
  std::string err;
  ASSERT_TRUE(unbind_driver(h.roots, kQemu, &err)) << err;
  EXPECT_EQ(h.writes, (Writes{{"sys/bus/pci/drivers/nvme/unbind", kQemu}}));
  EXPECT_EQ(h.driver_of(kQemu), "");
  h.writes.clear();
  EXPECT_TRUE(unbind_driver(h.roots, kQemu, &err)) << err;
  EXPECT_TRUE(h.writes.empty()) << "already without a driver";
}

TEST(PciRefuse, MountedNamespacePartitionOrHolder) {
  FakeHost h;
  h.standard();
  std::string err;
  // Mounts of other disks, including one whose name extends a namespace's, do not count.
  h.set_proc("mounts",
             "/dev/sda1 / ext4 rw 0 0\n/dev/nvme0n10 /x ext4 rw 0 0\n"
             "/dev/nvme0n1p2 /mnt/my\\040data ext4 rw,relatime 0 0\n");
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("0000:01:00.0 is in use"), std::string::npos) << err;
  EXPECT_NE(err.find("/dev/nvme0n1p2 is mounted on /mnt/my data (ext4)"), std::string::npos) << err;
  EXPECT_EQ(err.find("nvme0n10"), std::string::npos) << err;
  EXPECT_EQ(err.find("sda1"), std::string::npos) << err;
  EXPECT_FALSE(unbind_driver(h.roots, kQemu, &err));
  EXPECT_NE(err.find("/dev/nvme0n1p2 is mounted"), std::string::npos) << err;
  EXPECT_TRUE(h.writes.empty());
  EXPECT_EQ(h.driver_of(kQemu), "nvme");

  // Through a /dev symlink (fstab's UUID=...).
  fs::create_directories(h.sys().parent_path() / "dev/disk/by-uuid");
  put(h.sys().parent_path() / "dev/nvme0n1p1", "");
  fs::create_symlink("../../nvme0n1p1", h.sys().parent_path() / "dev/disk/by-uuid/1234-abcd");
  h.set_proc("mounts", "/dev/disk/by-uuid/1234-abcd /boot vfat rw 0 0\n");
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("/dev/disk/by-uuid/1234-abcd is mounted on /boot"), std::string::npos) << err;

  // Through a device-mapper holder of the second namespace.
  fs::create_directories(h.dev_dir(kQemu) / "nvme/nvme0/nvme0n2/holders/dm-0");
  put(h.sys() / "class/block/dm-0/dm/name", "vg-data\n");
  h.set_proc("mounts", "/dev/mapper/vg-data /srv xfs rw 0 0\n");
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("/dev/mapper/vg-data is mounted on /srv (xfs)"), std::string::npos) << err;

  // Nothing of it mounted: the move goes ahead.
  h.set_proc("mounts", "/dev/sda1 / ext4 rw 0 0\n");
  EXPECT_TRUE(bind_driver(h.roots, kQemu, "vfio-pci", &err)) << err;
  EXPECT_EQ(h.driver_of(kQemu), "vfio-pci");
}

TEST(PciRefuse, SwapOrAnOpenBlockDevice) {
  FakeHost h;
  h.standard();
  std::string err;
  h.set_proc("swaps",
             "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
             "/dev/nvme0n1p3                          partition\t1048572\t\t0\t\t-2\n");
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("/dev/nvme0n1p3 is in use as swap"), std::string::npos) << err;
  h.set_proc("swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n");

  h.add_open(310, "postgres", 9, "/dev/nvme0n2");
  EXPECT_FALSE(unbind_driver(h.roots, kQemu, &err));
  EXPECT_NE(err.find("/dev/nvme0n2 is open in process 310 (postgres)"), std::string::npos) << err;
  EXPECT_TRUE(h.writes.empty());
}

TEST(PciRefuse, VfioGroupHeldOpenNamesTheProcess) {
  FakeHost h;
  h.standard();
  h.add_open(100, "qemu-system-x86", 3, "/dev/vfio/99");  // another group
  h.add_open(4242, "warpfs", 7, "/dev/vfio/13");
  std::string err;
  EXPECT_FALSE(bind_driver(h.roots, kIntel, "nvme", &err));
  EXPECT_NE(err.find("0000:02:00.0 is in use, leaving it on vfio-pci"), std::string::npos) << err;
  EXPECT_NE(err.find("/dev/vfio/13 is open in process 4242 (warpfs)"), std::string::npos) << err;
  EXPECT_EQ(err.find("qemu"), std::string::npos) << err;
  EXPECT_FALSE(unbind_driver(h.roots, kIntel, &err));
  EXPECT_NE(err.find("process 4242"), std::string::npos) << err;
  EXPECT_TRUE(h.writes.empty());
  EXPECT_EQ(h.driver_of(kIntel), "vfio-pci");

  fs::remove(h.sys().parent_path() / "proc/4242/fd/7");  // the process closed it
  EXPECT_TRUE(bind_driver(h.roots, kIntel, "nvme", &err)) << err;
  EXPECT_EQ(h.driver_of(kIntel), "nvme");
}

TEST(PciRefuse, IommuOffSaysHowToTurnItOn) {
  FakeHost h;
  h.standard();
  std::string err;
  EXPECT_FALSE(bind_driver(h.roots, kLoose, "vfio-pci", &err));
  EXPECT_NE(err.find("the IOMMU is off"), std::string::npos) << err;
  EXPECT_NE(err.find("intel_iommu=on"), std::string::npos) << err;
  EXPECT_NE(err.find("amd_iommu=on"), std::string::npos) << err;
  EXPECT_TRUE(h.writes.empty());
}

TEST(PciRefuse, GroupWithDevicesOnOtherDriversIsNotViable) {
  FakeHost h;
  h.standard();
  h.add_device("0000:01:00.1", 0x1b36, 0x000d, 0x0c0330, "xhci_hcd", 12);  // USB, same group
  h.add_device("0000:01:00.2", 0x1b36, 0x0001, 0x060400, "pcieport", 12);  // a bridge: fine
  h.add_device("0000:01:00.3", 0x1b36, 0x0010, 0x010802, "", 12);          // unbound: fine
  std::string err;
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("IOMMU group 12 of 0000:01:00.0 is not viable"), std::string::npos) << err;
  EXPECT_NE(err.find("0000:01:00.1 (bound to xhci_hcd)"), std::string::npos) << err;
  EXPECT_EQ(err.find("0000:01:00.2"), std::string::npos) << err;
  EXPECT_EQ(err.find("0000:01:00.3"), std::string::npos) << err;
  EXPECT_TRUE(h.writes.empty());
  EXPECT_EQ(h.driver_of(kQemu), "nvme");
}

TEST(PciErrors, WrongDevicesDriversAndTrees) {
  FakeHost h;
  h.standard();
  std::string err;
  EXPECT_FALSE(bind_driver(h.roots, "0000:05:00.0", "vfio-pci", &err));
  EXPECT_NE(err.find("no PCI device 0000:05:00.0"), std::string::npos) << err;
  EXPECT_FALSE(bind_driver(h.roots, kVga, "vfio-pci", &err));
  EXPECT_NE(err.find("0000:00:02.0 is not an NVMe controller (PCI class 0x030000"),
            std::string::npos)
      << err;
  EXPECT_FALSE(unbind_driver(h.roots, kVga, &err));
  EXPECT_NE(err.find("is not an NVMe controller"), std::string::npos) << err;
  EXPECT_FALSE(bind_driver(h.roots, "01:00", "vfio-pci", &err));
  EXPECT_NE(err.find("'01:00' is not a PCI address"), std::string::npos) << err;
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "uio_pci_generic", &err));
  EXPECT_NE(err.find("the drivers are vfio-pci and nvme"), std::string::npos) << err;

  // vfio-pci not loaded: a fake tree never runs modprobe on the real kernel.
  fs::remove_all(h.sys() / "bus/pci/drivers/vfio-pci");
  fs::remove(h.dev_dir(kIntel) / "driver");
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("the vfio-pci driver is not loaded"), std::string::npos) << err;
  EXPECT_NE(err.find("modprobe vfio-pci"), std::string::npos) << err;
  EXPECT_TRUE(h.writes.empty());
}

TEST(PciErrors, UnwritableSysfsNamesTheFileAndAsksForRoot) {
  FakeHost h;
  h.standard();
  std::string err;
  fs::remove(h.dev_dir(kQemu) / "driver_override");  // a kernel older than 3.16
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("cannot open " + h.dev_dir(kQemu).string() +
                     "/driver_override: No such file or directory"),
            std::string::npos)
      << err;
  EXPECT_TRUE(h.writes.empty());
  EXPECT_EQ(h.driver_of(kQemu), "nvme");

  if (::geteuid() == 0) GTEST_SKIP() << "root writes read-only files";
  put(h.dev_dir(kQemu) / "driver_override", "");
  ::chmod((h.dev_dir(kQemu) / "driver_override").c_str(), 0444);
  EXPECT_FALSE(bind_driver(h.roots, kQemu, "vfio-pci", &err));
  EXPECT_NE(err.find("driver_override: Permission denied (run as root)"), std::string::npos) << err;
  EXPECT_EQ(h.driver_of(kQemu), "nvme");
}

// The tool: exit status, stdout, stderr prefix.
struct ToolRun {
  int status = -1;
  std::string out;
};

ToolRun run_tool(const FakeHost& h, const std::string& args) {
  const std::string cmd = std::string(WARPFS_PCI_BIN) + " --sysfs " + h.roots.sysfs + " --proc " +
                          h.roots.proc + " --dev " + h.roots.dev + " " + args + " 2>&1";
  ToolRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(PciTool, ListBindUnbindAndErrors) {
  FakeHost h;
  h.standard();
  ToolRun r = run_tool(h, "list --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3) << r.out;
  EXPECT_EQ(r.out.rfind("{\"bdf\":\"0000:01:00.0\",\"vendor_id\":\"1b36\"", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\"block_devices\":[\"nvme0n1\",\"nvme0n2\"]"), std::string::npos);

  r = run_tool(h, "list");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("BDF ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("Intel Corporation PCIe Data Center SSD"), std::string::npos) << r.out;

  // Without the fake kernel a move cannot complete here; the moves are tested above.
  r = run_tool(h, "bind 0000:09:00.0 vfio-pci");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out.rfind("warpfs-pci: no PCI device 0000:09:00.0", 0), 0u) << r.out;
  h.set_proc("mounts", "/dev/nvme0n1p1 /data ext4 rw 0 0\n");
  r = run_tool(h, "unbind 0000:01:00.0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("warpfs-pci: 0000:01:00.0 is in use"), std::string::npos) << r.out;
  r = run_tool(h, "frobnicate");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("warpfs-pci: unknown command 'frobnicate'"), std::string::npos) << r.out;
  r = run_tool(h, "--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("usage: warpfs-pci list"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace warpfs::nvme::pci
