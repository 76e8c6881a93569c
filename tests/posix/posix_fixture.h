// The POSIX suite's common ground: the directory under test (WARPFS_TEST_DIR, checked once
// before any test runs), a fresh subdirectory per test named after the test and removed at
// its end, and small helpers.
//
// Helpers named x...() are for setting a test up: they throw std::system_error naming the
// call and the path when the call fails, which GoogleTest reports as a test failure. What a
// test is about is checked with EXPECT_OK / EXPECT_ERRNO (or plain EXPECT_*), which capture
// errno right after the call.
//
// Not thread-safe unless a function says so: tests that start threads use only the syscalls
// themselves inside the threads and report back through their own data.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace warpfs::posix_test {

// The absolute, resolved directory named by WARPFS_TEST_DIR.
const std::string& test_root();

// True when WARPFS_TEST_FS=warpfs: enables the few expectations only warpfs is held to
// (statfs magic and block size, its xattr space limit, its 16 TiB file size limit).
bool is_warpfs();

// Owns a file descriptor; closes it when destroyed.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Owns a DIR*; closes it when destroyed.
class Dir {
 public:
  explicit Dir(DIR* d) : d_(d) {}
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;
  ~Dir() {
    if (d_ != nullptr) ::closedir(d_);
  }
  DIR* get() const { return d_; }

 private:
  DIR* d_;
};

// What a syscall returned and the errno it left.
struct SysResult {
  long rc;
  int err;
};

::testing::AssertionResult FailsWith(const char* expr, int expected, SysResult r);
::testing::AssertionResult Succeeds(const char* expr, SysResult r);

// The errno value's symbolic name ("ENOENT"), or its number.
std::string errno_name(int err);

// Runs expr (an integer-returning call) and captures errno immediately after it.
#define POSIX_CALL(expr)                                      \
  ([&]() {                                                    \
    errno = 0;                                                \
    const long posix_rc_ = static_cast<long>(expr);           \
    return ::warpfs::posix_test::SysResult{posix_rc_, errno}; \
  }())
// The call must fail (-1) with exactly errno `err`. Failures print only the call and both
// outcomes (GTEST_ASSERT_ is what EXPECT_PRED_FORMAT* expand to).
#define EXPECT_ERRNO(err, expr)                                                \
  GTEST_ASSERT_(::warpfs::posix_test::FailsWith(#expr, err, POSIX_CALL(expr)), \
                GTEST_NONFATAL_FAILURE_)
#define ASSERT_ERRNO(err, expr) \
  GTEST_ASSERT_(::warpfs::posix_test::FailsWith(#expr, err, POSIX_CALL(expr)), GTEST_FATAL_FAILURE_)
// The call must not return -1.
#define EXPECT_OK(expr) \
  GTEST_ASSERT_(::warpfs::posix_test::Succeeds(#expr, POSIX_CALL(expr)), GTEST_NONFATAL_FAILURE_)
#define ASSERT_OK(expr) \
  GTEST_ASSERT_(::warpfs::posix_test::Succeeds(#expr, POSIX_CALL(expr)), GTEST_FATAL_FAILURE_)

// Throws std::system_error(errno, what) when rc is -1; returns rc otherwise.
long check(long rc, const std::string& what);

Fd xopen(const std::string& path, int flags, mode_t mode = 0644);
Fd xopenat(int dirfd, const std::string& name, int flags, mode_t mode = 0644);
void xmkdir(const std::string& path, mode_t mode = 0755);
void xsymlink(const std::string& target, const std::string& path);
void xlink(const std::string& from, const std::string& to);
void xunlink(const std::string& path);
struct stat xstat(const std::string& path);
struct stat xlstat(const std::string& path);
struct stat xfstat(int fd);
// Creates or truncates `path` and writes `data` into it.
void write_file(const std::string& path, std::string_view data, mode_t mode = 0644);
// The whole content of `path`.
std::string read_file(const std::string& path);
// Writes all of `data` at `off` (retrying short writes).
void pwrite_all(int fd, std::string_view data, off_t off);
// Up to `n` bytes from `off` (fewer only at end of file).
std::string pread_upto(int fd, size_t n, off_t off);
// lstat succeeds.
bool exists(const std::string& path);
// The names in a directory, "." and ".." left out, sorted; throws on error.
std::vector<std::string> list_dir(const std::string& path);
std::set<std::string> list_dir_set(const std::string& path);

// `n` deterministic pseudo-random bytes: the same (seed, n) give the same bytes; the bytes
// at position i do not depend on n, so pattern(s, n) is a prefix of pattern(s, n + k).
std::string pattern(uint64_t seed, size_t n);

// `n` bytes aligned to 4 KiB, as O_DIRECT transfers need; throws when out of memory.
struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char[], FreeDeleter>;
AlignedBuffer aligned_buffer(size_t n);
// The first offset where a and b differ (or the shorter length), for failure messages.
std::string first_difference(std::string_view a, std::string_view b);

// Removes a tree through file descriptors (so depth and name lengths are not limited by
// PATH_MAX). Returns "" on success, or the first failure, naming the path.
std::string remove_tree(const std::string& path);

// Times.
int64_t ns_of(const timespec& t);
// CLOCK_REALTIME_COARSE: the clock the kernel stamps inodes with (current_time()); a fine
// clock read can be ahead of it by a tick, so lower bounds are taken from it.
int64_t coarse_now_ns();
int64_t fine_now_ns();
// Spins (yielding) until the coarse clock is past `t_ns`, so that a timestamp taken by the
// next operation is certainly greater than `t_ns`. This orders timestamps; it hides no race.
void wait_clock_past(int64_t t_ns);

// Runs `fn` in a child process whose effective capabilities lack CAP_FSETID (a writer whose
// writes drop set-user-ID, as root's do not) and returns its exit status: fn's result, 3 or 4
// if the capabilities could not be changed, -1 if it did not exit.
int exit_status_without_fsetid(const std::function<int()>& fn);

// Sets umask for the scope of the object.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t m) : old_(::umask(m)) {}
  ~ScopedUmask() { ::umask(old_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t old_;
};

// Every test runs in root/<Suite>.<Name>, created fresh (a leftover from an interrupted run
// is removed first) and removed at the end; failing to remove it fails the test, since a
// directory that cannot be emptied is a filesystem bug too.
class PosixTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // An absolute path inside this test's directory.
  std::string path(std::string_view rel) const;
  const std::string& dir() const { return dir_; }
  // An O_DIRECTORY descriptor of this test's directory, for the *at() calls.
  int dfd() const { return dfd_.get(); }

 private:
  std::string dir_;
  Fd dfd_;
};

}  // namespace warpfs::posix_test
