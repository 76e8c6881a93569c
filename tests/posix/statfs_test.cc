// statvfs/statfs: numbers that make sense, free space and free inodes that follow writes,
// creates and unlinks. Other processes may use the same filesystem, so the comparisons
// leave generous slack; they still fail when space is not accounted at all.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <string>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using StatfsTest = PosixTest;

constexpr int64_t kMiB = 1 << 20;
constexpr long kFuseSuperMagic = 0x65735546;

struct statvfs xstatvfs(const std::string& p) {
  struct statvfs v;
  check(::statvfs(p.c_str(), &v), "statvfs " + p);
  return v;
}

int64_t free_bytes(const struct statvfs& v) {
  return static_cast<int64_t>(v.f_bfree) * static_cast<int64_t>(v.f_frsize);
}

// Makes freed space visible in the counters: the directory's entries and the whole
// filesystem's journal (ext4, for one, returns freed blocks when its transaction commits).
void settle(int dirfd) {
  check(::fsync(dirfd), "fsync directory");
  check(::syncfs(dirfd), "syncfs");
}

TEST_F(StatfsTest, NumbersAreSane) {
  const struct statvfs v = xstatvfs(dir());
  EXPECT_GT(v.f_bsize, 0u);
  EXPECT_GT(v.f_frsize, 0u);
  EXPECT_GT(v.f_blocks, 0u);
  EXPECT_LE(v.f_bfree, v.f_blocks);
  EXPECT_LE(v.f_bavail, v.f_bfree);
  EXPECT_LE(v.f_ffree, v.f_files);
  EXPECT_LE(v.f_favail, v.f_ffree);
  EXPECT_EQ(v.f_namemax, 255u);
  struct statvfs fv;
  ASSERT_OK(::fstatvfs(dfd(), &fv));
  EXPECT_EQ(fv.f_blocks, v.f_blocks);
  EXPECT_EQ(fv.f_frsize, v.f_frsize);
  EXPECT_EQ(fv.f_fsid, v.f_fsid);
  EXPECT_EQ(xstatvfs(test_root()).f_blocks, v.f_blocks) << "one filesystem";
  EXPECT_ERRNO(ENOENT, ::statvfs(path("missing").c_str(), &fv));
}

TEST_F(StatfsTest, FreeSpaceFollowsWritesAndUnlinks) {
  constexpr int64_t kWrite = 128 * kMiB;
  const struct statvfs v0 = xstatvfs(dir());
  if (static_cast<int64_t>(v0.f_bavail * v0.f_frsize) < 4 * kWrite) {
    GTEST_SKIP() << "needs " << 4 * kWrite / kMiB << " MiB free";
  }
  settle(dfd());
  const int64_t before = free_bytes(xstatvfs(dir()));
  {
    Fd fd = xopen(path("big"), O_CREAT | O_WRONLY, 0644);
    const std::string chunk = pattern(1, static_cast<size_t>(kMiB));
    for (int64_t off = 0; off < kWrite; off += kMiB) pwrite_all(fd.get(), chunk, off);
    ASSERT_OK(::fsync(fd.get()));
  }
  const int64_t written = free_bytes(xstatvfs(dir()));
  EXPECT_GE(before - written, kWrite / 2)
      << "writing " << kWrite / kMiB << " MiB took only " << (before - written) / kMiB << " MiB";
  EXPECT_LE(before - written, kWrite * 3 / 2)
      << "writing " << kWrite / kMiB << " MiB took " << (before - written) / kMiB << " MiB";
  xunlink(path("big"));
  // Freeing may be asynchronous: a FUSE filesystem releases an unlinked inode when
  // the kernel's FORGET arrives, which may be handled after a later statfs on another
  // daemon thread; ext4 returns blocks when its journal commits. So poll (no sleeping) until
  // the space is back or 10 s have passed.
  const int64_t deadline = fine_now_ns() + 10'000'000'000;
  int64_t after = 0;
  do {
    settle(dfd());
    after = free_bytes(xstatvfs(dir()));
  } while (after < before - kWrite / 4 && fine_now_ns() < deadline);
  EXPECT_GE(after, before - kWrite / 4)
      << "10 s after the unlink " << (before - after) / kMiB << " MiB are still missing";
}

TEST_F(StatfsTest, FreeInodesFollowCreatesAndUnlinks) {
  constexpr int kFiles = 200;
  settle(dfd());
  const struct statvfs v0 = xstatvfs(dir());
  if (v0.f_files == 0) GTEST_SKIP() << "the filesystem reports no inode counts";
  for (int i = 0; i < kFiles; ++i) write_file(path("f" + std::to_string(i)), "");
  settle(dfd());
  const struct statvfs v1 = xstatvfs(dir());
  EXPECT_GE(static_cast<int64_t>(v0.f_ffree) - static_cast<int64_t>(v1.f_ffree), kFiles / 2);
  for (int i = 0; i < kFiles; ++i) xunlink(path("f" + std::to_string(i)));
  // Inodes may come back asynchronously, as blocks do (see above).
  const int64_t deadline = fine_now_ns() + 10'000'000'000;
  int64_t ffree = 0;
  do {
    settle(dfd());
    ffree = static_cast<int64_t>(xstatvfs(dir()).f_ffree);
  } while (ffree < static_cast<int64_t>(v0.f_ffree) - kFiles / 2 && fine_now_ns() < deadline);
  EXPECT_GE(ffree, static_cast<int64_t>(v0.f_ffree) - kFiles / 2);
}

TEST_F(StatfsTest, WarpfsIdentifiesItself) {
  struct statfs s;
  ASSERT_OK(::statfs(dir().c_str(), &s));
  if (!is_warpfs()) {
    GTEST_SKIP() << "warpfs-only (WARPFS_TEST_FS=warpfs); f_type here is 0x" << std::hex
                 << s.f_type;
  }
  EXPECT_EQ(s.f_type, kFuseSuperMagic) << "not a FUSE mount: is WARPFS_TEST_DIR on warpfs?";
  EXPECT_EQ(s.f_bsize, 4096);
  EXPECT_EQ(s.f_frsize, 4096);
  EXPECT_EQ(s.f_namelen, 255);
}

}  // namespace
}  // namespace warpfs::posix_test
