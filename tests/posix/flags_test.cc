// Inode flags through FS_IOC_GETFLAGS/SETFLAGS (chattr, lsattr): immutable (+i) refuses every
// change and append-only (+a) every change but appending, with the errors the VFS gives
// (EPERM); clearing them restores everything. Runs as root (CAP_LINUX_IMMUTABLE).
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <string>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

class FlagsTest : public PosixTest {
 protected:
  // Sets the flags of `p`; false (and the test skipped) where the filesystem has none.
  int set(const std::string& p, int flags) {
    Fd fd = xopen(p, O_RDONLY | O_NONBLOCK);
    return ::ioctl(fd.get(), FS_IOC_SETFLAGS, &flags) == 0 ? 0 : errno;
  }
  int get(const std::string& p) {
    Fd fd = xopen(p, O_RDONLY | O_NONBLOCK);
    int flags = -1;
    EXPECT_EQ(::ioctl(fd.get(), FS_IOC_GETFLAGS, &flags), 0) << std::strerror(errno);
    return flags;
  }
  void TearDown() override {  // the fixture removes the tree: nothing may stay pinned
    for (const char* n : {"f", "a", "d"}) {
      struct stat st;
      if (::lstat(path(n).c_str(), &st) == 0 && !S_ISLNK(st.st_mode)) (void)set(path(n), 0);
    }
    PosixTest::TearDown();
  }
};

TEST_F(FlagsTest, ImmutableRefusesEveryChangeUntilCleared) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs CAP_LINUX_IMMUTABLE";
  write_file(path("f"), "fixed");
  if (int rc = set(path("f"), FS_IMMUTABLE_FL); rc == ENOTTY || rc == EOPNOTSUPP)
    GTEST_SKIP() << "no inode flags here";
  ASSERT_EQ(set(path("f"), FS_IMMUTABLE_FL), 0);
  EXPECT_EQ(get(path("f")) & (FS_IMMUTABLE_FL | FS_APPEND_FL), FS_IMMUTABLE_FL);
  EXPECT_EQ(read_file(path("f")), "fixed") << "reading stays";
  EXPECT_ERRNO(EPERM, ::open(path("f").c_str(), O_WRONLY));
  EXPECT_ERRNO(EPERM, ::open(path("f").c_str(), O_RDWR | O_APPEND));
  EXPECT_ERRNO(EPERM, ::truncate(path("f").c_str(), 0));
  EXPECT_ERRNO(EPERM, ::chmod(path("f").c_str(), 0600));
  EXPECT_ERRNO(EPERM, ::utimensat(AT_FDCWD, path("f").c_str(), nullptr, 0));
  EXPECT_ERRNO(EPERM, ::unlink(path("f").c_str()));
  EXPECT_ERRNO(EPERM, ::rename(path("f").c_str(), path("g").c_str()));
  EXPECT_ERRNO(EPERM, ::link(path("f").c_str(), path("h").c_str()));
  EXPECT_ERRNO(EPERM, ::setxattr(path("f").c_str(), "user.k", "v", 1, 0));
  // An immutable directory takes no new names and loses none.
  xmkdir(path("d"));
  write_file(path("d/in"), "x");
  ASSERT_EQ(set(path("d"), FS_IMMUTABLE_FL), 0);
  EXPECT_ERRNO(EPERM, ::open(path("d/new").c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_ERRNO(EPERM, ::unlink(path("d/in").c_str()));
  EXPECT_ERRNO(EPERM, ::mkdir(path("d/sub").c_str(), 0755));
  // Cleared: everything works again.
  ASSERT_EQ(set(path("d"), 0), 0);
  ASSERT_EQ(set(path("f"), 0), 0);
  EXPECT_EQ(get(path("f")) & FS_IMMUTABLE_FL, 0);
  write_file(path("f"), "changed");
  EXPECT_EQ(read_file(path("f")), "changed");
  ASSERT_OK(::unlink(path("d/in").c_str()));
}

TEST_F(FlagsTest, AppendOnlyTakesAppendsAndNothingElse) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs CAP_LINUX_IMMUTABLE";
  write_file(path("a"), "log:");
  if (int rc = set(path("a"), FS_APPEND_FL); rc == ENOTTY || rc == EOPNOTSUPP)
    GTEST_SKIP() << "no inode flags here";
  ASSERT_EQ(set(path("a"), FS_APPEND_FL), 0);
  EXPECT_EQ(get(path("a")) & (FS_IMMUTABLE_FL | FS_APPEND_FL), FS_APPEND_FL);
  EXPECT_ERRNO(EPERM, ::open(path("a").c_str(), O_WRONLY));
  EXPECT_ERRNO(EPERM, ::open(path("a").c_str(), O_WRONLY | O_APPEND | O_TRUNC));
  {
    Fd fd = xopen(path("a"), O_WRONLY | O_APPEND);
    ASSERT_EQ(::write(fd.get(), "one;", 4), 4);
    ASSERT_EQ(::pwrite(fd.get(), "two;", 4, 0), 4) << "O_APPEND: the offset is ignored";
  }
  EXPECT_EQ(read_file(path("a")), "log:one;two;");
  EXPECT_ERRNO(EPERM, ::truncate(path("a").c_str(), 0));
  EXPECT_ERRNO(EPERM, ::chmod(path("a").c_str(), 0600));
  EXPECT_ERRNO(EPERM, ::unlink(path("a").c_str()));
  EXPECT_ERRNO(EPERM, ::rename(path("a").c_str(), path("b").c_str()));
  ASSERT_EQ(set(path("a"), 0), 0);
  ASSERT_OK(::truncate(path("a").c_str(), 0));
}

}  // namespace
}  // namespace warpfs::posix_test
