// fsync and fdatasync of one file (file.cc FsImpl::fsync): what they send to the device,
// counted at the emulated controller (NVMe Flush and Write commands), and what survives a
// power cut after them.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

uint64_t flushes(Rig& r) {
  return r.stack->transport->counters().flushes;
}

TEST(Fsync, OverwriteCostsOneFlushAndACleanFileNone) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  ASSERT_EQ(r->write(f, 0, pattern(1, 0, 64 << 10)), 0);
  ASSERT_EQ(r->fs->fsync(f, false), 0);  // the new file: a commit
  // Clean since: nothing at all is sent.
  uint64_t before = flushes(*r);
  const uint64_t commits = r->fs->stats().commits;
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  ASSERT_EQ(r->fs->fsync(f, true), 0);
  EXPECT_EQ(flushes(*r), before);
  // An overwrite inside the file: fdatasync needs no commit (only mtime changed), one Flush.
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(r->write(f, 4096 * static_cast<uint64_t>(i), pattern(2 + i, 0, 4096)), 0);
    before = flushes(*r);
    ASSERT_EQ(r->fs->fsync(f, true), 0);
    EXPECT_EQ(flushes(*r), before + 1) << i;
  }
  EXPECT_EQ(r->fs->stats().commits, commits);
  // fsync (not data) of the same: mtime is the inode's, so a commit (its two flushes cover
  // the data; no third).
  ASSERT_EQ(r->write(f, 8192, pattern(9, 0, 4096)), 0);
  before = flushes(*r);
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  EXPECT_EQ(r->fs->stats().commits, commits + 1);
  EXPECT_EQ(flushes(*r), before + 2);
  // An append: the size is what fdatasync needs, so a commit.
  ASSERT_EQ(r->write(f, 64 << 10, pattern(10, 0, 4096)), 0);
  before = flushes(*r);
  ASSERT_EQ(r->fs->fsync(f, true), 0);
  EXPECT_EQ(r->fs->stats().commits, commits + 2);
  EXPECT_EQ(flushes(*r), before + 2);
  // Another file's changes do not make this one dirty.
  const Ino g = r->create(kRootInode, "g");
  ASSERT_EQ(r->write(g, 0, pattern(11, 0, 10000)), 0);
  before = flushes(*r);
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  EXPECT_EQ(flushes(*r), before);
}

TEST(Fsync, DataAnEvictionWroteBackStillNeedsAFlush) {
  // Under the software cache: data written back by someone else (here a full flush's
  // write-back, then more writes) is on the device but maybe volatile; fsync knows by the
  // flush numbering, not by the cache line being clean.
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  ASSERT_EQ(r->write(f, 0, pattern(1, 0, 8192)), 0);
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  ASSERT_EQ(r->write(f, 0, pattern(2, 0, 4096)), 0);
  const uint64_t before = flushes(*r);
  ASSERT_EQ(r->fs->fsync(f, true), 0);
  ASSERT_EQ(r->fs->fsync(f, true), 0);  // the second finds it durable
  EXPECT_EQ(flushes(*r), before + 1);
}

TEST(Fsync, NewFileAndItsNameSurviveAPowerCut) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino d = r->mkdir(kRootInode, "d");
  const Ino f = r->create(d, "f");
  ASSERT_EQ(r->write(f, 0, pattern(3, 0, 20000)), 0);
  ASSERT_EQ(r->fs->fsync(f, true), 0);
  const Ino e = r->create(d, "e");
  ASSERT_NE(e, 0u);
  ASSERT_EQ(r->fs->fsync(d, false), 0);  // the directory: its names
  ASSERT_TRUE(r->crash_and_remount(0.0));
  Ino got = 0;
  ASSERT_EQ(r->lookup(kRootInode, "d", &got), 0);
  ASSERT_EQ(r->lookup(got, "f", &got), 0);
  EXPECT_EQ(r->read(got, 0, 20001), pattern(3, 0, 20000));
  ASSERT_EQ(r->lookup(kRootInode, "d", &got), 0);
  EXPECT_EQ(r->lookup(got, "e"), 0);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Fsync, OverwritesFdatasyncedSurviveAPowerCut) {
  for (int round = 0; round < 4; ++round) {
    auto r = Rig::make(64);
    ASSERT_TRUE(r);
    const Ino f = r->create(kRootInode, "f");
    std::string model = pattern(4, 0, 256 << 10);
    ASSERT_EQ(r->write(f, 0, model), 0);
    ASSERT_EQ(r->fs->fsync(f, false), 0);
    std::mt19937_64 rng(round);
    for (int i = 0; i < 40; ++i) {
      const uint64_t off = rng() % (model.size() - 5000);
      const std::string data = pattern(rng(), off, 1 + rng() % 5000);
      ASSERT_EQ(r->write(f, off, data), 0);
      model.replace(off, data.size(), data);
      ASSERT_EQ(r->fs->fsync(f, true), 0);
    }
    ASSERT_TRUE(r->crash_and_remount(static_cast<double>(round % 3) / 2));
    Ino got = 0;
    ASSERT_EQ(r->lookup(kRootInode, "f", &got), 0);
    EXPECT_TRUE(r->read(got, 0, model.size() + 1) == model) << "round " << round;
    EXPECT_EQ(r->check_and_remount(), "") << "round " << round;
  }
}

// Threads fsync files of their own while others write (and extend) theirs; a power cut;
// every byte an fsync acknowledged is there.
TEST(Fsync, ConcurrentFsyncsOfDifferentFilesEachHoldAfterAPowerCut) {
  for (int round = 0; round < 3; ++round) {
    auto r = Rig::make(64);
    ASSERT_TRUE(r);
    constexpr int kSyncers = 4, kWriters = 2;
    std::vector<Ino> ino(kSyncers + kWriters);
    for (size_t i = 0; i < ino.size(); ++i) ino[i] = r->create(kRootInode, "t" + std::to_string(i));
    std::vector<std::string> synced(kSyncers);
    std::atomic<bool> stop{false};
    std::vector<std::thread> th;
    for (int t = 0; t < kSyncers; ++t) {
      th.emplace_back([&, t] {
        std::mt19937_64 rng(round * 100 + t);
        std::string model;
        for (int i = 0; i < 60; ++i) {
          const uint64_t off = rng() % (model.size() + 1 + 8192);
          const std::string data = pattern(rng(), off, 1 + rng() % 12000);
          ASSERT_EQ(r->write(ino[t], off, data), 0);
          if (model.size() < off + data.size()) model.resize(off + data.size(), '\0');
          model.replace(off, data.size(), data);
          ASSERT_EQ(r->fs->fsync(ino[t], (i & 1) != 0), 0);
          synced[t] = model;
        }
      });
    }
    for (int t = 0; t < kWriters; ++t) {
      th.emplace_back([&, t] {
        std::mt19937_64 rng(round * 100 + 50 + t);
        for (uint64_t i = 0; !stop.load(); ++i) {
          ASSERT_EQ(r->write(ino[kSyncers + t], (i % 64) * 8192, pattern(rng(), 0, 9000)), 0);
        }
      });
    }
    for (int t = 0; t < kSyncers; ++t) th[t].join();
    stop = true;
    for (size_t t = kSyncers; t < th.size(); ++t) th[t].join();
    ASSERT_TRUE(r->crash_and_remount(static_cast<double>(round % 3) / 2));
    for (int t = 0; t < kSyncers; ++t) {
      Ino got = 0;
      ASSERT_EQ(r->lookup(kRootInode, "t" + std::to_string(t), &got), 0);
      EXPECT_TRUE(r->read(got, 0, synced[t].size() + 1) == synced[t])
          << "round " << round << " t" << t;
    }
    EXPECT_EQ(r->check_and_remount(), "") << "round " << round;
  }
}

}  // namespace
}  // namespace warpfs::fs::test
