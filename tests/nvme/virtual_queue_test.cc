// The BaM queue protocol under many threads over few small queues, the warp's asynchronous
// form, and the locked baseline, each block's content verified. Test names with
// "Concurrent" run under TSan in CI.
#include "warpfs/nvme/virtual_queue.h"

#include <atomic>
#include <memory>
#include <thread>

#include "nvme/rig.h"
#include "warpfs/nvme/check.h"
#include "warpfs/nvme/io_batch.h"
#include "warpfs/nvme/io_engine.h"
#include "warpfs/nvme/locked_queue.h"

namespace warpfs::nvme::test {
namespace {

// WARPFS_DCHECK (check.h): compiled out, the condition is never evaluated.
TEST(DebugCheck, TheConditionRunsOnlyWhereChecksAreCompiledIn) {
  int evaluated = 0;
  WARPFS_DCHECK(++evaluated > 0, "counts its evaluations");
  EXPECT_EQ(evaluated, port::kDebugChecks ? 1 : 0);
}

TEST(DebugCheckDeathTest, AViolatedRequiresAborts) {
  if (!port::kDebugChecks) GTEST_SKIP() << "built without WARPFS_DEBUG_CHECKS";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // TSan: no fork() from a threaded process
  EXPECT_DEATH(WARPFS_DCHECK(1 + 1 == 3, "arithmetic"),
               "virtual_queue_test.cc:[0-9]+: check failed: 1 \\+ 1 == 3 \\(arithmetic\\)");
  // VirtualQueue::init: entries a power of two in 2..65536 (the check runs before the memory
  // is touched).
  QueueView q;
  q.entries = 3;
  alignas(port::kCacheLine) static uint8_t mem[1];
  EXPECT_DEATH(VirtualQueue::init(mem, q), "a power of two in 2..65536");
  q.entries = 1u << 17;
  EXPECT_DEATH(VirtualQueue::init(mem, q), "a power of two in 2..65536");
}

TEST(VirtualQueue, SingleThreadWrapsSmallQueueManyTimes) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  VirtualQueuePtr vq = make_virtual_queue(v);
  DmaRegion buf = r->alloc(kPage);
  for (uint64_t i = 0; i < 500; ++i) {
    const uint64_t lba = (i * 37) % 1000;
    fill_pattern(buf.vaddr, r->lba, lba, i);
    SubmissionEntry w = make_write(r->nsid, lba, 1);
    w.prp1 = buf.iova;
    ASSERT_EQ(vq->execute(w), 0);
    std::memset(buf.vaddr, 0, r->lba);
    SubmissionEntry rd = make_read(r->nsid, lba, 1);
    rd.prp1 = buf.iova;
    ASSERT_EQ(vq->execute(rd), 0);
    ASSERT_TRUE(check_pattern(buf.vaddr, r->lba, lba, i)) << i;
  }
  EXPECT_EQ(vq->outstanding(), 0u);
}

TEST(VirtualQueue, ErrorsComeBackToTheirOwnThread) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 4, QueuePriority::kMedium, &v).is_ok());
  VirtualQueuePtr vq = make_virtual_queue(v);
  DmaRegion buf = r->alloc(kPage);
  SubmissionEntry bad = make_read(r->nsid, r->lbas, 1);  // one past the end
  bad.prp1 = buf.iova;
  const uint16_t got = vq->execute(bad);
  EXPECT_TRUE(r->lba_range_status(got)) << std::hex << got;
  SubmissionEntry good = make_read(r->nsid, r->lbas - 1, 1);
  good.prp1 = buf.iova;
  EXPECT_EQ(vq->execute(good), 0);
}

// A keyed interrupt line (InterruptLine): raise_key(k) releases a thread asleep on key k
// and leaves every other key's sequence alone. The waiter sleeps with no timeout, so a lost
// wake-up hangs the test (ctest's timeout fails it) instead of passing late.
TEST(InterruptLine, ConcurrentKeyedWaiterWakesOnItsOwnKey) {
  auto line = std::make_unique<InterruptLine>();
  line->keyed = true;
  const uint32_t mine = InterruptLine::key(3, 17);
  const uint32_t other = InterruptLine::key(3, 18);
  ASSERT_NE(mine, other);
  const uint32_t seen = line->key_seq(mine);
  std::atomic<bool> woken{false};
  std::thread waiter([&] {
    while (line->key_seq(mine) == seen) line->wait_key(mine, seen, 0);
    woken.store(true);
  });
  line->raise_key(other);
  EXPECT_EQ(line->key_seq(mine), seen);
  line->raise_key(mine);
  waiter.join();
  EXPECT_TRUE(woken.load());
  EXPECT_EQ(line->key_seq(mine), seen + 1);
  EXPECT_EQ(line->key_seq(other), 1u);
}

// A line learns how far its completions are (InterruptLine, "Far completions"): waits of
// hundreds of microseconds make it far, and its waiters then sleep after kFarSteps back-off
// steps instead of yielding through all of Backoff's (on a keyed line only); short waits bring
// the long yield back.
// A prompt keyed line sleeps right after its spin whatever it noted.
TEST(InterruptLine, WaitersSleepSoonerWhereCompletionsAreFar) {
  auto line = std::make_unique<InterruptLine>();
  line->keyed = true;
  auto steps_before_sleep = [&] {
    port::Backoff b;
    uint32_t n = 0;
    while (!line->sleep_now(b) && n < 1000) {
      b.yield_only();  // no spinning or sleeping in the test: only the count matters
      ++n;
      b.pause();
    }
    return n;
  };
  EXPECT_FALSE(line->far());
  const uint32_t near_steps = steps_before_sleep();
  EXPECT_GT(near_steps, InterruptLine::kFarSteps * 4);
  for (int i = 0; i < 40; ++i) line->note_wait(300'000);
  EXPECT_TRUE(line->far());
  EXPECT_EQ(steps_before_sleep(), InterruptLine::kFarSteps);
  line->keyed = false;  // a line whose every completion wakes all its sleepers keeps yielding
  EXPECT_EQ(steps_before_sleep(), near_steps);
  line->keyed = true;
  for (int i = 0; i < 60; ++i) line->note_wait(5'000);
  EXPECT_FALSE(line->far());
  EXPECT_EQ(steps_before_sleep(), near_steps);
  line->prompt = true;
  for (int i = 0; i < 40; ++i) line->note_wait(300'000);
  port::Backoff b;
  EXPECT_FALSE(line->sleep_now(b));
  while (b.spinning()) b.pause();
  EXPECT_TRUE(line->sleep_now(b)) << "a prompt keyed line sleeps once the spin is over";
}

// The estimate settles on a steady sample, whichever side of kFarUs it comes from (an
// eighth of the way each time, at least 1 µs), and a sample counts as at most kFarUs * 2.
TEST(InterruptLine, TheWaitEstimateSettlesOnASteadySample) {
  auto line = std::make_unique<InterruptLine>();
  line->keyed = true;
  for (int i = 0; i < 100; ++i) line->note_wait(300'000);
  EXPECT_EQ(line->wait_us.value.load(port::Order::kRelaxed), InterruptLine::kFarUs * 2);
  for (int i = 0; i < 100; ++i) line->note_wait((InterruptLine::kFarUs - 1) * 1000);
  EXPECT_EQ(line->wait_us.value.load(port::Order::kRelaxed), InterruptLine::kFarUs - 1);
  EXPECT_FALSE(line->far());
  for (int i = 0; i < 100; ++i) line->note_wait(InterruptLine::kFarUs * 1000);
  EXPECT_EQ(line->wait_us.value.load(port::Order::kRelaxed), InterruptLine::kFarUs);
  EXPECT_TRUE(line->far());
}

// A wait ends at the line's last raise where that came after the waiter's first poll in
// vain, not when the waiter noted it (a sleeper's wake-up is not the device's latency); a
// raise from before the wait began does not end it.
TEST(InterruptLine, AWaitEndsAtTheLinesLastRaise) {
  auto line = std::make_unique<InterruptLine>();
  line->keyed = true;
  ASSERT_TRUE(line->learns());
  line->raise_key(InterruptLine::key(1, 2));
  const uint64_t raised = line->raised_ns.value.load(port::Order::kRelaxed);
  ASSERT_NE(raised, 0u);
  // The clock well past the raise (a busy wait on the clock: only the difference matters).
  while (port::now_ns() < raised + 2'000'000) {
  }
  for (int i = 0; i < 100; ++i) line->note_wait_since(raised - 10'000);
  EXPECT_EQ(line->wait_us.value.load(port::Order::kRelaxed), 10u) << "ended at the raise";
  for (int i = 0; i < 100; ++i) line->note_wait_since(raised + 1);
  EXPECT_TRUE(line->far()) << "a raise before the wait began does not end it";
}

// The waiters of a queue over a slow device teach its line that completions are far: each
// waits at least the device's latency, whatever the scheduler does. (That short waits make
// the line near again is WaitersSleepSoonerWhereCompletionsAreFar's: over a device with no
// latency, how long a waiter waits is the scheduler's to say, and a loaded machine can
// deschedule the controller's worker for milliseconds.)
TEST(InterruptLine, WaitersLearnTheirDevicesLatency) {
  WARPFS_EMULATED_ONLY() << "sets the model's latency";
  EmulatedConfig cfg;
  cfg.latency_ns = 200'000;
  cfg.inline_io = false;  // completions from the worker thread: the line is not prompt
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  ASSERT_NE(v.irq, nullptr);
  ASSERT_FALSE(v.irq->prompt);
  ASSERT_TRUE(v.irq->learns());
  EXPECT_FALSE(v.irq->far()) << "a new line starts near";
  VirtualQueuePtr vq = make_virtual_queue(v);
  DmaRegion buf = r->alloc(kPage);
  for (uint64_t i = 0; i < 40; ++i) {
    SubmissionEntry rd = make_read(r->nsid, i, 1);
    rd.prp1 = buf.iova;
    ASSERT_EQ(vq->execute(rd), 0);
  }
  EXPECT_TRUE(v.irq->far()) << "learned " << v.irq->wait_us.value.load(port::Order::kRelaxed)
                            << " us";
}

// The emulated controller's lines are keyed, and each CQE it posts raises the key of its
// (SQ, CID), and no other: what a waiter in VirtualQueue::wait or IoBatch::wait_all sleeps on.
TEST(InterruptLine, TheEmulatedControllerRaisesEachCompletionsKey) {
  WARPFS_EMULATED_ONLY() << "a VFIO or TCP line names no command: it is not keyed";
  EmulatedConfig cfg;
  cfg.latency_ns = 20'000;  // completions from the worker thread, after the submitter waits
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  ASSERT_NE(v.irq, nullptr);
  ASSERT_TRUE(v.irq->keyed);  // else the sleep below would never end
  VirtualQueuePtr vq = make_virtual_queue(v);
  DmaRegion buf = r->alloc(kPage);
  for (uint64_t i = 0; i < 20; ++i) {
    uint32_t before[InterruptLine::kKeys];
    for (uint32_t k = 0; k < InterruptLine::kKeys; ++k) before[k] = v.irq->key_seq(k);
    SubmissionEntry rd = make_read(r->nsid, i, 1);
    rd.prp1 = buf.iova;
    Ticket t;
    vq->submit(rd, &t, [] {});
    // Asleep on the command's key with no timeout: only the controller's raise_key ends
    // this (it comes after the CQE is visible, so VirtualQueue::wait alone could return
    // first).
    const uint32_t k = vq->key_of(t);
    while (v.irq->key_seq(k) == before[k]) v.irq->wait_key(k, before[k], 0);
    ASSERT_EQ(vq->wait(&t), 0);
    EXPECT_EQ(v.irq->key_seq(k), before[k] + 1) << i;
    for (uint32_t o = 0; o < InterruptLine::kKeys; ++o) {
      if (o != k) {
        EXPECT_EQ(v.irq->key_seq(o), before[o]) << i << " key " << o;
      }
    }
  }
}

// Each thread owns a range of blocks and repeatedly writes a new generation then reads it
// back, through a QueueMapper over two small queues: ticket, turn, CID and marker handling
// under contention, with out-of-order completions where the device reorders them.
void concurrent_mapper_run(EmulatedConfig cfg, int threads, int ops, uint32_t entries) {
  ControllerOptions o;
  o.io_queues = 2;
  auto r = Rig::make(cfg, 16ull << 20, o);
  ASSERT_TRUE(r);
  EngineOptions eo;
  eo.metadata_queues = 1;
  eo.queue_entries = entries;
  std::string err;
  auto engine = IoEngine::create(*r->ctrl, eo, &err);
  ASSERT_TRUE(engine) << err;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      DmaRegion buf;
      if (!r->transport->dma_alloc(kPage, &buf).is_ok()) return failures.fetch_add(1), void();
      const uint64_t base = static_cast<uint64_t>(t) * 64;
      for (int i = 0; i < ops; ++i) {
        const uint64_t lba = base + static_cast<uint64_t>(i) % 64;
        const Priority p = i % 3 == 0 ? Priority::kMetadata : Priority::kBulk;
        fill_pattern(buf.vaddr, r->lba, lba, static_cast<uint64_t>(i));
        SubmissionEntry w = make_write(r->nsid, lba, 1);
        w.prp1 = buf.iova;
        if (engine->mapper().execute(w, p) != 0) failures.fetch_add(1);
        std::memset(buf.vaddr, 0, r->lba);
        SubmissionEntry rd = make_read(r->nsid, lba, 1);
        rd.prp1 = buf.iova;
        if (engine->mapper().execute(rd, p) != 0) failures.fetch_add(1);
        if (!check_pattern(buf.vaddr, r->lba, lba, static_cast<uint64_t>(i))) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(VirtualQueue, ConcurrentThreadsFewSmallQueues) {
  concurrent_mapper_run({}, 8, 300, 16);
}

TEST(VirtualQueue, ConcurrentOutOfOrderCompletions) {
  EmulatedConfig cfg;
  cfg.latency_ns = 2'000;
  cfg.latency_jitter_ns = 30'000;
  cfg.shuffle_completions = true;
  cfg.worker_threads = 2;
  concurrent_mapper_run(cfg, 6, 150, 8);
}

// Inline mode: submitting threads run the device model themselves, racing each other and
// the workers for it (with and without timed, reordered completions).
TEST(VirtualQueue, ConcurrentInlineDevice) {
  EmulatedConfig cfg;
  cfg.inline_io = true;
  cfg.worker_threads = 2;
  concurrent_mapper_run(cfg, 8, 300, 16);
  cfg.latency_ns = 2'000;
  cfg.latency_jitter_ns = 30'000;
  cfg.shuffle_completions = true;
  concurrent_mapper_run(cfg, 6, 150, 8);
}

// The store as the write cache: media access without the model's lock, from the worker and
// from inline ringers at once, every block verified.
TEST(VirtualQueue, ConcurrentThreadsWithTheCacheInTheStore) {
  EmulatedConfig cfg;
  cfg.cache_in_store = true;
  cfg.inline_io = true;
  cfg.worker_threads = 2;
  concurrent_mapper_run(cfg, 8, 300, 16);
  cfg.inline_io = false;
  cfg.latency_jitter_ns = 20'000;
  concurrent_mapper_run(cfg, 6, 150, 8);
}

TEST(VirtualQueue, ConcurrentTinyQueueMoreThreadsThanSlots) {
  concurrent_mapper_run({}, 12, 100, 4);  // 4-entry queues: 3 commands in flight per queue
}

// One thread keeps 32 commands in flight on an 8-entry queue: submissions must poll the
// batch's own earlier commands to free slots.
TEST(IoBatch, ThirtyTwoInFlightOnAnEightEntryQueue) {
  ControllerOptions o;
  o.io_queues = 1;
  auto r = Rig::make({}, 16ull << 20, o);
  ASSERT_TRUE(r);
  EngineOptions eo;
  eo.queue_entries = 8;
  std::string err;
  auto engine = IoEngine::create(*r->ctrl, eo, &err);
  ASSERT_TRUE(engine) << err;
  DmaRegion buf = r->alloc(32 * kPage);
  auto* base = static_cast<uint8_t*>(buf.vaddr);
  const uint32_t blocks = static_cast<uint32_t>(kPage / r->lba);  // 4 KiB per command
  for (uint64_t round = 0; round < 20; ++round) {
    {
      IoBatch b(engine->mapper());
      for (int i = 0; i < IoBatch::kWidth; ++i) {
        fill_pattern(base + i * kPage, kPage, round * 32 + i, round);
        SubmissionEntry w = make_write(r->nsid, (round * 32 + i) * blocks, blocks);
        w.prp1 = buf.iova + i * kPage;
        b.submit(w, Priority::kBulk);
      }
      ASSERT_EQ(b.wait_all(), 0);
    }
    std::memset(base, 0, 32 * kPage);
    IoBatch b(engine->mapper());
    for (int i = 0; i < IoBatch::kWidth; ++i) {
      SubmissionEntry rd = make_read(r->nsid, (round * 32 + i) * blocks, blocks);
      rd.prp1 = buf.iova + i * kPage;
      b.submit(rd, Priority::kBulk);
    }
    ASSERT_EQ(b.wait_all(), 0);
    for (int i = 0; i < IoBatch::kWidth; ++i) {
      ASSERT_TRUE(check_pattern(base + i * kPage, kPage, round * 32 + i, round)) << i;
    }
  }
}

TEST(IoBatch, ConcurrentBatchesOverSharedQueues) {
  ControllerOptions o;
  o.io_queues = 2;
  EmulatedConfig cfg;
  cfg.latency_jitter_ns = 10'000;
  auto r = Rig::make(cfg, 16ull << 20, o);
  ASSERT_TRUE(r);
  EngineOptions eo;
  eo.queue_entries = 16;
  std::string err;
  auto engine = IoEngine::create(*r->ctrl, eo, &err);
  ASSERT_TRUE(engine) << err;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  const uint64_t lb = r->lba;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      DmaRegion buf;
      if (!r->transport->dma_alloc(32 * lb, &buf).is_ok()) return failures.fetch_add(1), void();
      auto* p = static_cast<uint8_t*>(buf.vaddr);
      for (uint64_t round = 0; round < 15; ++round) {
        const uint64_t lba0 = static_cast<uint64_t>(t) * 1024 + (round % 4) * 32;
        {
          IoBatch b(engine->mapper());
          for (int i = 0; i < 32; ++i) {
            fill_pattern(p + i * lb, lb, lba0 + i, round);
            SubmissionEntry w = make_write(r->nsid, lba0 + i, 1);
            w.prp1 = buf.iova + i * lb;
            b.submit(w, i % 4 ? Priority::kBulk : Priority::kMetadata);
          }
          failures += b.wait_all();
        }
        std::memset(p, 0, 32 * lb);
        IoBatch b(engine->mapper());
        for (int i = 0; i < 32; ++i) {
          SubmissionEntry rd = make_read(r->nsid, lba0 + i, 1);
          rd.prp1 = buf.iova + i * lb;
          b.submit(rd, Priority::kBulk);
        }
        failures += b.wait_all();
        for (int i = 0; i < 32; ++i)
          failures += check_pattern(p + i * lb, lb, lba0 + i, round) ? 0 : 1;
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(LockedQueue, ConcurrentThreadsVerifyContent) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  LockedQueue lq(v);
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t) {
    ts.emplace_back([&, t] {
      DmaRegion buf;
      if (!r->transport->dma_alloc(kPage, &buf).is_ok()) return failures.fetch_add(1), void();
      for (uint64_t i = 0; i < 200; ++i) {
        const uint64_t lba = static_cast<uint64_t>(t) * 100 + i % 100;
        fill_pattern(buf.vaddr, r->lba, lba, i);
        SubmissionEntry w = make_write(r->nsid, lba, 1);
        w.prp1 = buf.iova;
        failures += lq.execute(w) != 0;
        std::memset(buf.vaddr, 0, r->lba);
        SubmissionEntry rd = make_read(r->nsid, lba, 1);
        rd.prp1 = buf.iova;
        failures += lq.execute(rd) != 0;
        failures += check_pattern(buf.vaddr, r->lba, lba, i) ? 0 : 1;
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace warpfs::nvme::test
