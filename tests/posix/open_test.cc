// open/openat/close: creation and its mode, the errors of opening the wrong kind of thing,
// descriptors and their offsets. O_APPEND, O_TRUNC and O_EXCL are in io_test.cc.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using OpenTest = PosixTest;

TEST_F(OpenTest, CreateMakesAnEmptyRegularFileWithTheRequestedMode) {
  Fd fd(::open(path("f").c_str(), O_CREAT | O_WRONLY, 0640));
  ASSERT_TRUE(fd.ok()) << std::strerror(errno);
  const struct stat st = xfstat(fd.get());
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_gid, ::getegid());
  EXPECT_EQ(list_dir(dir()), std::vector<std::string>{"f"});
}

TEST_F(OpenTest, CreateAppliesTheUmask) {
  ScopedUmask mask(027);
  Fd fd(::open(path("f").c_str(), O_CREAT | O_WRONLY, 0777));
  ASSERT_TRUE(fd.ok()) << std::strerror(errno);
  EXPECT_EQ(xfstat(fd.get()).st_mode & 07777, 0750u);
  ASSERT_OK(::mkdir(path("d").c_str(), 0777));
  EXPECT_EQ(xstat(path("d")).st_mode & 07777, 0750u);
}

TEST_F(OpenTest, CreateWithoutExclOpensTheExistingFileUntouched) {
  write_file(path("f"), "hello", 0644);
  const ino_t ino = xstat(path("f")).st_ino;
  Fd fd(::open(path("f").c_str(), O_CREAT | O_RDWR, 0600));
  ASSERT_TRUE(fd.ok()) << std::strerror(errno);
  const struct stat st = xfstat(fd.get());
  EXPECT_EQ(st.st_ino, ino);
  EXPECT_EQ(st.st_mode & 07777, 0644u) << "O_CREAT must not change an existing file's mode";
  EXPECT_EQ(pread_upto(fd.get(), 100, 0), "hello");
}

TEST_F(OpenTest, MissingFileOrParentIsENOENT) {
  EXPECT_ERRNO(ENOENT, ::open(path("missing").c_str(), O_RDONLY));
  EXPECT_ERRNO(ENOENT, ::open(path("missing").c_str(), O_WRONLY));
  EXPECT_ERRNO(ENOENT, ::open(path("nodir/f").c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_ERRNO(ENOENT, ::open("", O_RDONLY));
  EXPECT_FALSE(exists(path("missing")));
  EXPECT_FALSE(exists(path("nodir")));
}

TEST_F(OpenTest, FileUsedAsDirectoryIsENOTDIR) {
  write_file(path("f"), "x");
  EXPECT_ERRNO(ENOTDIR, ::open(path("f/x").c_str(), O_RDONLY));
  EXPECT_ERRNO(ENOTDIR, ::open(path("f/x").c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_ERRNO(ENOTDIR, ::open(path("f/").c_str(), O_RDONLY));
  EXPECT_ERRNO(ENOTDIR, ::open(path("f").c_str(), O_RDONLY | O_DIRECTORY));
  EXPECT_ERRNO(ENOTDIR, ::openat(Fd(::open(path("f").c_str(), O_RDONLY)).get(), "x", O_RDONLY));
}

TEST_F(OpenTest, DirectoryForWritingIsEISDIR) {
  xmkdir(path("d"));
  EXPECT_ERRNO(EISDIR, ::open(path("d").c_str(), O_WRONLY));
  EXPECT_ERRNO(EISDIR, ::open(path("d").c_str(), O_RDWR));
  EXPECT_ERRNO(EISDIR, ::open(path("d").c_str(), O_CREAT | O_WRONLY, 0644));
  Fd fd(::open(path("d").c_str(), O_RDONLY | O_DIRECTORY));
  ASSERT_TRUE(fd.ok()) << std::strerror(errno);
  char c;
  EXPECT_ERRNO(EISDIR, ::read(fd.get(), &c, 1));
  EXPECT_TRUE(S_ISDIR(xfstat(fd.get()).st_mode));
}

TEST_F(OpenTest, AccessModeIsEnforcedOnTheDescriptor) {
  write_file(path("f"), "data");
  Fd ro = xopen(path("f"), O_RDONLY);
  Fd wo = xopen(path("f"), O_WRONLY);
  char buf[4];
  EXPECT_ERRNO(EBADF, ::write(ro.get(), "x", 1));
  EXPECT_ERRNO(EBADF, ::pwrite(ro.get(), "x", 1, 0));
  EXPECT_ERRNO(EBADF, ::read(wo.get(), buf, sizeof buf));
  EXPECT_ERRNO(EBADF, ::pread(wo.get(), buf, sizeof buf, 0));
  EXPECT_EQ(read_file(path("f")), "data");
}

TEST_F(OpenTest, ClosedDescriptorIsEBADF) {
  write_file(path("f"), "data");
  int fd = ::open(path("f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_OK(::close(fd));
  char c;
  EXPECT_ERRNO(EBADF, ::close(fd));
  EXPECT_ERRNO(EBADF, ::read(fd, &c, 1));
  struct stat st;
  EXPECT_ERRNO(EBADF, ::fstat(fd, &st));
  EXPECT_ERRNO(EBADF, ::openat(fd, "x", O_RDONLY));
  EXPECT_ERRNO(EBADF, ::fsync(fd));
}

TEST_F(OpenTest, EachOpenHasItsOwnOffsetAndDupSharesOne) {
  write_file(path("f"), "0123456789");
  Fd a = xopen(path("f"), O_RDONLY);
  Fd b = xopen(path("f"), O_RDONLY);
  char buf[4] = {};
  ASSERT_EQ(::read(a.get(), buf, 3), 3);
  EXPECT_EQ(std::string(buf, 3), "012");
  ASSERT_EQ(::read(b.get(), buf, 2), 2);
  EXPECT_EQ(std::string(buf, 2), "01") << "a second open must start at offset 0";
  Fd c(::dup(a.get()));
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(::read(c.get(), buf, 2), 2);
  EXPECT_EQ(std::string(buf, 2), "34") << "a dup shares the offset";
  EXPECT_EQ(::lseek(a.get(), 0, SEEK_CUR), 5);
}

TEST_F(OpenTest, WritesThroughOneDescriptorAreVisibleThroughAnother) {
  Fd w = xopen(path("f"), O_CREAT | O_WRONLY, 0644);
  Fd r = xopen(path("f"), O_RDONLY);
  for (int i = 0; i < 50; ++i) {
    const std::string chunk = pattern(static_cast<uint64_t>(i), 1000 + i);
    const off_t off = static_cast<off_t>(i) * 997;
    pwrite_all(w.get(), chunk, off);
    EXPECT_EQ(pread_upto(r.get(), chunk.size(), off), chunk) << "write " << i;
    EXPECT_GE(xstat(path("f")).st_size, off + static_cast<off_t>(chunk.size()));
  }
}

TEST_F(OpenTest, SymlinksAreFollowedUnlessNoFollow) {
  write_file(path("target"), "via link");
  xsymlink("target", path("link"));
  EXPECT_EQ(read_file(path("link")), "via link");
  EXPECT_ERRNO(ELOOP, ::open(path("link").c_str(), O_RDONLY | O_NOFOLLOW));
  // O_CREAT through a dangling symlink creates the file it points to.
  xsymlink("created", path("dangling"));
  Fd fd(::open(path("dangling").c_str(), O_CREAT | O_WRONLY, 0600));
  ASSERT_TRUE(fd.ok()) << std::strerror(errno);
  pwrite_all(fd.get(), "new", 0);
  EXPECT_EQ(read_file(path("created")), "new");
  EXPECT_TRUE(S_ISLNK(xlstat(path("dangling")).st_mode));
  EXPECT_EQ(xstat(path("created")).st_mode & 07777, 0600u);
}

TEST_F(OpenTest, OpenatResolvesRelativeToTheDirectoryDescriptor) {
  xmkdir(path("d"));
  Fd d = xopen(path("d"), O_RDONLY | O_DIRECTORY);
  Fd f(::openat(d.get(), "inner", O_CREAT | O_WRONLY, 0644));
  ASSERT_TRUE(f.ok()) << std::strerror(errno);
  pwrite_all(f.get(), "inside", 0);
  EXPECT_EQ(read_file(path("d/inner")), "inside");
  EXPECT_FALSE(exists(path("inner")));
  // An absolute path ignores the descriptor.
  Fd abs(::openat(d.get(), path("d/inner").c_str(), O_RDONLY));
  EXPECT_TRUE(abs.ok());
  EXPECT_ERRNO(ENOENT, ::openat(d.get(), "missing", O_RDONLY));
}

TEST_F(OpenTest, ManyDescriptorsOnOneFileAreIndependent) {
  write_file(path("f"), pattern(7, 4096));
  std::vector<Fd> fds;
  for (int i = 0; i < 200; ++i) {
    fds.push_back(xopen(path("f"), O_RDONLY));
    ASSERT_EQ(::lseek(fds.back().get(), i, SEEK_SET), i);
  }
  const std::string want = pattern(7, 4096);
  for (int i = 0; i < 200; ++i) {
    char c;
    ASSERT_EQ(::read(fds[i].get(), &c, 1), 1);
    EXPECT_EQ(c, want[i]) << "descriptor " << i;
  }
}

TEST_F(OpenTest, CloseOnExecFlagIsKept) {
  write_file(path("f"), "x");
  Fd a = xopen(path("f"), O_RDONLY | O_CLOEXEC);
  Fd b = xopen(path("f"), O_RDONLY);
  EXPECT_NE(::fcntl(a.get(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_EQ(::fcntl(b.get(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_EQ(::fcntl(a.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
}

}  // namespace
}  // namespace warpfs::posix_test
