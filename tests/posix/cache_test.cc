// What a program sees must not depend on where the kernel keeps a file's data for a while: a
// FUSE mount with the writeback cache (warpfs -o writeback_cache) holds buffered writes and
// stores into shared mappings in the page cache and sends them to the filesystem later, in
// any order, and owns the times and size meanwhile. Each case checks what a local filesystem
// promises: right away, and again after the kernel has dropped the inode and asks the
// filesystem afresh (drop_caches, as root; without it those checks are skipped), which shows
// what the filesystem itself holds.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

// "" if a == b, else where they differ first.
std::string differs(const std::string& a, const std::string& b) {
  return a == b ? "" : first_difference(a, b);
}

class PageCacheTest : public PosixTest {
 protected:
  // Drops clean pages and unused inodes and dentries of every filesystem, so that the next
  // stat or read of a file nobody holds open asks the filesystem. False where not allowed.
  static bool drop_caches() {
    Fd fd(::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC));
    return fd.ok() && ::write(fd.get(), "3", 1) == 1;
  }
  // Sets the times of `p` in the past, so that any later change gives a different time.
  static void times_in_past(const std::string& p) {
    const timespec t[2] = {{1000000000, 1}, {1000000000, 2}};
    check(::utimensat(AT_FDCWD, p.c_str(), t, 0), "utimensat " + p);
  }
};

// The times a buffered write gave (write(2)'s, not the write-back's) are what the filesystem
// keeps: the kernel's cached ones, and after eviction the stored ones, are the same.
TEST_F(PageCacheTest, BufferedWriteKeepsTheTimesOfTheCall) {
  const std::string f = path("f");
  write_file(f, pattern(1, 8192));
  times_in_past(f);
  Fd fd = xopen(f, O_WRONLY);
  pwrite_all(fd.get(), "changed", 100);
  pwrite_all(fd.get(), "grown", 9000);
  const struct stat seen = xfstat(fd.get());
  EXPECT_GT(ns_of(seen.st_mtim), int64_t{1000000000} * 1000000000);
  EXPECT_EQ(seen.st_size, 9005);
  // The write-back (fsync) happens on a later clock tick than the write.
  wait_clock_past(std::max(ns_of(seen.st_mtim), ns_of(seen.st_ctim)));
  ASSERT_OK(::fsync(fd.get()));
  fd.reset();
  if (!drop_caches()) GTEST_SKIP() << "cannot drop the inode cache (not root)";
  const struct stat after = xstat(f);
  EXPECT_EQ(ns_of(after.st_mtim), ns_of(seen.st_mtim));
  EXPECT_EQ(ns_of(after.st_ctim), ns_of(seen.st_ctim));
  EXPECT_EQ(after.st_size, 9005);
  std::string want = pattern(1, 8192);
  want.replace(100, 7, "changed");
  want.resize(9000, '\0');
  want += "grown";
  EXPECT_EQ(differs(read_file(f), want), "");
}

// Stores into a shared mapping reach the file by msync, and mark mtime and ctime for update
// (POSIX msync): stat shows a new mtime after msync, and the filesystem keeps that one.
TEST_F(PageCacheTest, MappedStoresReachTheFileWithTheirTimes) {
  const std::string f = path("f");
  write_file(f, std::string(8192, 'a'));
  times_in_past(f);
  Fd fd = xopen(f, O_RDWR);
  void* p = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
  std::memcpy(static_cast<char*>(p) + 5000, "mapped", 6);
  ASSERT_OK(::msync(p, 8192, MS_SYNC));
  const struct stat seen = xfstat(fd.get());
  EXPECT_GT(ns_of(seen.st_mtim), int64_t{1000000000} * 1000000000);
  ASSERT_OK(::munmap(p, 8192));
  wait_clock_past(std::max(ns_of(seen.st_mtim), ns_of(seen.st_ctim)));
  ASSERT_OK(::fsync(fd.get()));
  fd.reset();
  std::string want(8192, 'a');
  want.replace(5000, 6, "mapped");
  EXPECT_EQ(differs(read_file(f), want), "");
  if (!drop_caches()) GTEST_SKIP() << "cannot drop the inode cache (not root)";
  EXPECT_EQ(differs(read_file(f), want), "");
  EXPECT_EQ(ns_of(xstat(f).st_mtim), ns_of(seen.st_mtim));
}

// A write by a process without CAP_FSETID drops set-user-ID at the call; a chmod after it
// sets the bit again, and the write reaching the filesystem later must not drop it.
TEST_F(PageCacheTest, ChmodAfterAWriteKeepsSetUserId) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs CAP_FSETID to drop";
  const std::string f = path("f");
  write_file(f, std::string(8192, 'a'), 0755);
  ASSERT_OK(::chmod(f.c_str(), 04755));
  Fd fd = xopen(f, O_WRONLY);
  ASSERT_EQ(exit_status_without_fsetid([&] { return ::pwrite(fd.get(), "b", 1, 10) == 1 ? 0 : 5; }),
            0);
  EXPECT_EQ(xstat(f).st_mode & 07777, 0755u);
  ASSERT_OK(::chmod(f.c_str(), 04755));
  ASSERT_OK(::fsync(fd.get()));
  fd.reset();
  EXPECT_EQ(xstat(f).st_mode & 07777, 04755u);
  if (!drop_caches()) GTEST_SKIP() << "cannot drop the inode cache (not root)";
  EXPECT_EQ(xstat(f).st_mode & 07777, 04755u);
  EXPECT_EQ(read_file(f).substr(8, 4), "aaba");
}

// O_APPEND from several processes at once: every record lands whole, at its own place, none
// lost, each process's in its order.
TEST_F(PageCacheTest, AppendersInSeveralProcesses) {
  constexpr int kProcs = 4, kRecords = 300;
  constexpr size_t kLen = 100;  // not a divisor of the page size: records straddle pages
  const std::string f = path("log");
  write_file(f, "");
  auto record = [](int p, int i) {
    std::string r = std::to_string(p) + ":" + std::to_string(i) + ":";
    r += pattern(static_cast<uint64_t>(p * 100000 + i), kLen - r.size() - 1);
    return r + "\n";
  };
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(f.c_str(), O_WRONLY | O_APPEND);
      if (fd < 0) _exit(2);
      for (int i = 0; i < kRecords; ++i) {
        const std::string r = record(p, i);
        if (::write(fd, r.data(), r.size()) != static_cast<ssize_t>(r.size())) _exit(3);
        if (i % 50 == 0 && ::fdatasync(fd) != 0) _exit(4);  // write-backs between appends
      }
      _exit(::close(fd) == 0 ? 0 : 5);
    }
    pids.push_back(pid);
  }
  for (const pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  auto check_log = [&](const std::string& got) {
    ASSERT_EQ(got.size(), kProcs * kRecords * kLen);
    std::map<int, int> next;  // process -> its next record
    for (size_t off = 0; off < got.size(); off += kLen) {
      const std::string r = got.substr(off, kLen);
      const int p = std::atoi(r.c_str());
      ASSERT_TRUE(p >= 0 && p < kProcs) << "at " << off;
      ASSERT_EQ(r, record(p, next[p])) << "at " << off;
      ++next[p];
    }
  };
  check_log(read_file(f));
  if (!drop_caches()) GTEST_SKIP() << "cannot drop the page cache (not root)";
  check_log(read_file(f));
}

// A write-only open that writes part of a page: the kernel may read the rest of the page
// first, on that open, and the bytes around the write must stay as they were.
TEST_F(PageCacheTest, WriteOnlyOpenKeepsTheRestOfThePage) {
  const std::string f = path("f");
  const std::string old = pattern(2, 3 * 4096 + 123);
  write_file(f, old);
  drop_caches();  // the pages are not cached: a partial write must read them (if it can)
  Fd fd = xopen(f, O_WRONLY);
  pwrite_all(fd.get(), "hello", 5000);
  pwrite_all(fd.get(), "tail", old.size() + 10);  // the old last page, and past the end
  ASSERT_OK(::close(fd.release()));
  std::string want = old;
  want.replace(5000, 5, "hello");
  want.resize(old.size() + 10, '\0');
  want += "tail";
  EXPECT_EQ(differs(read_file(f), want), "");
  if (!drop_caches()) GTEST_SKIP() << "cannot drop the page cache (not root)";
  EXPECT_EQ(differs(read_file(f), want), "");
}

// A truncate below pages that are dirty, then growing again: the cut bytes read as zeroes,
// before and after the write-back.
TEST_F(PageCacheTest, TruncateBesideDirtyPages) {
  const std::string f = path("f");
  Fd fd = xopen(f, O_RDWR | O_CREAT | O_TRUNC);
  const std::string data = pattern(3, 3 * 4096);
  pwrite_all(fd.get(), data, 0);
  ASSERT_OK(::ftruncate(fd.get(), 4096 + 2048));
  ASSERT_OK(::ftruncate(fd.get(), 3 * 4096));
  pwrite_all(fd.get(), "z", 3 * 4096 - 1);
  std::string want = data.substr(0, 4096 + 2048);
  want.resize(3 * 4096 - 1, '\0');
  want += "z";
  EXPECT_EQ(differs(pread_upto(fd.get(), 4 * 4096, 0), want), "");
  ASSERT_OK(::fsync(fd.get()));
  fd.reset();
  if (!drop_caches()) GTEST_SKIP() << "cannot drop the page cache (not root)";
  EXPECT_EQ(differs(read_file(f), want), "");
}

// O_DIRECT and buffered I/O on one file, as on a local filesystem: a direct write replaces
// what a buffered write left in the cache (also once that is written back), and a direct
// read sees a buffered write that is not written back yet.
TEST_F(PageCacheTest, DirectAndBufferedOnOneFile) {
  const std::string f = path("f");
  Fd buffered = xopen(f, O_RDWR | O_CREAT | O_TRUNC);
  Fd direct(::open(f.c_str(), O_RDWR | O_DIRECT));
  if (!direct.ok() && errno == EINVAL) GTEST_SKIP() << "no O_DIRECT here";
  ASSERT_TRUE(direct.ok()) << std::strerror(errno);
  AlignedBuffer b = aligned_buffer(4096);
  pwrite_all(buffered.get(), std::string(4096, 'A'), 0);
  std::memset(b.get(), 'B', 4096);
  ASSERT_EQ(::pwrite(direct.get(), b.get(), 4096, 0), 4096) << std::strerror(errno);
  EXPECT_EQ(pread_upto(buffered.get(), 4096, 0), std::string(4096, 'B'));
  pwrite_all(buffered.get(), std::string(4096, 'C'), 4096);
  ASSERT_EQ(::pread(direct.get(), b.get(), 4096, 4096), 4096) << std::strerror(errno);
  EXPECT_EQ(std::string(b.get(), 4096), std::string(4096, 'C'));
  ASSERT_OK(::fsync(buffered.get()));
  buffered.reset();
  direct.reset();
  const std::string want = std::string(4096, 'B') + std::string(4096, 'C');
  EXPECT_EQ(differs(read_file(f), want), "");
  if (!drop_caches()) GTEST_SKIP() << "cannot drop the page cache (not root)";
  EXPECT_EQ(differs(read_file(f), want), "");
}

// SEEK_DATA and SEEK_HOLE see data that is not written back yet: never a hole where it lies.
TEST_F(PageCacheTest, SeekDataFindsDataNotWrittenBack) {
  Fd fd = xopen(path("f"), O_RDWR | O_CREAT | O_TRUNC);
  ASSERT_OK(::ftruncate(fd.get(), 1 << 20));
  pwrite_all(fd.get(), pattern(6, 4096), 512 << 10);
  const off_t data = ::lseek(fd.get(), 0, SEEK_DATA);
  ASSERT_GE(data, 0) << std::strerror(errno);
  EXPECT_LE(data, 512 << 10);
  const off_t hole = ::lseek(fd.get(), 512 << 10, SEEK_HOLE);
  ASSERT_GE(hole, 0) << std::strerror(errno);
  EXPECT_GE(hole, (512 << 10) + 4096);
}

// statfs counts blocks that buffered writes take at once, before any write-back (as ext4's
// delayed allocation reserves them at write(2)), so df and a program that checks the space
// before writing more see it. Blocks of files unlinked earlier may be freed meanwhile (under
// FUSE when the kernel's FORGET arrives, which it sends when it likes): the drop may fall
// short of the data by a few such blocks, never by the most of it that uncounted writes lose.
TEST_F(PageCacheTest, StatfsCountsWritesNotWrittenBack) {
  constexpr size_t kBytes = 16u << 20;
  struct statvfs before {};
  ASSERT_OK(::statvfs(dir().c_str(), &before));
  Fd fd = xopen(path("f"), O_WRONLY | O_CREAT | O_TRUNC);
  pwrite_all(fd.get(), pattern(4, kBytes), 0);
  struct statvfs after {};
  ASSERT_OK(::statvfs(dir().c_str(), &after));
  const uint64_t data_blocks = kBytes / after.f_frsize;
  EXPECT_GE(before.f_bfree - after.f_bfree, data_blocks - data_blocks / 16)
      << "free blocks " << before.f_bfree << " before the writes, " << after.f_bfree << " after";
}

}  // namespace
}  // namespace warpfs::posix_test
