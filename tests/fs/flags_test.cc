// Inode flags in the core (Filesystem::get_flags/set_flags; FORMAT.md "Inode"): they persist
// and pass fsck, and once set_flags returns no change gets through, whatever other threads
// were doing.
#include <fcntl.h>
#include <linux/fs.h>

#include <atomic>
#include <thread>
#include <vector>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

TEST(Flags, PersistAndPassFsck) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  const Ino a = r->create(kRootInode, "a");
  ASSERT_EQ(r->fs->set_flags(f, FS_IMMUTABLE_FL), 0);
  ASSERT_EQ(r->fs->set_flags(a, FS_APPEND_FL), 0);
  EXPECT_EQ(r->fs->set_flags(a, FS_APPEND_FL | FS_NOATIME_FL), EOPNOTSUPP);
  EXPECT_EQ(r->check_and_remount(), "");
  uint32_t v = 0;
  ASSERT_EQ(r->fs->get_flags(f, &v), 0);
  EXPECT_EQ(v, static_cast<uint32_t>(FS_IMMUTABLE_FL));
  ASSERT_EQ(r->fs->get_flags(a, &v), 0);
  EXPECT_EQ(v, static_cast<uint32_t>(FS_APPEND_FL));
  EXPECT_EQ(r->write(f, 0, "x"), EPERM);
  EXPECT_EQ(r->write(a, 0, "x"), 0) << "at the end (size 0)";
  EXPECT_EQ(r->write(a, 0, "y"), EPERM) << "inside";
  EXPECT_EQ(r->write(a, 1, "y"), 0);
  EXPECT_EQ(r->fs->unlink(kRootInode, "f"), EPERM);
  EXPECT_EQ(r->fs->open(f, O_WRONLY), EPERM);
  EXPECT_EQ(r->fs->open(a, O_WRONLY), EPERM);
  ASSERT_EQ(r->fs->open(a, O_WRONLY | O_APPEND), 0);
  r->fs->release(a);
  ASSERT_EQ(r->fs->set_flags(f, 0), 0);
  EXPECT_EQ(r->fs->unlink(kRootInode, "f"), 0);
  EXPECT_EQ(r->check_and_remount(), "");
}

// Writers, a renamer and an xattr setter race set_flags(+i): every change that starts after
// it returned is refused; the ones before it may land.
TEST(Flags, NothingChangesOnceImmutableReturns) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  std::atomic<bool> pinned{false};
  std::atomic<int> late_changes{0}, refused{0};
  auto changer = [&](int id) {
    for (int i = 0; i < 400; ++i) {
      const bool after = pinned.load();
      int rc;
      if (id == 0) {
        rc = r->fs->rename(kRootInode, i % 2 ? "g" : "f", kRootInode, i % 2 ? "f" : "g", 0);
        if (rc == ENOENT) continue;  // the other name: the last rename was refused
      } else if (id == 1) {
        rc = r->fs->setxattr(f, "user.k", "v", 1, 0);
      } else {
        const std::string data(100, static_cast<char>('a' + id));
        size_t w = 0;
        rc = r->fs->write(f, static_cast<uint64_t>(id) * 4096 + i, data.size(), data.data(), &w);
      }
      if (after && rc == 0) late_changes++;
      if (rc == EPERM) refused++;
    }
  };
  std::vector<std::thread> ts;
  for (int id = 0; id < 4; ++id) ts.emplace_back(changer, id);
  ASSERT_EQ(r->fs->set_flags(f, FS_IMMUTABLE_FL), 0);
  pinned = true;
  for (auto& t : ts) t.join();
  EXPECT_EQ(late_changes.load(), 0);
  EXPECT_GT(refused.load(), 0);
  ASSERT_EQ(r->fs->set_flags(f, 0), 0);
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test
