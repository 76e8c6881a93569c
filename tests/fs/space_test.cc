// Space freed by unlink, truncate and punch is there for the next allocation at once: every
// allocating operation commits the transaction that holds freed blocks and retries before
// it reports ENOSPC (filesystem.h; internal.h retry_enospc). Alone and with threads.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/statvfs.h>

#include <atomic>
#include <thread>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

// Blocks file data may still take.
uint64_t avail_blocks(Filesystem& fs) {
  struct statvfs st;
  EXPECT_EQ(fs.statfs(&st), 0);
  return st.f_bavail;
}

// A file of `bytes` through fallocate; its inode. The kernel's reference from the create is
// dropped (forget) as the kernel drops it when it evicts an unlinked inode.
Ino big_file(Rig& r, const std::string& name, uint64_t bytes) {
  const Ino f = r.create(kRootInode, name);
  EXPECT_EQ(r.fs->fallocate(f, 0, 0, bytes), 0) << name << "\n" << r.log;
  r.fs->forget(f, 1);
  return f;
}

// Most of the free space, in bytes: two of these never fit at once.
uint64_t most(Rig& r) {
  return avail_blocks(*r.fs) * 3 / 4 * kBlockSize;
}

TEST(Space, FallocateRightAfterUnlinkOfAFileAsBig) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const uint64_t bytes = most(*r);
  big_file(*r, "a", bytes);
  ASSERT_EQ(r->fs->unlink(kRootInode, "a"), 0);
  const Ino b = r->create(kRootInode, "b");
  EXPECT_EQ(r->fs->fallocate(b, 0, 0, bytes), 0) << r->log;
  EXPECT_EQ(r->size(b), bytes);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Space, WriteRightAfterTruncateAndPunch) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const uint64_t bytes = most(*r);
  const Ino a = big_file(*r, "a", bytes);
  SetAttr s;
  s.size = true;
  s.new_size = 0;
  Attr at;
  ASSERT_EQ(r->fs->setattr(a, s, &at), 0);  // truncate: its blocks are held until a commit
  const Ino b = r->create(kRootInode, "b");
  const std::string data = pattern(3, 0, static_cast<size_t>(bytes));
  EXPECT_EQ(r->write(b, 0, data), 0) << r->log;
  // Punch b's whole range and fill a again, by writing.
  ASSERT_EQ(r->fs->fallocate(b, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, bytes), 0);
  EXPECT_EQ(r->write(a, 0, data), 0) << r->log;
  EXPECT_EQ(r->read(a, bytes - 100, 100), data.substr(static_cast<size_t>(bytes) - 100));
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Space, MetadataAllocationsRightAfterUnlink) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  // Fill the disk to the metadata reserve, then free one file.
  const Ino a = big_file(*r, "a", most(*r));
  (void)a;
  const Ino fill = r->create(kRootInode, "fill");
  uint64_t off = 0;
  for (;;) {
    const uint64_t n = avail_blocks(*r->fs);
    if (n == 0) break;
    if (r->fs->fallocate(fill, 0, off, n * kBlockSize) != 0) break;
    off += n * kBlockSize;
  }
  EXPECT_EQ(avail_blocks(*r->fs), 0u);
  ASSERT_EQ(r->fs->unlink(kRootInode, "a"), 0);
  // Directories, xattr blocks, long symlinks and big directories all allocate.
  Attr at;
  const Ino d = r->mkdir(kRootInode, "d");
  EXPECT_NE(d, 0u);
  const std::string v(3000, 'x');
  EXPECT_EQ(r->fs->setxattr(fill, "user.big", v.data(), v.size(), 0), 0) << r->log;
  EXPECT_EQ(r->fs->symlink(d, "s", std::string(2000, 't'), Caller{}, &at), 0) << r->log;
  r->fs->forget(at.ino, 1);
  EXPECT_EQ(r->check_and_remount(), "");
}

// Two threads take turns with most of the disk: each allocates, then unlinks. Whatever the
// interleaving, at most two such files exist, and a commit frees what an unlink held: no
// ENOSPC, ever.
TEST(Space, ThreadsTakingTurnsWithMostOfTheDiskNeverSeeEnospc) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const uint64_t bytes = avail_blocks(*r->fs) * 2 / 5 * kBlockSize;  // two fit, not three
  std::atomic<int> enospc{0}, other{0};
  auto turn = [&](int t) {
    for (int i = 0; i < 12; ++i) {
      const std::string name = "t" + std::to_string(t);
      Attr a;
      int rc = r->fs->mknod(kRootInode, name, S_IFREG | 0644, 0, Caller{}, &a);
      if (rc == 0) {
        r->fs->forget(a.ino, 1);
        rc = i % 2 ? r->fs->fallocate(a.ino, 0, 0, bytes) : 0;
        if (rc == 0 && i % 2 == 0) {
          const std::string data = pattern(t, 0, static_cast<size_t>(bytes));
          size_t w = 0;
          rc = r->fs->write(a.ino, 0, data.size(), data.data(), &w);
          if (rc == 0 && w != data.size()) rc = ENOSPC;
        }
      }
      if (rc == ENOSPC)
        enospc++;
      else if (rc)
        other++;
      if (r->fs->unlink(kRootInode, name) != 0) other++;
    }
  };
  std::thread t1(turn, 1), t2(turn, 2);
  t1.join();
  t2.join();
  EXPECT_EQ(enospc.load(), 0) << r->log;
  EXPECT_EQ(other.load(), 0) << r->log;
  EXPECT_EQ(r->check_and_remount(), "");
}

// A punch over a file fragmented into one-block extents frees more extents than one
// transaction can hold the leaves of: it goes in pieces of a few extents each (as truncate
// does), so the journal never overflows (which would leave the filesystem read-only).
TEST(Space, PunchOfAFragmentedFileFitsTheJournal) {
  MkfsOptions mo;
  mo.journal_blocks = 64;  // a transaction of at most 61 blocks: about 61 extent leaves
  auto r = Rig::make(256, mo);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  constexpr uint64_t kBlocks = 34048;  // 17024 one-block extents: 67 leaves of 255
  const std::string mib(1 << 20, 'd');
  for (uint64_t off = 0; off < kBlocks * kBlockSize; off += mib.size())
    ASSERT_EQ(r->write(f, off, mib), 0);
  for (uint64_t b = 1; b < kBlocks; b += 2) {
    ASSERT_EQ(
        r->fs->fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, b * kBlockSize, kBlockSize),
        0);
  }
  fs::InodeReport rep;
  ASSERT_EQ(r->fs->inspect(f, &rep), 0);
  ASSERT_GT(rep.extents.size(), 61u * kExtentNodeCapacity / 2) << "not fragmented enough to test";
  ASSERT_EQ(
      r->fs->fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, kBlocks * kBlockSize), 0)
      << r->log;
  ASSERT_EQ(r->fs->sync(), 0) << r->log;
  EXPECT_FALSE(r->fs->read_only()) << r->log;
  ASSERT_EQ(r->fs->inspect(f, &rep), 0);
  EXPECT_TRUE(rep.extents.empty()) << rep.extents.size() << " extents left, the first at "
                                   << (rep.extents.empty() ? 0 : rep.extents[0].logical) << "+"
                                   << (rep.extents.empty() ? 0 : rep.extents[0].blocks());
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test
