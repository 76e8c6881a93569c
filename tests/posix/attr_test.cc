// chmod/chown/truncate/utimensat, and which operations must update mtime and ctime.
//
// Timestamp rules are checked without sleeping: mtime and atime are first set far in the
// past, and the test spins until the clock is past the current ctime, so that an update by
// the operation under test is certainly visible as a larger value.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <string>
#include <vector>

#include "posix_fixture.h"

namespace warpfs::posix_test {
namespace {

using AttrTest = PosixTest;

constexpr int64_t kSecond = 1'000'000'000;
// 2001-09-09, with nanoseconds that survive only if the filesystem keeps them.
constexpr timespec kPastAtime{1'000'000'000, 123'456'789};
constexpr timespec kPastMtime{1'000'000'100, 987'654'321};

struct Times {
  int64_t a, m, c;
};

Times times_of(const std::string& p) {
  const struct stat st = xlstat(p);
  return {ns_of(st.st_atim), ns_of(st.st_mtim), ns_of(st.st_ctim)};
}

// Sets atime/mtime of each path to the past and waits until a new timestamp would be larger
// than every current ctime. Returns the times after that.
std::vector<Times> age(const std::vector<std::string>& paths) {
  const timespec ts[2] = {kPastAtime, kPastMtime};
  int64_t newest = 0;
  for (const auto& p : paths) {
    check(::utimensat(AT_FDCWD, p.c_str(), ts, AT_SYMLINK_NOFOLLOW), "utimensat " + p);
    newest = std::max(newest, times_of(p).c);
  }
  wait_clock_past(newest);
  std::vector<Times> out;
  for (const auto& p : paths) out.push_back(times_of(p));
  return out;
}

TEST_F(AttrTest, ChmodSetsEveryPermissionBit) {
  write_file(path("f"), "x");
  xmkdir(path("d"));
  for (mode_t m : {00000, 00400, 00644, 00755, 00777, 01777, 02755, 04755, 06711, 07777}) {
    ASSERT_OK(::chmod(path("f").c_str(), m));
    EXPECT_EQ(xstat(path("f")).st_mode & 07777, m) << std::oct << m;
    EXPECT_TRUE(S_ISREG(xstat(path("f")).st_mode));
    ASSERT_OK(::chmod(path("d").c_str(), m));
    EXPECT_EQ(xstat(path("d")).st_mode & 07777, m) << std::oct << m;
  }
  Fd fd = xopen(path("f"), O_RDONLY);
  ASSERT_OK(::fchmod(fd.get(), 0640));
  EXPECT_EQ(xstat(path("f")).st_mode & 07777, 0640u);
  EXPECT_ERRNO(ENOENT, ::chmod(path("missing").c_str(), 0644));
}

TEST_F(AttrTest, ChmodThroughASymlinkChangesTheTarget) {
  write_file(path("f"), "x", 0644);
  xsymlink("f", path("l"));
  const mode_t link_mode = xlstat(path("l")).st_mode;
  ASSERT_OK(::chmod(path("l").c_str(), 0600));
  EXPECT_EQ(xstat(path("f")).st_mode & 07777, 0600u);
  EXPECT_EQ(xlstat(path("l")).st_mode, link_mode);
}

TEST_F(AttrTest, ChownChangesOwnerAndGroup) {
  if (::geteuid() != 0) GTEST_SKIP() << "chown to other users needs root";
  write_file(path("f"), "x");
  ASSERT_OK(::chown(path("f").c_str(), 1000, 2000));
  struct stat st = xstat(path("f"));
  EXPECT_EQ(st.st_uid, 1000u);
  EXPECT_EQ(st.st_gid, 2000u);
  ASSERT_OK(::chown(path("f").c_str(), static_cast<uid_t>(-1), 3000));
  st = xstat(path("f"));
  EXPECT_EQ(st.st_uid, 1000u) << "-1 leaves the owner";
  EXPECT_EQ(st.st_gid, 3000u);
  ASSERT_OK(::chown(path("f").c_str(), 4000, static_cast<gid_t>(-1)));
  st = xstat(path("f"));
  EXPECT_EQ(st.st_uid, 4000u);
  EXPECT_EQ(st.st_gid, 3000u) << "-1 leaves the group";
  Fd fd = xopen(path("f"), O_RDONLY);
  ASSERT_OK(::fchown(fd.get(), 65534, 65534));
  EXPECT_EQ(xstat(path("f")).st_uid, 65534u);
  xmkdir(path("d"));
  ASSERT_OK(::chown(path("d").c_str(), 123, 456));
  EXPECT_EQ(xstat(path("d")).st_uid, 123u);
  EXPECT_EQ(xstat(path("d")).st_gid, 456u);
}

TEST_F(AttrTest, LchownChangesTheSymlinkNotItsTarget) {
  if (::geteuid() != 0) GTEST_SKIP() << "chown to other users needs root";
  write_file(path("f"), "x");
  xsymlink("f", path("l"));
  ASSERT_OK(::lchown(path("l").c_str(), 777, 888));
  EXPECT_EQ(xlstat(path("l")).st_uid, 777u);
  EXPECT_EQ(xlstat(path("l")).st_gid, 888u);
  EXPECT_EQ(xstat(path("f")).st_uid, 0u);
  ASSERT_OK(::chown(path("l").c_str(), 999, 999));
  EXPECT_EQ(xstat(path("f")).st_uid, 999u) << "chown follows the symlink";
  EXPECT_EQ(xlstat(path("l")).st_uid, 777u);
}

// A truncate by a caller without CAP_FSETID drops set-user-ID, and set-group-ID where the
// group may execute (do_truncate; on warpfs the daemon does it, told by the kernel); one
// with CAP_FSETID keeps both. The bits are gone for another look at once and after the
// inode is read back.
TEST_F(AttrTest, TruncateWithoutFsetidClearsSetuidAndSetgid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs CAP_FSETID to keep the bits and to drop it";
  struct Case {
    const char* name;
    mode_t before, after;
    bool ftruncate;
  };
  for (const Case& c :
       {Case{"suid", 04755, 0755, false}, Case{"sgid", 02755, 0755, true},
        Case{"both", 06755, 0755, false}, Case{"sgid-noexec", 02644, 02644, true}}) {
    SCOPED_TRACE(c.name);
    const std::string f = path(c.name);
    write_file(f, std::string(8192, 'a'), 0644);
    ASSERT_OK(::chmod(f.c_str(), c.before));
    ASSERT_OK(::truncate(f.c_str(), 4096));  // as root: kept
    EXPECT_EQ(xstat(f).st_mode & 07777, c.before);
    ASSERT_EQ(exit_status_without_fsetid([&] {
                if (!c.ftruncate) return ::truncate(f.c_str(), 100) == 0 ? 0 : 5;
                const int fd = ::open(f.c_str(), O_WRONLY);
                const int rc = fd >= 0 && ::ftruncate(fd, 100) == 0 ? 0 : 6;
                if (fd >= 0) ::close(fd);
                return rc;
              }),
              0);
    EXPECT_EQ(xstat(f).st_mode & 07777, c.after);
    EXPECT_EQ(xstat(f).st_size, 100);
  }
  // The inode read back: the kernel's copy of it dropped (as root).
  Fd dc(::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC));
  if (!dc.ok() || ::write(dc.get(), "3", 1) != 1) GTEST_SKIP() << "cannot drop the inode cache";
  EXPECT_EQ(xstat(path("suid")).st_mode & 07777, 0755u);
  EXPECT_EQ(xstat(path("sgid-noexec")).st_mode & 07777, 02644u);
}

TEST_F(AttrTest, ChownClearsSetuidAndSetgidOfExecutables) {
  if (::geteuid() != 0) GTEST_SKIP() << "chown to other users needs root";
  write_file(path("suid"), "x");
  ASSERT_OK(::chmod(path("suid").c_str(), 04755));
  ASSERT_OK(::chown(path("suid").c_str(), 1000, 1000));
  EXPECT_EQ(xstat(path("suid")).st_mode & 07777, 0755u);
  write_file(path("sgid"), "x");
  ASSERT_OK(::chmod(path("sgid").c_str(), 02755));
  ASSERT_OK(::chown(path("sgid").c_str(), 1000, 1000));
  EXPECT_EQ(xstat(path("sgid")).st_mode & 07777, 0755u);
  // A directory keeps its setgid bit (it means inheritance there, not privilege).
  xmkdir(path("d"));
  ASSERT_OK(::chmod(path("d").c_str(), 02775));
  ASSERT_OK(::chown(path("d").c_str(), 1000, 1000));
  EXPECT_EQ(xstat(path("d")).st_mode & 07777, 02775u);
}

TEST_F(AttrTest, TruncateGrowsWithZeroes) {
  write_file(path("f"), "abc");
  ASSERT_OK(::truncate(path("f").c_str(), 10000));
  EXPECT_EQ(xstat(path("f")).st_size, 10000);
  const std::string data = read_file(path("f"));
  EXPECT_EQ(data, "abc" + std::string(9997, '\0')) << first_difference(data, "abc");
  ASSERT_OK(::truncate(path("f").c_str(), 3 * 4096 + 5000));
  EXPECT_EQ(read_file(path("f")), "abc" + std::string(3 * 4096 + 4997, '\0'));
}

// Data cut off by a shrink must never come back when the file grows again, whether the
// cut is mid-block or on a boundary, by truncate or by a write past the end.
TEST_F(AttrTest, ShrinkThenGrowDoesNotResurrectOldData) {
  const std::string full = pattern(11, 5 * 4096 + 123);
  for (off_t cut : {0, 1, 4095, 4096, 5000, 8192, 12000}) {
    write_file(path("f"), full);
    Fd fd = xopen(path("f"), O_RDWR);
    ASSERT_OK(::ftruncate(fd.get(), cut));
    EXPECT_EQ(xfstat(fd.get()).st_size, cut);
    ASSERT_OK(::ftruncate(fd.get(), static_cast<off_t>(full.size())));
    std::string want = full.substr(0, static_cast<size_t>(cut));
    want.resize(full.size(), '\0');
    std::string got = pread_upto(fd.get(), full.size(), 0);
    EXPECT_EQ(got, want) << "cut at " << cut << ": " << first_difference(got, want);
    // Again, but growing by a write beyond the end.
    ASSERT_OK(::ftruncate(fd.get(), cut));
    pwrite_all(fd.get(), "END", static_cast<off_t>(full.size()));
    want += "END";
    got = pread_upto(fd.get(), want.size() + 10, 0);
    EXPECT_EQ(got, want) << "cut at " << cut << " then write: " << first_difference(got, want);
  }
}

TEST_F(AttrTest, TruncateErrors) {
  write_file(path("f"), "data");
  xmkdir(path("d"));
  EXPECT_ERRNO(EISDIR, ::truncate(path("d").c_str(), 0));
  EXPECT_ERRNO(EINVAL, ::truncate(path("f").c_str(), -1));
  EXPECT_ERRNO(ENOENT, ::truncate(path("missing").c_str(), 0));
  Fd ro = xopen(path("f"), O_RDONLY);
  EXPECT_ERRNO(EINVAL, ::ftruncate(ro.get(), 0));
  Fd d = xopen(path("d"), O_RDONLY | O_DIRECTORY);
  EXPECT_ERRNO(EINVAL, ::ftruncate(d.get(), 0));
  EXPECT_EQ(read_file(path("f")), "data");
}

TEST_F(AttrTest, UtimensatStoresExplicitTimesToTheNanosecond) {
  write_file(path("f"), "x");
  xmkdir(path("d"));
  write_file(path("target"), "t");
  xsymlink("target", path("l"));
  const timespec ts[2] = {{1'000'000'000, 123'456'789}, {1'234'567'890, 987'654'321}};
  for (const char* name : {"f", "d"}) {
    ASSERT_OK(::utimensat(dfd(), name, ts, 0));
    const struct stat st = xlstat(path(name));
    EXPECT_EQ(ns_of(st.st_atim), ns_of(ts[0])) << name;
    EXPECT_EQ(ns_of(st.st_mtim), ns_of(ts[1])) << name;
  }
  const int64_t target_mtime = times_of(path("target")).m;
  ASSERT_OK(::utimensat(dfd(), "l", ts, AT_SYMLINK_NOFOLLOW));
  EXPECT_EQ(times_of(path("l")).m, ns_of(ts[1]));
  EXPECT_EQ(times_of(path("l")).a, ns_of(ts[0]));
  EXPECT_EQ(times_of(path("target")).m, target_mtime) << "the target must not change";
  // Past 2038 (the 32-bit limit) and the last nanosecond of a second.
  const timespec late[2] = {{4'102'444'800, 999'999'999}, {2'147'483'648, 1}};
  Fd fd = xopen(path("f"), O_RDONLY);
  ASSERT_OK(::futimens(fd.get(), late));
  EXPECT_EQ(times_of(path("f")).a, ns_of(late[0]));
  EXPECT_EQ(times_of(path("f")).m, ns_of(late[1]));
  const timespec bad[2] = {{0, 1'000'000'000}, {0, 0}};
  EXPECT_ERRNO(EINVAL, ::utimensat(dfd(), "f", bad, 0));
}

// Dates before 1970 (tar archives and restored backups carry them): negative seconds with
// their nanoseconds, exactly, for files, directories and symlinks; stat of a fresh lookup too.
TEST_F(AttrTest, TimesBefore1970AreStoredExactly) {
  write_file(path("f"), "x");
  xmkdir(path("d"));
  xsymlink("f", path("l"));
  const timespec cases[][2] = {
      {{-1, 0}, {-1, 999'999'999}},                            // the second before the epoch
      {{-315'619'200, 0}, {-315'619'200, 500'000'000}},        // 1960-01-01
      {{-2'147'483'648, 0}, {-2'147'483'648, 1}},              // 1901-12-13, the 32-bit limit
      {{-5'000'000'000, 123}, {-9'000'000'000, 999'999'999}},  // 1811, 1684
  };
  for (const auto& ts : cases) {
    for (const char* name : {"f", "d", "l"}) {
      ASSERT_OK(::utimensat(dfd(), name, ts, AT_SYMLINK_NOFOLLOW));
      const struct stat st = xlstat(path(name));
      EXPECT_EQ(st.st_atim.tv_sec, ts[0].tv_sec) << name;
      EXPECT_EQ(st.st_atim.tv_nsec, ts[0].tv_nsec) << name;
      EXPECT_EQ(st.st_mtim.tv_sec, ts[1].tv_sec) << name;
      EXPECT_EQ(st.st_mtim.tv_nsec, ts[1].tv_nsec) << name;
    }
  }
}

// Any int64 seconds utimensat passes (FORMAT.md "Inode": beyond 1677..2262 the exact time
// is in the inode's internal record), for files, directories and symlinks; UTIME_OMIT keeps
// such a time. warpfs-only: other filesystems clamp to their own ranges.
TEST_F(AttrTest, TimesOverTheWholeRangeAreExactOnWarpfs) {
  if (!is_warpfs()) GTEST_SKIP() << "warpfs' own range";
  write_file(path("f"), "x");
  xmkdir(path("d"));
  xsymlink("f", path("l"));
  const timespec cases[][2] = {
      {{INT64_MAX, 999'999'999}, {INT64_MIN, 0}},
      {{10'413'792'000, 5}, {-11'676'096'000, 999'999'999}},          // 2300, 1600
      {{2'147'483'648, 0}, {-2'147'483'648, 0}},                      // 2038-01-19T03:14:08, 1901
      {{9'223'372'036, 854'775'807}, {-9'223'372'037, 145'224'192}},  // the old limits
      {{INT64_MAX / 2, 5}, {-(INT64_MAX / 2), 5}},
  };
  for (const auto& ts : cases) {
    for (const char* name : {"f", "d", "l"}) {
      ASSERT_OK(::utimensat(dfd(), name, ts, AT_SYMLINK_NOFOLLOW));
      const struct stat st = xlstat(path(name));
      // At the ends of the kernel's own range (s_time_min/max, INT64_MIN/MAX seconds) its
      // timestamp_truncate() zeroes the nanoseconds before they reach the filesystem (for
      // some inodes: not for a file it has cached writes for); elsewhere they are exact.
      auto nsec_ok = [](const timespec& got, const timespec& want) {
        const bool at_end = want.tv_sec == INT64_MAX || want.tv_sec == INT64_MIN;
        return got.tv_nsec == want.tv_nsec || (at_end && got.tv_nsec == 0);
      };
      EXPECT_EQ(st.st_atim.tv_sec, ts[0].tv_sec) << name;
      EXPECT_TRUE(nsec_ok(st.st_atim, ts[0])) << name << " " << st.st_atim.tv_nsec;
      EXPECT_EQ(st.st_mtim.tv_sec, ts[1].tv_sec) << name;
      EXPECT_TRUE(nsec_ok(st.st_mtim, ts[1])) << name << " " << st.st_mtim.tv_nsec;
    }
  }
  const timespec omit_mtime[2] = {{1'000'000'000, 0}, {0, UTIME_OMIT}};
  ASSERT_OK(::utimensat(dfd(), "f", omit_mtime, 0));
  const struct stat st = xstat(path("f"));
  EXPECT_EQ(st.st_atim.tv_sec, 1'000'000'000);
  EXPECT_EQ(st.st_mtim.tv_sec, -(INT64_MAX / 2)) << "UTIME_OMIT keeps it";
  EXPECT_EQ(st.st_mtim.tv_nsec, 5);
}

TEST_F(AttrTest, UtimeOmitKeepsAndUtimeNowTakesTheCurrentTime) {
  write_file(path("f"), "x");
  const Times t0 = age({path("f")})[0];
  const timespec only_mtime[2] = {{0, UTIME_OMIT}, {5, 5}};
  ASSERT_OK(::utimensat(dfd(), "f", only_mtime, 0));
  Times t = times_of(path("f"));
  EXPECT_EQ(t.a, t0.a) << "UTIME_OMIT must leave atime";
  EXPECT_EQ(t.m, 5 * kSecond + 5);
  EXPECT_GT(t.c, t0.c) << "changing times changes ctime";

  const int64_t before = coarse_now_ns();
  const timespec atime_now[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
  ASSERT_OK(::utimensat(dfd(), "f", atime_now, 0));
  const int64_t after = fine_now_ns();
  t = times_of(path("f"));
  EXPECT_GE(t.a, before);
  EXPECT_LE(t.a, after);
  EXPECT_EQ(t.m, 5 * kSecond + 5) << "UTIME_OMIT must leave mtime";

  age({path("f")});
  const int64_t before2 = coarse_now_ns();
  ASSERT_OK(::utimensat(dfd(), "f", nullptr, 0));
  const int64_t after2 = fine_now_ns();
  t = times_of(path("f"));
  for (int64_t v : {t.a, t.m}) {
    EXPECT_GE(v, before2);
    EXPECT_LE(v, after2);
  }
}

TEST_F(AttrTest, WriteUpdatesMtimeAndCtimeButReadDoesNot) {
  write_file(path("f"), "0123456789");
  Times t0 = age({path("f")})[0];
  {
    Fd fd = xopen(path("f"), O_RDONLY);
    char buf[10];
    ASSERT_EQ(::read(fd.get(), buf, sizeof buf), 10);
  }
  Times t = times_of(path("f"));
  EXPECT_EQ(t.m, t0.m) << "a read must not change mtime";
  EXPECT_EQ(t.c, t0.c) << "a read must not change ctime";
  t0 = t;  // the read may have updated atime (relatime)
  const int64_t before = coarse_now_ns();
  {
    Fd fd = xopen(path("f"), O_WRONLY);
    pwrite_all(fd.get(), "x", 5);
  }
  t = times_of(path("f"));
  EXPECT_GE(t.m, before);
  EXPECT_GT(t.c, t0.c);
  EXPECT_EQ(t.a, t0.a) << "a write must not change atime";
}

TEST_F(AttrTest, TruncateUpdatesMtimeAndCtime) {
  write_file(path("f"), pattern(1, 10000));
  for (off_t size : {5000, 20000, 0}) {
    const Times t0 = age({path("f")})[0];
    ASSERT_OK(::truncate(path("f").c_str(), size));
    const Times t = times_of(path("f"));
    EXPECT_GT(t.m, t0.m) << "truncate to " << size;
    EXPECT_GT(t.c, t0.c) << "truncate to " << size;
  }
  write_file(path("g"), "not empty");
  const Times t0 = age({path("g")})[0];
  Fd fd = xopen(path("g"), O_WRONLY | O_TRUNC);
  const Times t = times_of(path("g"));
  EXPECT_GT(t.m, t0.m) << "open with O_TRUNC";
  EXPECT_GT(t.c, t0.c) << "open with O_TRUNC";
}

TEST_F(AttrTest, RenameUpdatesBothParentsAndTheFilesCtimeNotItsMtime) {
  xmkdir(path("from"));
  xmkdir(path("to"));
  write_file(path("from/f"), "x");
  const auto t0 = age({path("from"), path("to"), path("from/f")});
  ASSERT_OK(::rename(path("from/f").c_str(), path("to/f").c_str()));
  const Times from = times_of(path("from"));
  const Times to = times_of(path("to"));
  const Times f = times_of(path("to/f"));
  EXPECT_GT(from.m, t0[0].m);
  EXPECT_GT(from.c, t0[0].c);
  EXPECT_GT(to.m, t0[1].m);
  EXPECT_GT(to.c, t0[1].c);
  EXPECT_EQ(f.m, t0[2].m) << "rename must not change the file's mtime";
  EXPECT_GT(f.c, t0[2].c) << "Linux filesystems update the renamed inode's ctime";
}

TEST_F(AttrTest, LinkAndUnlinkUpdateTheInodesCtimeAndTheDirectorysTimes) {
  xmkdir(path("d"));
  write_file(path("f"), "x");
  auto t0 = age({path("d"), path("f")});
  ASSERT_OK(::link(path("f").c_str(), path("d/g").c_str()));
  Times d = times_of(path("d"));
  Times f = times_of(path("f"));
  EXPECT_GT(d.m, t0[0].m);
  EXPECT_GT(d.c, t0[0].c);
  EXPECT_GT(f.c, t0[1].c) << "link changes the inode's ctime (its link count)";
  EXPECT_EQ(f.m, t0[1].m) << "but not its mtime";

  t0 = age({path("d"), path("f")});
  ASSERT_OK(::unlink(path("d/g").c_str()));
  d = times_of(path("d"));
  f = times_of(path("f"));
  EXPECT_GT(d.m, t0[0].m);
  EXPECT_GT(d.c, t0[0].c);
  EXPECT_GT(f.c, t0[1].c) << "unlink changes the remaining link's ctime";
  EXPECT_EQ(f.m, t0[1].m);
}

TEST_F(AttrTest, CreatingAndRemovingEntriesUpdatesTheDirectorysTimes) {
  xmkdir(path("d"));
  struct Op {
    const char* what;
    std::function<void()> run;
  };
  const std::vector<Op> ops = {
      {"create", [&] { write_file(path("d/f"), ""); }},
      {"mkdir", [&] { xmkdir(path("d/sub")); }},
      {"symlink", [&] { xsymlink("f", path("d/l")); }},
      {"mkfifo", [&] { check(::mkfifo(path("d/p").c_str(), 0644), "mkfifo"); }},
      {"rename within",
       [&] { check(::rename(path("d/f").c_str(), path("d/g").c_str()), "rename"); }},
      {"unlink", [&] { xunlink(path("d/g")); }},
      {"rmdir", [&] { check(::rmdir(path("d/sub").c_str()), "rmdir"); }},
  };
  for (const Op& op : ops) {
    const Times t0 = age({path("d")})[0];
    op.run();
    const Times t = times_of(path("d"));
    EXPECT_GT(t.m, t0.m) << op.what;
    EXPECT_GT(t.c, t0.c) << op.what;
  }
}

TEST_F(AttrTest, ChmodAndChownChangeCtimeOnly) {
  write_file(path("f"), "x");
  Times t0 = age({path("f")})[0];
  ASSERT_OK(::chmod(path("f").c_str(), 0600));
  Times t = times_of(path("f"));
  EXPECT_GT(t.c, t0.c);
  EXPECT_EQ(t.m, t0.m);
  EXPECT_EQ(t.a, t0.a);
  t0 = age({path("f")})[0];
  ASSERT_OK(::chown(path("f").c_str(), ::geteuid(), ::getegid()));
  t = times_of(path("f"));
  EXPECT_GT(t.c, t0.c) << "even a chown to the same owner changes ctime";
  EXPECT_EQ(t.m, t0.m);
}

}  // namespace
}  // namespace warpfs::posix_test
