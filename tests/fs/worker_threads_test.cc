// The daemons' default FUSE worker counts (fs/daemon/worker_threads.h): from the CPUs the
// daemon may run on, not the machine's.
#include "fs/daemon/worker_threads.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <thread>

namespace warpfs::daemon {
namespace {

TEST(WorkerThreads, OnePerTwoCpusForAPromptDeviceTwoPerCpuForASlowOneWithinBounds) {
  EXPECT_EQ(default_max_threads(1), 10u);  // libfuse's default at least
  EXPECT_EQ(default_max_threads(2), 10u);
  EXPECT_EQ(default_max_threads(16), 10u);
  EXPECT_EQ(default_max_threads(21), 10u);
  EXPECT_EQ(default_max_threads(22), 11u);
  EXPECT_EQ(default_max_threads(64), 32u);
  EXPECT_EQ(default_max_threads(128), 64u);
  EXPECT_EQ(default_max_threads(512), 64u);
  EXPECT_EQ(slow_device_max_threads(1), 24u);
  EXPECT_EQ(slow_device_max_threads(12), 24u);
  EXPECT_EQ(slow_device_max_threads(16), 32u);
  EXPECT_EQ(slow_device_max_threads(32), 64u);
  EXPECT_EQ(slow_device_max_threads(33), 64u);
  EXPECT_EQ(slow_device_max_threads(4096), 64u);
}

// A slow device's count only where handlers wait out its commands: not where it is prompt,
// nor where reapers answer the reads.
TEST(WorkerThreads, TheSlowDeviceCountOnlyWhereNoReaperAnswersReads) {
  EXPECT_EQ(default_worker_threads(true, 0, 16), 10u);
  EXPECT_EQ(default_worker_threads(true, 4, 16), 10u);
  EXPECT_EQ(default_worker_threads(false, 4, 16), 10u);
  EXPECT_EQ(default_worker_threads(false, 0, 16), 32u);
  EXPECT_EQ(default_worker_threads(false, 0, 2), 24u);
  EXPECT_EQ(default_worker_threads(false, default_read_reapers(2), 2), 24u);  // none on 2
  EXPECT_EQ(default_worker_threads(false, default_read_reapers(64), 64), 32u);
}

TEST(WorkerThreads, IdleWorkersParkOnEightCpusOrMore) {
  EXPECT_FALSE(park_idle_workers(1));
  EXPECT_FALSE(park_idle_workers(2));
  EXPECT_FALSE(park_idle_workers(7));
  EXPECT_TRUE(park_idle_workers(8));
  EXPECT_TRUE(park_idle_workers(16));
}

// A daemon started under taskset (or in a cpuset) counts the CPUs of its mask.
TEST(WorkerThreads, TheCpusCountedAreThoseOfTheAffinityMask) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(usable_cpus(), static_cast<unsigned>(CPU_COUNT(&all)));
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c) {
    if (CPU_ISSET(c, &all)) first = c;
  }
  ASSERT_GE(first, 0);
  unsigned in_thread = 0;
  std::thread t([&] {  // a thread of its own: the test's own mask stays as it was
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0) in_thread = usable_cpus();
  });
  t.join();
  EXPECT_EQ(in_thread, 1u);
}

// Reapers of reads (read_reaper.h): none below 4 CPUs, where each hand-off cost more than it
// saved; then three per 4 CPUs, at most 32.
TEST(WorkerThreads, ReadReapersStartAtFourCpusThreePerFour) {
  EXPECT_EQ(default_read_reapers(1), 0u);
  EXPECT_EQ(default_read_reapers(2), 0u);
  EXPECT_EQ(default_read_reapers(3), 0u);
  EXPECT_EQ(default_read_reapers(4), 3u);
  EXPECT_EQ(default_read_reapers(7), 5u);
  EXPECT_EQ(default_read_reapers(16), 12u);
  EXPECT_EQ(default_read_reapers(42), 31u);
  EXPECT_EQ(default_read_reapers(64), 32u);
}

}  // namespace
}  // namespace warpfs::daemon
