// Unlinked but still open: the inode lives on through its descriptors (readable, writable,
// fstat says nlink 0) while the name is gone; the same for a file replaced by rename and
// for a removed directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using UnlinkOpenTest = PosixTest;

TEST_F(UnlinkOpenTest, UnlinkedFileStaysUsableThroughItsDescriptor) {
  const std::string data = pattern(1, 100000);
  write_file(path("f"), data);
  Fd fd = xopen(path("f"), O_RDWR);
  ASSERT_OK(::unlink(path("f").c_str()));
  EXPECT_FALSE(exists(path("f")));
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{});
  struct stat st = xfstat(fd.get());
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_EQ(st.st_size, 100000);
  EXPECT_EQ(pread_upto(fd.get(), data.size(), 0), data);
  const std::string more = pattern(2, 50000);
  pwrite_all(fd.get(), more, 90000);
  EXPECT_EQ(xfstat(fd.get()).st_size, 140000);
  EXPECT_EQ(pread_upto(fd.get(), more.size(), 90000), more);
  ASSERT_OK(::ftruncate(fd.get(), 10));
  EXPECT_EQ(pread_upto(fd.get(), 100, 0), data.substr(0, 10));
  ASSERT_OK(::fchmod(fd.get(), 0600));
  EXPECT_EQ(xfstat(fd.get()).st_mode & 07777, 0600u);
  ASSERT_OK(::fsetxattr(fd.get(), "user.orphan", "yes", 3, 0));
  char buf[4];
  EXPECT_EQ(::fgetxattr(fd.get(), "user.orphan", buf, sizeof buf), 3);
  ASSERT_OK(::fsync(fd.get()));
  // A new file under the old name is a different file.
  write_file(path("f"), "new");
  EXPECT_EQ(read_file(path("f")), "new");
  EXPECT_EQ(pread_upto(fd.get(), 100, 0), data.substr(0, 10));
  EXPECT_EQ(xfstat(fd.get()).st_nlink, 0u);
}

TEST_F(UnlinkOpenTest, SecondDescriptorOpenedBeforeUnlinkSeesTheSameInode) {
  write_file(path("f"), "shared");
  Fd a = xopen(path("f"), O_RDWR);
  Fd b = xopen(path("f"), O_RDONLY);
  xunlink(path("f"));
  pwrite_all(a.get(), "SHARED", 0);
  EXPECT_EQ(pread_upto(b.get(), 10, 0), "SHARED");
  a.reset();
  EXPECT_EQ(pread_upto(b.get(), 10, 0), "SHARED") << "after the writer closed";
  EXPECT_EQ(xfstat(b.get()).st_nlink, 0u);
}

TEST_F(UnlinkOpenTest, ManyUnlinkedFilesKeepTheirOwnContents) {
  std::vector<Fd> fds;
  for (int i = 0; i < 32; ++i) {
    const std::string name = "f" + std::to_string(i);
    write_file(path(name), pattern(static_cast<uint64_t>(i), 5000 + static_cast<size_t>(i)));
    fds.push_back(xopen(path(name), O_RDONLY));
    xunlink(path(name));
  }
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{});
  for (int i = 0; i < 32; ++i) {
    const std::string want = pattern(static_cast<uint64_t>(i), 5000 + static_cast<size_t>(i));
    EXPECT_EQ(pread_upto(fds[i].get(), 10000, 0), want) << "file " << i;
  }
}

TEST_F(UnlinkOpenTest, HardLinkedFileKeepsItsOtherName) {
  write_file(path("a"), "both");
  xlink(path("a"), path("b"));
  Fd fd = xopen(path("a"), O_RDONLY);
  xunlink(path("a"));
  EXPECT_EQ(xfstat(fd.get()).st_nlink, 1u);
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{"b"});
  EXPECT_EQ(read_file(path("b")), "both");
}

TEST_F(UnlinkOpenTest, FileReplacedByRenameLivesOnThroughItsDescriptor) {
  write_file(path("old"), "old contents");
  write_file(path("new"), "new contents");
  Fd fd = xopen(path("old"), O_RDONLY);
  ASSERT_OK(::rename(path("new").c_str(), path("old").c_str()));
  EXPECT_EQ(pread_upto(fd.get(), 100, 0), "old contents");
  EXPECT_EQ(xfstat(fd.get()).st_nlink, 0u);
  EXPECT_EQ(read_file(path("old")), "new contents");
}

TEST_F(UnlinkOpenTest, UnlinkedFileCannotBeLinkedBack) {
  if (::geteuid() != 0) GTEST_SKIP() << "linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH";
  write_file(path("f"), "x");
  Fd fd = xopen(path("f"), O_RDONLY);
  xunlink(path("f"));
  EXPECT_ERRNO(ENOENT, ::linkat(fd.get(), "", dfd(), "again", AT_EMPTY_PATH));
  EXPECT_FALSE(exists(path("again")));
}

TEST_F(UnlinkOpenTest, RemovedDirectoryIsEmptyAndRefusesNewEntries) {
  xmkdir(path("d"));
  Fd fd = xopen(path("d"), O_RDONLY | O_DIRECTORY);
  ASSERT_OK(::rmdir(path("d").c_str()));
  EXPECT_FALSE(exists(path("d")));
  EXPECT_EQ(xfstat(fd.get()).st_nlink, 0u);
  char buf[4096];
  EXPECT_ERRNO(ENOENT, ::syscall(SYS_getdents64, fd.get(), buf, sizeof buf));
  EXPECT_ERRNO(ENOENT, ::openat(fd.get(), "x", O_CREAT | O_WRONLY, 0644));
  EXPECT_ERRNO(ENOENT, ::mkdirat(fd.get(), "sub", 0755));
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{});
}

}  // namespace
}  // namespace warpfs::posix_test
