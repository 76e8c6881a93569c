// RAID sets as users make and open them: mkfs.warpfs --raid, fsck.warpfs DEV,DEV,..., and
// the refusals of assembly (wrong order, a foreign member, a missing member), each naming the
// device; the filesystem over a set's DeviceStack.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fs/core_rig.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/layout.h"

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

// A RAID 1 of images a, b (`mib` MiB each) as a failed member leaves it: b's label records
// member 0 failed one generation later, and a's data area is zeroed.
void fail_member0(const std::string& a, const std::string& b, uint64_t mib) {
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
  ASSERT_EQ(truncate(a.c_str(), static_cast<off_t>(mib) << 20), 0);
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
  ASSERT_NO_FATAL_FAILURE(fail_member0(a, b, 64));
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

// fsck.warpfs --resync on images: a degraded RAID 1 (member 0's data lost, the survivor's
// label says so) is rebuilt and checks clean with byte-equal copies; a blank image in a
// member's place is refused by a plain open, naming the position, and rebuilt by --resync;
// a RAID 0 set, a member of another set, a single device and -n are refused.
TEST(RaidProgram, ResyncRebuildsFailedAndBlankMembers) {
#ifndef WARPFS_FSCK_BIN
  GTEST_SKIP() << "no fsck.warpfs";
#else
  TempDir t;
  ASSERT_FALSE(t.path.empty());
  const std::string a = t.img("a.img"), b = t.img("b.img"), c = t.img("c.img"), x = t.img("x.img"),
                    y = t.img("y.img");
  std::string out;
  ASSERT_EQ(run(kMkfs + " -q --raid 1 --size 32M " + a + " " + b, &out), 0) << out;
  // b records a failed, one generation later; a's data is gone.
  ASSERT_NO_FATAL_FAILURE(fail_member0(a, b, 32));
  auto data_of = [](const std::string& img) {
    std::string s;
    FILE* f = std::fopen(img.c_str(), "rb");
    if (!f) return s;
    std::fseek(f, blockdev::RaidLabel::kDataOffset * kBlockSize, SEEK_SET);
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
    std::fclose(f);
    return s;
  };
  EXPECT_NE(data_of(a), data_of(b));
  EXPECT_EQ(run(kFsck + " -n --resync " + a + "," + b, &out), 16) << out;
  EXPECT_EQ(run(kFsck + " --resync " + a + "," + b, &out), 0) << out;
  EXPECT_NE(out.find("RAID member 0 (" + a + ") rebuilt"), std::string::npos) << out;
  EXPECT_NE(out.find("label generation 4, not degraded"), std::string::npos) << out;
  EXPECT_EQ(data_of(a), data_of(b));
  EXPECT_EQ(run(kFsck + " -f " + a + "," + b, &out), 0) << out;
  EXPECT_EQ(out.find("degraded"), std::string::npos) << out;
  EXPECT_EQ(run(kFsck + " --resync " + a + "," + b, &out), 0) << out;
  EXPECT_NE(out.find("not degraded: nothing to resync"), std::string::npos) << out;
  // A blank image in member 1's place.
  FILE* blank = std::fopen(c.c_str(), "wb");
  ASSERT_NE(blank, nullptr);
  std::fclose(blank);
  ASSERT_EQ(truncate(c.c_str(), 32 << 20), 0);
  EXPECT_EQ(run(kFsck + " -f " + a + "," + c, &out), 8) << out;
  EXPECT_NE(out.find(c + " (given as member 1): not a member of a RAID set"), std::string::npos)
      << out;
  // Member 1 is not marked failed (its image was set aside whole): b may hold newer data
  // than a's label knows of, so replacing it takes --replace.
  EXPECT_EQ(run(kFsck + " --resync " + a + "," + c, &out), 8) << out;
  EXPECT_NE(out.find("is not marked failed"), std::string::npos) << out;
  EXPECT_EQ(run(kFsck + " --replace " + a + "," + c, &out), 16) << out;  // needs --resync
  EXPECT_EQ(run(kFsck + " --resync --replace " + a + "," + c, &out), 0) << out;
  EXPECT_NE(out.find("RAID member 1 (" + c + ") rebuilt"), std::string::npos) << out;
  EXPECT_EQ(data_of(a), data_of(c));
  EXPECT_EQ(run(kFsck + " -f " + a + "," + c, &out), 0) << out;
  // The old member 1 is stale now: the set names c in its place.
  EXPECT_EQ(run(kFsck + " -f " + a + "," + b, &out), 8) << out;
  EXPECT_NE(out.find(b + " was member 1 of RAID set"), std::string::npos) << out;
  EXPECT_NE(out.find("has been replaced (now " + c), std::string::npos) << out;
  EXPECT_EQ(run(kFsck + " --resync " + a + "," + b, &out), 8) << out;
  EXPECT_NE(out.find("has been replaced"), std::string::npos) << out;
  // Refusals.
  ASSERT_EQ(run(kMkfs + " -q --raid 0 --size 16M " + x + " " + y, &out), 0) << out;
  EXPECT_EQ(run(kFsck + " --resync " + x + "," + y, &out), 8) << out;
  EXPECT_NE(out.find("is RAID 0"), std::string::npos) << out;
  EXPECT_EQ(run(kFsck + " --resync " + a + "," + y, &out), 8) << out;
  EXPECT_NE(out.find(y + " (given as member 1) is a member of another RAID set"), std::string::npos)
      << out;
  EXPECT_EQ(run(kFsck + " --resync " + a, &out), 8) << out;
  EXPECT_NE(out.find("a resync takes a RAID set's devices"), std::string::npos) << out;
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

// A member of a set as resync sees it, that goes dark at its set's `cut`-th write: the power
// fails on every member then (each loses what its volatile write cache held, at random) and
// nothing more reaches any of them.
struct CutAt {
  int cut = -1;  // -1: never
  std::atomic<int> writes{0};
  std::atomic<bool> gone{false};
  TestDevices* devices = nullptr;
};
class CuttingMember final : public blockdev::BlockDevice {
 public:
  CuttingMember(blockdev::BlockDevice& in, CutAt& c) : in_(in), c_(c) {}
  uint32_t block_bytes() const override { return in_.block_bytes(); }
  uint64_t block_count() const override { return in_.block_count(); }
  blockdev::Status read(uint64_t b, uint32_t n, void* buf) override {
    return c_.gone ? dark() : in_.read(b, n, buf);
  }
  blockdev::Status write(uint64_t b, uint32_t n, const void* buf) override {
    if (c_.writes.fetch_add(1) == c_.cut) {
      c_.gone = true;
      c_.devices->power_cut(0.5);
    }
    return c_.gone ? dark() : in_.write(b, n, buf);
  }
  blockdev::Status flush() override { return c_.gone ? dark() : in_.flush(); }
  blockdev::Status trim(uint64_t b, uint64_t n) override {
    return c_.gone ? dark() : in_.trim(b, n);
  }

 private:
  static blockdev::Status dark() {
    return blockdev::Status::error(blockdev::Code::kIoError, "power cut");
  }
  blockdev::BlockDevice& in_;
  CutAt& c_;
};

// Member k's data rows, read from its own device.
std::string member_rows(TestDevices& d, size_t k, uint64_t rows) {
  std::string s(rows * kBlockSize, '\0');
  for (uint64_t r = 0; r < rows; r += 256) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(256, rows - r));
    EXPECT_TRUE(d.nvme[k]
                    ->read(blockdev::RaidLabel::kDataOffset + r, n, s.data() + r * kBlockSize)
                    .is_ok());
  }
  return s;
}

// A RAID 1 whose member 1 failed and then missed writes is rebuilt offline: a power cut at
// a point of the resync (each member's controller losing its volatile cache on its own
// draws) leaves a set that opens degraded (or, past the first final label, whole) with
// the filesystem intact and clean; the resync run again (or first) leaves the set whole,
// both copies byte-equal, the files intact and fsck clean.
TEST(RaidResync, AFailedMirrorIsRebuiltAndACutMidResyncLeavesTheSetDegraded) {
  // Cut points: the survivor's label, the label area, the 8th data chunk, none.
  for (int cut : {0, 2, 11, -1}) {
    SCOPED_TRACE("cut " + std::to_string(cut));
    RaidEnv env("1");
    auto r = Rig::make(24);
    ASSERT_TRUE(r);
    const std::string one = pattern(1, 0, 3 << 20), two = pattern(2, 0, 2 << 20);
    const Ino a = r->create(kRootInode, "a");
    ASSERT_EQ(r->write(a, 0, one), 0);
    ASSERT_TRUE(r->remount());
    fail_member_media(*r, 1, nvme::FaultKind::kWriteFault);
    const Ino b = r->create(kRootInode, "b");
    ASSERT_EQ(r->write(b, 0, two), 0);
    ASSERT_EQ(r->write(a, 1 << 20, two.substr(0, 1 << 20)), 0);
    ASSERT_EQ(r->fs->fsync(a, false), 0);
    ASSERT_TRUE(r->devices->raid->member_failed(1));
    ASSERT_EQ(r->fs->unmount(), 0) << r->log;
    r->fs.reset();
    r->cut.reset();
    TestDevices& d = *r->devices;
    d.raid.reset();
    d.stacks[1]->transport->clear_faults();
    CutAt c;
    c.cut = cut;
    c.devices = &d;
    CuttingMember m0(*d.nvme[0], c), m1(*d.nvme[1], c);
    std::vector<blockdev::RaidMemberSeen> seen(2);
    seen[0].name = "member0", seen[1].name = "member1";
    blockdev::RaidResyncReport rep;
    std::string err;
    const bool done = blockdev::resync_raid_set({&m0, &m1}, seen, nullptr, &rep, &err).is_ok();
    EXPECT_EQ(done, cut < 0) << err;
    // Powered off and on (the power already went at a cut).
    auto cycle = [&] {
      d.power_off();
      const bool ok = d.power_on({}, 0, r->io_timeout_ns, &err);
      EXPECT_TRUE(ok) << err;
      r->stack = ok ? d.stacks[0].get() : nullptr;
      r->dev = ok ? &d.device() : nullptr;
      return ok;
    };
    if (!c.gone) d.power_cut(1.0);
    ASSERT_TRUE(cycle());
    if (!done) {
      ASSERT_TRUE(d.raid->member_failed(1));
      ASSERT_TRUE(r->mount());
      std::string got;
      ASSERT_EQ(read_rc(*r, b, 0, two.size(), &got), 0);
      EXPECT_EQ(got, two);
      ASSERT_EQ(r->fs->unmount(), 0) << r->log;
      r->fs.reset();
      r->cut.reset();
      d.raid.reset();
      ASSERT_TRUE(
          blockdev::resync_raid_set({d.nvme[0].get(), d.nvme[1].get()}, seen, nullptr, &rep, &err)
              .is_ok())
          << err;
      d.power_cut(1.0);
      ASSERT_TRUE(cycle());
    }
    EXPECT_EQ(rep.rebuilt, 2u);
    ASSERT_TRUE(d.raid);
    EXPECT_EQ(d.raid->stats().failed, 0u);
    const uint64_t rows = d.raid->map().member_blocks;
    EXPECT_TRUE(member_rows(d, 0, rows) == member_rows(d, 1, rows));
    EXPECT_EQ(r->fsck_unmounted(), "");
    ASSERT_TRUE(r->mount());
    std::string got;
    ASSERT_EQ(read_rc(*r, b, 0, two.size(), &got), 0);
    EXPECT_EQ(got, two);
    ASSERT_EQ(read_rc(*r, a, 0, one.size(), &got), 0);
    EXPECT_EQ(got, one.substr(0, 1 << 20) + two.substr(0, 1 << 20) + one.substr(2 << 20));
  }
}

// fsck compares a mirror's copies (pass M): a corrupted copy of an inode-table block on
// member 0 (a problem) and of a file's data block on member 1 (a notice: after a crash file
// data may differ) are both reported by a check (which writes nothing); a repair takes the
// inode block from member 1, whose checksums verify, and the data block from member 0, the
// lowest-numbered member; then both copies are equal, fsck is clean and the file reads back.
TEST(RaidFsck, ComparesMirrorsAndRepairsFromTheVerifiedOrLowestCopy) {
  RaidEnv env("1");
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const std::string data = pattern(7, 0, 256 << 10);
  const Ino a = r->create(kRootInode, "a");
  ASSERT_EQ(r->write(a, 0, data), 0);
  ASSERT_NE(r->mkdir(kRootInode, "d"), 0u);
  ASSERT_EQ(r->fs->unmount(), 0) << r->log;
  r->fs.reset();
  blockdev::RaidBlockDevice& raid = *r->devices->raid;
  ASSERT_EQ(raid.copies(), 2u);
  const Layout l(r->superblock_at(0));
  const uint64_t ib = l.inode_block(kRootInode);
  uint64_t db = 0;  // the file's first data block
  std::vector<uint8_t> blk(kBlockSize);
  for (uint64_t b = l.first_group; b < l.block_count && db == 0; ++b) {
    ASSERT_TRUE(raid.read(b, 1, blk.data()).is_ok());
    if (std::memcmp(blk.data(), data.data(), kBlockSize) == 0) db = b;
  }
  ASSERT_NE(db, 0u);
  std::vector<uint8_t> inode_block(kBlockSize);
  ASSERT_TRUE(raid.read_copy(ib, 1, 1, inode_block.data()).is_ok());
  auto corrupt = [&](uint64_t b, uint32_t c, size_t off) {
    std::vector<uint8_t> x(kBlockSize);
    ASSERT_TRUE(raid.read_copy(b, 1, c, x.data()).is_ok());
    x[off] ^= 0x40;
    ASSERT_TRUE(raid.write_copy(b, 1, c, x.data()).is_ok());
  };
  corrupt(ib, 0, l.inode_offset(kRootInode) + 16);
  corrupt(db, 1, 100);
  ASSERT_TRUE(raid.flush().is_ok());
  auto run_fsck = [&](bool repair, FsckResult* res) {
    FsckOptions o;
    o.repair = repair;
    std::string out;
    *res = fsck(raid, o, [&](const std::string& line) { out += line + "\n"; });
    return out;
  };
  FsckResult res;
  std::string out = run_fsck(false, &res);
  EXPECT_EQ(res.exit_code, kFsckUncorrected) << out;
  EXPECT_EQ(res.copies_differing, 2u) << out;
  EXPECT_NE(out.find("block " + std::to_string(ib) +
                     " (the inode table of group 0): the copy on member 0 (member0) differs "
                     "from member 1 (member1)'s"),
            std::string::npos)
      << out;
  EXPECT_NE(
      out.find("block " + std::to_string(db) +
               " (data area of group 0): the copy on member 1 (member1) differs from member 0 "
               "(member0)'s"),
      std::string::npos)
      << out;
  std::vector<uint8_t> x(kBlockSize), y(kBlockSize);
  ASSERT_TRUE(raid.read_copy(ib, 1, 0, x.data()).is_ok());
  EXPECT_NE(x, inode_block);  // the check wrote nothing
  out = run_fsck(true, &res);
  EXPECT_EQ(res.exit_code & kFsckUncorrected, 0) << out;
  EXPECT_NE(res.exit_code & kFsckCorrected, 0) << out;
  EXPECT_NE(out.find("rewritten from member 1 (member1)'s copy (its checksum verifies)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rewritten from member 0 (member0)'s copy (the lowest-numbered member)"),
            std::string::npos)
      << out;
  for (uint64_t b : {ib, db}) {
    ASSERT_TRUE(raid.read_copy(b, 1, 0, x.data()).is_ok());
    ASSERT_TRUE(raid.read_copy(b, 1, 1, y.data()).is_ok());
    EXPECT_EQ(x, y) << b;
  }
  EXPECT_EQ(x, std::vector<uint8_t>(data.begin(), data.begin() + kBlockSize));
  ASSERT_TRUE(raid.read_copy(ib, 1, 0, x.data()).is_ok());
  EXPECT_EQ(x, inode_block);
  out = run_fsck(false, &res);
  EXPECT_EQ(res.exit_code, kFsckClean) << out;
  EXPECT_EQ(res.copies_differing, 0u);
  // A zeroed copy of an inode-table block (a lost mapping, a stray trim) verifies too (no
  // inode in it fails its checksum): the repair takes the copy with the inodes, not the
  // lowest-numbered one, which would wipe them from both.
  ASSERT_TRUE(raid.write_copy(ib, 1, 0, std::vector<uint8_t>(kBlockSize, 0).data()).is_ok());
  ASSERT_TRUE(raid.flush().is_ok());
  out = run_fsck(false, &res);
  EXPECT_EQ(res.copies_differing, 1u) << out;
  out = run_fsck(true, &res);
  EXPECT_NE(out.find("rewritten from member 1 (member1)'s copy (its checksum verifies)"),
            std::string::npos)
      << out;
  ASSERT_TRUE(raid.read_copy(ib, 1, 0, x.data()).is_ok());
  EXPECT_EQ(x, inode_block);
  ASSERT_TRUE(r->mount());
  std::string got;
  ASSERT_EQ(read_rc(*r, a, 0, data.size(), &got), 0);
  EXPECT_EQ(got, data);
}

// pass M reads a copy block by block after a read error in its chunk: an unreadable block on
// one copy and another on the other copy, in the same chunk, are each served from the copy
// that can read it, and only those blocks are reported.
TEST(RaidFsck, ReadErrorsOnBothCopiesOfOneChunkAreEachServedByTheOtherCopy) {
  RaidEnv env("1");
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const std::string data = pattern(9, 0, 64 << 10);
  const Ino a = r->create(kRootInode, "a");
  ASSERT_EQ(r->write(a, 0, data), 0);
  ASSERT_EQ(r->fs->unmount(), 0) << r->log;
  r->fs.reset();
  blockdev::RaidBlockDevice& raid = *r->devices->raid;
  uint64_t db = 0;
  const Layout l(r->superblock_at(0));
  std::vector<uint8_t> blk(kBlockSize);
  for (uint64_t b = l.first_group; b < l.block_count && db == 0; ++b) {
    ASSERT_TRUE(raid.read(b, 1, blk.data()).is_ok());
    if (std::memcmp(blk.data(), data.data(), kBlockSize) == 0) db = b;
  }
  ASSERT_NE(db, 0u);
  // RAID 1: set block b is member block kDataOffset + b on every member (512 B LBAs).
  auto unreadable = [&](size_t k, uint64_t b) {
    nvme::Fault f;
    f.kind = nvme::FaultKind::kReadError;
    f.slba = (blockdev::RaidLabel::kDataOffset + b) * kBlockSize / 512;
    f.nlb = kBlockSize / 512;
    r->devices->stacks[k]->transport->inject(f);
  };
  unreadable(0, db);      // block db on member 0
  unreadable(1, db + 1);  // block db + 1 on member 1
  FsckOptions o;
  o.repair = false;
  std::string out;
  FsckResult res = fsck(raid, o, [&](const std::string& line) { out += line + "\n"; });
  EXPECT_EQ(res.copies_differing, 2u) << out;
  EXPECT_EQ(out.find("no copy can be read"), std::string::npos) << out;
  EXPECT_NE(out.find("block " + std::to_string(db) +
                     " (data area of group 0): the copy on "
                     "member 0 (member0) (unreadable)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("block " + std::to_string(db + 1) +
                     " (data area of group 0): the copy on "
                     "member 1 (member1) (unreadable)"),
            std::string::npos)
      << out;
}

// A power cut that tears a write of a RAID 1 tears each member's copy on its own draws
// (TestDevices::make_cut): the members stop at independent points, so the two copies of the
// torn blocks differ, each block old or new on each copy.
TEST(RaidCrash, ATornWriteTearsEachMirrorCopyIndependently) {
  RaidEnv env("1");
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->fs->unmount(), 0) << r->log;
  r->fs.reset();
  const uint64_t at = r->dev->block_count() - 200;  // free blocks before the backup
  const std::string data = pattern(9, 0, 64 * kBlockSize);
  r->cut->cut_at(1, true, 12345);
  EXPECT_FALSE(r->cut->write(at, 64, data.data()).is_ok());
  ASSERT_TRUE(r->power_cycle(1.0));  // what reached each member's cache persists
  blockdev::RaidBlockDevice& raid = *r->devices->raid;
  EXPECT_EQ(raid.stats().failed, 0u);  // no label changed: every member was cut
  std::string c0(64 * kBlockSize, '\0'), c1(64 * kBlockSize, '\0');
  ASSERT_TRUE(raid.read_copy(at, 64, 0, c0.data()).is_ok());
  ASSERT_TRUE(raid.read_copy(at, 64, 1, c1.data()).is_ok());
  const std::string zero(kBlockSize, '\0');
  int differ = 0, landed0 = 0, landed1 = 0;
  for (uint64_t i = 0; i < 64; ++i) {
    const std::string a = c0.substr(i * kBlockSize, kBlockSize),
                      b = c1.substr(i * kBlockSize, kBlockSize);
    const std::string want = data.substr(i * kBlockSize, kBlockSize);
    EXPECT_TRUE(a == want || a == zero) << i;
    EXPECT_TRUE(b == want || b == zero) << i;
    differ += a != b;
    landed0 += a == want;
    landed1 += b == want;
  }
  EXPECT_GT(differ, 0);
  EXPECT_GT(landed0, 0);
  EXPECT_GT(landed1, 0);
  EXPECT_LT(landed0, 64);
  EXPECT_LT(landed1, 64);
}

}  // namespace
}  // namespace warpfs::fs::test
