// The metadata cache's page pool (fs/src/page_pool.h): pages come back for reuse without new
// memory, no page is ever held by two takers at once (threads taking, writing, checking and
// giving while another trims), and trim() gives a free page's memory back to the kernel.
#include "page_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace warpfs::fs::test {
namespace {

TEST(PagePool, GivenPagesAreTakenAgainWithoutNewMemory) {
  PagePool& pool = PagePool::instance();
  std::vector<uint8_t*> held;
  for (int i = 0; i < 300; ++i) held.push_back(pool.take());
  std::set<uint8_t*> first(held.begin(), held.end());
  EXPECT_EQ(first.size(), held.size()) << "a page handed out twice";
  for (uint8_t* p : held) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % PagePool::kPage, 0u);
    std::memset(p, 0xa5, PagePool::kPage);  // every byte of it is the holder's
  }
  const PagePool::Counts before = pool.counts();
  for (uint8_t* p : held) pool.give(p);
  held.clear();
  for (int i = 0; i < 300; ++i) held.push_back(pool.take());
  EXPECT_EQ(pool.counts().chunks, before.chunks) << "reuse mapped new memory";
  for (uint8_t* p : held) EXPECT_EQ(first.count(p), 1u) << "not one of the pages given back";
  for (uint8_t* p : held) pool.give(p);
}

TEST(PagePool, NoPageIsHeldTwiceOrMiscountedUnderConcurrentTakeGiveAndTrim) {
  PagePool& pool = PagePool::instance();
  const size_t in_use = pool.counts().in_use;
  constexpr int kThreads = 8, kRounds = 4000, kHeld = 6;
  std::atomic<int> clobbered{0};
  std::atomic<bool> done{false};
  std::thread trimmer([&] {
    while (!done.load(std::memory_order_relaxed)) {
      pool.trim();
      std::this_thread::yield();
    }
  });
  // Every page of every chunk is held, free or being trimmed, and counted so, at any moment.
  std::atomic<int> miscounted{0};
  std::thread counter([&] {
    while (!done.load(std::memory_order_relaxed)) {
      const PagePool::Counts c = pool.counts();
      if (c.in_use + c.free_resident + c.free_released !=
          c.chunks * (PagePool::kChunk / PagePool::kPage))
        miscounted.fetch_add(1);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<uint8_t*> mine;
      for (int r = 0; r < kRounds; ++r) {
        uint8_t* p = pool.take();
        const uint8_t mark = static_cast<uint8_t>(t * 31 + r);
        std::memset(p, mark, PagePool::kPage);
        mine.push_back(p);
        if (mine.size() == kHeld || r + 1 == kRounds) {
          std::this_thread::yield();  // let the others take and give meanwhile
          for (size_t k = 0; k < mine.size(); ++k) {
            const uint8_t want = static_cast<uint8_t>(t * 31 + r - (mine.size() - 1 - k));
            for (size_t i = 0; i < PagePool::kPage; i += 512) {
              if (mine[k][i] != want) {
                clobbered.fetch_add(1);
                break;
              }
            }
            pool.give(mine[k]);
          }
          mine.clear();
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  done = true;
  trimmer.join();
  counter.join();
  EXPECT_EQ(clobbered.load(), 0) << "a page was written by another holder, or trimmed while held";
  EXPECT_EQ(miscounted.load(), 0) << "counts() that did not add up to the chunks' pages";
  EXPECT_EQ(pool.counts().in_use, in_use);
}

TEST(PagePool, TrimGivesFreePagesMemoryBack) {
  PagePool& pool = PagePool::instance();
  pool.trim();  // whatever earlier tests left warm
  std::vector<uint8_t*> held;
  for (int i = 0; i < 256; ++i) {
    held.push_back(pool.take());
    std::memset(held.back(), 0x5a, PagePool::kPage);
  }
  auto resident = [](uint8_t* p) {
    unsigned char v = 0;
    EXPECT_EQ(mincore(p, PagePool::kPage, &v), 0);
    return (v & 1) != 0;
  };
  for (uint8_t* p : held) ASSERT_TRUE(resident(p));
  for (uint8_t* p : held) pool.give(p);
  EXPECT_GE(pool.counts().free_resident, held.size());
  EXPECT_GE(pool.trim(), held.size());
  EXPECT_EQ(pool.counts().free_resident, 0u);
  int still = 0;
  for (uint8_t* p : held) still += resident(p) ? 1 : 0;
  EXPECT_EQ(still, 0) << "trimmed pages still hold memory";
  // A trimmed page taken again reads as a fresh one.
  uint8_t* p = pool.take();
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[PagePool::kPage - 1], 0);
  pool.give(p);
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define POOL_TEST_ASAN 1
#endif

// The optimised build hands out the page given back last (its lines are in the CPU's cache);
// under ASan the one given back longest ago, so that a stale pointer to a page just given
// back stays poisoned, and reported, for as long as the pool can.
TEST(PagePool, TheNextTakeIsTheNewestFreePageOrUnderAsanTheOldest) {
  PagePool& pool = PagePool::instance();
  uint8_t* a = pool.take();
  uint8_t* b = pool.take();
  pool.give(a);
  pool.give(b);
  uint8_t* c = pool.take();
#if defined(POOL_TEST_ASAN)
  EXPECT_NE(c, b);
#else
  EXPECT_EQ(c, b);
#endif
  pool.give(c);
}

TEST(PagePoolDeathTest, GivingAPageBackTwiceAbortsUnderAsan) {
#if !defined(POOL_TEST_ASAN)
  GTEST_SKIP() << "the check is ASan's poisoning";
#else
  EXPECT_DEATH(
      {
        PagePool& pool = PagePool::instance();
        uint8_t* p = pool.take();
        pool.give(p);
        pool.give(p);
      },
      "given back twice");
#endif
}

}  // namespace
}  // namespace warpfs::fs::test
