// The metadata cache's cap (MountOptions::meta_cache_mb) and forgetting: what the kernel
// forgets leaves the cache, the cache stays under its cap while the kernel holds inodes, and
// every block dropped reads back from its home exactly (the tree, data and xattrs after
// shrink_caches() are the same, and fsck is clean). Under concurrency: tests/fs/stress.h
// runs with a 1 MiB cache on every other seed.
#include <sys/stat.h>

#include <vector>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

struct Made {
  std::vector<Ino> dirs, files;
};

// `d` directories of `f` files each, every file with a little data and an xattr. Lookups of
// everything are kept (as the kernel keeps its inodes) unless `forget`.
Made make_tree(Rig& r, int d, int f, bool forget) {
  Made m;
  for (int i = 0; i < d; ++i) {
    const Ino dir = r.mkdir(kRootInode, "d" + std::to_string(i));
    m.dirs.push_back(dir);
    for (int j = 0; j < f; ++j) {
      const Ino ino = r.create(dir, "file-with-a-longer-name-" + std::to_string(j));
      EXPECT_EQ(r.write(ino, 0, pattern(ino, 0, 100)), 0);
      const std::string v = "v" + std::to_string(ino);
      EXPECT_EQ(r.fs->setxattr(ino, "user.x", v.data(), v.size(), 0), 0);
      m.files.push_back(ino);
      if (forget) r.fs->forget(ino, 1);
    }
    if (forget) r.fs->forget(dir, 1);
  }
  return m;
}

// Every file of the tree reads back right, by name.
void check_tree(Rig& r, int d, int f) {
  for (int i = 0; i < d; ++i) {
    Ino dir = 0;
    ASSERT_EQ(r.lookup(kRootInode, "d" + std::to_string(i), &dir), 0);
    for (int j = 0; j < f; ++j) {
      Ino ino = 0;
      ASSERT_EQ(r.lookup(dir, "file-with-a-longer-name-" + std::to_string(j), &ino), 0);
      EXPECT_EQ(r.read(ino, 0, 200), pattern(ino, 0, 100));
      std::string v;
      EXPECT_EQ(r.fs->getxattr(ino, "user.x", &v), 0);
      EXPECT_EQ(v, "v" + std::to_string(ino));
    }
  }
}

TEST(MetaCache, WhatTheKernelForgetsLeavesTheCache) {
  auto r = Rig::make(256);
  ASSERT_TRUE(r);
  const uint64_t at_mount = r->fs->stats().meta_buffers;
  make_tree(*r, 30, 200, true);  // 6000 inodes: ~400 inode-table blocks, ~300 directory blocks
  r->fs->shrink_caches();
  const FsStats s = r->fs->stats();
  EXPECT_EQ(s.nodes, 1u) << "only the root stays in the node table";
  EXPECT_LE(s.meta_buffers, at_mount + 2) << "the blocks of forgotten inodes stay cached";
  EXPECT_GT(s.meta_evicted, 600u);
  check_tree(*r, 30, 200);  // read back from their homes
  EXPECT_EQ(r->check_and_remount(), "");
  check_tree(*r, 30, 200);
}

TEST(MetaCache, StaysUnderItsCapWhileTheKernelHoldsEverything) {
  auto r = Rig::make(256);
  ASSERT_TRUE(r);
  r->meta_cache_mb = 1;  // 256 blocks
  ASSERT_TRUE(r->remount());
  make_tree(*r, 30, 200, false);
  r->fs->shrink_caches();
  const FsStats s = r->fs->stats();
  EXPECT_EQ(s.nodes, 30u * 200 + 30 + 1);
  EXPECT_LE(s.meta_buffers, 256u);
  EXPECT_GT(s.meta_evicted, 400u);
  check_tree(*r, 30, 200);
  // Changes to blocks that were dropped and read again go home like any other.
  Ino dir = 0;
  ASSERT_EQ(r->lookup(kRootInode, "d7", &dir), 0);
  ASSERT_EQ(r->fs->unlink(dir, "file-with-a-longer-name-3"), 0);
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->lookup(dir, "file-with-a-longer-name-3"), ENOENT);
  EXPECT_EQ(r->lookup(dir, "file-with-a-longer-name-4"), 0);
}

}  // namespace
}  // namespace warpfs::fs::test
