// The FUSE session loop's ReaderGate (fs/daemon/reader_gate.h): which idle workers wait in
// the kernel for a request and which park. A fake clock moves the load's windows on, so no
// test waits for time to pass.
#include "fs/daemon/reader_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace warpfs::daemon {
namespace {

std::atomic<uint64_t> g_now{1'000'000'000};
uint64_t fake_now() {
  return g_now.load();
}
void next_window() {
  g_now.fetch_add(ReaderGate::kWindowNs);
}

// Whether `p` has been woken (its semaphore posted), taking the wake-up.
bool woken(ReaderGate::Parking& p) {
  return sem_trywait(&p.sem) == 0;
}

// Eight workers (started with `start`), as a burst leaves them: all reading again, each once
// busy at the same time.
void burst_of_eight(ReaderGate& g, ReaderGate::Parking (&parking)[8], bool start_them = true) {
  if (start_them) {
    for (int i = 0; i < 8; ++i) g.add_reader();
  }
  ReaderGate::Parking* wake[ReaderGate::kWake];
  bool start = false;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(g.took(wake, &start), 0u);
    EXPECT_EQ(start, i == 7) << "only the last reader to take a request asks for another";
  }
  for (auto& p : parking) EXPECT_TRUE(g.done(&p)) << "nobody parks: the load used every reader";
  EXPECT_EQ(g.readers(), 8);
  EXPECT_EQ(g.parked(), 0u);
  EXPECT_EQ(g.spare(), 0);
}

// A gate (parking or not) with eight workers as a burst leaves them, `windows` windows ago,
// and the arguments of took() at hand.
struct AfterABurst {
  explicit AfterABurst(bool parks, int windows = 0) : g(parks, &fake_now) {
    burst_of_eight(g, parking);
    for (int w = 0; w < windows; ++w) next_window();
  }
  unsigned take() { return g.took(wake, &start); }
  // One request at a time until two read: parking[0..5] park, the last first.
  void park_six() {
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(take(), 0u);
      EXPECT_FALSE(start);
      ASSERT_FALSE(g.done(&parking[i])) << i;
    }
  }

  ReaderGate g;
  ReaderGate::Parking parking[8];
  ReaderGate::Parking* wake[ReaderGate::kWake];
  bool start = false;
};

TEST(ReaderGate, UnderALoadEveryWorkerKeepsReading) {
  AfterABurst b(true);
  // The same load again, window after window: nobody parks.
  for (int w = 0; w < 5; ++w) {
    next_window();
    burst_of_eight(b.g, b.parking, false);
  }
  for (auto& p : b.parking) EXPECT_FALSE(woken(p));
}

TEST(ReaderGate, WorkersParkDownToTwoReadersOnceTheRestWereSpareForAWholeWindow) {
  // One request at a time, in the window after the burst: the burst's window left no reader
  // idle, so nobody parks yet.
  AfterABurst b(true, 1);
  EXPECT_EQ(b.take(), 0u);
  EXPECT_TRUE(b.g.done(&b.parking[0]));
  EXPECT_EQ(b.g.spare(), 0);
  // A window later, seven readers were left idle all through the last one: each worker done
  // with a request parks until two read.
  next_window();
  b.park_six();
  EXPECT_EQ(b.g.readers(), 2);
  EXPECT_EQ(b.g.parked(), 6u);
  // Now the two readers alternate, and nobody is woken or parked.
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(b.take(), 0u);
    EXPECT_FALSE(b.start);
    EXPECT_TRUE(b.g.done(&b.parking[6 + i % 2]));
  }
  EXPECT_EQ(b.g.parked(), 6u);
  EXPECT_LT(b.g.spare(), ReaderGate::kMinReaders);
  // In the windows after, too.
  for (int w = 0; w < 3; ++w) {
    next_window();
    EXPECT_EQ(b.take(), 0u);
    EXPECT_TRUE(b.g.done(&b.parking[6]));
  }
  EXPECT_EQ(b.g.parked(), 6u);
  for (auto& p : b.parking) EXPECT_FALSE(woken(p));
}

// A gate that does not park (few CPUs: park_idle_workers) keeps every worker reading.
TEST(ReaderGate, AGateThatDoesNotParkKeepsEveryWorkerReading) {
  AfterABurst b(false, 3);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(b.take(), 0u);
    EXPECT_TRUE(b.g.done(&b.parking[i % 8]));
  }
  EXPECT_EQ(b.g.readers(), 8);
  EXPECT_EQ(b.g.parked(), 0u);
}

// A window with no request at all had every reader idle: after a quiet spell, the first
// worker done with a request parks at once.
TEST(ReaderGate, AfterAQuietSpellTheSpareReadersParkAtOnce) {
  AfterABurst b(true, 3);
  EXPECT_EQ(b.take(), 0u);
  EXPECT_FALSE(b.g.done(&b.parking[0]));
  EXPECT_EQ(b.g.parked(), 1u);
}

TEST(ReaderGate, TheLastReaderToTakeARequestWakesTheTwoParkedLast) {
  AfterABurst b(true, 2);
  b.park_six();
  // Two requests at once: the second takes the last reader.
  EXPECT_EQ(b.take(), 0u);
  ASSERT_EQ(b.take(), 2u);
  EXPECT_FALSE(b.start);
  EXPECT_EQ(b.wake[0], &b.parking[5]);
  EXPECT_EQ(b.wake[1], &b.parking[4]);
  EXPECT_EQ(b.g.readers(), 2);
  EXPECT_EQ(b.g.parked(), 4u);
  // Both of those take one too: the next two parked are woken, and so on until none is left.
  EXPECT_EQ(b.take(), 0u);
  ASSERT_EQ(b.take(), 2u);
  EXPECT_EQ(b.wake[0], &b.parking[3]);
  EXPECT_EQ(b.wake[1], &b.parking[2]);
  EXPECT_EQ(b.take(), 0u);
  ASSERT_EQ(b.take(), 2u);
  EXPECT_EQ(b.take(), 0u);
  EXPECT_EQ(b.take(), 0u);
  EXPECT_TRUE(b.start) << "with none parked, the loop is asked to start a worker";
  EXPECT_EQ(b.g.readers(), 0);
  EXPECT_EQ(b.g.parked(), 0u);
  // Eight busy now, no reader left: all of them read when done.
  for (auto& p : b.parking) EXPECT_TRUE(b.g.done(&p));
  EXPECT_EQ(b.g.readers(), 8);
}

// Workers as SessionLoop runs them, over a fake kernel queue of requests: bursts, then one request
// at a time, then bursts again, with the clock moved on between them. Every request must be served
// (a lost wake-up would leave one in the queue with every worker parked or waiting), and the light
// load must park workers.
TEST(ReaderGate, ThreadsServeBurstsAndSingleRequestsWithoutLosingAWakeUp) {
  constexpr unsigned kMaxWorkers = 16;
  ReaderGate g(true, &fake_now);
  std::mutex mu;
  std::condition_variable queued, served;
  std::deque<int> queue;    // mu: requests; -1 ends the worker that takes it
  uint64_t done_count = 0;  // mu
  unsigned ended = 0;       // mu: workers that took an end request
  std::atomic<unsigned> started{0};
  std::vector<std::thread> threads;  // grown by workers (start): guarded by spawn_mu
  std::mutex spawn_mu;
  std::unique_ptr<ReaderGate::Parking[]> parking(new ReaderGate::Parking[kMaxWorkers]);

  std::function<void(unsigned)> worker;
  auto start_worker = [&]() {
    std::lock_guard<std::mutex> l(spawn_mu);
    const unsigned id = started.load();
    if (id == kMaxWorkers) return;
    g.add_reader();
    started.store(id + 1);
    threads.emplace_back(worker, id);
  };
  worker = [&](unsigned id) {
    for (;;) {
      int req;
      {
        std::unique_lock<std::mutex> l(mu);
        queued.wait(l, [&] { return !queue.empty(); });
        req = queue.front();
        queue.pop_front();
      }
      ReaderGate::Parking* wake[ReaderGate::kWake];
      bool start = false;
      const unsigned n = g.took(wake, &start);
      for (unsigned i = 0; i < n; ++i) ReaderGate::wake(wake[i]);
      if (req < 0) {  // ends, and reads no more
        {
          std::lock_guard<std::mutex> l(mu);
          ++ended;
        }
        served.notify_all();
        return;
      }
      if (start) start_worker();
      // Counted served once the gate has had its say (no test of how soon after a reply the
      // next request comes: the single requests below come one after the other).
      const bool reads = g.done(&parking[id]);
      {
        std::lock_guard<std::mutex> l(mu);
        ++done_count;
      }
      served.notify_all();
      if (!reads) ReaderGate::wait(&parking[id]);
    }
  };
  start_worker();

  auto submit = [&](int n) {
    {
      std::lock_guard<std::mutex> l(mu);
      for (int i = 0; i < n; ++i) queue.push_back(i);
    }
    queued.notify_all();
  };
  uint64_t expected = 0;
  auto wait_served = [&]() {
    std::unique_lock<std::mutex> l(mu);
    return served.wait_for(l, std::chrono::seconds(60), [&] { return done_count == expected; });
  };
  for (int phase = 0; phase < 3; ++phase) {
    for (int burst = 0; burst < 50; ++burst) {
      submit(64);
      expected += 64;
      ASSERT_TRUE(wait_served()) << "a burst's requests stayed queued: phase " << phase;
    }
    for (int i = 0; i < 300; ++i) {
      if (i % 50 == 0) next_window();
      submit(1);
      expected += 1;
      ASSERT_TRUE(wait_served()) << "a single request stayed queued: phase " << phase;
    }
    if (started.load() > ReaderGate::kMinReaders) {
      EXPECT_GT(g.parked(), 0u) << "a light load after a burst parks the workers it needs not";
    }
    EXPECT_LE(g.readers(), ReaderGate::kMinReaders) << phase;
  }
  // End every worker: each takes an end request, and the last reader's wake-ups bring the
  // parked ones back to take theirs.
  const unsigned n = started.load();
  {
    std::lock_guard<std::mutex> l(mu);
    for (unsigned i = 0; i < n; ++i) queue.push_back(-1);
  }
  queued.notify_all();
  {
    std::unique_lock<std::mutex> l(mu);
    if (!served.wait_for(l, std::chrono::seconds(60), [&] { return ended == n; })) {
      // A worker left parked with nobody reading: joining would hang.
      ADD_FAILURE() << ended << " of " << n << " workers ended; " << g.parked() << " parked";
      std::abort();
    }
  }
  std::lock_guard<std::mutex> l(spawn_mu);
  for (auto& t : threads) t.join();
  EXPECT_EQ(g.parked(), 0u);
  EXPECT_TRUE(queue.empty());
}

}  // namespace
}  // namespace warpfs::daemon
