// The parts of the VFIO transport that can be checked without a device: DEVICE names, and
// the sysfs checks that turn a wrong setup into a message saying what to do. (The transport
// itself runs against QEMU's NVMe device in tests/vfio/.)
#include "warpfs/nvme/vfio.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "warpfs/nvme/device.h"

namespace warpfs::nvme {
namespace {

namespace fsys = std::filesystem;

TEST(DeviceName, EmulatedVfioAndNamespaceSuffix) {
  DeviceSpec s;
  std::string err;
  ASSERT_TRUE(parse_device("emu:/tmp/x.img", &s, &err)) << err;
  EXPECT_EQ(s.kind, DeviceSpec::Kind::kEmulated);
  EXPECT_EQ(s.path, "/tmp/x.img");
  EXPECT_EQ(s.nsid, 0u);
  ASSERT_TRUE(parse_device("/tmp/y.img", &s, &err)) << err;
  EXPECT_EQ(s.path, "/tmp/y.img");
  ASSERT_TRUE(parse_device("vfio:0000:01:00.0", &s, &err)) << err;
  EXPECT_EQ(s.kind, DeviceSpec::Kind::kVfio);
  EXPECT_EQ(s.bdf, "0000:01:00.0");
  EXPECT_EQ(s.nsid, 0u);
  ASSERT_TRUE(parse_device("vfio:0000:5e:00.1,ns=2", &s, &err)) << err;
  EXPECT_EQ(s.bdf, "0000:5e:00.1");
  EXPECT_EQ(s.nsid, 2u);
  ASSERT_TRUE(parse_device("emu:a.img,ns=7", &s, &err)) << err;
  EXPECT_EQ(s.path, "a.img");
  EXPECT_EQ(s.nsid, 7u);
}

TEST(DeviceName, BadNamesAreRefusedWithTheExpectedForm) {
  DeviceSpec s;
  for (const char* bad :
       {"", "vfio:", "vfio:01:00.0", "vfio:0000:01:00", "vfio:0000:0g:00.0",
        "vfio:0000:01:00.0,ns=0", "vfio:0000:01:00.0,ns=x", "emu:", "vfio:0000:01:00.0,ns="}) {
    std::string err;
    EXPECT_FALSE(parse_device(bad, &s, &err)) << bad;
    EXPECT_FALSE(err.empty()) << bad;
  }
  std::string err;
  EXPECT_FALSE(parse_device("vfio:1:2:3", &s, &err));
  EXPECT_NE(err.find("vfio:DDDD:BB:DD.F"), std::string::npos) << err;
}

// A fake /sys with one PCI device, shaped by each test.
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warpfs-vfio-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dev_ = root_ + "/bus/pci/devices/" + kBdf;
    fsys::create_directories(dev_);
    fsys::create_directories(root_ + "/bus/pci/drivers/vfio-pci");
    fsys::create_directories(root_ + "/bus/pci/drivers/nvme");
    fsys::create_directories(root_ + "/kernel/iommu_groups/7");
    write("class", "0x010802");
  }
  void TearDown() override { fsys::remove_all(root_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dev_ + "/" + name) << text << "\n";
  }
  void link(const std::string& name, const std::string& target) {
    fsys::remove(dev_ + "/" + name);
    fsys::create_symlink(target, dev_ + "/" + name);
  }
  int check(std::string* err) { return vfio_precheck(root_, kBdf, err); }

  static constexpr const char* kBdf = "0000:00:04.0";
  std::string root_, dev_;
};

TEST_F(FakeSysfs, MissingDeviceNamesTheListTool) {
  std::string err;
  EXPECT_EQ(vfio_precheck(root_, "0000:99:00.0", &err), -1);
  EXPECT_NE(err.find("no PCI device 0000:99:00.0"), std::string::npos) << err;
  EXPECT_NE(err.find("warpfs-pci list"), std::string::npos) << err;
}

TEST_F(FakeSysfs, NotAnNvmeController) {
  write("class", "0x020000");
  std::string err;
  EXPECT_EQ(check(&err), -1);
  EXPECT_NE(err.find("not an NVMe controller"), std::string::npos) << err;
  EXPECT_NE(err.find("0x020000"), std::string::npos) << err;
}

TEST_F(FakeSysfs, UnboundAndBoundToNvmeSayHowToBind) {
  std::string err;
  EXPECT_EQ(check(&err), -1);
  EXPECT_NE(err.find("not bound to any driver"), std::string::npos) << err;
  EXPECT_NE(err.find("warpfs-pci bind 0000:00:04.0 vfio-pci"), std::string::npos) << err;
  link("driver", "../../../bus/pci/drivers/nvme");
  EXPECT_EQ(check(&err), -1);
  EXPECT_NE(err.find("bound to the 'nvme' driver"), std::string::npos) << err;
}

TEST_F(FakeSysfs, NoIommuGroupMeansTheIommuIsOff) {
  link("driver", "../../../bus/pci/drivers/vfio-pci");
  std::string err;
  EXPECT_EQ(check(&err), -1);
  EXPECT_NE(err.find("IOMMU is off"), std::string::npos) << err;
  EXPECT_NE(err.find("intel_iommu=on"), std::string::npos) << err;
}

TEST_F(FakeSysfs, BoundWithAGroupPassesAndReturnsIt) {
  link("driver", "../../../bus/pci/drivers/vfio-pci");
  link("iommu_group", "../../../kernel/iommu_groups/7");
  std::string err;
  EXPECT_EQ(check(&err), 7) << err;
}

TEST_F(FakeSysfs, OpenStopsAtTheFirstProblemWithoutTouchingAnything) {
  link("driver", "../../../bus/pci/drivers/nvme");
  VfioOptions o;
  o.sysfs = root_;
  std::string err;
  EXPECT_EQ(VfioTransport::open(kBdf, o, &err), nullptr);
  EXPECT_NE(err.find("vfio:0000:00:04.0: bound to the 'nvme' driver"), std::string::npos) << err;
}

}  // namespace
}  // namespace warpfs::nvme
