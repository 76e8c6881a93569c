// Permission checks as an unprivileged user: each probe runs in a child process that drops
// to uid/gid 65534 (nobody/nogroup, no supplementary groups) and reports the errno of one
// call back through a pipe. warpfs mounts with default_permissions, so the kernel checks
// mode bits against the owner and group warpfs reports; these tests need root to set up.
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <functional>
#include <string>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;
// Reported when the child could not drop its privileges: not an errno value.
constexpr int kCannotDrop = -1000;

// What an as_nobody() result means, for messages.
std::string outcome(int r) {
  if (r == 0) return "success";
  if (r == kCannotDrop) return "could not drop privileges";
  return errno_name(r);
}

class PermTest : public PosixTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "permission tests need root to set owners and to drop";
    PosixTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_OK(::chmod(dir().c_str(), 0755));
    // Everything else hangs on the unprivileged user reaching the test directory; an
    // EACCES there would make every probe below "pass" for the wrong reason.
    const int reach = as_nobody([&] {
      struct stat st;
      return ::stat(path(".").c_str(), &st);
    });
    ASSERT_EQ(reach, 0) << "uid " << kNobody << " cannot reach " << dir() << " (" << outcome(reach)
                        << "): WARPFS_TEST_DIR and its parents must be searchable by others";
  }

  // Runs `call` as nobody in a child process; returns 0 if it succeeded (did not return
  // -1), the errno it failed with otherwise, or kCannotDrop.
  static int as_nobody(const std::function<long()>& call) {
    int pipefd[2];
    if (::pipe(pipefd) != 0) return kCannotDrop;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(pipefd[0]);
      int result = kCannotDrop;
      if (::setgroups(0, nullptr) == 0 && ::setgid(kNogroup) == 0 && ::setuid(kNobody) == 0) {
        errno = 0;
        result = call() == -1 ? errno : 0;
      }
      ssize_t ignored = ::write(pipefd[1], &result, sizeof result);
      (void)ignored;
      ::_exit(0);
    }
    ::close(pipefd[1]);
    int result = kCannotDrop;
    if (pid < 0 || ::read(pipefd[0], &result, sizeof result) != sizeof result) result = kCannotDrop;
    ::close(pipefd[0]);
    if (pid > 0) ::waitpid(pid, nullptr, 0);
    return result;
  }

  // A file owned by root with `mode`.
  void root_file(const std::string& name, mode_t mode, const std::string& data = "secret") {
    write_file(path(name), data);
    check(::chmod(path(name).c_str(), mode), "chmod " + name);
  }
};

::testing::AssertionResult NobodyGets(const char* call, int expected, int got) {
  if (got == expected) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "as uid " << kNobody << ": " << call << "\n  expected: " << outcome(expected)
         << "\n  actual:   " << outcome(got);
}

// Runs `call` as nobody and expects `expected` (0 for success, or an errno value).
#define EXPECT_AS_NOBODY(expected, call)                                                  \
  GTEST_ASSERT_(NobodyGets(#call, expected, as_nobody([&]() -> long { return (call); })), \
                GTEST_NONFATAL_FAILURE_)

TEST_F(PermTest, OwnerOnlyFileIsEACCESForOthers) {
  root_file("private", 0600);
  root_file("public", 0644);
  EXPECT_AS_NOBODY(EACCES, ::open(path("private").c_str(), O_RDONLY));
  EXPECT_AS_NOBODY(EACCES, ::open(path("private").c_str(), O_WRONLY));
  EXPECT_AS_NOBODY(EACCES, ::access(path("private").c_str(), R_OK));
  EXPECT_AS_NOBODY(0, ::open(path("public").c_str(), O_RDONLY));
  EXPECT_AS_NOBODY(EACCES, ::open(path("public").c_str(), O_WRONLY));
  EXPECT_AS_NOBODY(EACCES, ::open(path("public").c_str(), O_WRONLY | O_TRUNC));
  EXPECT_AS_NOBODY(EACCES, ::truncate(path("public").c_str(), 0));
  EXPECT_EQ(read_file(path("public")), "secret") << "nothing was truncated";
}

// open(O_TRUNC) by a user without CAP_FSETID who is not in the file's group drops set-user-ID
// and set-group-ID, as a write does (on warpfs the truncate is the daemon's: atomic O_TRUNC).
TEST_F(PermTest, TruncatingOpenDropsSetIdBits) {
  root_file("suid", 04777, "data");
  root_file("sgid", 02777, "data");
  root_file("sgid_noexec", 02767, "data");  // without group execute: a non-member drops it too
  for (const char* name : {"suid", "sgid", "sgid_noexec"}) {
    EXPECT_AS_NOBODY(0, [&]() -> long {
      const int fd = ::open(path(name).c_str(), O_WRONLY | O_TRUNC);
      return fd < 0 ? -1 : ::close(fd);
    }());
  }
  struct stat st;
  ASSERT_OK(::stat(path("suid").c_str(), &st));
  EXPECT_EQ(st.st_mode & 07777, 0777u);
  EXPECT_EQ(st.st_size, 0);
  ASSERT_OK(::stat(path("sgid").c_str(), &st));
  EXPECT_EQ(st.st_mode & 07777, 0777u);
  ASSERT_OK(::stat(path("sgid_noexec").c_str(), &st));
  EXPECT_EQ(st.st_mode & 07777, 0767u);
  EXPECT_EQ(st.st_size, 0);
}

TEST_F(PermTest, RootIgnoresModeBits) {
  root_file("none", 0000, "data");
  Fd fd(::open(path("none").c_str(), O_RDWR));
  EXPECT_TRUE(fd.ok()) << "root (CAP_DAC_OVERRIDE) opens a mode 0000 file: "
                       << std::strerror(errno);
  EXPECT_EQ(read_file(path("none")), "data");
}

TEST_F(PermTest, WritingIntoARootDirectoryIsEACCES) {
  xmkdir(path("d"), 0755);
  root_file("d/existing", 0666);
  EXPECT_AS_NOBODY(EACCES, ::open(path("d/new").c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_AS_NOBODY(EACCES, ::mkdir(path("d/sub").c_str(), 0755));
  EXPECT_AS_NOBODY(EACCES, ::symlink("x", path("d/link").c_str()));
  EXPECT_AS_NOBODY(EACCES, ::unlink(path("d/existing").c_str()));
  EXPECT_AS_NOBODY(EACCES, ::rename(path("d/existing").c_str(), path("d/moved").c_str()));
  // The file itself is writable by everyone: only the directory refuses.
  EXPECT_AS_NOBODY(0, ::open(path("d/existing").c_str(), O_WRONLY));
  EXPECT_EQ(list_dir(path("d")), std::vector<std::string>{"existing"});
}

TEST_F(PermTest, FilesCreatedByAUserBelongToThem) {
  xmkdir(path("open"));
  ASSERT_OK(::chmod(path("open").c_str(), 0777));
  EXPECT_AS_NOBODY(0, ::close(::open(path("open/mine").c_str(), O_CREAT | O_WRONLY, 0640)));
  EXPECT_AS_NOBODY(0, ::mkdir(path("open/mydir").c_str(), 0700));
  const struct stat f = xstat(path("open/mine"));
  EXPECT_EQ(f.st_uid, kNobody);
  EXPECT_EQ(f.st_gid, kNogroup);
  EXPECT_EQ(f.st_mode & 07777, 0640u);
  EXPECT_EQ(xstat(path("open/mydir")).st_uid, kNobody);
}

TEST_F(PermTest, SearchAndReadPermissionOnDirectories) {
  xmkdir(path("closed"), 0700);
  root_file("closed/f", 0644);
  xmkdir(path("searchonly"), 0711);
  root_file("searchonly/f", 0644);
  EXPECT_AS_NOBODY(EACCES, [&] {
    struct stat st;
    return ::stat(path("closed/f").c_str(), &st);
  }());
  EXPECT_AS_NOBODY(EACCES, ::open(path("closed/f").c_str(), O_RDONLY));
  EXPECT_AS_NOBODY(0, ::open(path("searchonly/f").c_str(), O_RDONLY)) << "x is enough to pass";
  EXPECT_AS_NOBODY(EACCES, ::open(path("searchonly").c_str(), O_RDONLY | O_DIRECTORY))
      << "but listing needs r";
}

TEST_F(PermTest, GroupClassIsCheckedBeforeOthers) {
  // The group class applies to members of the group even when "others" would allow more.
  root_file("group_none", 0604);
  ASSERT_OK(::chown(path("group_none").c_str(), 0, kNogroup));
  root_file("group_read", 0640);
  ASSERT_OK(::chown(path("group_read").c_str(), 0, kNogroup));
  EXPECT_AS_NOBODY(EACCES, ::open(path("group_none").c_str(), O_RDONLY));
  EXPECT_AS_NOBODY(0, ::open(path("group_read").c_str(), O_RDONLY));
  // Likewise the owner class for the owner.
  root_file("owner_none", 0066);
  ASSERT_OK(::chown(path("owner_none").c_str(), kNobody, 0));
  EXPECT_AS_NOBODY(EACCES, ::open(path("owner_none").c_str(), O_RDONLY));
}

TEST_F(PermTest, StickyDirectoryProtectsOtherUsersFiles) {
  xmkdir(path("tmp"));
  ASSERT_OK(::chmod(path("tmp").c_str(), 01777));
  root_file("tmp/roots", 0666);
  EXPECT_AS_NOBODY(EPERM, ::unlink(path("tmp/roots").c_str()));
  EXPECT_AS_NOBODY(EPERM, ::rename(path("tmp/roots").c_str(), path("tmp/stolen").c_str()));
  EXPECT_TRUE(exists(path("tmp/roots")));
  EXPECT_AS_NOBODY(0, [&] {
    const int fd = ::open(path("tmp/own").c_str(), O_CREAT | O_WRONLY, 0644);
    if (fd < 0) return -1;
    ::close(fd);
    return ::unlink(path("tmp/own").c_str());
  }()) << "a user may remove their own file";
}

TEST_F(PermTest, OnlyTheOwnerMayChangeModeOwnerAndExplicitTimes) {
  root_file("f", 0666);
  EXPECT_AS_NOBODY(EPERM, ::chmod(path("f").c_str(), 0777));
  EXPECT_AS_NOBODY(EPERM, ::chown(path("f").c_str(), kNobody, kNogroup));
  const timespec explicit_times[2] = {{1000, 0}, {1000, 0}};
  EXPECT_AS_NOBODY(EPERM, ::utimensat(AT_FDCWD, path("f").c_str(), explicit_times, 0));
  // Setting both times to "now" only needs write permission.
  EXPECT_AS_NOBODY(0, ::utimensat(AT_FDCWD, path("f").c_str(), nullptr, 0));
  root_file("ro", 0644);
  EXPECT_AS_NOBODY(EACCES, ::utimensat(AT_FDCWD, path("ro").c_str(), nullptr, 0));
  EXPECT_EQ(xstat(path("f")).st_mode & 07777, 0666u);
  EXPECT_EQ(xstat(path("f")).st_uid, 0u);
  // The owner may chmod their own file without any mode bits.
  root_file("theirs", 0000);
  ASSERT_OK(::chown(path("theirs").c_str(), kNobody, kNogroup));
  EXPECT_AS_NOBODY(0, ::chmod(path("theirs").c_str(), 0600));
  EXPECT_EQ(xstat(path("theirs")).st_mode & 07777, 0600u);
}

TEST_F(PermTest, XattrsNeedWritePermission) {
  root_file("ro", 0644);
  root_file("rw", 0666);
  EXPECT_AS_NOBODY(EACCES, ::setxattr(path("ro").c_str(), "user.x", "v", 1, 0));
  EXPECT_AS_NOBODY(0, ::setxattr(path("rw").c_str(), "user.x", "v", 1, 0));
}

}  // namespace
}  // namespace warpfs::posix_test
