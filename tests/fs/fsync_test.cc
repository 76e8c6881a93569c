// fsync and fdatasync of one file (file.cc FsImpl::fsync): what they send to the device,
// counted at the emulated controller (NVMe Flush and Write commands), and what survives a
// power cut after them.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "fs/core_rig.h"
#include "warpfs/blockdev/stack.h"

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

TEST(Fsync, ASecondFsyncFindsTheFirstsFlush) {
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

// Threads overwriting files of their own and fdatasyncing each write: never more than one
// Flush per call (calls that meet may share one), and no commit.
TEST(Fsync, ConcurrentFdatasyncsOfOverwritesCostAtMostOneFlushEach) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  constexpr int kThreads = 4, kCalls = 50;
  std::vector<Ino> ino(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    ino[t] = r->create(kRootInode, "o" + std::to_string(t));
    ASSERT_EQ(r->write(ino[t], 0, pattern(t, 0, 64 << 10)), 0);
  }
  ASSERT_EQ(r->fs->sync(), 0);
  const uint64_t before = flushes(*r), commits = r->fs->stats().commits;
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        ASSERT_EQ(r->write(ino[t], (i % 16) * 4096, pattern(i, 0, 4096)), 0);
        ASSERT_EQ(r->fs->fsync(ino[t], true), 0);
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_LE(flushes(*r) - before, uint64_t{kThreads} * kCalls);
  EXPECT_GT(flushes(*r) - before, 0u);
  EXPECT_EQ(r->fs->stats().commits, commits);
}

// Under the software cache (the daemon's stack): fdatasync of an overwritten file writes
// back that file's dirty line and nothing else (another file's dirty lines stay cached), then
// one Flush; data a full flush already wrote back still gets a Flush of its own (it may have
// been written back after that flush began: the flush numbering, not the clean line, says).
TEST(Fsync, UnderTheCacheOnlyTheFilesBlocksAreWrittenBack) {
  auto stack = cache::test::Stack::make(64 << 20);
  ASSERT_TRUE(stack);
  std::string err;
  {
    auto raw = blockdev::NvmeBlockDevice::create(*stack->engine, 1, kBlockSize, &err);
    ASSERT_TRUE(raw) << err;
    Geometry g;
    MkfsOptions mo;
    mo.seed = 7;
    ASSERT_TRUE(plan_geometry(raw->block_count(), mo, &g, &err)) << err;
    ASSERT_TRUE(format(*raw, mo, g, nullptr).is_ok());
  }
  auto cached = blockdev::CachedBlockDevice::create(*stack->backend,
                                                    blockdev::cache_of_size(16, kBlockSize), &err);
  ASSERT_TRUE(cached) << err;
  MountOptions o;
  o.commit_interval_ms = 60000;
  auto fs = Filesystem::mount(*cached, o, &err);
  ASSERT_TRUE(fs) << err;
  auto writes = [&] { return stack->transport->counters().writes; };
  auto flushes = [&] { return stack->transport->counters().flushes; };
  auto put = [&](Ino ino, uint64_t off, const std::string& d) {
    size_t w = 0;
    ASSERT_EQ(fs->write(ino, off, d.size(), d.data(), &w), 0);
    ASSERT_EQ(w, d.size());
  };
  Attr a;
  ASSERT_EQ(fs->mknod(kRootInode, "f", S_IFREG | 0644, 0, Caller{}, &a), 0);
  const Ino f = a.ino;
  put(f, 0, pattern(1, 0, 16 * 4096));  // 16 blocks: through cache lines
  ASSERT_EQ(fs->fsync(f, false), 0);
  ASSERT_EQ(fs->mknod(kRootInode, "g", S_IFREG | 0644, 0, Caller{}, &a), 0);
  const Ino g = a.ino;
  put(g, 0, pattern(2, 0, 3 * 4096));  // dirty lines of another file
  put(f, 4096, pattern(3, 0, 4096));   // one dirty line of f
  uint64_t w0 = writes(), f0 = flushes();
  ASSERT_EQ(fs->fsync(f, true), 0);
  EXPECT_EQ(writes(), w0 + 1) << "only f's one dirty block";
  EXPECT_EQ(flushes(), f0 + 1);
  w0 = writes(), f0 = flushes();
  ASSERT_EQ(fs->fsync(f, true), 0);  // clean: nothing
  EXPECT_EQ(writes(), w0);
  EXPECT_EQ(flushes(), f0);
  // g is new: its fdatasync commits, and the commit's whole-cache flush writes its lines.
  ASSERT_EQ(fs->fsync(g, true), 0);
  EXPECT_EQ(flushes(), f0 + 2);
  put(f, 8192, pattern(4, 0, 4096));
  ASSERT_EQ(fs->sync(), 0);  // writes f's new line back and flushes
  // The line is clean now, which does not prove a flush came after its write-back (an
  // eviction could have written it just after one began): fsync flushes once more.
  f0 = flushes();
  ASSERT_EQ(fs->fsync(f, true), 0);
  EXPECT_EQ(flushes(), f0 + 1);
  ASSERT_EQ(fs->unmount(), 0);
}

// A file closed and forgotten by the kernel leaves the node table; what it had not made
// durable goes with its inode number, so that the fsync after it is looked up again still
// commits and flushes.
TEST(Fsync, AForgottenNodesUnsyncedChangesAreSyncedWhenItComesBack) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  ASSERT_EQ(r->write(f, 0, pattern(5, 0, 8192)), 0);
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  ASSERT_EQ(r->write(f, 8192, pattern(6, 0, 4096)), 0);  // a new size, uncommitted
  r->fs->forget(f, 1);                                   // leaves the node table
  Attr a;
  ASSERT_EQ(r->fs->lookup(kRootInode, "f", &a), 0);
  ASSERT_EQ(a.ino, f);
  const uint64_t commits = r->fs->stats().commits;
  ASSERT_EQ(r->fs->fsync(f, true), 0);
  EXPECT_EQ(r->fs->stats().commits, commits + 1);
  ASSERT_TRUE(r->crash_and_remount(0.0));
  EXPECT_EQ(r->read(f, 0, 20000), pattern(5, 0, 8192) + pattern(6, 0, 4096));
  EXPECT_EQ(r->check_and_remount(), "");
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
