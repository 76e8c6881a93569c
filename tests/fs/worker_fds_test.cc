// The FUSE session loop's table of which /dev/fuse descriptor each request came from
// (fs/daemon/worker_fds.h), without a mount: what it finds, what it forgets, and that many
// threads noting and looking up at once never get a descriptor for a request it was not
// noted with unless that slot was being rewritten (the reply's ENOENT fallback covers that).
#include "fs/daemon/worker_fds.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace warpfs::daemon {
namespace {

TEST(WorkerFds, FindsTheDescriptorEachRequestWasNotedWith) {
  auto t = std::make_unique<WorkerFds>();
  // FUSE's uniques step by two; a burst of requests from four workers' descriptors.
  for (uint64_t u = 2; u < 2 + 2 * 1000; u += 2) t->note(u, 10 + static_cast<int>(u / 2 % 4));
  for (uint64_t u = 2; u < 2 + 2 * 1000; u += 2) {
    ASSERT_EQ(t->find(u), 10 + static_cast<int>(u / 2 % 4)) << "unique " << u;
  }
}

TEST(WorkerFds, AnUnknownOrOverwrittenRequestIsNotFound) {
  auto t = std::make_unique<WorkerFds>();
  EXPECT_EQ(t->find(2), -1);  // never noted
  t->note(2, 7);
  // Enough later requests that every slot has been taken again: the first is forgotten,
  // not answered with a later request's descriptor.
  for (uint64_t u = 4; u < 4 + 2 * uint64_t{WorkerFds::kSlots} * 4; u += 2) t->note(u, 8);
  EXPECT_EQ(t->find(2), -1);
  EXPECT_EQ(t->find(4 + 2 * uint64_t{WorkerFds::kSlots} * 4 - 2), 8);
}

TEST(WorkerFds, TheFallbackListSeesEveryWorkerAndStopsAtTheFirstThatTakes) {
  auto t = std::make_unique<WorkerFds>();
  EXPECT_EQ(t->size(), 0u);
  EXPECT_FALSE(t->any([](int) { return true; }));  // no worker: nothing to try
  for (int fd = 20; fd < 25; ++fd) t->add(fd);
  EXPECT_EQ(t->size(), 5u);
  std::vector<int> tried;
  EXPECT_TRUE(t->any([&](int fd) {
    tried.push_back(fd);
    return fd == 22;
  }));
  EXPECT_EQ(tried, (std::vector<int>{20, 21, 22}));
  tried.clear();
  EXPECT_FALSE(t->any([&](int fd) {
    tried.push_back(fd);
    return false;
  }));
  EXPECT_EQ(tried.size(), 5u);
}

// Readers note requests while repliers look them up, as the session's workers and reapers
// do. A lookup may miss (-1), or, while another request rewrites that slot, name that other
// request's descriptor; it must never name one that no request of the same slot had. Each
// request's descriptor here is its unique / 2, so the request a wrong one came from is known.
TEST(WorkerFds, ConcurrentNotesAndLookupsNeverInventADescriptor) {
  auto t = std::make_unique<WorkerFds>();
  constexpr int kReaders = 4, kRepliers = 4;
  constexpr uint64_t kPerReader = 200000;
  std::atomic<uint64_t> next{2};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> found{0}, right{0}, bad{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&] {
      for (uint64_t i = 0; i < kPerReader; ++i) {
        const uint64_t u = next.fetch_add(2);
        t->note(u, static_cast<int>(u / 2));
      }
    });
  }
  for (int r = 0; r < kRepliers; ++r) {
    threads.emplace_back([&, r] {
      uint64_t seed = 88172645463325252ull + static_cast<uint64_t>(r);
      while (!stop.load(std::memory_order_relaxed)) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        const uint64_t top = next.load(std::memory_order_relaxed);
        const uint64_t back = 2 * (seed % (2 * WorkerFds::kSlots)) + 2;
        if (top <= back + 2) continue;
        const uint64_t u = top - back;  // a recent request, noted or about to be
        const int fd = t->find(u);
        if (fd < 0) continue;
        found.fetch_add(1, std::memory_order_relaxed);
        const uint64_t from = 2 * static_cast<uint64_t>(fd);  // the request fd was noted with
        if (from == u) {
          right.fetch_add(1, std::memory_order_relaxed);
        } else if (WorkerFds::index(from) != WorkerFds::index(u)) {
          bad.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) threads[static_cast<size_t>(r)].join();
  stop = true;
  for (size_t i = kReaders; i < threads.size(); ++i) threads[i].join();
  EXPECT_GT(right.load(), 0u) << found.load() << " found";
  EXPECT_EQ(bad.load(), 0u);
}

}  // namespace
}  // namespace warpfs::daemon
