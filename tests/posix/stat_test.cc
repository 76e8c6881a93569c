// stat/lstat/fstat/fstatat/statx: the fields of files, directories and symlinks, inode
// numbers, block counts, and the errors of looking up what is not there.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using StatTest = PosixTest;

TEST_F(StatTest, NewFileHasTheExpectedFields) {
  const int64_t before = coarse_now_ns();
  write_file(path("f"), "12345", 0640);
  const int64_t after = fine_now_ns();
  const struct stat st = xstat(path("f"));
  const struct stat parent = xstat(dir());
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_size, 5);
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_gid, ::getegid());
  EXPECT_NE(st.st_ino, 0u);
  EXPECT_NE(st.st_ino, parent.st_ino);
  EXPECT_EQ(st.st_dev, parent.st_dev);
  EXPECT_GT(st.st_blksize, 0);
  for (const timespec* t : {&st.st_atim, &st.st_mtim, &st.st_ctim}) {
    EXPECT_GE(ns_of(*t), before);
    EXPECT_LE(ns_of(*t), after);
  }
}

TEST_F(StatTest, StatFstatAndFstatatAgree) {
  write_file(path("f"), pattern(1, 10000));
  Fd fd = xopen(path("f"), O_RDONLY);
  const struct stat a = xstat(path("f"));
  const struct stat b = xfstat(fd.get());
  struct stat c;
  ASSERT_OK(::fstatat(dfd(), "f", &c, 0));
  struct stat d;
  ASSERT_OK(::fstatat(fd.get(), "", &d, AT_EMPTY_PATH));
  for (const struct stat* s : std::initializer_list<const struct stat*>{&b, &c, &d}) {
    EXPECT_EQ(s->st_ino, a.st_ino);
    EXPECT_EQ(s->st_dev, a.st_dev);
    EXPECT_EQ(s->st_mode, a.st_mode);
    EXPECT_EQ(s->st_size, a.st_size);
    EXPECT_EQ(s->st_nlink, a.st_nlink);
    EXPECT_EQ(ns_of(s->st_mtim), ns_of(a.st_mtim));
    EXPECT_EQ(ns_of(s->st_ctim), ns_of(a.st_ctim));
  }
}

TEST_F(StatTest, LstatDescribesTheSymlinkAndStatItsTarget) {
  write_file(path("target"), "abc");
  xsymlink("target", path("link"));
  const struct stat l = xlstat(path("link"));
  const struct stat s = xstat(path("link"));
  EXPECT_TRUE(S_ISLNK(l.st_mode));
  EXPECT_EQ(l.st_size, 6) << "a symlink's size is the length of its target";
  EXPECT_TRUE(S_ISREG(s.st_mode));
  EXPECT_EQ(s.st_ino, xstat(path("target")).st_ino);
  EXPECT_NE(l.st_ino, s.st_ino);
  struct stat nofollow;
  ASSERT_OK(::fstatat(dfd(), "link", &nofollow, AT_SYMLINK_NOFOLLOW));
  EXPECT_EQ(nofollow.st_ino, l.st_ino);
}

TEST_F(StatTest, DirectoryLinkCountIsTwoPlusSubdirectories) {
  xmkdir(path("d"));
  EXPECT_TRUE(S_ISDIR(xstat(path("d")).st_mode));
  EXPECT_EQ(xstat(path("d")).st_nlink, 2u);
  for (const char* sub : {"d/a", "d/b", "d/c"}) xmkdir(path(sub));
  write_file(path("d/file"), "x");
  xsymlink("a", path("d/link"));
  EXPECT_EQ(xstat(path("d")).st_nlink, 5u) << "files and symlinks do not count";
  ASSERT_OK(::rmdir(path("d/b").c_str()));
  EXPECT_EQ(xstat(path("d")).st_nlink, 4u);
  EXPECT_EQ(xstat(path("d/a")).st_nlink, 2u);
}

TEST_F(StatTest, LookupErrors) {
  write_file(path("f"), "x");
  struct stat st;
  EXPECT_ERRNO(ENOENT, ::stat(path("missing").c_str(), &st));
  EXPECT_ERRNO(ENOENT, ::lstat(path("missing/x").c_str(), &st));
  EXPECT_ERRNO(ENOTDIR, ::stat(path("f/x").c_str(), &st));
  EXPECT_ERRNO(ENOTDIR, ::stat(path("f/").c_str(), &st));
  EXPECT_ERRNO(ENOENT, ::stat("", &st));
  EXPECT_ERRNO(ENOENT, ::fstatat(dfd(), "missing", &st, 0));
  xsymlink("missing", path("dangling"));
  EXPECT_ERRNO(ENOENT, ::stat(path("dangling").c_str(), &st));
  EXPECT_OK(::lstat(path("dangling").c_str(), &st));
}

TEST_F(StatTest, InodeNumbersAreUniqueStableAndMatchReaddir) {
  std::map<std::string, ino_t> ino;
  std::set<ino_t> seen;
  for (int i = 0; i < 200; ++i) {
    const std::string name = "f" + std::to_string(i);
    if (i % 10 == 0) {
      xmkdir(path(name));
    } else {
      write_file(path(name), name);
    }
    ino[name] = xstat(path(name)).st_ino;
    EXPECT_TRUE(seen.insert(ino[name]).second) << name << " reuses inode " << ino[name];
  }
  for (const auto& [name, i] : ino) EXPECT_EQ(xstat(path(name)).st_ino, i) << name;
  Dir d(::opendir(dir().c_str()));
  ASSERT_NE(d.get(), nullptr);
  size_t matched = 0;
  while (dirent* e = ::readdir(d.get())) {
    auto it = ino.find(e->d_name);
    if (it == ino.end()) continue;
    EXPECT_EQ(e->d_ino, it->second) << e->d_name;
    ++matched;
  }
  EXPECT_EQ(matched, ino.size());
}

TEST_F(StatTest, BlocksCoverWrittenDataAndEmptyFilesHaveNone) {
  write_file(path("empty"), "");
  EXPECT_EQ(xstat(path("empty")).st_blocks, 0);
  Fd fd = xopen(path("full"), O_CREAT | O_WRONLY, 0644);
  pwrite_all(fd.get(), pattern(3, 1 << 20), 0);
  ASSERT_OK(::fsync(fd.get()));
  const struct stat st = xfstat(fd.get());
  EXPECT_EQ(st.st_size, 1 << 20);
  EXPECT_GE(st.st_blocks * 512, 1 << 20) << "st_blocks counts 512-byte units";
  EXPECT_LE(st.st_blocks * 512, 2 << 20) << "a 1 MiB file should not take 2 MiB";
}

TEST_F(StatTest, StatxReportsTheBasicFields) {
  write_file(path("f"), pattern(2, 777), 0604);
  struct statx sx;
  ASSERT_OK(::statx(dfd(), "f", AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx));
  const unsigned need = STATX_TYPE | STATX_MODE | STATX_NLINK | STATX_UID | STATX_GID |
                        STATX_MTIME | STATX_CTIME | STATX_INO | STATX_SIZE;
  EXPECT_EQ(sx.stx_mask & need, need);
  const struct stat st = xstat(path("f"));
  EXPECT_EQ(sx.stx_size, 777u);
  EXPECT_EQ(sx.stx_mode, st.st_mode);
  EXPECT_EQ(sx.stx_ino, st.st_ino);
  EXPECT_EQ(sx.stx_nlink, st.st_nlink);
  EXPECT_EQ(int64_t{sx.stx_mtime.tv_sec} * 1'000'000'000 + sx.stx_mtime.tv_nsec, ns_of(st.st_mtim));
}

TEST_F(StatTest, SizeFollowsWrites) {
  Fd fd = xopen(path("f"), O_CREAT | O_RDWR, 0644);
  off_t expect = 0;
  for (off_t len : {1, 4095, 1, 4096, 10000, 65536}) {
    pwrite_all(fd.get(), pattern(static_cast<uint64_t>(len), static_cast<size_t>(len)), expect);
    expect += len;
    EXPECT_EQ(xfstat(fd.get()).st_size, expect);
    EXPECT_EQ(xstat(path("f")).st_size, expect);
  }
  // A write inside the file does not change its size.
  pwrite_all(fd.get(), "zz", 10);
  EXPECT_EQ(xstat(path("f")).st_size, expect);
}

}  // namespace
}  // namespace warpfs::posix_test
