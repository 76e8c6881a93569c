// Reads answered after their handler returns (Filesystem::read_start, the daemon's
// ReadReaper): the lock's detached holds that keep a file's blocks while its reads are in
// flight, the filesystem's pending reads over a device with a latency model (with and without
// the software cache), and the reaper that answers them, each from several threads at once.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "fs/core_rig.h"
#include "fs/daemon/read_reaper.h"
#include "locks.h"

namespace warpfs::fs::test {
namespace {

using port::now_ns;  // CLOCK_MONOTONIC

// A detached hold, taken under a shared hold and released by another thread, keeps lock()
// waiting and try_lock() failing until it goes; shared holders still come and go meanwhile.
TEST(AsyncRead, DetachedHoldKeepsTheExclusiveLockerWaitingUntilAnotherThreadReleasesIt) {
  SharedMutex m;
  m.lock_shared();
  m.hold_detached();
  m.unlock_shared();
  EXPECT_FALSE(m.try_lock());
  ASSERT_TRUE(m.try_lock_shared());  // readers are not held off by the hold itself
  m.unlock_shared();
  std::atomic<bool> released{false}, locked{false};
  std::thread locker([&] {
    m.lock();
    EXPECT_TRUE(released.load()) << "lock() returned with a detached hold left";
    locked = true;
    m.unlock();
  });
  while (!m.writer_waiting()) std::this_thread::yield();  // the locker is in lock()
  for (int i = 0; i < 1000; ++i) {  // and stays there, asleep or not, while the hold is left
    ASSERT_FALSE(locked.load());
    std::this_thread::yield();
  }
  std::thread releaser([&] {
    released = true;
    m.release_detached();
  });
  releaser.join();
  locker.join();
  EXPECT_TRUE(locked.load());
  ASSERT_TRUE(m.try_lock());
  m.unlock();
}

// Many holds from many threads: every lock() sees none left, whatever the interleaving, and
// some lock() calls begin while holds are out (the case the drain in lock() is for).
TEST(AsyncRead, DetachedHoldsFromManyThreadsNeverOverlapAnExclusiveHolder) {
  SharedMutex m;
  std::atomic<int> outstanding{0};  // holds taken and not yet released
  std::atomic<bool> stop{false}, locking{false}, seen_holds{false};
  std::vector<std::thread> th;
  for (int t = 0; t < 3; ++t) {
    th.emplace_back([&] {
      while (!locking.load()) std::this_thread::yield();  // the exclusive locker runs
      // 2,000 holds, and on until the locker has come while some were out.
      for (int i = 0; i < 2000 || !seen_holds.load(); ++i) {
        m.lock_shared();
        m.hold_detached();
        outstanding.fetch_add(1);
        m.unlock_shared();
        std::this_thread::yield();
        outstanding.fetch_sub(1);
        m.release_detached();
      }
    });
  }
  uint64_t locks = 0;
  std::thread exclusive([&] {
    locking = true;
    while (!stop.load()) {
      if (outstanding.load() > 0) seen_holds = true;  // this lock() begins with holds out
      m.lock();
      ++locks;
      EXPECT_EQ(outstanding.load(), 0);
      m.unlock();
    }
  });
  for (auto& t : th) t.join();
  stop = true;
  exclusive.join();
  EXPECT_GT(locks, 0u);
}

// The reapers answer every item once, on their own threads, whichever thread added it and in
// whatever order the items end; stop() answers what is left before it returns.
TEST(AsyncRead, ReaperAnswersEveryItemOnceAndStopAnswersTheRest) {
  struct Shared {
    std::mutex mu;
    std::map<int, int> answers;           // mu
    std::set<std::thread::id> answerers;  // mu
  } sh;
  class Item final : public daemon::ReadReaper::Item {
   public:
    Item(Shared& s, int id, uint64_t ends_at) : s_(s), id_(id), ends_at_(ends_at) {}
    bool poll() override { return now_ns() >= ends_at_; }
    void idle(port::Backoff& b) override { b.pause(); }
    void answer() override {
      std::lock_guard<std::mutex> g(s_.mu);
      ++s_.answers[id_];
      s_.answerers.insert(std::this_thread::get_id());
    }

   private:
    Shared& s_;
    int id_;
    uint64_t ends_at_;
  };
  constexpr int kThreads = 4, kEach = 500;
  daemon::ReadReaper reaper;
  reaper.start(3);
  std::set<std::thread::id> adders{std::this_thread::get_id()};
  std::mutex adders_mu;
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([&, t] {
      {
        std::lock_guard<std::mutex> g(adders_mu);
        adders.insert(std::this_thread::get_id());
      }
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int i = 0; i < kEach; ++i) {
        // Ends from now to 200 µs on: out of order, some at once.
        reaper.enter();
        reaper.add(std::make_unique<Item>(sh, t * kEach + i, now_ns() + rng() % 200'000));
      }
    });
  }
  for (auto& x : th) x.join();
  reaper.enter();
  reaper.add(std::make_unique<Item>(sh, -1, now_ns() + 20'000'000));  // left for stop()
  reaper.stop();
  EXPECT_EQ(reaper.answered(), uint64_t{kThreads} * kEach + 1);
  EXPECT_EQ(reaper.in_flight(), 0u);  // each counted out once
  std::lock_guard<std::mutex> g(sh.mu);
  EXPECT_EQ(sh.answers.size(), size_t{kThreads} * kEach + 1);
  for (const auto& [id, n] : sh.answers) EXPECT_EQ(n, 1) << "item " << id;
  EXPECT_GE(sh.answerers.size(), 1u);
  EXPECT_LE(sh.answerers.size(), 3u);
  for (const auto& id : sh.answerers) EXPECT_EQ(adders.count(id), 0u) << "answered by an adder";
}

// A 50 ms device: the read of a file's extent is in flight when read_start returns, over the
// software cache or straight to the namespace, with the holes beside it zeroed. A truncate of
// the file meanwhile returns only after the read has ended (its blocks stay the file's until
// then: DetachedHolds); the data is the file's. What read_start does not leave in flight: two
// extents, holes alone, past the end, an unaligned start, a buffer without room for whole
// blocks (each read at once, the same bytes as read()); a device that fails (EIO, logged).
class AsyncReadOverDevice : public ::testing::TestWithParam<uint64_t> {};

TEST_P(AsyncReadOverDevice, ReadStartLeavesReadsInFlightAndATruncateWaitsForThem) {
  nvme::EmulatedConfig cfg;
  cfg.latency_ns = 50'000'000;
  auto r = Rig::make(64, {}, nvme::EngineOptions{}.io_timeout_ns, cfg, GetParam());
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  ASSERT_NE(f, 0u);
  // Blocks 0-39 written, 40-42 a hole to the file's end (100 bytes into block 42). A write of
  // 32 blocks or more goes around the software cache: its lines do not hold them.
  constexpr size_t kBuf = 96 * kBlockSize;
  const std::string a = pattern(f, 0, 40 * kBlockSize);
  ASSERT_EQ(r->write(f, 0, a), 0);
  SetAttr grow;
  grow.size = true;
  grow.new_size = 42 * kBlockSize + 100;
  Attr attr;
  ASSERT_EQ(r->fs->setattr(f, grow, &attr), 0);
  ASSERT_EQ(r->fs->fsync(f, false), 0);
  // Over a RAID set (WARPFS_TEST_RAID) a read left in flight lies on one member: one block
  // (the file's 40 span several stripes, and such a range is read at once), the first that
  // no member's cache holds (a write's pieces under 32 blocks, the cache's bypass, are
  // cached by their member: those read at once).
  const bool raid = TestDevices::raid_level() >= 0;
  void* mem = nullptr;
  ASSERT_TRUE(r->dev->alloc_io_buffer(kBuf, &mem).is_ok());
  char* buf = static_cast<char*>(mem);
  std::memset(buf, 0x5a, kBuf);

  std::unique_ptr<Filesystem::PendingRead> pending;
  size_t got = 0;
  uint64_t at = 0;  // the block read first
  ASSERT_EQ(r->fs->read_start(f, 0, raid ? kBlockSize : kBuf, buf, kBuf, &got, &pending), 0);
  while (raid && pending == nullptr && ++at < 40) {
    ASSERT_EQ(r->fs->read_start(f, at * kBlockSize, kBlockSize, buf, kBuf, &got, &pending), 0);
  }
  if (raid && pending == nullptr && GetParam() != 0) {
    r->dev->free_io_buffer(mem, kBuf);
    GTEST_SKIP() << "the members' caches hold all 40 blocks (the set cut the write into "
                    "pieces under 32 blocks): every read ends at once";
  }
  ASSERT_NE(pending, nullptr) << "a 50 ms device's read ended at once";
  uint64_t truncated_at = 0;
  std::thread truncater([&] {
    SetAttr s;
    s.size = true;
    s.new_size = 0;
    Attr out;
    EXPECT_EQ(r->fs->setattr(f, s, &out), 0);
    truncated_at = now_ns();
  });
  uint64_t last_poll = 0;  // when the poll that saw the read end began
  for (;;) {
    const uint64_t t = now_ns();
    if (pending->poll()) {
      last_poll = t;
      break;
    }
    std::this_thread::yield();
  }
  truncater.join();
  EXPECT_GT(truncated_at, last_poll) << "the truncate ended while the read was in flight";
  ASSERT_EQ(pending->result(&got), 0);
  if (raid) {
    ASSERT_EQ(got, kBlockSize);
    EXPECT_EQ(std::string(buf, kBlockSize), a.substr(at * kBlockSize, kBlockSize));
  } else {
    ASSERT_EQ(got, 42 * kBlockSize + 100);
    EXPECT_EQ(std::string(buf, a.size()), a);
    EXPECT_EQ(std::string(buf + 40 * kBlockSize, 2 * kBlockSize + 100),
              std::string(2 * kBlockSize + 100, '\0'));
  }
  pending.reset();
  EXPECT_EQ(r->size(f), 0u);

  // Read at once, the same bytes as read(): two extents (the second after a hole), a hole
  // alone, past the end, an unaligned start, no room for the whole last block.
  const std::string b1 = pattern(f, 0, 40 * kBlockSize);
  const std::string b2 = pattern(f, 50 * kBlockSize, 40 * kBlockSize);
  ASSERT_EQ(r->write(f, 0, b1), 0);
  ASSERT_EQ(r->write(f, 50 * kBlockSize, b2), 0);
  const std::string want = r->read(f, 0, kBuf);
  ASSERT_EQ(want.size(), 90 * kBlockSize);
  ASSERT_EQ(r->fs->read_start(f, 0, kBuf, buf, kBuf, &got, &pending), 0);
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(std::string(buf, got), want);
  ASSERT_EQ(r->fs->read_start(f, 42 * kBlockSize, 4 * kBlockSize, buf, kBuf, &got, &pending), 0);
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(std::string(buf, got), std::string(4 * kBlockSize, '\0'));
  ASSERT_EQ(r->fs->read_start(f, 90 * kBlockSize, kBlockSize, buf, kBuf, &got, &pending), 0);
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(got, 0u);
  ASSERT_EQ(r->fs->read_start(f, 10, 100, buf, kBuf, &got, &pending), 0);
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(std::string(buf, got), want.substr(10, 100));
  ASSERT_EQ(r->fs->read_start(f, 0, 100, buf, 100, &got, &pending), 0);
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(std::string(buf, got), want.substr(0, 100));
  EXPECT_EQ(r->check_and_remount(), "");

  // The device fails: EIO, the failing read logged, nothing left held (the unmount's
  // truncate-free path aside, a later lock of the file's rw would hang on a leaked hold).
  r->cut->cut();
  EXPECT_EQ(r->fs->read_start(f, 0, 4 * kBlockSize, buf, kBuf, &got, &pending), EIO);
  EXPECT_EQ(pending, nullptr);
  EXPECT_NE(r->log.find("read of blocks"), std::string::npos) << r->log;
  r->dev->free_io_buffer(mem, kBuf);
}

INSTANTIATE_TEST_SUITE_P(CacheMb, AsyncReadOverDevice, ::testing::Values(0, 8));

// Readers with reads in flight on a 200 µs device, each polled to its end by another thread
// (a reaper of their own), while writers truncate, write whole and rewrite the same files:
// every block a read returns is zero or the stamp of that file and block, never another's,
// and the filesystem checks clean after.
TEST(AsyncRead, ReadsInFlightWithTruncatesAndRewritesReturnOnlyTheFilesBlocks) {
  nvme::EmulatedConfig cfg;
  cfg.latency_ns = 200'000;
  // No software cache: its lines would hold every block written, and no read would go to the
  // device (the test above covers reads through the cache).
  auto r = Rig::make(64, {}, nvme::EngineOptions{}.io_timeout_ns, cfg, 0);
  ASSERT_TRUE(r);
  constexpr int kFiles = 4, kBlocks = 16;
  Ino files[kFiles];
  auto stamp = [](Ino ino, uint64_t block, uint32_t gen) {
    std::string s(kBlockSize, '\0');
    for (size_t i = 0; i + 16 <= s.size(); i += 16) {
      std::memcpy(&s[i], &ino, 8);
      const uint64_t tag = block << 32 | gen;
      std::memcpy(&s[i + 8], &tag, 8);
    }
    return s;
  };
  for (int i = 0; i < kFiles; ++i) {
    files[i] = r->create(kRootInode, "f" + std::to_string(i));
    ASSERT_NE(files[i], 0u);
  }
  std::mutex file_mu[kFiles];
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, in_flight{0};
  std::vector<std::thread> th;
  // Each file one extent, so that its reads go to the device in one piece (read_start's
  // case): truncated to nothing and written whole again, or a block rewritten in place.
  for (int w = 0; w < 2; ++w) {
    th.emplace_back([&, w] {
      std::mt19937 rng(static_cast<uint32_t>(w + 10));
      for (uint32_t gen = 1; gen < 150; ++gen) {
        const int k = static_cast<int>(rng() % kFiles);
        const Ino f = files[k];
        std::lock_guard<std::mutex> g(file_mu[k]);  // one writer of a file at a time
        if (r->size(f) == 0) {
          std::string all;
          for (uint64_t b = 0; b < kBlocks; ++b) all += stamp(f, b, gen);
          EXPECT_EQ(r->write(f, 0, all), 0);
        } else if (rng() % 4 == 0) {
          SetAttr s;
          s.size = true;
          s.new_size = 0;
          Attr out;
          EXPECT_EQ(r->fs->setattr(f, s, &out), 0);
        } else {
          const uint64_t b = rng() % kBlocks;
          EXPECT_EQ(r->write(f, b * kBlockSize, stamp(f, b, gen)), 0);
        }
      }
    });
  }
  for (int rd = 0; rd < 2; ++rd) {
    th.emplace_back([&, rd] {
      std::mt19937 rng(static_cast<uint32_t>(rd + 20));
      void* mem = nullptr;
      ASSERT_TRUE(r->dev->alloc_io_buffer(kBlocks * kBlockSize, &mem).is_ok());
      char* buf = static_cast<char*>(mem);
      while (!stop.load()) {
        const int k = static_cast<int>(rng() % kFiles);
        std::unique_ptr<Filesystem::PendingRead> pending;
        size_t got = 0;
        ASSERT_EQ(r->fs->read_start(files[k], 0, kBlocks * kBlockSize, buf, kBlocks * kBlockSize,
                                    &got, &pending),
                  0);
        if (pending != nullptr) {
          in_flight.fetch_add(1);
          std::thread poller([&] {  // another thread sees it through, as the reaper does
            port::Backoff b;
            while (!pending->poll()) pending->idle(b);
          });
          poller.join();
          ASSERT_EQ(pending->result(&got), 0);
        }
        reads.fetch_add(1);
        // Each 16-byte unit zero, or this file's stamp for this block (a read racing an
        // overwrite of a block may see part of each generation, as through the kernel).
        for (size_t off = 0; off + 16 <= got; off += 16) {
          const uint64_t b = off / kBlockSize;
          Ino ino = 0;
          uint64_t tag = 0;
          std::memcpy(&ino, buf + off, 8);
          std::memcpy(&tag, buf + off + 8, 8);
          const bool ok = (ino == 0 && tag == 0) || (ino == files[k] && (tag >> 32) == b);
          ASSERT_TRUE(ok) << "file " << k << " block " << b << " +" << off % kBlockSize
                          << ": neither zero nor its stamp";
        }
      }
      r->dev->free_io_buffer(mem, kBlocks * kBlockSize);
    });
  }
  th[0].join();
  th[1].join();
  stop = true;
  th[2].join();
  th[3].join();
  EXPECT_GT(reads.load(), 0u);
  EXPECT_GT(in_flight.load(), 0u) << "no read was left in flight";
  EXPECT_EQ(r->check_and_remount(), "");
}

}  // namespace
}  // namespace warpfs::fs::test
