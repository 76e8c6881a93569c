// RAID sets as users make and open them: mkfs.warpfs --raid, fsck.warpfs DEV,DEV,..., and
// the refusals of assembly (wrong order, a foreign member, a missing member), each naming the
// device; the filesystem over a set's DeviceStack.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fs/core_rig.h"
#include "warpfs/blockdev/stack.h"

namespace warpfs::fs::test {
namespace {

int run(const std::string& cmd, std::string* out) {
  return run_command(cmd, out);
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
  EXPECT_EQ(run(kFsck + " -f -y " + a, &out), 8) << out;
  EXPECT_NE(out.find("it is member 0 of the RAID 1 set"), std::string::npos) << out;
  EXPECT_EQ(run(kFsck + " -f " + a + "," + b, &out), 0) << out;  // and -y wrote nothing
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
  // One image twice (by two names) is refused before anything waits for its lock.
  EXPECT_EQ(run(kFsck + " -f " + a + ",emu:" + t.path + "/../" +
                    t.path.substr(t.path.rfind('/') + 1) + "/a.img",
                &out),
            8)
      << out;
  EXPECT_NE(out.find("are the same device"), std::string::npos) << out;
  EXPECT_EQ(run(kMkfs + " -q --force --raid 1 " + a + " " + a, &out), 1) << out;
  EXPECT_NE(out.find(a + " and " + a + " are the same device"), std::string::npos) << out;
  // --force makes a new set of old members.
  EXPECT_EQ(run(kMkfs + " -q --force --raid 0 " + b + " " + a, &out), 0) << out;
  EXPECT_EQ(run(kFsck + " -f " + b + "," + a, &out), 0) << out;
#endif
}

// A set whose newest label marks a member failed: fsck and the stack say so, and the
// failed member's blocks are not read (here: its data area is zeroed, and the set checks
// clean all the same).
TEST(RaidProgram, ADegradedSetIsReportedAndItsFailedMemberUnused) {
#ifndef WARPFS_FSCK_BIN
  GTEST_SKIP() << "no fsck.warpfs";
#else
  TempDir t;
  ASSERT_FALSE(t.path.empty());
  const std::string a = t.img("a.img"), b = t.img("b.img");
  std::string out;
  ASSERT_EQ(run(kMkfs + " -q --raid 1 --size 64M " + a + " " + b, &out), 0) << out;
  // Member 1 (b) records member 0 (a) failed, one generation later; a's data is gone.
  {
    FILE* f = std::fopen(b.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::vector<uint8_t> block(kBlockSize);
    ASSERT_EQ(std::fread(block.data(), 1, block.size(), f), block.size());
    blockdev::RaidLabel l;
    std::string why;
    ASSERT_TRUE(blockdev::RaidLabel::decode(block.data(), &l, &why)) << why;
    l.failed = 1;
    l.flags |= blockdev::RaidLabel::kDegraded;
    l.generation = 2;
    l.encode(block.data());
    ASSERT_EQ(std::fseek(f, 0, SEEK_SET), 0);
    ASSERT_EQ(std::fwrite(block.data(), 1, block.size(), f), block.size());
    std::fclose(f);
    ASSERT_EQ(truncate(a.c_str(), blockdev::RaidLabel::kDataOffset * kBlockSize), 0);
    ASSERT_EQ(truncate(a.c_str(), 64 << 20), 0);
  }
  EXPECT_EQ(run(kFsck + " -f -n " + a + "," + b, &out), 0) << out;
  EXPECT_NE(out.find("is degraded: member 0 (" + a + ") failed and is not used"), std::string::npos)
      << out;
  blockdev::StackOptions so;
  so.wait_for_release_s = 0;
  std::string err;
  auto st = blockdev::DeviceStack::open(a + "," + b, so, &err);
  ASSERT_TRUE(st) << err;
  EXPECT_EQ(st->stats().raid.failed, 1u);
  EXPECT_EQ(st->stats().raid.generation, 2u);
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

// Runs a rig on a RAID set (TestDevices reads WARPFS_TEST_RAID when it is made).
struct RaidEnv {
  std::string old;
  bool had;
  explicit RaidEnv(const char* level) {
    const char* e = std::getenv("WARPFS_TEST_RAID");
    had = e != nullptr;
    if (had) old = e;
    setenv("WARPFS_TEST_RAID", level, 1);
  }
  ~RaidEnv() {
    if (had) {
      setenv("WARPFS_TEST_RAID", old.c_str(), 1);
    } else {
      unsetenv("WARPFS_TEST_RAID");
    }
  }
};

int read_rc(Rig& r, Ino ino, uint64_t off, size_t len, std::string* out) {
  out->assign(len, '\0');
  size_t got = 0;
  const int rc = r.fs->read(ino, off, len, out->data(), &got);
  out->resize(got);
  return rc;
}

// Injects `kind` on all of member k's data area (its label stays readable).
void fail_member_media(Rig& r, size_t k, nvme::FaultKind kind) {
  nvme::Fault f;
  f.kind = kind;
  f.slba = blockdev::RaidLabel::kDataOffset * kBlockSize / 512;  // the rig's 512 B LBAs
  f.nlb = UINT32_MAX;
  r.devices->stacks[k]->transport->inject(f);
}

// The faults that fail the single-device tests in fault_test.cc, on one member of a RAID 1:
// reads are served by the mirror (counted), writes go on on the survivor, which records the
// member as failed, and a set powered up again keeps it failed (its stale data never read):
// the filesystem sees no error and checks clean.
TEST(RaidFaults, AMirrorServesReadsAndTakesWritesWhenOneMemberFails) {
  RaidEnv env("1");
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->devices->raid);
  blockdev::RaidBlockDevice& raid = *r->devices->raid;
  const std::string data = pattern(1, 0, 1 << 20);  // 8 stripes of 128 KiB
  const Ino a = r->create(kRootInode, "a");
  ASSERT_EQ(r->write(a, 0, data), 0);
  ASSERT_TRUE(r->remount());
  fail_member_media(*r, 0, nvme::FaultKind::kReadError);
  std::string got;
  for (uint64_t off = 0; off < data.size(); off += 128 << 10) {  // one block of each stripe
    ASSERT_EQ(read_rc(*r, a, off, kBlockSize, &got), 0) << off;
    EXPECT_EQ(got, data.substr(off, kBlockSize)) << off;
  }
  EXPECT_GT(raid.stats().read_failovers, 0u);
  EXPECT_EQ(raid.stats().failed, 0u);
  EXPECT_GT(r->stack->transport->faults_hit(), 0u);

  // Member 0 stops taking writes: the write and its fsync succeed on member 1.
  r->stack->transport->clear_faults();
  fail_member_media(*r, 0, nvme::FaultKind::kWriteFault);
  const std::string fresh = pattern(2, 0, 1 << 20);
  ASSERT_EQ(r->write(a, 0, fresh), 0);
  ASSERT_EQ(r->fs->fsync(a, false), 0);
  EXPECT_TRUE(raid.member_failed(0));
  EXPECT_EQ(raid.stats().generation, 2u);

  // Powered up again (the faults are gone with the old controller), the labels keep member 0
  // failed: its stale data (the first pattern) is never read back.
  ASSERT_TRUE(r->crash_and_remount(1.0));
  ASSERT_TRUE(r->devices->raid);
  EXPECT_TRUE(r->devices->raid->member_failed(0));
  ASSERT_EQ(r->lookup(kRootInode, "a", nullptr), 0);
  for (uint64_t off = 0; off < fresh.size(); off += 128 << 10) {
    ASSERT_EQ(read_rc(*r, a, off, kBlockSize, &got), 0) << off;
    EXPECT_EQ(got, fresh.substr(off, kBlockSize)) << off;
  }
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test
