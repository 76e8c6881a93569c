// Inode times over the whole signed 64-bit range of seconds (fs/FORMAT.md "Inode"): in the
// nanosecond field between 1677 and 2262, beyond that a sentinel and the exact time in the
// inode's internal record.
#include <sys/xattr.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

const std::vector<TimeSpec> kTimes = {
    {-2147483648LL, 0},          // 1901-12-13T20:45:52, INT32_MIN
    {-315619200LL, 123456789},   // 1960-01-01
    {-1, 0},                     // one second before the epoch
    {-1, 999999999},             // the last nanosecond before it
    {2147483648LL, 1},           // 2038-01-19T03:14:08, INT32_MAX + 1
    {10413792000LL, 500},        // 2300-01-01: past 2262, out of the field's range
    {-11676096000LL, 42},        // 1600-01-01: before 1677
    {INT64_MAX, 999999999},      // the largest time
    {INT64_MIN, 0},              // the smallest
    {9223372036LL, 854775807},   // INT64_MAX ns exactly: a sentinel's own value
    {-9223372037LL, 145224192},  // INT64_MIN ns exactly
};

int set_times(Filesystem& fs, Ino ino, const TimeSpec* a, const TimeSpec* m, Attr* out) {
  SetAttr s;
  if (a) s.atime = true, s.new_atime = *a;
  if (m) s.mtime = true, s.new_mtime = *m;
  return fs.setattr(ino, s, out);
}

std::string show(const TimeSpec& t) {
  return std::to_string(t.sec) + "." + std::to_string(t.nsec);
}

TEST(Times, EveryRangeIsExactAndSurvivesARemount) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  std::vector<Ino> files;
  for (size_t i = 0; i < kTimes.size(); ++i) {
    // Files, directories and symlinks alike.
    Ino f = 0;
    const std::string name = "t" + std::to_string(i);
    if (i % 3 == 0) {
      f = r->create(kRootInode, name);
    } else if (i % 3 == 1) {
      f = r->mkdir(kRootInode, name);
    } else {
      Attr a;
      EXPECT_EQ(r->fs->symlink(kRootInode, name, "target", Caller{}, &a), 0);
      f = a.ino;
    }
    files.push_back(f);
    const TimeSpec& a = kTimes[i];
    const TimeSpec& m = kTimes[kTimes.size() - 1 - i];
    Attr out;
    ASSERT_EQ(set_times(*r->fs, f, &a, &m, &out), 0) << show(a);
    EXPECT_EQ(out.atime, a) << show(out.atime) << " for " << show(a);
    EXPECT_EQ(out.mtime, m) << show(out.mtime) << " for " << show(m);
  }
  auto check = [&] {
    for (size_t i = 0; i < kTimes.size(); ++i) {
      Attr a;
      ASSERT_EQ(r->fs->getattr(files[i], &a), 0);
      EXPECT_EQ(a.atime, kTimes[i]) << show(a.atime) << " for " << show(kTimes[i]);
      EXPECT_EQ(a.mtime, kTimes[kTimes.size() - 1 - i]) << show(a.mtime);
      Attr l;
      ASSERT_EQ(r->fs->lookup(kRootInode, "t" + std::to_string(i), &l), 0);
      EXPECT_EQ(l.atime, kTimes[i]) << "lookup too";
      r->fs->forget(files[i], 1);
    }
  };
  check();
  EXPECT_EQ(r->check_and_remount(), "");
  check();
}

TEST(Times, AnInRangeTimeReplacesTheSentinelAndTheRecordGoes) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  const TimeSpec far{INT64_MAX, 999999999}, early{-11676096000LL, 7};
  Attr a;
  ASSERT_EQ(set_times(*r->fs, f, &early, &far, &a), 0);
  EXPECT_EQ(a.blocks, 8u) << "the record's xattr block";
  std::string names;
  ASSERT_EQ(r->fs->listxattr(f, &names), 0);
  EXPECT_EQ(names, "") << "the internal record is never listed";
  // UTIME_OMIT (mtime not given) keeps the exact mtime; UTIME_NOW replaces the atime.
  SetAttr s;
  s.atime = s.atime_now = true;
  ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
  EXPECT_EQ(a.mtime, far);
  EXPECT_GT(a.atime.sec, 1700000000);
  EXPECT_EQ(a.blocks, 8u) << "mtime still needs the record";
  EXPECT_EQ(r->check_and_remount(), "");
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.mtime, far);
  // A write sets mtime to now: no sentinel is left, and the record goes with the change.
  ASSERT_EQ(r->write(f, 0, "data"), 0);
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_GT(a.mtime.sec, 1700000000);
  EXPECT_EQ(a.blocks, 8u) << "one data block, no xattr block";
  EXPECT_EQ(r->check_and_remount(), "");
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.blocks, 8u);
  // Nanoseconds out of range are refused.
  const TimeSpec bad{0, 1000000000};
  EXPECT_EQ(set_times(*r->fs, f, &bad, nullptr, &a), EINVAL);
}

TEST(Times, RecordBesideUserAttributesAndThreads) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  for (int i = 0; i < 300; ++i) {
    const std::string k = "user.k" + std::to_string(i);
    ASSERT_EQ(r->fs->setxattr(f, k, "v", 1, 0), 0);
  }
  // Threads setting out-of-range and in-range times and reading them back at once: every
  // read sees one of the times written, exactly.
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const TimeSpec& v = kTimes[(t * 7 + i) % kTimes.size()];
        Attr a;
        if (set_times(*r->fs, f, &v, &v, &a) != 0) ++bad;
        if (r->fs->getattr(f, &a) != 0) ++bad;
        bool known = false;
        for (const TimeSpec& k : kTimes) known = known || (a.atime == k);
        if (!known) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  std::string names;
  ASSERT_EQ(r->fs->listxattr(f, &names), 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), '\0'), 300);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Times, ImageWithoutTheFeatureClampsAsBefore) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  ASSERT_TRUE(r->set_features(r->superblock_at(0).features & ~uint32_t{kFeatureXattrChain}));
  const TimeSpec far{INT64_MAX, 999999999}, early{INT64_MIN, 0};
  Attr a;
  ASSERT_EQ(set_times(*r->fs, f, &early, &far, &a), 0);
  EXPECT_EQ(time_ns_from(a.atime), kTimeBelow + 1);
  EXPECT_EQ(time_ns_from(a.mtime), kTimeAbove - 1);
  EXPECT_EQ(a.blocks, 0u) << "no record";
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test
