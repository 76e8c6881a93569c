// The filesystem core driven directly (no FUSE): names, data, mapping trees, directories at
// scale, xattrs, orphans, ENOSPC, crash consistency, and concurrency. Every scenario ends
// with fsck of the unmounted image, which must be clean.
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

std::set<std::string> list(Filesystem& fs, Ino dir) {
  std::set<std::string> names;
  uint64_t off = 0;
  for (;;) {
    size_t n = 0;
    EXPECT_EQ(fs.readdir(dir, off,
                         [&](const DirEntry& e) {
                           if (n == 7)
                             return false;  // small batches: resume by cookie, as the kernel does
                           ++n;
                           EXPECT_TRUE(names.insert(e.name).second) << "duplicate " << e.name;
                           off = e.next_offset;
                           return true;
                         }),
              0);
    if (n == 0) break;
  }
  return names;
}

TEST(Core, NamesPersistAndFsckIsClean) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino d = r->mkdir(kRootInode, "dir");
  const Ino f = r->create(d, "file");
  Attr a;
  EXPECT_EQ(r->fs->mknod(d, "file", S_IFREG | 0644, 0, Caller{}, &a), EEXIST);
  EXPECT_EQ(r->fs->symlink(d, "short", "file", Caller{}, &a), 0);
  const std::string long_target(3000, 'x');
  EXPECT_EQ(r->fs->symlink(d, "long", long_target, Caller{}, &a), 0);
  EXPECT_EQ(r->fs->link(f, kRootInode, "hard", &a), 0);
  EXPECT_EQ(a.nlink, 2u);
  EXPECT_EQ(r->lookup(kRootInode, "nope"), ENOENT);
  EXPECT_EQ(r->lookup(f, "x"), ENOTDIR);
  EXPECT_EQ(r->lookup(kRootInode, std::string(256, 'a')), ENAMETOOLONG);
  EXPECT_EQ(r->fs->rmdir(kRootInode, "dir"), ENOTEMPTY);
  EXPECT_EQ(r->fs->unlink(kRootInode, "dir"), EISDIR);
  EXPECT_EQ(r->fs->rmdir(d, "file"), ENOTDIR);
  ASSERT_EQ(r->write(f, 0, "hello"), 0);

  EXPECT_EQ(r->check_and_remount(), "");
  ASSERT_TRUE(r->fs);
  Ino d2, f2;
  ASSERT_EQ(r->lookup(kRootInode, "dir", &d2), 0);
  EXPECT_EQ(d2, d);
  ASSERT_EQ(r->lookup(d, "file", &f2), 0);
  EXPECT_EQ(r->read(f2, 0, 100), "hello");
  EXPECT_EQ(list(*r->fs, d), (std::set<std::string>{".", "..", "file", "short", "long"}));
  Ino s;
  ASSERT_EQ(r->lookup(d, "short", &s), 0);
  std::string t;
  EXPECT_EQ(r->fs->readlink(s, &t), 0);
  EXPECT_EQ(t, "file");
  ASSERT_EQ(r->lookup(d, "long", &s), 0);
  EXPECT_EQ(r->fs->readlink(s, &t), 0);
  EXPECT_EQ(t, long_target);
  ASSERT_EQ(r->fs->getattr(d, &a), 0);
  EXPECT_EQ(a.nlink, 2u);
  ASSERT_EQ(r->fs->getattr(kRootInode, &a), 0);
  EXPECT_EQ(a.nlink, 3u);
  EXPECT_EQ(r->fs->unlink(kRootInode, "hard"), 0);
  EXPECT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.nlink, 1u);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Core, SpecialFilesKeepTheirTypeAndDeviceNumber) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  Attr a;
  ASSERT_EQ(r->fs->mknod(kRootInode, "null", S_IFCHR | 0666, makedev(1, 3), Caller{}, &a), 0);
  ASSERT_EQ(r->fs->mknod(kRootInode, "fifo", S_IFIFO | 0600, 0, Caller{}, &a), 0);
  ASSERT_EQ(r->fs->mknod(kRootInode, "sock", S_IFSOCK | 0600, 0, Caller{}, &a), 0);
  EXPECT_EQ(r->check_and_remount(), "");
  Ino ino;
  ASSERT_EQ(r->lookup(kRootInode, "null", &ino), 0);
  ASSERT_EQ(r->fs->getattr(ino, &a), 0);
  EXPECT_TRUE(S_ISCHR(a.mode));
  EXPECT_EQ(a.rdev, makedev(1, 3));
  ASSERT_EQ(r->lookup(kRootInode, "fifo", &ino), 0);
  ASSERT_EQ(r->fs->getattr(ino, &a), 0);
  EXPECT_TRUE(S_ISFIFO(a.mode));
  EXPECT_EQ(a.rdev, 0u);
}

TEST(Core, DataAtEveryAlignmentAndSize) {
  auto r = Rig::make(256);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  std::string model;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 300; ++i) {
    const uint64_t off = rng() % (6 << 20);
    const size_t len = 1 + rng() % (i % 10 == 0 ? (1 << 20) : 9000);
    const std::string data = pattern(i, off, len);
    ASSERT_EQ(r->write(f, off, data), 0);
    if (model.size() < off + len) model.resize(off + len, '\0');
    model.replace(off, len, data);
  }
  ASSERT_EQ(r->size(f), model.size());
  EXPECT_TRUE(r->read(f, 0, model.size()) == model);
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_TRUE(r->read(f, 0, model.size()) == model);
  for (int i = 0; i < 50; ++i) {
    const uint64_t off = rng() % model.size();
    const size_t len = 1 + rng() % 20000;
    EXPECT_TRUE(r->read(f, off, len) == model.substr(off, len)) << off << "+" << len;
  }
}

TEST(Core, SparseFilesBeyondFourGiBAndSeekDataHole) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "sparse");
  const uint64_t far = (5ull << 30) + 123;
  ASSERT_EQ(r->write(f, far, "tail"), 0);
  ASSERT_EQ(r->write(f, 8192, "head"), 0);
  EXPECT_EQ(r->size(f), far + 4);
  EXPECT_EQ(r->read(f, far - 2, 10), std::string("\0\0tail", 6));
  EXPECT_EQ(r->read(f, 0, 4), std::string(4, '\0'));
  uint64_t pos;
  EXPECT_EQ(r->fs->lseek(f, 0, SEEK_DATA, &pos), 0);
  EXPECT_EQ(pos, 8192u);
  EXPECT_EQ(r->fs->lseek(f, 8192, SEEK_HOLE, &pos), 0);
  EXPECT_EQ(pos, 12288u);
  EXPECT_EQ(r->fs->lseek(f, 12288, SEEK_DATA, &pos), 0);
  EXPECT_EQ(pos, far / 4096 * 4096);
  EXPECT_EQ(r->fs->lseek(f, far + 4, SEEK_DATA, &pos), ENXIO);
  Attr a;
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.blocks, 2u * 8) << "two 4 KiB blocks allocated, nothing for the holes";
  // Punch the head, fallocate a range: unwritten extents read as zeroes and count as holes.
  EXPECT_EQ(r->fs->fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8192, 4096), 0);
  EXPECT_EQ(r->read(f, 8192, 4), std::string(4, '\0'));
  EXPECT_EQ(r->fs->fallocate(f, 0, 1 << 20, 1 << 20), 0);
  EXPECT_EQ(r->read(f, 1 << 20, 8), std::string(8, '\0'));
  EXPECT_EQ(r->fs->lseek(f, 0, SEEK_DATA, &pos), 0);
  EXPECT_EQ(pos, far / 4096 * 4096);
  ASSERT_EQ(r->write(f, (1 << 20) + 100, "mid"), 0);
  EXPECT_EQ(r->read(f, (1 << 20) + 98, 7), std::string("\0\0mid\0\0", 7));
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(f, (1 << 20) + 98, 7), std::string("\0\0mid\0\0", 7));
  EXPECT_EQ(r->read(f, far, 4), "tail");
}

TEST(Core, TruncateShrinksGrowsAndZeroes) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "t");
  ASSERT_EQ(r->write(f, 0, pattern(1, 0, 100000)), 0);
  SetAttr s;
  s.size = true;
  s.new_size = 5000;
  Attr a;
  ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
  s.new_size = 20000;
  ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
  EXPECT_EQ(r->read(f, 0, 5000), pattern(1, 0, 5000));
  EXPECT_EQ(r->read(f, 5000, 15000), std::string(15000, '\0'));
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.blocks, 2u * 8) << "blocks past the new end are freed";
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(f, 4990, 20), pattern(1, 4990, 10) + std::string(10, '\0'));
}

TEST(Core, FragmentedFilesUseExtentTreesOfDepthOneAndTwo) {
  auto r = Rig::make(128);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "frag");
  // Every other block: each write is its own extent. 2 * 254 * 8 + a bit needs depth 2.
  const uint32_t n = 4300;
  for (uint32_t i = 0; i < n; ++i)
    ASSERT_EQ(r->write(f, uint64_t{i} * 2 * 4096, pattern(i, 0, 4096)), 0) << i;
  EXPECT_EQ(r->check_and_remount(), "");
  for (uint32_t i = 0; i < n; i += 97) {
    EXPECT_EQ(r->read(f, uint64_t{i} * 2 * 4096, 4096), pattern(i, 0, 4096)) << i;
    EXPECT_EQ(r->read(f, (uint64_t{i} * 2 + 1) * 4096, 16), std::string(16, '\0'));
  }
  // Fill the gaps: extents merge back as the file becomes contiguous on disk? Not
  // necessarily; but the tree must shrink back to the inode when truncated.
  SetAttr s;
  s.size = true;
  s.new_size = 3 * 4096;
  Attr a;
  ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
  EXPECT_EQ(a.blocks, 2u * 8);
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(f, 0, 4096), pattern(0, 0, 4096));
}

TEST(Core, LargeDirectoryLookupsReadFewBlocks) {
  MkfsOptions mo;
  mo.inodes = 40000;
  auto r = Rig::make(256, mo);
  ASSERT_TRUE(r);
  const Ino d = r->mkdir(kRootInode, "big");
  const int n = 30000;
  for (int i = 0; i < n; ++i) {
    Attr a;
    ASSERT_EQ(r->fs->mknod(d, "file-" + std::to_string(i), S_IFREG | 0600, 0, Caller{}, &a), 0)
        << i;
    r->fs->forget(a.ino, 1);
  }
  EXPECT_EQ(r->check_and_remount(), "");
  const FsStats before = r->fs->stats();
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(r->lookup(d, "file-" + std::to_string(i * 131 % n)), 0) << r->log;
  const FsStats after = r->fs->stats();
  // Cold cache: index root + index block + leaf + inode table block per lookup at most.
  EXPECT_LE(after.meta_reads - before.meta_reads, 200u * 4);
  const auto names = list(*r->fs, d);
  EXPECT_EQ(names.size(), size_t{n} + 2);
  for (int i = 0; i < n; i += 2) ASSERT_EQ(r->fs->unlink(d, "file-" + std::to_string(i)), 0);
  EXPECT_EQ(list(*r->fs, d).size(), size_t{n / 2} + 2);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Core, ReaddirOffsetsSurviveConcurrentChanges) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino d = r->mkdir(kRootInode, "d");
  for (int i = 0; i < 2000; ++i) r->create(d, "n" + std::to_string(i));
  // Read half, then add and remove entries, then read on from the cookie.
  std::set<std::string> seen;
  uint64_t off = 0;
  ASSERT_EQ(r->fs->readdir(d, 0,
                           [&](const DirEntry& e) {
                             seen.insert(e.name);
                             off = e.next_offset;
                             return seen.size() < 1000;
                           }),
            0);
  for (int i = 0; i < 2000; i += 3) {
    if (!seen.count("n" + std::to_string(i))) continue;
    ASSERT_EQ(r->fs->unlink(d, "n" + std::to_string(i)), 0);  // already returned: no effect
  }
  for (int i = 0; i < 500; ++i) r->create(d, "new" + std::to_string(i));
  ASSERT_EQ(r->fs->readdir(d, off,
                           [&](const DirEntry& e) {
                             EXPECT_TRUE(seen.insert(e.name).second)
                                 << "returned twice: " << e.name;
                             return true;
                           }),
            0);
  for (int i = 0; i < 2000; ++i) EXPECT_TRUE(seen.count("n" + std::to_string(i))) << i;
}

TEST(Core, RenameReplacesExchangesAndRefusesLoops) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino a = r->mkdir(kRootInode, "a");
  const Ino b = r->mkdir(a, "b");
  const Ino f = r->create(kRootInode, "f");
  const Ino g = r->create(kRootInode, "g");
  ASSERT_EQ(r->write(g, 0, "gee"), 0);
  EXPECT_EQ(r->fs->rename(kRootInode, "a", b, "x", 0), EINVAL);
  EXPECT_EQ(r->fs->rename(kRootInode, "f", kRootInode, "g", RENAME_NOREPLACE), EEXIST);
  EXPECT_EQ(r->fs->rename(kRootInode, "f", kRootInode, "a", 0), EISDIR);
  EXPECT_EQ(r->fs->rename(a, "b", kRootInode, "f", 0), ENOTDIR);
  EXPECT_EQ(r->fs->rename(kRootInode, "nope", kRootInode, "x", 0), ENOENT);
  EXPECT_EQ(r->fs->rename(kRootInode, "f", kRootInode, "a", RENAME_EXCHANGE), 0);
  Ino x;
  ASSERT_EQ(r->lookup(kRootInode, "a", &x), 0);
  EXPECT_EQ(x, f);
  ASSERT_EQ(r->lookup(kRootInode, "f", &x), 0);
  EXPECT_EQ(x, a);
  // Move the directory b up: link counts follow.
  ASSERT_EQ(r->fs->rename(a, "b", kRootInode, "b", 0), 0);
  Attr at;
  ASSERT_EQ(r->fs->getattr(a, &at), 0);
  EXPECT_EQ(at.nlink, 2u);
  ASSERT_EQ(r->fs->getattr(kRootInode, &at), 0);
  EXPECT_EQ(at.nlink, 4u);
  // Replace g with the file now called "a": g's inode is freed.
  ASSERT_EQ(r->fs->rename(kRootInode, "a", kRootInode, "g", 0), 0);
  EXPECT_EQ(r->lookup(kRootInode, "a"), ENOENT);
  ASSERT_EQ(r->lookup(kRootInode, "g", &x), 0);
  EXPECT_EQ(x, f);
  // Replace an empty directory with a directory.
  r->mkdir(kRootInode, "empty");
  ASSERT_EQ(r->fs->rename(kRootInode, "b", kRootInode, "empty", 0), 0);
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(list(*r->fs, kRootInode), (std::set<std::string>{".", "..", "f", "g", "empty"}));
}

// An image without kFeatureXattrChain: one block per inode, as before the feature
// (xattr_test.cc has the chains).
TEST(Core, ExtendedAttributes) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->set_features(r->superblock_at(0).features & ~uint32_t{kFeatureXattrChain}));
  const Ino f = r->create(kRootInode, "x");
  EXPECT_EQ(r->fs->setxattr(f, "user.a", "1", 1, 0), 0);
  EXPECT_EQ(r->fs->setxattr(f, "user.a", "2", 1, XATTR_CREATE), EEXIST);
  EXPECT_EQ(r->fs->setxattr(f, "user.b", "2", 1, XATTR_REPLACE), ENODATA);
  EXPECT_EQ(r->fs->setxattr(f, "trusted.t", "tt", 2, 0), 0);
  EXPECT_EQ(r->fs->setxattr(f, "bogus.t", "tt", 2, 0), EOPNOTSUPP);
  EXPECT_EQ(r->fs->setxattr(f, "user.big", std::string(5000, 'b').data(), 5000, 0), ENOSPC);
  EXPECT_EQ(r->fs->setxattr(f, "user.big", std::string(4000, 'b').data(), 4000, 0), 0);
  EXPECT_EQ(r->fs->setxattr(f, "user.more", std::string(200, 'm').data(), 200, 0), ENOSPC);
  std::string v;
  EXPECT_EQ(r->fs->getxattr(f, "user.a", &v), 0);
  EXPECT_EQ(v, "1");
  EXPECT_EQ(r->fs->getxattr(f, "user.none", &v), ENODATA);
  EXPECT_EQ(r->check_and_remount(), "");
  std::string names;
  EXPECT_EQ(r->fs->listxattr(f, &names), 0);
  EXPECT_EQ(names, std::string("user.a\0trusted.t\0user.big\0", 26));
  EXPECT_EQ(r->fs->removexattr(f, "user.big"), 0);
  EXPECT_EQ(r->fs->removexattr(f, "user.big"), ENODATA);
  EXPECT_EQ(r->fs->removexattr(f, "user.a"), 0);
  EXPECT_EQ(r->fs->removexattr(f, "trusted.t"), 0);
  Attr a;
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.blocks, 0u) << "the empty xattr block is freed";
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Core, UnlinkedWhileOpenLivesUntilReleaseOrNextMount) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  Attr a;
  ASSERT_EQ(r->fs->mknod(kRootInode, "open", S_IFREG | 0644, 0, Caller{}, &a), 0);
  const Ino f = a.ino;
  ASSERT_EQ(r->fs->open(f, O_RDWR), 0);
  ASSERT_EQ(r->write(f, 0, pattern(3, 0, 50000)), 0);
  struct statvfs before, during, after;
  ASSERT_EQ(r->fs->statfs(&before), 0);
  ASSERT_EQ(r->fs->unlink(kRootInode, "open"), 0);
  EXPECT_EQ(r->lookup(kRootInode, "open"), ENOENT);
  EXPECT_EQ(r->read(f, 0, 50000), pattern(3, 0, 50000));
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.nlink, 0u);
  ASSERT_EQ(r->fs->sync(), 0);
  ASSERT_EQ(r->fs->statfs(&during), 0);
  EXPECT_EQ(during.f_bfree, before.f_bfree);
  r->fs->forget(f, 1);
  r->fs->release(f);
  ASSERT_EQ(r->fs->sync(), 0);
  ASSERT_EQ(r->fs->statfs(&after), 0);
  EXPECT_GT(after.f_bfree, during.f_bfree);
  EXPECT_EQ(r->check_and_remount(), "");

  // Now the daemon dies while the unlinked file is open: the next mount frees it.
  ASSERT_EQ(r->fs->mknod(kRootInode, "open2", S_IFREG | 0644, 0, Caller{}, &a), 0);
  ASSERT_EQ(r->fs->open(a.ino, O_RDWR), 0);
  ASSERT_EQ(r->write(a.ino, 0, pattern(4, 0, 80000)), 0);
  ASSERT_EQ(r->fs->unlink(kRootInode, "open2"), 0);
  ASSERT_EQ(r->fs->fsync(a.ino, false), 0);
  ASSERT_TRUE(r->crash_and_remount(0.0));
  EXPECT_EQ(r->fs->stats().orphans_freed_at_mount, 1u) << r->log;
  ASSERT_EQ(r->fs->statfs(&after), 0);
  // `before` counted the first file's 13 blocks as used; both files are gone now.
  EXPECT_EQ(after.f_bfree, before.f_bfree + (50000 / 4096 + 1));
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Core, FullDiskGivesEnospcAndRecovers) {
  auto r = Rig::make(16);
  ASSERT_TRUE(r);
  struct statvfs st;
  ASSERT_EQ(r->fs->statfs(&st), 0);
  const Ino f = r->create(kRootInode, "fill");
  const std::string chunk = pattern(9, 0, 1 << 20);
  uint64_t off = 0;
  int rc = 0;
  while ((rc = r->write(f, off, chunk)) == 0) off += chunk.size();
  EXPECT_EQ(rc, ENOSPC);
  // A short write filled the last blocks: every byte the size claims reads back.
  const uint64_t sz = r->size(f);
  EXPECT_GE(sz, off);
  EXPECT_EQ(r->read(f, sz - 100, 100), chunk.substr((sz - 100) % chunk.size(), 100));
  struct statvfs full;
  ASSERT_EQ(r->fs->statfs(&full), 0);
  EXPECT_EQ(full.f_bavail, 0u) << "df shows nothing left for data";
  EXPECT_GT(full.f_bfree, 0u) << "the metadata reserve";
  // File data is full, but the metadata reserve still lets names be made (ext4 keeps
  // reserved blocks the same way) until it too runs out: then ENOSPC, nothing half-done.
  Attr a;
  EXPECT_EQ(r->fs->mkdir(kRootInode, "more", 0755, Caller{}, &a), 0);
  int made = 0;
  while ((rc = r->fs->mkdir(kRootInode, "d" + std::to_string(made), 0755, Caller{}, &a)) == 0) {
    r->fs->forget(a.ino, 1);
    ++made;
  }
  EXPECT_EQ(rc, ENOSPC);
  EXPECT_GT(made, 10);
  EXPECT_EQ(r->check_and_remount(), "");
  ASSERT_EQ(r->fs->unlink(kRootInode, "fill"), 0);
  ASSERT_EQ(r->fs->rmdir(kRootInode, "more"), 0);
  for (int i = 0; i < made; ++i) ASSERT_EQ(r->fs->rmdir(kRootInode, "d" + std::to_string(i)), 0);
  ASSERT_EQ(r->fs->sync(), 0);
  struct statvfs st2;
  ASSERT_EQ(r->fs->statfs(&st2), 0);
  EXPECT_EQ(st2.f_bfree, st.f_bfree) << "all space comes back";
  EXPECT_GT(r->cut->trimmed(), sz / 4096 - 1) << "freed blocks are trimmed";
  EXPECT_EQ(r->fs->mkdir(kRootInode, "more", 0755, Caller{}, &a), 0);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Core, ReadOnlyMountRefusesChanges) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  ASSERT_EQ(r->write(f, 0, "data"), 0);
  ASSERT_EQ(r->fs->unmount(), 0);
  r->fs.reset();
  ASSERT_TRUE(r->mount(true));
  Attr a;
  EXPECT_EQ(r->fs->mknod(kRootInode, "g", S_IFREG | 0644, 0, Caller{}, &a), EROFS);
  size_t w;
  EXPECT_EQ(r->fs->write(f, 0, 1, "x", &w), EROFS);
  EXPECT_EQ(r->read(f, 0, 4), "data");
  r->fs.reset();
  EXPECT_EQ(r->fsck_unmounted(), "");
}

// Random operations with fsync; the machine dies at a random point; after remount every
// fsync'd file has exactly its fsync'd contents and fsck is clean.
TEST(Core, CrashAfterFsyncKeepsEverythingFsynced) {
  for (int round = 0; round < 6; ++round) {
    auto r = Rig::make(64);
    ASSERT_TRUE(r);
    std::mt19937_64 rng(round);
    std::map<std::string, std::string> synced;  // name -> contents at its last fsync
    std::map<std::string, std::pair<Ino, std::string>> live;
    const int ops = 150 + static_cast<int>(rng() % 150);
    for (int i = 0; i < ops; ++i) {
      const std::string name = "f" + std::to_string(rng() % 12);
      const int op = static_cast<int>(rng() % 10);
      auto it = live.find(name);
      if (it == live.end()) {
        live[name] = {r->create(kRootInode, name), ""};
        continue;
      }
      auto& [ino, model] = it->second;
      if (op < 5) {
        const uint64_t off = rng() % 200000;
        const std::string data = pattern(rng(), off, 1 + rng() % 30000);
        ASSERT_EQ(r->write(ino, off, data), 0);
        if (model.size() < off + data.size()) model.resize(off + data.size(), '\0');
        model.replace(off, data.size(), data);
      } else if (op < 6) {
        SetAttr s;
        s.size = true;
        s.new_size = rng() % 100000;
        Attr a;
        ASSERT_EQ(r->fs->setattr(ino, s, &a), 0);
        model.resize(s.new_size, '\0');
      } else if (op < 8) {
        ASSERT_EQ(r->fs->fsync(ino, false), 0);
        synced[name] = model;
      } else if (op < 9) {
        ASSERT_EQ(r->fs->unlink(kRootInode, name), 0);
        r->fs->forget(ino, 1);
        live.erase(it);
        synced.erase(name);
        ASSERT_EQ(r->fs->sync(), 0);  // the unlink is durable too
      }
    }
    ASSERT_TRUE(r->crash_and_remount(static_cast<double>(round % 3) / 2));
    for (const auto& [name, contents] : synced) {
      Ino ino = 0;
      ASSERT_EQ(r->lookup(kRootInode, name, &ino), 0) << name << " round " << round;
      // Writes after the last fsync may or may not have reached the media (a later
      // commit may have carried them); what was fsync'd and not rewritten must be there.
      const std::string now = r->read(ino, 0, contents.size() + 1);
      auto lv = live.find(name);
      if (lv != live.end() && lv->second.second == contents) {
        EXPECT_TRUE(now == contents) << name << " round " << round;
      }
    }
    EXPECT_EQ(r->check_and_remount(), "") << "round " << round;
  }
}

TEST(Core, ConcurrentCreatorsWritersAndRenamers) {
  auto r = Rig::make(128);
  ASSERT_TRUE(r);
  const int threads = 4, per = 150;
  std::vector<Ino> dirs;
  for (int t = 0; t < threads; ++t) dirs.push_back(r->mkdir(kRootInode, "d" + std::to_string(t)));
  std::vector<std::thread> th;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    th.emplace_back([&, t] {
      for (int i = 0; i < per; ++i) {
        Attr a;
        const std::string name = "f" + std::to_string(i);
        if (r->fs->mknod(dirs[t], name, S_IFREG | 0644, 0, Caller{}, &a) != 0) ++failures;
        size_t w;
        const std::string data = pattern(t * 1000 + i, 0, 5000 + i);
        if (r->fs->write(a.ino, 0, data.size(), data.data(), &w) != 0) ++failures;
        // Move every third file to the next thread's directory, under a unique name.
        if (i % 3 == 0 && r->fs->rename(dirs[t], name, dirs[(t + 1) % threads],
                                        "m" + std::to_string(t) + "-" + name, 0) != 0) {
          ++failures;
        }
        r->fs->forget(a.ino, 1);
        if (i % 50 == 0) r->fs->fsync(a.ino, false);
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(r->check_and_remount(), "");
  for (int t = 0; t < threads; ++t) {
    const auto names = list(*r->fs, dirs[t]);
    EXPECT_EQ(names.size(), size_t{per} + 2) << t;  // 2/3 own + 1/3 from the neighbour
    Ino ino = 0;
    ASSERT_EQ(r->lookup(dirs[(t + 1) % threads], "m" + std::to_string(t) + "-f3", &ino), 0);
    EXPECT_EQ(r->read(ino, 0, 6000), pattern(t * 1000 + 3, 0, 5003));
  }
}

}  // namespace
}  // namespace warpfs::fs::test
