// RAID sets as users make and open them: mkfs.warpfs --raid, fsck.warpfs DEV,DEV,..., and
// the refusals of assembly (wrong order, a foreign member, a missing member), each naming the
// device; the filesystem over a set's DeviceStack.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fs/core_rig.h"
#include "warpfs/blockdev/stack.h"

namespace warpfs::fs::test {
namespace {

int run(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  out->clear();
  while (std::fgets(buf, sizeof buf, p) != nullptr) *out += buf;
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

struct TempDir {
  std::string path;
  TempDir() {
    char d[] = "/tmp/warpfs-raid-XXXXXX";
    path = mkdtemp(d) ? d : "";
  }
  ~TempDir() {
    if (!path.empty()) (void)std::system(("rm -rf " + path).c_str());
  }
  std::string img(const std::string& name) const { return path + "/" + name; }
};

const std::string kMkfs = WARPFS_MKFS_BIN;
#ifdef WARPFS_FSCK_BIN
const std::string kFsck = WARPFS_FSCK_BIN;
#endif

TEST(RaidProgram, MkfsMakesSetsThatOpenOnlyWhole) {
#ifndef WARPFS_FSCK_BIN
  GTEST_SKIP() << "no fsck.warpfs";
#else
  TempDir t;
  ASSERT_FALSE(t.path.empty());
  const std::string a = t.img("a.img"), b = t.img("b.img"), c = t.img("c.img"), d = t.img("d.img"),
                    e = t.img("e.img");
  std::string out;
  ASSERT_EQ(run(kMkfs + " --raid 1 --size 64M " + a + " " + b, &out), 0) << out;
  EXPECT_NE(out.find("RAID 1 over 2 members, stripe 128 KiB"), std::string::npos) << out;
  EXPECT_EQ(run(kFsck + " -f " + a + "," + b, &out), 0) << out;
  // Wrong order: named, with the order to give.
  EXPECT_EQ(run(kFsck + " -f " + b + "," + a, &out), 8) << out;
  EXPECT_NE(out.find(b + " is member 1 of RAID set"), std::string::npos) << out;
  EXPECT_NE(out.find("given as member 0: give them in the order " + a + "," + b), std::string::npos)
      << out;
  // RAID 0 of three with a 64 KiB stripe; a member of the first set is foreign to it.
  ASSERT_EQ(run(kMkfs + " -q --raid 0 --stripe 64K --size 32M " + c + "," + d + "," + e, &out), 0)
      << out;
  EXPECT_EQ(run(kFsck + " -f " + c + "," + d + "," + e, &out), 0) << out;
  EXPECT_EQ(run(kFsck + " -f " + c + "," + b + "," + e, &out), 8) << out;
  EXPECT_NE(out.find(b + " is a member of another RAID set"), std::string::npos) << out;
  // A missing member: its position and the name it was made from.
  EXPECT_EQ(run(kFsck + " -f " + c + "," + d, &out), 8) << out;
  EXPECT_NE(out.find("member 2 of RAID set"), std::string::npos) << out;
  EXPECT_NE(out.find("(" + e + ", generated id"), std::string::npos) << out;
  EXPECT_NE(out.find("is missing: 2 of 3 devices given"), std::string::npos) << out;
  // A member is no filesystem of its own, and mkfs will not overwrite it unasked.
  EXPECT_NE(run(kFsck + " -f " + a, &out), 0) << out;
  EXPECT_EQ(run(kMkfs + " " + a, &out), 1) << out;
  EXPECT_NE(out.find("contains member 0 of RAID set"), std::string::npos) << out;
  EXPECT_EQ(run(kMkfs + " --raid 1 " + a + " " + c, &out), 1) << out;
  EXPECT_NE(out.find(a + " contains member 0 of RAID set"), std::string::npos) << out;
  // Bad requests make nothing.
  EXPECT_EQ(
      run(kMkfs + " --raid 10 --size 32M " + t.img("x1") + " " + t.img("x2") + " " + t.img("x3"),
          &out),
      2)
      << out;
  EXPECT_NE(out.find("RAID 10 needs an even number of devices"), std::string::npos) << out;
  EXPECT_NE(access(t.img("x1").c_str(), F_OK), 0);
  EXPECT_EQ(run(kMkfs + " --raid 5 " + a + " " + b, &out), 2) << out;
  EXPECT_EQ(run(kMkfs + " --raid 1 --stripe 12K " + a + " " + b, &out), 2) << out;
  EXPECT_EQ(run(kMkfs + " --raid 1 " + a, &out), 2) << out;
  EXPECT_EQ(run(kMkfs + " " + a + " " + b, &out), 2) << out;
  EXPECT_EQ(run(kMkfs + " " + a + "," + b, &out), 2) << out;
  EXPECT_NE(out.find("give --raid"), std::string::npos) << out;
  // --force makes a new set of old members.
  EXPECT_EQ(run(kMkfs + " -q --force --raid 0 " + b + " " + a, &out), 0) << out;
  EXPECT_EQ(run(kFsck + " -f " + b + "," + a, &out), 0) << out;
#endif
}

// The device-list syntax: key=value pieces stay with the device before them.
TEST(RaidProgram, DeviceListsSplitAtDevicesNotOptions) {
  using blockdev::split_device_list;
  EXPECT_EQ(split_device_list("emu:a.img"), std::vector<std::string>{"emu:a.img"});
  EXPECT_EQ(split_device_list("emu:a.img,ns=2"), std::vector<std::string>{"emu:a.img,ns=2"});
  EXPECT_EQ(split_device_list("emu:a,ns=2,vfio:0000:01:00.0,ns=3,b.img"),
            (std::vector<std::string>{"emu:a,ns=2", "vfio:0000:01:00.0,ns=3", "b.img"}));
  EXPECT_EQ(split_device_list("a,,b"), (std::vector<std::string>{"a", "", "b"}));
}

// The filesystem over a set opened as the daemon opens it: files written through a RAID 1
// of two images survive a remount, either member's data is the whole filesystem's, and the
// set checks clean.
TEST(RaidStack, FilesystemOverASetRemountsAndChecksClean) {
  TempDir t;
  ASSERT_FALSE(t.path.empty());
  const std::string list = t.img("m0.img") + "," + t.img("m1.img");
  std::string out;
  ASSERT_EQ(run(kMkfs + " -q --raid 1 --size 64M " + t.img("m0.img") + " " + t.img("m1.img"), &out),
            0)
      << out;
  blockdev::StackOptions so;
  so.cache_mb = 8;  // each member its own cache shard
  so.wait_for_release_s = 0;
  std::string err, log;
  so.log = [&](const std::string& s) { log += s + "\n"; };
  const std::string data(300000, 'r');
  for (int round = 0; round < 2; ++round) {
    auto st = blockdev::DeviceStack::open(list, so, &err);
    ASSERT_TRUE(st) << err;
    ASSERT_EQ(st->members().size(), 2u);
    MountOptions mo;
    mo.log = [&](const std::string& s) { log += s + "\n"; };
    auto fs = Filesystem::mount(st->device(), mo, &err);
    ASSERT_TRUE(fs) << err << log;
    Attr a;
    if (round == 0) {
      ASSERT_EQ(fs->mknod(kRootInode, "f", S_IFREG | 0644, 0, Caller{}, &a), 0);
      size_t done = 0;
      ASSERT_EQ(fs->write(a.ino, 0, data.size(), data.data(), &done), 0);
      ASSERT_EQ(done, data.size());
    } else {
      ASSERT_EQ(fs->lookup(kRootInode, "f", &a), 0);
      std::string back(data.size(), 0);
      size_t got = 0;
      ASSERT_EQ(fs->read(a.ino, 0, back.size(), back.data(), &got), 0);
      EXPECT_EQ(got, data.size());
      EXPECT_EQ(back, data);
      const blockdev::StackStats ss = st->stats();
      EXPECT_TRUE(ss.is_raid);
      EXPECT_EQ(ss.raid.level, 1u);
      EXPECT_EQ(ss.raid.failed, 0u);
    }
    EXPECT_EQ(fs->unmount(), 0) << log;
  }
#ifdef WARPFS_FSCK_BIN
  EXPECT_EQ(run(kFsck + " -f " + list, &out), 0) << out;
#endif
}

}  // namespace
}  // namespace warpfs::fs::test
