// The kernel's attribute cache after changes a filesystem makes beyond what the kernel
// updates itself: a FUSE mount's kernel keeps attributes for the daemon's timeout (warpfs:
// a day) and asks again only where it knows they changed, so what stat answers from the cache
// must equal what the filesystem holds (statx with AT_STATX_FORCE_SYNC asks the filesystem;
// a kernel filesystem answers both alike). Each case stats first, so that the attributes are
// cached, changes them, and compares in another process, as a second program would see them.
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

class CoherenceTest : public PosixTest {
 protected:
  // statx of `p` for `mask`, from the cache where the kernel has it (flags 0) or from the
  // filesystem (AT_STATX_FORCE_SYNC).
  static struct statx statx_of(const std::string& p, unsigned mask, int flags) {
    struct statx sx {};
    check(::statx(AT_FDCWD, p.c_str(), flags, mask, &sx), "statx " + p);
    return sx;
  }
  // In a child process: the cached `mask` attributes of `p` equal the filesystem's. Returns
  // "" or what differs.
  static std::string cached_equals_fresh(const std::string& p, unsigned mask) {
    int fds[2];
    check(::pipe(fds), "pipe");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      const struct statx c = statx_of(p, mask, 0);
      const struct statx f = statx_of(p, mask, AT_STATX_FORCE_SYNC);
      std::string why;
      auto same = [&](const char* what, long long a, long long b) {
        if (a != b)
          why += std::string(what) + " cached " + std::to_string(a) + " fresh " +
                 std::to_string(b) + "; ";
      };
      if (mask & STATX_MODE) same("mode", c.stx_mode, f.stx_mode);
      if (mask & STATX_BLOCKS) same("blocks", c.stx_blocks, f.stx_blocks);
      if (mask & STATX_CTIME) {
        same("ctime.sec", c.stx_ctime.tv_sec, f.stx_ctime.tv_sec);
        same("ctime.nsec", c.stx_ctime.tv_nsec, f.stx_ctime.tv_nsec);
      }
      if (::write(fds[1], why.data(), why.size()) < 0) _exit(2);
      _exit(0);
    }
    ::close(fds[1]);
    std::string out;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the child failed";
    return out;
  }
  // Caches the attributes and waits until a change would stamp a newer ctime.
  static void cache_and_wait(const std::string& p) {
    const struct statx sx = statx_of(p, STATX_BASIC_STATS, 0);
    wait_clock_past(sx.stx_ctime.tv_sec * 1'000'000'000ll + sx.stx_ctime.tv_nsec);
  }
};

// chattr: the kernel sends the fileattr ioctl and marks no attribute stale; the new ctime
// must show at once.
TEST_F(CoherenceTest, InodeFlagsChangeShowsAtOnce) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs CAP_LINUX_IMMUTABLE";
  write_file(path("f"), "x");
  cache_and_wait(path("f"));
  Fd fd = xopen(path("f"), O_RDONLY);
  int flags = FS_APPEND_FL;
  if (::ioctl(fd.get(), FS_IOC_SETFLAGS, &flags) != 0) {
    if (errno == ENOTTY || errno == EOPNOTSUPP) GTEST_SKIP() << "no inode flags here";
    FAIL() << "FS_IOC_SETFLAGS: " << std::strerror(errno);
  }
  const std::string why = cached_equals_fresh(path("f"), STATX_BASIC_STATS);
  flags = 0;
  ASSERT_EQ(::ioctl(fd.get(), FS_IOC_SETFLAGS, &flags), 0) << std::strerror(errno);
  EXPECT_EQ(why, "");
  cache_and_wait(path("f"));
  ASSERT_EQ(::ioctl(fd.get(), FS_IOC_SETFLAGS, &flags), 0);  // no change: nothing to show
  EXPECT_EQ(cached_equals_fresh(path("f"), STATX_BASIC_STATS), "");
}

// An extended attribute that takes or frees storage changes st_blocks, which a statx asking
// for STATX_BLOCKS alone reads from the cache unless the kernel was told.
TEST_F(CoherenceTest, XattrStorageShowsInBlocksAtOnce) {
  write_file(path("f"), "x");
  for (int round = 0; round < 2; ++round) {
    (void)statx_of(path("f"), STATX_BASIC_STATS, 0);
    if (round == 0) {
      const std::string v(1000, 'v');
      ASSERT_EQ(::setxattr(path("f").c_str(), "user.k", v.data(), v.size(), 0), 0)
          << std::strerror(errno);
    } else {
      ASSERT_EQ(::removexattr(path("f").c_str(), "user.k"), 0) << std::strerror(errno);
    }
    EXPECT_EQ(cached_equals_fresh(path("f"), STATX_BLOCKS), "") << "round " << round;
    EXPECT_EQ(cached_equals_fresh(path("f"), STATX_BASIC_STATS), "") << "round " << round;
  }
}

// Several processes at once, each changing the attribute storage and the inode flags of its
// own file while the others stat theirs: every change shows at once to a further process.
TEST_F(CoherenceTest, ConcurrentChangesShowAtOnce) {
  constexpr int kProcs = 4, kRounds = 20;
  const bool root = ::geteuid() == 0;
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcs; ++i) {
    const std::string f = path("f" + std::to_string(i));
    write_file(f, "x");
    const pid_t pid = ::fork();
    if (pid == 0) {
      int bad = 0;
      const std::string v(1000, 'v');
      for (int r = 0; r < kRounds && bad == 0; ++r) {
        (void)statx_of(f, STATX_BASIC_STATS, 0);
        if (::setxattr(f.c_str(), "user.k", v.data(), v.size(), 0) != 0) bad = 10;
        if (!bad && !cached_equals_fresh(f, STATX_BLOCKS).empty()) bad = 11;
        if (!bad && ::removexattr(f.c_str(), "user.k") != 0) bad = 12;
        if (!bad && !cached_equals_fresh(f, STATX_BLOCKS).empty()) bad = 13;
        if (!bad && root) {
          Fd fd = xopen(f, O_RDONLY);
          for (int flags : {FS_APPEND_FL, 0}) {
            cache_and_wait(f);
            if (::ioctl(fd.get(), FS_IOC_SETFLAGS, &flags) != 0) {
              if (errno != ENOTTY && errno != EOPNOTSUPP) bad = 14;
              break;
            }
            if (!cached_equals_fresh(f, STATX_BASIC_STATS).empty()) bad = 15;
          }
        }
      }
      _exit(bad);
    }
    pids.push_back(pid);
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "process " << i << ": status " << status;
  }
}

// A write drops security.capability and set-user-ID (file_remove_privs; for an O_DIRECT
// write on warpfs the daemon does it, the kernel does not): another process sees both gone
// at once, with the write's ctime.
TEST_F(CoherenceTest, WriteDroppingPrivilegesShowsAtOnce) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs CAP_SETFCAP and CAP_FSETID to set them";
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    const std::string f = path(direct ? "direct" : "buffered");
    write_file(f, std::string(4096, 'a'), 0755);
    ASSERT_EQ(::chmod(f.c_str(), 04755), 0);
    vfs_cap_data cap{};
    cap.magic_etc = VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE;
    cap.data[0].permitted = 1u << CAP_NET_RAW;
    if (::setxattr(f.c_str(), "security.capability", &cap, XATTR_CAPS_SZ_2, 0) != 0) {
      if (errno == EOPNOTSUPP) GTEST_SKIP() << "no security.capability here";
      FAIL() << "setxattr security.capability: " << std::strerror(errno);
    }
    cache_and_wait(f);
    {
      Fd fd = xopen(f, O_WRONLY | (direct ? O_DIRECT : 0));
      // The privileges are dropped for a writer without CAP_FSETID: drop it for the write.
      ASSERT_EQ(exit_status_without_fsetid([&] {
                  AlignedBuffer b = aligned_buffer(4096);
                  std::memset(b.get(), 'b', 4096);
                  return ::pwrite(fd.get(), b.get(), 4096, 0) == 4096 ? 0 : 5;
                }),
                0);
    }
    EXPECT_ERRNO(ENODATA, ::getxattr(f.c_str(), "security.capability", nullptr, 0));
    EXPECT_EQ(cached_equals_fresh(f, STATX_BASIC_STATS), "");
    EXPECT_EQ(xstat(f).st_mode & 07777, 0755u);
  }
}

}  // namespace
}  // namespace warpfs::posix_test
