// The overwrite fast path (file.cc FsImpl::overwrite): a write over mapped, written blocks
// inside the size takes the node's lock shared and opens no transaction; its times reach the
// inode at the next store (fsync, sync, unmount, forget, the committer). What it must still
// do (drop privileges, refuse pinned files), what it races (truncate, extension, other
// writers, readers), and what survives a power cut.
#include <linux/fs.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

constexpr uint64_t kB = kBlockSize;

// A block that says which file block it was written for and by which write (tag), the rest
// derived from both: check() tells a whole block from a torn or misplaced one.
std::string stamped(uint64_t lblk, uint64_t tag) {
  std::string b = pattern(tag, lblk * kB, kB);
  std::memcpy(b.data(), &lblk, 8);
  std::memcpy(b.data() + 8, &tag, 8);
  return b;
}
std::string stamped_run(uint64_t lblk, uint64_t count, uint64_t tag) {
  std::string s;
  for (uint64_t i = 0; i < count; ++i) s += stamped(lblk + i, tag);
  return s;
}
// The tag of a whole block stamped for `lblk`; false if torn or another block's. `zero_ok`:
// an all-zero block passes too (tag 0).
bool check(const char* p, uint64_t lblk, uint64_t* tag, bool zero_ok = false) {
  if (zero_ok && std::all_of(p, p + kB, [](char c) { return c == 0; })) {
    *tag = 0;
    return true;
  }
  uint64_t l;
  std::memcpy(&l, p, 8);
  std::memcpy(tag, p + 8, 8);
  return l == lblk && std::memcmp(p, stamped(lblk, *tag).data(), kB) == 0;
}

uint64_t mtime(Rig& r, Ino f) {
  Attr a;
  EXPECT_EQ(r.fs->getattr(f, &a), 0);
  return time_ns_from(a.mtime);
}

// A file of `blocks` stamped blocks (tag 1), synced: overwrites of it take the fast path.
Ino make_file(Rig& r, const std::string& name, uint64_t blocks) {
  const Ino f = r.create(kRootInode, name);
  EXPECT_EQ(r.write(f, 0, stamped_run(0, blocks, 1)), 0);
  EXPECT_EQ(r.fs->fsync(f, false), 0);
  return f;
}

TEST(Overwrite, OpensNoTransactionAndItsTimesReachTheInodeAtTheNextStore) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = make_file(*r, "f", 16);
  std::string model = stamped_run(0, 16, 1);
  const uint64_t commits = r->fs->stats().commits;
  const uint64_t m0 = mtime(*r, f);
  // Overwrites: mtime changes at once, yet nothing is dirty in the journal (the ordinary
  // path's store would make shrink_caches commit).
  ASSERT_EQ(r->write(f, 2 * kB, stamped_run(2, 3, 2)), 0);
  model.replace(2 * kB, 3 * kB, stamped_run(2, 3, 2));
  const uint64_t m1 = mtime(*r, f);
  EXPECT_GT(m1, m0);
  r->fs->shrink_caches();
  EXPECT_EQ(r->fs->stats().commits, commits);
  EXPECT_EQ(r->read(f, 0, 16 * kB), model);
  // fdatasync: no commit (a time is not needed to read the data back), the data durable.
  ASSERT_EQ(r->fs->fsync(f, true), 0);
  EXPECT_EQ(r->fs->stats().commits, commits);
  ASSERT_TRUE(r->crash_and_remount(0.0));
  EXPECT_EQ(r->read(f, 0, 16 * kB + 1), model);
  EXPECT_EQ(mtime(*r, f), m0);  // the overwrite's time was lost with the power (lazytime)
  // fsync: the time is stored and committed, exactly.
  ASSERT_EQ(r->write(f, 0, stamped_run(0, 1, 3)), 0);  // the first after mount: ordinary
  model.replace(0, kB, stamped_run(0, 1, 3));
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  const uint64_t c1 = r->fs->stats().commits;
  ASSERT_EQ(r->write(f, 7 * kB, stamped_run(7, 2, 4)), 0);
  model.replace(7 * kB, 2 * kB, stamped_run(7, 2, 4));
  const uint64_t m2 = mtime(*r, f);
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  EXPECT_EQ(r->fs->stats().commits, c1 + 1);
  ASSERT_TRUE(r->crash_and_remount(0.0));
  EXPECT_EQ(r->read(f, 0, 16 * kB + 1), model);
  EXPECT_EQ(mtime(*r, f), m2);
  // sync and unmount store them too.
  ASSERT_EQ(r->write(f, 0, stamped_run(0, 1, 5)), 0);  // ordinary
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  ASSERT_EQ(r->write(f, 9 * kB, stamped_run(9, 1, 6)), 0);
  model.replace(0, kB, stamped_run(0, 1, 5));
  model.replace(9 * kB, kB, stamped_run(9, 1, 6));
  const uint64_t m3 = mtime(*r, f);
  ASSERT_EQ(r->fs->sync(), 0);
  ASSERT_TRUE(r->crash_and_remount(0.0));
  EXPECT_EQ(mtime(*r, f), m3);
  ASSERT_EQ(r->write(f, 0, stamped_run(0, 1, 7)), 0);  // ordinary
  ASSERT_EQ(r->write(f, 10 * kB, stamped_run(10, 1, 8)), 0);
  model.replace(0, kB, stamped_run(0, 1, 7));
  model.replace(10 * kB, kB, stamped_run(10, 1, 8));
  const uint64_t m4 = mtime(*r, f);
  ASSERT_TRUE(r->remount());
  EXPECT_EQ(mtime(*r, f), m4);
  EXPECT_EQ(r->read(f, 0, 16 * kB + 1), model);
  EXPECT_EQ(r->check_and_remount(), "");
}

// The kernel forgets the node: its times are stored before it leaves the node table (else
// the next lookup would read the old ones back, or it would have to stay in the table).
TEST(Overwrite, ForgetStoresTheTimes) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = make_file(*r, "f", 4);
  ASSERT_EQ(r->write(f, kB, stamped_run(1, 1, 2)), 0);
  const uint64_t m = mtime(*r, f);
  const uint64_t nodes = r->fs->stats().nodes;
  r->fs->forget(f, 1);
  EXPECT_EQ(r->fs->stats().nodes, nodes - 1);  // it left: the lookup loads the stored inode
  Attr a;
  ASSERT_EQ(r->fs->lookup(kRootInode, "f", &a), 0);
  EXPECT_EQ(time_ns_from(a.mtime), m);
  EXPECT_EQ(time_ns_from(a.ctime), m);
}

// The committer stores the times on its own (the interval shortened for this test).
TEST(Overwrite, TheCommitterStoresTheTimes) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  r->commit_interval_ms = 20;
  ASSERT_TRUE(r->remount());
  const Ino f = make_file(*r, "f", 4);
  ASSERT_EQ(r->write(f, kB, stamped_run(1, 1, 2)), 0);
  const uint64_t m = mtime(*r, f);
  const uint64_t commits = r->fs->stats().commits;
  // Waits for an event (a commit), not for time to pass; bounded.
  for (int i = 0; i < 5000 && r->fs->stats().commits == commits; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GT(r->fs->stats().commits, commits);
  ASSERT_TRUE(r->crash_and_remount(0.0));
  EXPECT_EQ(mtime(*r, f), m);
}

// What the fast path may not skip: clearing set-user-ID, dropping a capability set after the
// last write, refusing an immutable file; an explicit mtime after an overwrite wins.
TEST(Overwrite, PrivilegesFlagsAndExplicitTimes) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = make_file(*r, "f", 4);
  SetAttr s;
  s.mode = true;
  s.new_mode = 04755;
  Attr a;
  ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
  ASSERT_EQ(r->write(f, 0, stamped_run(0, 1, 2)), 0);
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.mode & 07777, 0755u);
  ASSERT_EQ(r->write(f, kB, stamped_run(1, 1, 3)), 0);  // fast now
  const std::string cap(20, 'c');
  ASSERT_EQ(r->fs->setxattr(f, "security.capability", cap.data(), cap.size(), 0), 0);
  ASSERT_EQ(r->write(f, 2 * kB, stamped_run(2, 1, 4)), 0);
  std::string v;
  EXPECT_EQ(r->fs->getxattr(f, "security.capability", &v), ENODATA);
  ASSERT_EQ(r->write(f, 3 * kB, stamped_run(3, 1, 5)), 0);  // fast again
  ASSERT_EQ(r->fs->set_flags(f, FS_IMMUTABLE_FL), 0);
  EXPECT_EQ(r->write(f, 3 * kB, stamped_run(3, 1, 6)), EPERM);
  ASSERT_EQ(r->fs->set_flags(f, FS_APPEND_FL), 0);
  EXPECT_EQ(r->write(f, 3 * kB, stamped_run(3, 1, 6)), EPERM);
  ASSERT_EQ(r->fs->set_flags(f, 0), 0);
  ASSERT_EQ(r->write(f, 3 * kB, stamped_run(3, 1, 7)), 0);
  ASSERT_EQ(r->write(f, 3 * kB, stamped_run(3, 1, 8)), 0);  // fast
  s = SetAttr{};
  s.mtime = true;
  s.new_mtime = TimeSpec{1, 0};
  ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
  EXPECT_EQ(mtime(*r, f), 1'000'000'000u);
  ASSERT_TRUE(r->remount());
  EXPECT_EQ(mtime(*r, f), 1'000'000'000u);
  EXPECT_EQ(r->read(f, 3 * kB, kB), stamped_run(3, 1, 8));
  EXPECT_EQ(r->check_and_remount(), "");
}

// A page of the kernel's writeback cache written back (WriteFrom::kPageCache): the kernel
// set the times and dropped the privileges at write(2), so the write-back changes neither
// the times, the mode nor security.capability (a chmod may have set them since), only the
// data and a growing size; the kernel's times come with a setattr that carries ctime, kept
// exactly. An ordinary write afterwards does all of it again.
int page_cache_write(Rig& r, Ino f, uint64_t off, const std::string& data) {
  size_t w = 0;
  const int rc = r.fs->write(f, off, data.size(), data.data(), &w, nullptr, WriteFrom::kPageCache);
  return rc == 0 && w != data.size() ? ENOSPC : rc;
}

SetAttr kernel_times(const TimeSpec& m, const TimeSpec& c) {
  SetAttr s;
  s.mtime = s.ctime = true;
  s.new_mtime = m;
  s.new_ctime = c;
  return s;
}

TEST(PageCache, WriteBackKeepsTimesPrivilegesAndCapability) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = make_file(*r, "f", 4);
  const std::string cap(20, 'c');
  ASSERT_EQ(r->fs->setxattr(f, "security.capability", cap.data(), cap.size(), 0), 0);
  SetAttr s = kernel_times({1000, 7}, {2000, 9});
  s.mode = true;
  s.new_mode = 06775;
  Attr a;
  ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
  EXPECT_EQ(a.ctime, (TimeSpec{2000, 9}));
  ASSERT_EQ(page_cache_write(*r, f, 0, stamped_run(0, 1, 2)), 0);       // fast path
  ASSERT_EQ(page_cache_write(*r, f, kB + 10, "partial"), 0);            // ordinary path
  ASSERT_EQ(page_cache_write(*r, f, 4 * kB, stamped_run(4, 2, 3)), 0);  // grows
  auto same = [&](const char* when) {
    Attr b;
    ASSERT_EQ(r->fs->getattr(f, &b), 0);
    EXPECT_EQ(b.mode & 07777, 06775u) << when;
    EXPECT_EQ(b.mtime, (TimeSpec{1000, 7})) << when;
    EXPECT_EQ(b.ctime, (TimeSpec{2000, 9})) << when;
    EXPECT_EQ(b.size, 6 * kB) << when;
    std::string v;
    EXPECT_EQ(r->fs->getxattr(f, "security.capability", &v), 0) << when;
    std::string want = stamped_run(0, 6, 1);
    want.replace(0, kB, stamped_run(0, 1, 2));
    want.replace(kB + 10, 7, "partial");
    want.replace(4 * kB, 2 * kB, stamped_run(4, 2, 3));
    EXPECT_TRUE(r->read(f, 0, 6 * kB) == want) << when;
  };
  same("at once");
  ASSERT_TRUE(r->remount());
  same("after a remount");
  ASSERT_EQ(r->write(f, 0, stamped_run(0, 1, 4)), 0);  // the writer's own write
  ASSERT_EQ(r->fs->getattr(f, &a), 0);
  EXPECT_EQ(a.mode & 07777, 0775u);
  EXPECT_GT(a.mtime.sec, 2000);
  std::string v;
  EXPECT_EQ(r->fs->getxattr(f, "security.capability", &v), ENODATA);
  EXPECT_EQ(r->check_and_remount(), "");
}

// Append-only: the write-back of the page that holds the old end rewrites the bytes below it,
// which must be left as they are; a change there, or any write of the writer's own below the
// end, is refused. The kernel's times (mtime with ctime) may be set, an mtime alone may not.
TEST(PageCache, AppendOnlyTakesItsOldEndRewrittenUnchanged) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "log");
  const std::string old = pattern(5, 0, 6000);
  ASSERT_EQ(r->write(f, 0, old), 0);
  ASSERT_EQ(r->fs->set_flags(f, FS_APPEND_FL), 0);
  const std::string page = old.substr(kB) + "appended";
  EXPECT_EQ(page_cache_write(*r, f, kB, page), 0);
  std::string changed = page;
  changed[10] ^= 1;
  EXPECT_EQ(page_cache_write(*r, f, kB, changed), EPERM);
  EXPECT_EQ(r->write(f, kB, page), EPERM);
  EXPECT_EQ(r->write(f, 6008, "more"), 0);
  EXPECT_EQ(r->read(f, 0, 8192), old + "appended" + "more");
  Attr a;
  EXPECT_EQ(r->fs->setattr(f, kernel_times({3000, 0}, {3001, 0}), &a), 0);
  SetAttr m;
  m.mtime = true;
  m.new_mtime = {4000, 0};
  EXPECT_EQ(r->fs->setattr(f, m, &a), EPERM);
  ASSERT_EQ(r->fs->set_flags(f, 0), 0);
  EXPECT_EQ(r->check_and_remount(), "");
}

// Write-backs from several threads at once (overwrites on the fast path, partial blocks and
// growth on the ordinary one) while the kernel's times arrive from another: the times are
// the last setattr's, never a write-back's, and every block is its writer's.
TEST(PageCache, ThreadsWriteBackWhileTheTimesArrive) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  constexpr int kWriters = 4, kWrites = 200;
  constexpr uint64_t kOwn = 32;
  const Ino f = make_file(*r, "f", kWriters * kOwn);
  std::vector<std::string> own(kWriters);
  std::atomic<int> writers_left{kWriters};
  std::vector<std::thread> th;
  for (int t = 0; t < kWriters; ++t) {
    th.emplace_back([&, t] {
      std::mt19937_64 rng(t + 7);
      const uint64_t base = t * kOwn;
      own[t] = stamped_run(base, kOwn, 1);
      for (int i = 0; i < kWrites; ++i) {
        const uint64_t tag = (static_cast<uint64_t>(t + 1) << 32) | static_cast<uint64_t>(i + 2);
        const uint64_t count = 1 + rng() % 4, first = base + rng() % (kOwn - count + 1);
        std::string data = stamped_run(first, count, tag);
        uint64_t off = first * kB;
        if (rng() % 3 == 0) {  // a partial block: the ordinary path
          off += 100;
          data.resize(data.size() - 200);
        }
        ASSERT_EQ(page_cache_write(*r, f, off, data), 0);
        own[t].replace(off - base * kB, data.size(), data);
      }
      writers_left.fetch_sub(1);
    });
  }
  // The grower: a file of its own, written back past its end.
  const Ino g = r->create(kRootInode, "g");
  th.emplace_back([&] {
    for (uint64_t b = 0; b < 64; ++b) ASSERT_EQ(page_cache_write(*r, g, b * kB, stamped(b, 9)), 0);
  });
  TimeSpec last{};
  th.emplace_back([&] {
    for (int64_t i = 1; writers_left.load() > 0; ++i) {
      last = {5000 + i, static_cast<int64_t>(i % 1000)};
      Attr a;
      ASSERT_EQ(r->fs->setattr(f, kernel_times(last, last), &a), 0);
    }
  });
  for (auto& x : th) x.join();
  ASSERT_EQ(page_cache_write(*r, f, 0, stamped_run(0, 1, 99)), 0);  // after the last setattr
  own[0].replace(0, kB, stamped_run(0, 1, 99));
  auto verify = [&](const char* when) {
    Attr a;
    ASSERT_EQ(r->fs->getattr(f, &a), 0);
    EXPECT_EQ(a.mtime, last) << when;
    EXPECT_EQ(a.ctime, last) << when;
    const std::string all = r->read(f, 0, kWriters * kOwn * kB);
    for (int t = 0; t < kWriters; ++t)
      EXPECT_TRUE(all.compare(t * kOwn * kB, kOwn * kB, own[t]) == 0) << when << " writer " << t;
    EXPECT_EQ(r->size(g), 64 * kB) << when;
    EXPECT_TRUE(r->read(g, 0, 64 * kB) == stamped_run(0, 64, 9)) << when;
  };
  verify("at once");
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  ASSERT_EQ(r->fs->fsync(g, true), 0);
  ASSERT_TRUE(r->crash_and_remount(0.0));
  verify("after fsync and a power cut");
  EXPECT_EQ(r->check_and_remount(), "");
}

// A write sets mtime and ctime to now whatever they were: an mtime set past now (in range,
// and beyond 2262, a sentinel with its record) or before 1970 (a negative time, a large u64)
// is replaced, at once and after a remount.
TEST(Overwrite, ReplacesTimesSetInTheFutureOrBefore1970) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = make_file(*r, "f", 2);
  const TimeSpec set[] = {{4102444800, 0} /* 2100 */,
                          {-315619200, 0} /* 1960 */,
                          {int64_t{1} << 40, 5} /* far past 2262 */,
                          {-(int64_t{1} << 40), 5} /* far before 1677 */};
  for (const TimeSpec& t : set) {
    SetAttr s;
    s.mtime = true;
    s.new_mtime = t;
    Attr a;
    ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
    ASSERT_EQ(a.mtime, t);
    timespec before;
    clock_gettime(CLOCK_REALTIME, &before);
    ASSERT_EQ(r->write(f, 0, stamped_run(0, 1, 9)), 0);
    ASSERT_EQ(r->fs->getattr(f, &a), 0);
    EXPECT_GE(a.mtime.sec, before.tv_sec - 1) << t.sec;
    EXPECT_LE(a.mtime.sec, before.tv_sec + 60) << t.sec;
    ASSERT_TRUE(r->remount());
    ASSERT_EQ(r->fs->getattr(f, &a), 0);
    EXPECT_GE(a.mtime.sec, before.tv_sec - 1) << t.sec;
    EXPECT_LE(a.mtime.sec, before.tv_sec + 60) << t.sec;
  }
  EXPECT_EQ(r->check_and_remount(), "");
}

// Writers overwrite blocks of their own (checked against a model after every write) and a
// shared range (any block whole, from one write that covered it), readers read all along
// (every block whole); no transaction opens; all of it survives an fsync and a power cut.
TEST(Overwrite, ThreadsOverwriteOwnAndSharedRangesWithReaders) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  constexpr int kWriters = 4, kReaders = 2, kWrites = 300;
  constexpr uint64_t kOwn = 64, kShared = 64, kBlocks = kWriters * kOwn + kShared;
  const Ino f = make_file(*r, "f", kBlocks);
  const uint64_t commits = r->fs->stats().commits;
  std::vector<std::string> own(kWriters);
  std::mutex log_mu;
  std::vector<std::vector<uint64_t>> covered(kBlocks);  // tags written to each block
  std::atomic<int> writers_left{kWriters};
  std::vector<std::thread> th;
  for (int t = 0; t < kWriters; ++t) {
    th.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      const uint64_t base = t * kOwn;
      own[t] = stamped_run(base, kOwn, 1);
      for (int i = 0; i < kWrites; ++i) {
        const uint64_t tag = (static_cast<uint64_t>(t + 1) << 32) | static_cast<uint64_t>(i + 2);
        const bool shared = rng() % 3 == 0;
        const uint64_t lo = shared ? kWriters * kOwn : base, span = shared ? kShared : kOwn;
        const uint64_t count = 1 + rng() % 8, first = lo + rng() % (span - count + 1);
        if (shared) {
          std::lock_guard<std::mutex> g(log_mu);
          for (uint64_t b = first; b < first + count; ++b) covered[b].push_back(tag);
        }
        ASSERT_EQ(r->write(f, first * kB, stamped_run(first, count, tag)), 0);
        if (shared) continue;
        own[t].replace((first - base) * kB, count * kB, stamped_run(first, count, tag));
        const uint64_t rf = base + rng() % kOwn, rc = 1 + rng() % (base + kOwn - rf);
        ASSERT_EQ(r->read(f, rf * kB, rc * kB), own[t].substr((rf - base) * kB, rc * kB));
      }
      writers_left.fetch_sub(1);
    });
  }
  std::atomic<uint64_t> reads{0};
  for (int t = 0; t < kReaders; ++t) {
    th.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      while (writers_left.load() > 0) {
        const uint64_t count = 1 + rng() % 16, first = rng() % (kBlocks - count + 1);
        const std::string got = r->read(f, first * kB, count * kB);
        ASSERT_EQ(got.size(), count * kB);
        for (uint64_t i = 0; i < count; ++i) {
          uint64_t tag;
          ASSERT_TRUE(check(got.data() + i * kB, first + i, &tag)) << "block " << first + i;
        }
        reads.fetch_add(1);
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_GT(reads.load(), 0u);
  r->fs->shrink_caches();  // commits whatever a transaction dirtied: nothing
  EXPECT_EQ(r->fs->stats().commits, commits);
  EXPECT_EQ(r->size(f), kBlocks * kB);
  auto verify = [&](const char* when) {
    const std::string all = r->read(f, 0, kBlocks * kB + 1);
    ASSERT_EQ(all.size(), kBlocks * kB) << when;
    for (int t = 0; t < kWriters; ++t) {
      EXPECT_TRUE(all.compare(t * kOwn * kB, kOwn * kB, own[t]) == 0) << when << " writer " << t;
    }
    for (uint64_t b = kWriters * kOwn; b < kBlocks; ++b) {
      uint64_t tag;
      ASSERT_TRUE(check(all.data() + b * kB, b, &tag)) << when << " block " << b;
      const auto& c = covered[b];
      EXPECT_TRUE(tag == 1 || std::find(c.begin(), c.end(), tag) != c.end()) << when << b;
    }
  };
  verify("before");
  ASSERT_EQ(r->fs->fsync(f, true), 0);
  ASSERT_TRUE(r->crash_and_remount(0.0));
  verify("after the power cut");
  EXPECT_EQ(r->check_and_remount(), "");
}

// Overwriters race a thread that truncates the file and extends it again (both exclusive:
// the fast path's "inside the size and mapped" must hold from its check to its last block),
// while another file grows into the blocks the truncates free. A fast write that kept going
// after a truncate took its blocks would land in the other file or in metadata: every block
// of each file is its own (or zero for the first), and fsck is clean.
TEST(Overwrite, RacesTruncateAndExtendWithoutTouchingFreedBlocks) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  constexpr uint64_t kBlocks = 256;
  const Ino f = make_file(*r, "f", kBlocks);
  const Ino g = r->create(kRootInode, "g");
  std::atomic<bool> stop{false};
  std::vector<std::thread> th;
  for (int t = 0; t < 3; ++t) {
    th.emplace_back([&, t] {
      std::mt19937_64 rng(t + 7);
      for (uint64_t i = 2; !stop.load(); ++i) {
        const uint64_t count = 1 + rng() % 8, first = rng() % (kBlocks - count + 1);
        ASSERT_EQ(r->write(f, first * kB, stamped_run(first, count, (t + 1) << 24 | i)), 0);
      }
    });
  }
  std::thread grower([&] {
    for (uint64_t b = 0; !stop.load() && b < 4000; ++b) {
      ASSERT_EQ(r->write(g, b * kB, stamped_run(b, 1, 9)), 0);
    }
  });
  {
    std::mt19937_64 rng(3);
    for (int i = 0; i < 150; ++i) {
      SetAttr s;
      s.size = true;
      s.new_size = (rng() % kBlocks) * kB;
      Attr a;
      ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
      if (i % 2) {
        s.new_size = kBlocks * kB;  // a hole to the end: the writes there are ordinary
        ASSERT_EQ(r->fs->setattr(f, s, &a), 0);
      } else {
        const uint64_t from = a.size / kB;
        ASSERT_EQ(r->write(f, from * kB, stamped_run(from, kBlocks - from, 1)), 0);
      }
      ASSERT_EQ(r->fs->fsync(f, false), 0);  // commits: the freed blocks become free
    }
  }
  stop.store(true);
  for (auto& x : th) x.join();
  grower.join();
  auto verify = [&](const char* when) {
    const std::string all = r->read(f, 0, kBlocks * kB + 1);
    ASSERT_EQ(all.size() % kB, 0u) << when;
    for (uint64_t b = 0; b < all.size() / kB; ++b) {
      uint64_t tag;
      ASSERT_TRUE(check(all.data() + b * kB, b, &tag, true)) << when << " f block " << b;
    }
    const uint64_t gs = r->size(g);
    const std::string gd = r->read(g, 0, gs);
    for (uint64_t b = 0; b < gs / kB; ++b) {
      uint64_t tag;
      ASSERT_TRUE(check(gd.data() + b * kB, b, &tag) && tag == 9) << when << " g block " << b;
    }
  };
  verify("mounted");
  ASSERT_TRUE(r->remount());
  verify("remounted");
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test
