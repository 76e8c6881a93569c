#include "posix_fixture.h"

#include <linux/capability.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

namespace warpfs::posix_test {
namespace {

std::string& root_storage() {
  static std::string root;
  return root;
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr,
               "\n*** posix_tests: %s\n"
               "*** Set WARPFS_TEST_DIR to an existing directory on the filesystem under test,\n"
               "*** e.g.  WARPFS_TEST_DIR=/mnt/warpfs/t ./posix_tests\n\n",
               msg.c_str());
  std::exit(2);
}

// Checks WARPFS_TEST_DIR before the first test; a suite that runs nowhere must not pass.
class TestDirEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("WARPFS_TEST_DIR");
    if (env == nullptr || *env == '\0') die("WARPFS_TEST_DIR is not set");
    char resolved[PATH_MAX];
    if (::realpath(env, resolved) == nullptr) {
      die(std::string("WARPFS_TEST_DIR=") + env + ": " + std::strerror(errno));
    }
    struct stat st;
    if (::stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode)) {
      die(std::string("WARPFS_TEST_DIR=") + env + " is not a directory");
    }
    root_storage() = resolved;
    // Modes in the tests are written as the files should end up; the umask must not differ
    // from one environment to another.
    ::umask(022);
    // Deep trees and many threads hold many descriptors.
    struct rlimit rl;
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &rl);
    }
    std::fprintf(stderr, "posix_tests: testing in %s%s\n", resolved,
                 is_warpfs() ? " (WARPFS_TEST_FS=warpfs: warpfs-only expectations on)" : "");
  }
};

[[maybe_unused]] ::testing::Environment* const kTestDirEnvironment =
    ::testing::AddGlobalTestEnvironment(new TestDirEnvironment);

std::string describe(int err) {
  return errno_name(err) + " (" + std::strerror(err) + ")";
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Removes every entry of the directory open as `fd` (closing it), then nothing else.
std::string empty_dir(int fd, const std::string& where) {
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    std::string err = where + ": fdopendir: " + std::strerror(errno);
    ::close(fd);
    return err;
  }
  std::vector<std::pair<std::string, unsigned char>> names;
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name, e->d_type);
  }
  if (errno != 0) {
    std::string err = where + ": readdir: " + std::strerror(errno);
    ::closedir(d);
    return err;
  }
  const int dirfd = ::dirfd(d);
  std::string first_error;
  for (const auto& [name, type] : names) {
    bool is_dir = type == DT_DIR;
    if (type == DT_UNKNOWN) {
      struct stat st;
      is_dir = ::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    const std::string child = where + "/" + name;
    if (is_dir) {
      const int cfd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      std::string err = cfd < 0 ? child + ": open: " + std::strerror(errno) : empty_dir(cfd, child);
      if (err.empty() && ::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0) {
        err = child + ": rmdir: " + std::strerror(errno);
      }
      if (first_error.empty()) first_error = err;
    } else if (::unlinkat(dirfd, name.c_str(), 0) != 0 && first_error.empty()) {
      first_error = child + ": unlink: " + std::strerror(errno);
    }
  }
  ::closedir(d);
  return first_error;
}

}  // namespace

const std::string& test_root() {
  return root_storage();
}

bool is_warpfs() {
  const char* fs = std::getenv("WARPFS_TEST_FS");
  return fs != nullptr && std::string_view(fs) == "warpfs";
}

std::string errno_name(int err) {
  const char* name = ::strerrorname_np(err);
  return name != nullptr ? name : "errno " + std::to_string(err);
}

::testing::AssertionResult FailsWith(const char* expr, int expected, SysResult r) {
  if (r.rc == -1 && r.err == expected) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << expr << "\n  expected: -1 with " << describe(expected) << "\n  actual:   ";
  if (r.rc == -1) {
    failure << "-1 with " << describe(r.err);
  } else {
    failure << r.rc << " (success)";
  }
  return failure;
}

::testing::AssertionResult Succeeds(const char* expr, SysResult r) {
  if (r.rc != -1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " failed with " << describe(r.err);
}

long check(long rc, const std::string& what) {
  if (rc == -1) throw std::system_error(errno, std::generic_category(), what);
  return rc;
}

Fd xopen(const std::string& path, int flags, mode_t mode) {
  return Fd(static_cast<int>(check(::open(path.c_str(), flags, mode), "open " + path)));
}

Fd xopenat(int dirfd, const std::string& name, int flags, mode_t mode) {
  return Fd(static_cast<int>(check(::openat(dirfd, name.c_str(), flags, mode), "openat " + name)));
}

void xmkdir(const std::string& path, mode_t mode) {
  check(::mkdir(path.c_str(), mode), "mkdir " + path);
}

void xsymlink(const std::string& target, const std::string& path) {
  check(::symlink(target.c_str(), path.c_str()), "symlink " + path);
}

void xlink(const std::string& from, const std::string& to) {
  check(::link(from.c_str(), to.c_str()), "link " + from + " " + to);
}

void xunlink(const std::string& path) {
  check(::unlink(path.c_str()), "unlink " + path);
}

struct stat xstat(const std::string& path) {
  struct stat st;
  check(::stat(path.c_str(), &st), "stat " + path);
  return st;
}

struct stat xlstat(const std::string& path) {
  struct stat st;
  check(::lstat(path.c_str(), &st), "lstat " + path);
  return st;
}

struct stat xfstat(int fd) {
  struct stat st;
  check(::fstat(fd, &st), "fstat fd " + std::to_string(fd));
  return st;
}

void write_file(const std::string& path, std::string_view data, mode_t mode) {
  Fd fd = xopen(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  pwrite_all(fd.get(), data, 0);
}

std::string read_file(const std::string& path) {
  Fd fd = xopen(path, O_RDONLY);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = check(::read(fd.get(), buf, sizeof buf), "read " + path);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

void pwrite_all(int fd, std::string_view data, off_t off) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        check(::pwrite(fd, data.data() + done, data.size() - done, off + static_cast<off_t>(done)),
              "pwrite at " + std::to_string(off + static_cast<off_t>(done)));
    if (n == 0) throw std::runtime_error("pwrite wrote nothing");
    done += static_cast<size_t>(n);
  }
}

std::string pread_upto(int fd, size_t n, off_t off) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t r =
        check(::pread(fd, out.data() + done, n - done, off + static_cast<off_t>(done)),
              "pread at " + std::to_string(off + static_cast<off_t>(done)));
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  out.resize(done);
  return out;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::vector<std::string> list_dir(const std::string& path) {
  Dir d(::opendir(path.c_str()));
  if (d.get() == nullptr) check(-1, "opendir " + path);
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = ::readdir(d.get())) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
    errno = 0;
  }
  if (errno != 0) check(-1, "readdir " + path);
  std::sort(names.begin(), names.end());
  return names;
}

std::set<std::string> list_dir_set(const std::string& path) {
  const auto names = list_dir(path);
  return {names.begin(), names.end()};
}

AlignedBuffer aligned_buffer(size_t n) {
  void* p = nullptr;
  if (int rc = ::posix_memalign(&p, 4096, n); rc != 0) {
    throw std::system_error(rc, std::generic_category(), "posix_memalign");
  }
  return AlignedBuffer(static_cast<char*>(p));
}

std::string pattern(uint64_t seed, size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = splitmix64(seed * 0x100000001b3ull + i / 8);
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

std::string first_difference(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "first difference at byte %zu: 0x%02x vs 0x%02x", i,
                    static_cast<unsigned char>(a[i]), static_cast<unsigned char>(b[i]));
      return buf;
    }
  }
  if (a.size() != b.size()) {
    return "sizes differ: " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  }
  return "identical";
}

std::string remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? "" : path + ": lstat: " + std::strerror(errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return ::unlink(path.c_str()) == 0 ? "" : path + ": unlink: " + std::strerror(errno);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  if (fd < 0) return path + ": open: " + std::strerror(errno);
  std::string err = empty_dir(fd, path);
  if (err.empty() && ::rmdir(path.c_str()) != 0) err = path + ": rmdir: " + std::strerror(errno);
  return err;
}

int64_t ns_of(const timespec& t) {
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

int64_t coarse_now_ns() {
  timespec t;
  ::clock_gettime(CLOCK_REALTIME_COARSE, &t);
  return ns_of(t);
}

int64_t fine_now_ns() {
  timespec t;
  ::clock_gettime(CLOCK_REALTIME, &t);
  return ns_of(t);
}

void wait_clock_past(int64_t t_ns) {
  const int64_t give_up = fine_now_ns() + 5'000'000'000;
  while (coarse_now_ns() <= t_ns) {
    if (fine_now_ns() > give_up) {
      throw std::runtime_error(
          "the coarse clock did not pass a file timestamp within 5 s: "
          "the filesystem stamps times in the future");
    }
    ::sched_yield();
  }
}

int exit_status_without_fsetid(const std::function<int()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2] = {};
    if (::syscall(SYS_capget, &h, d) != 0) _exit(3);
    d[CAP_FSETID / 32].effective &= ~(1u << (CAP_FSETID % 32));
    if (::syscall(SYS_capset, &h, d) != 0) _exit(4);
    _exit(fn());
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

void PosixTest::SetUp() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  std::replace(name.begin(), name.end(), '/', '_');
  dir_ = test_root() + "/" + name;
  const std::string leftover = remove_tree(dir_);
  ASSERT_EQ(leftover, "") << "cannot remove a leftover test directory";
  ASSERT_OK(::mkdir(dir_.c_str(), 0755));
  dfd_.reset(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY));
  ASSERT_TRUE(dfd_.ok()) << dir_ << ": " << std::strerror(errno);
}

void PosixTest::TearDown() {
  dfd_.reset();
  if (dir_.empty()) return;
  EXPECT_EQ(remove_tree(dir_), "") << "removing the test directory failed";
  EXPECT_FALSE(exists(dir_)) << dir_ << " still exists after it was removed";
}

std::string PosixTest::path(std::string_view rel) const {
  return dir_ + "/" + std::string(rel);
}

}  // namespace warpfs::posix_test
