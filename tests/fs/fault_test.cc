// Device faults injected by the emulated controller, seen through the filesystem (issue 7):
// the affected operation gets EIO (or ENOSPC for a full namespace), files the fault does not
// touch stay readable, the filesystem keeps working once the fault heals, and fsck finds
// nothing the fault does not explain.
#include <fcntl.h>

#include <cerrno>

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
  const uint64_t lba = find_lba(*r->stack->store, f.a_data.substr(5 * kBlockSize, kBlockSize));
  ASSERT_NE(lba, UINT64_MAX);
  nvme::Fault fault;
  fault.kind = nvme::FaultKind::kReadError;
  fault.slba = lba;
  fault.nlb = kBlockSize / kLba;
  r->stack->transport->inject(fault);

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
  const uint64_t lba = find_lba(*r->stack->store, f.a_data.substr(0, kBlockSize));
  ASSERT_NE(lba, UINT64_MAX);
  nvme::Fault fault;
  fault.kind = nvme::FaultKind::kWriteFault;
  fault.slba = lba;
  fault.nlb = kBlockSize / kLba;
  r->stack->transport->inject(fault);

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

}  // namespace
}  // namespace warpfs::fs::test
