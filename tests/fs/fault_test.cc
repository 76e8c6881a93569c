// Device faults injected by the emulated controller, seen through the filesystem:
// the affected operation gets EIO (or ENOSPC for a full namespace), files the fault does not
// touch stay readable, the filesystem keeps working once the fault heals, and fsck finds
// nothing the fault does not explain.
#include <fcntl.h>

#include <cerrno>
#include <thread>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

constexpr uint32_t kLba = 512;  // the rig's namespace format

// The first namespace LBA whose 4 KiB hold `want` (data blocks are found by content: the
// filesystem API has no block map, and a test should not reach into its internals).
uint64_t find_lba(nvme::BackingStore& store, const std::string& want) {
  std::string buf(kBlockSize, '\0');
  for (uint64_t off = 0; off + kBlockSize <= store.bytes(); off += kBlockSize) {
    if (!store.read(off, buf.data(), buf.size()).is_ok()) break;
    if (buf == want) return off / kLba;
  }
  return UINT64_MAX;
}

// Injects a fault of `kind` on the LBAs of the 4 KiB block that holds `block`; false if no
// block on the media holds it.
bool inject_on(Rig& r, nvme::FaultKind kind, const std::string& block,
               uint32_t times = UINT32_MAX) {
  const uint64_t lba = find_lba(*r.stack->store, block);
  if (lba == UINT64_MAX) return false;
  nvme::Fault fault;
  fault.kind = kind;
  fault.slba = lba;
  fault.nlb = kBlockSize / kLba;
  fault.times = times;
  r.stack->transport->inject(fault);
  return true;
}

struct Files {
  Ino a = 0, b = 0;
  std::string a_data, b_data;
};

// Two 64 KiB files on the media (synced, then a remount so nothing is cached).
Files two_files(Rig& r) {
  Files f;
  f.a_data = pattern(1, 0, 16 * kBlockSize);
  f.b_data = pattern(2, 0, 16 * kBlockSize);
  f.a = r.create(kRootInode, "a");
  f.b = r.create(kRootInode, "b");
  EXPECT_EQ(r.write(f.a, 0, f.a_data), 0);
  EXPECT_EQ(r.write(f.b, 0, f.b_data), 0);
  EXPECT_TRUE(r.remount());
  EXPECT_EQ(r.lookup(kRootInode, "a", &f.a), 0);
  EXPECT_EQ(r.lookup(kRootInode, "b", &f.b), 0);
  return f;
}

int read_rc(Rig& r, Ino ino, uint64_t off, size_t len, std::string* out = nullptr) {
  std::string buf(len, '\0');
  size_t got = 0;
  const int rc = r.fs->read(ino, off, len, buf.data(), &got);
  if (out) *out = buf.substr(0, got);
  return rc;
}

TEST(Faults, UnrecoveredReadErrorIsEioForThatFileOnly) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  Files f = two_files(*r);
  ASSERT_TRUE(
      inject_on(*r, nvme::FaultKind::kReadError, f.a_data.substr(5 * kBlockSize, kBlockSize)));

  EXPECT_EQ(read_rc(*r, f.a, 5 * kBlockSize, kBlockSize), EIO);
  EXPECT_EQ(read_rc(*r, f.a, 0, f.a_data.size()), EIO);  // a read across the bad block
  std::string got;
  EXPECT_EQ(read_rc(*r, f.a, 0, 5 * kBlockSize, &got), 0);  // the blocks before it are fine
  EXPECT_EQ(got, f.a_data.substr(0, 5 * kBlockSize));
  EXPECT_EQ(read_rc(*r, f.b, 0, f.b_data.size(), &got), 0);
  EXPECT_EQ(got, f.b_data);
  EXPECT_GE(r->stack->transport->faults_hit(), 2u);

  // Healed (say, the block was rewritten by the drive's firmware): all of it reads again.
  r->stack->transport->clear_faults();
  EXPECT_EQ(read_rc(*r, f.a, 0, f.a_data.size(), &got), 0);
  EXPECT_EQ(got, f.a_data);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Faults, WriteFaultIsEioAndTheFilesystemStaysConsistent) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  Files f = two_files(*r);
  ASSERT_TRUE(inject_on(*r, nvme::FaultKind::kWriteFault, f.a_data.substr(0, kBlockSize)));

  // Overwriting the bad block fails; the other file takes writes as before.
  const std::string fresh = pattern(3, 0, kBlockSize);
  size_t w = 0;
  EXPECT_EQ(r->fs->write(f.a, 0, fresh.size(), fresh.data(), &w), EIO);
  EXPECT_EQ(r->write(f.b, 0, fresh), 0);
  EXPECT_EQ(r->fs->fsync(f.b, false), 0);
  std::string got;
  EXPECT_EQ(read_rc(*r, f.b, 0, kBlockSize, &got), 0);
  EXPECT_EQ(got, fresh);

  r->stack->transport->clear_faults();
  EXPECT_EQ(r->write(f.a, 0, fresh), 0);
  EXPECT_EQ(read_rc(*r, f.a, 0, kBlockSize, &got), 0);
  EXPECT_EQ(got, fresh);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Faults, FullNamespaceIsEnospcAndRecovers) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino c = r->create(kRootInode, "c");
  ASSERT_NE(c, 0u);
  ASSERT_EQ(r->fs->fsync(c, false), 0);  // the create is on the media before the device fills
  r->stack->transport->set_capacity_exceeded(true);
  const std::string data = pattern(4, 0, 8 * kBlockSize);
  size_t w = 0;
  EXPECT_EQ(r->fs->write(c, 0, data.size(), data.data(), &w), ENOSPC);
  EXPECT_GT(r->stack->transport->faults_hit(), 0u);
  r->stack->transport->set_capacity_exceeded(false);
  EXPECT_EQ(r->write(c, 0, data), 0);
  EXPECT_EQ(r->read(c, 0, data.size()), data);
  EXPECT_EQ(r->check_and_remount(), "");
}

// Commands that never complete (bounded waiting): the engine's watchdog times them
// out, resets the controller and re-creates its queues; the operation that waited gets EIO.
constexpr uint64_t kIoTimeoutNs = 200'000'000;

TEST(Faults, AHungReadIsEioAndTheDeviceComesBack) {
  auto r = Rig::make(64, {}, kIoTimeoutNs);
  ASSERT_TRUE(r);
  Files f = two_files(*r);
  ASSERT_TRUE(inject_on(*r, nvme::FaultKind::kNoCompletion,
                        f.a_data.substr(5 * kBlockSize, kBlockSize), 1));

  EXPECT_EQ(read_rc(*r, f.a, 5 * kBlockSize, kBlockSize), EIO);
  // The read fails as soon as the queues stop; the reset finishes after (bounded wait).
  const uint64_t deadline = port::now_ns() + 30 * kIoTimeoutNs;
  while (r->stack->engine->counters().resets == 0 && port::now_ns() < deadline) {
    std::this_thread::yield();
  }
  const nvme::EngineCounters c = r->stack->engine->counters();
  EXPECT_EQ(c.timeouts, 1u);
  EXPECT_EQ(c.resets, 1u);
  EXPECT_FALSE(c.dead);
  // The queues were re-created: both files read whole, the hung block included.
  std::string got;
  EXPECT_EQ(read_rc(*r, f.b, 0, f.b_data.size(), &got), 0);
  EXPECT_EQ(got, f.b_data);
  EXPECT_EQ(read_rc(*r, f.a, 0, f.a_data.size(), &got), 0);
  EXPECT_EQ(got, f.a_data);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Faults, AHungDeviceFailsFsyncAndLosesNothingFsynced) {
  auto r = Rig::make(64, {}, kIoTimeoutNs);
  ASSERT_TRUE(r);
  const std::string kept = pattern(5, 0, 4 * kBlockSize);
  const Ino k = r->create(kRootInode, "kept");
  ASSERT_EQ(r->write(k, 0, kept), 0);
  ASSERT_EQ(r->fs->fsync(k, false), 0);
  // Every command from now on hangs (a device that stopped answering), until healed.
  nvme::Fault fault;
  fault.kind = nvme::FaultKind::kNoCompletion;
  fault.slba = 0;
  fault.nlb = UINT64_MAX / 2;
  r->stack->transport->inject(fault);
  const Ino n = r->create(kRootInode, "new");
  ASSERT_NE(n, 0u);
  // The data write or the commit that makes it durable hangs: one of them is EIO.
  const int wrc = r->write(n, 0, pattern(6, 0, 2 * kBlockSize));
  EXPECT_TRUE(wrc == 0 || wrc == EIO) << wrc;
  EXPECT_EQ(r->fs->fsync(n, false), EIO);
  EXPECT_GE(r->stack->engine->counters().resets, 1u);
  EXPECT_FALSE(r->stack->engine->counters().dead);
  // The device answers again; the filesystem refused to go on after the failed commit, so
  // it is mounted afresh: the fsync'd file is whole and fsck finds nothing.
  r->stack->transport->clear_faults();
  r->fs.reset();
  ASSERT_TRUE(r->mount());
  Ino k2 = 0;
  ASSERT_EQ(r->lookup(kRootInode, "kept", &k2), 0);
  EXPECT_EQ(r->read(k2, 0, kept.size()), kept);
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test

namespace warpfs::fs {
int errno_of(const blockdev::Status& st);  // fs/src/errors.cc
}  // namespace warpfs::fs

namespace warpfs::fs::test {
namespace {

// The one mapping from a device status to an errno: the type matters, not only the code
// (0x81 is Capacity Exceeded among generic statuses and Unrecovered Read Error among media
// ones), and DNR or More do not change it.
TEST(ErrnoOf, MapsEachDeviceStatusOnce) {
  using nvme::make_status;
  EXPECT_EQ(errno_of(blockdev::Status::ok()), 0);
  EXPECT_EQ(errno_of(blockdev::Status::nvme(
                make_status(nvme::sct::kGeneric, nvme::sc::kCapacityExceeded))),
            ENOSPC);
  EXPECT_EQ(errno_of(blockdev::Status::nvme(
                make_status(nvme::sct::kGeneric, nvme::sc::kCapacityExceeded, false))),
            ENOSPC);
  EXPECT_EQ(
      errno_of(blockdev::Status::nvme(make_status(nvme::sct::kGeneric, nvme::sc::kInvalidOpcode))),
      EOPNOTSUPP);
  EXPECT_EQ(errno_of(blockdev::Status::nvme(
                make_status(nvme::sct::kMedia, nvme::sc::kUnrecoveredReadError))),
            EIO);
  EXPECT_EQ(errno_of(blockdev::Status::error(blockdev::Code::kIoError, "cut off")), EIO);
  EXPECT_EQ(errno_of(blockdev::Status::error(blockdev::Code::kInvalidArgument, "range")), EIO);
}

}  // namespace
}  // namespace warpfs::fs::test
