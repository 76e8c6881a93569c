// link/unlink/symlink/readlink: hard links share one inode and its link count, symlinks
// store their target byte for byte (short targets and long ones alike), and the errors.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using LinkTest = PosixTest;

std::string read_link(const std::string& p) {
  std::string buf(8192, '\0');
  const ssize_t n = check(::readlink(p.c_str(), buf.data(), buf.size()), "readlink " + p);
  buf.resize(static_cast<size_t>(n));
  return buf;
}

TEST_F(LinkTest, HardLinkSharesTheInode) {
  write_file(path("a"), "shared");
  ASSERT_OK(::link(path("a").c_str(), path("b").c_str()));
  const struct stat a = xstat(path("a"));
  const struct stat b = xstat(path("b"));
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_nlink, 2u);
  EXPECT_EQ(b.st_nlink, 2u);
  {
    Fd fd = xopen(path("b"), O_WRONLY | O_APPEND);
    pwrite_all(fd.get(), " data", 0);
  }
  EXPECT_EQ(read_file(path("a")), "shared data");
  ASSERT_OK(::unlink(path("a").c_str()));
  EXPECT_FALSE(exists(path("a")));
  EXPECT_EQ(xstat(path("b")).st_nlink, 1u);
  EXPECT_EQ(read_file(path("b")), "shared data");
}

TEST_F(LinkTest, LinkErrors) {
  write_file(path("f"), "x");
  write_file(path("g"), "y");
  xmkdir(path("d"));
  EXPECT_ERRNO(EEXIST, ::link(path("f").c_str(), path("g").c_str()));
  EXPECT_ERRNO(EEXIST, ::link(path("f").c_str(), path("d").c_str()));
  EXPECT_ERRNO(ENOENT, ::link(path("missing").c_str(), path("new").c_str()));
  EXPECT_ERRNO(ENOENT, ::link(path("f").c_str(), path("missing/new").c_str()));
  EXPECT_ERRNO(ENOTDIR, ::link(path("f").c_str(), path("g/new").c_str()));
  EXPECT_ERRNO(EPERM, ::link(path("d").c_str(), path("dirlink").c_str()));
  EXPECT_EQ(read_file(path("g")), "y");
  EXPECT_EQ(xstat(path("f")).st_nlink, 1u);
  EXPECT_FALSE(exists(path("new")));
  EXPECT_FALSE(exists(path("dirlink")));
}

TEST_F(LinkTest, UnlinkErrors) {
  write_file(path("f"), "x");
  xmkdir(path("d"));
  EXPECT_ERRNO(ENOENT, ::unlink(path("missing").c_str()));
  EXPECT_ERRNO(EISDIR, ::unlink(path("d").c_str()));
  EXPECT_ERRNO(ENOTDIR, ::unlink(path("f/x").c_str()));
  EXPECT_ERRNO(ENOTDIR, ::unlinkat(dfd(), "f", AT_REMOVEDIR));
  EXPECT_ERRNO(EINVAL, ::unlinkat(dfd(), "f", 0x4000 /* not a valid flag */));
  EXPECT_TRUE(exists(path("f")));
  EXPECT_TRUE(exists(path("d")));
  EXPECT_OK(::unlinkat(dfd(), "d", AT_REMOVEDIR));
  EXPECT_OK(::unlinkat(dfd(), "f", 0));
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{});
}

TEST_F(LinkTest, ManyHardLinks) {
  write_file(path("f"), "many");
  for (int i = 0; i < 200; ++i) xlink(path("f"), path("l" + std::to_string(i)));
  EXPECT_EQ(xstat(path("f")).st_nlink, 201u);
  EXPECT_EQ(xstat(path("l199")).st_nlink, 201u);
  for (int i = 0; i < 200; i += 2) xunlink(path("l" + std::to_string(i)));
  EXPECT_EQ(xstat(path("l1")).st_nlink, 101u);
  xunlink(path("f"));
  for (int i = 1; i < 199; i += 2) xunlink(path("l" + std::to_string(i)));
  EXPECT_EQ(xstat(path("l199")).st_nlink, 1u);
  EXPECT_EQ(read_file(path("l199")), "many");
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{"l199"});
}

TEST_F(LinkTest, NameIsReusableAfterTheLastLinkGoes) {
  write_file(path("f"), "old contents");
  xunlink(path("f"));
  EXPECT_FALSE(exists(path("f")));
  write_file(path("f"), "new");
  EXPECT_EQ(read_file(path("f")), "new");
  EXPECT_EQ(xstat(path("f")).st_nlink, 1u);
}

TEST_F(LinkTest, ReadlinkReturnsTheTargetExactly) {
  ASSERT_OK(::symlink("some/relative/../target", path("rel").c_str()));
  ASSERT_OK(::symlink("/absolute/target", path("abs").c_str()));
  EXPECT_EQ(read_link(path("rel")), "some/relative/../target");
  EXPECT_EQ(read_link(path("abs")), "/absolute/target");
  // readlink does not NUL-terminate and truncates silently to the buffer.
  char buf[8];
  std::memset(buf, '#', sizeof buf);
  EXPECT_EQ(::readlink(path("abs").c_str(), buf, 5), 5);
  EXPECT_EQ(std::string(buf, 6), "/abso#");
  char at[64];
  const ssize_t n = ::readlinkat(dfd(), "rel", at, sizeof at);
  ASSERT_EQ(n, 23);
  EXPECT_EQ(std::string(at, static_cast<size_t>(n)), "some/relative/../target");
}

TEST_F(LinkTest, SymlinkTargetsOfManyLengths) {
  // Short targets may live in the inode and long ones in a block: both must round-trip.
  for (size_t len : {1, 2, 100, 142, 143, 144, 255, 256, 1000, 4000, 4095}) {
    std::string target;
    for (size_t i = 0; i < len; ++i) target.push_back(static_cast<char>('a' + (i * 7 + len) % 26));
    for (size_t i = 50; i < len; i += 51) target[i] = '/';
    const std::string name = "s" + std::to_string(len);
    ASSERT_OK(::symlink(target.c_str(), path(name).c_str())) << "length " << len;
    EXPECT_EQ(read_link(path(name)), target) << "length " << len;
    EXPECT_EQ(xlstat(path(name)).st_size, static_cast<off_t>(len));
  }
  const std::string too_long(4096, 'x');
  EXPECT_ERRNO(ENAMETOOLONG, ::symlink(too_long.c_str(), path("toolong").c_str()));
  EXPECT_ERRNO(ENOENT, ::symlink("", path("empty").c_str()));
  EXPECT_FALSE(exists(path("toolong")));
}

TEST_F(LinkTest, ReadlinkErrors) {
  write_file(path("f"), "x");
  xmkdir(path("d"));
  char buf[16];
  EXPECT_ERRNO(EINVAL, ::readlink(path("f").c_str(), buf, sizeof buf));
  EXPECT_ERRNO(EINVAL, ::readlink(path("d").c_str(), buf, sizeof buf));
  EXPECT_ERRNO(ENOENT, ::readlink(path("missing").c_str(), buf, sizeof buf));
  xsymlink("x", path("l"));
  EXPECT_ERRNO(EINVAL, ::readlink(path("l").c_str(), buf, 0));
}

TEST_F(LinkTest, SymlinksResolveRelativeToTheirDirectory) {
  xmkdir(path("d"));
  write_file(path("d/target"), "in d");
  write_file(path("target"), "at top");
  xsymlink("target", path("d/link"));
  xsymlink("../target", path("d/up"));
  xsymlink(path("d/target"), path("abs"));
  xsymlink("d", path("dirlink"));
  EXPECT_EQ(read_file(path("d/link")), "in d");
  EXPECT_EQ(read_file(path("d/up")), "at top");
  EXPECT_EQ(read_file(path("abs")), "in d");
  EXPECT_EQ(read_file(path("dirlink/target")), "in d");
  EXPECT_EQ(list_dir(path("dirlink")), (std::vector<std::string>{"link", "target", "up"}));
}

TEST_F(LinkTest, DanglingAndLoopingSymlinks) {
  xsymlink("missing", path("dangling"));
  xsymlink("loop2", path("loop1"));
  xsymlink("loop1", path("loop2"));
  xsymlink("self", path("self"));
  struct stat st;
  EXPECT_ERRNO(ENOENT, ::stat(path("dangling").c_str(), &st));
  EXPECT_ERRNO(ENOENT, ::open(path("dangling").c_str(), O_RDONLY));
  EXPECT_ERRNO(ELOOP, ::stat(path("loop1").c_str(), &st));
  EXPECT_ERRNO(ELOOP, ::open(path("self").c_str(), O_RDONLY));
  EXPECT_ERRNO(ELOOP, ::stat(path("self/x").c_str(), &st));
  EXPECT_OK(::lstat(path("loop1").c_str(), &st));
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_ERRNO(EEXIST, ::symlink("other", path("dangling").c_str()));
  EXPECT_EQ(read_link(path("dangling")), "missing");
}

TEST_F(LinkTest, HardLinkToASymlinkLinksTheSymlinkUnlessFollowed) {
  write_file(path("target"), "x");
  xsymlink("target", path("sym"));
  ASSERT_OK(::linkat(AT_FDCWD, path("sym").c_str(), AT_FDCWD, path("same").c_str(), 0));
  EXPECT_TRUE(S_ISLNK(xlstat(path("same")).st_mode));
  EXPECT_EQ(xlstat(path("same")).st_ino, xlstat(path("sym")).st_ino);
  EXPECT_EQ(xlstat(path("sym")).st_nlink, 2u);
  EXPECT_EQ(read_link(path("same")), "target");
  ASSERT_OK(::linkat(AT_FDCWD, path("sym").c_str(), AT_FDCWD, path("followed").c_str(),
                     AT_SYMLINK_FOLLOW));
  EXPECT_TRUE(S_ISREG(xlstat(path("followed")).st_mode));
  EXPECT_EQ(xstat(path("target")).st_nlink, 2u);
}

TEST_F(LinkTest, UnlinkingASymlinkLeavesItsTarget) {
  write_file(path("target"), "kept");
  xsymlink("target", path("sym"));
  ASSERT_OK(::unlink(path("sym").c_str()));
  EXPECT_FALSE(exists(path("sym")));
  EXPECT_EQ(read_file(path("target")), "kept");
}

}  // namespace
}  // namespace warpfs::posix_test
