// File handles through the core (Filesystem::lookup of "." and ".."): what the kernel asks
// when it decodes a handle it no longer caches. Alone and beside threads that unlink.
#include <atomic>
#include <thread>
#include <vector>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

TEST(Export, DotOfAnyInodeAndDotDotOfADirectory) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino d = r->mkdir(kRootInode, "d");
  const Ino f = r->create(d, "f");
  Attr a;
  ASSERT_EQ(r->fs->lookup(f, ".", &a), 0) << "\".\" of a regular file";
  EXPECT_EQ(a.ino, f);
  r->fs->forget(f, 1);
  ASSERT_EQ(r->fs->lookup(d, "..", &a), 0);
  EXPECT_EQ(a.ino, kRootInode);
  r->fs->forget(kRootInode, 1);
  // Deleted: stale, also while the kernel still holds its reference.
  ASSERT_EQ(r->fs->unlink(d, "f"), 0);
  EXPECT_EQ(r->fs->lookup(f, ".", &a), ESTALE);
  r->fs->forget(f, 1);
  EXPECT_EQ(r->fs->lookup(f, ".", &a), ESTALE) << "freed";
  EXPECT_EQ(r->fs->lookup(999, ".", &a), ESTALE) << "never used";
  // A reused number comes back with another generation (the kernel compares them).
  const Ino g = r->create(d, "g");
  if (g == f) {
    ASSERT_EQ(r->fs->lookup(g, ".", &a), 0);
    r->fs->forget(g, 1);
    EXPECT_NE(a.generation, 1u) << "a reused inode kept its generation";
  }
  EXPECT_EQ(r->check_and_remount(), "");
}

// Decoders racing unlinks: "." gives the live inode or ESTALE, and every reference it took is
// dropped again without leaking the inode (fsck finds nothing).
TEST(Export, DecodesRacingUnlinks) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  constexpr int kFiles = 200;
  std::vector<Ino> inos;
  for (int i = 0; i < kFiles; ++i) {
    inos.push_back(r->create(kRootInode, "f" + std::to_string(i)));
    r->fs->forget(inos.back(), 1);
  }
  std::atomic<int> bad{0};
  std::thread unlinker([&] {
    for (int i = 0; i < kFiles; ++i) {
      if (r->fs->unlink(kRootInode, "f" + std::to_string(i)) != 0) bad++;
    }
  });
  std::thread decoder([&] {
    for (int round = 0; round < 5; ++round) {
      for (Ino ino : inos) {
        Attr a;
        const int rc = r->fs->lookup(ino, ".", &a);
        if (rc == 0) {
          if (a.ino != ino || a.nlink == 0) bad++;
          r->fs->forget(ino, 1);
        } else if (rc != ESTALE) {
          bad++;
        }
      }
    }
  });
  unlinker.join();
  decoder.join();
  EXPECT_EQ(bad.load(), 0) << r->log;
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test
