// The filesystem core under concurrent load (tests/fs/stress.h), bounded for CI: these run
// in the optimised, ASan+UBSan and TSan builds. The journal's commit race that the
// concurrent stress found has a deterministic regression test of its own here.
#include "fs/stress.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "fs/core_rig.h"
#include "journal.h"
#include "warpfs/fs/replay.h"

namespace warpfs::fs::test {
namespace {

stress::Options small(uint64_t seed) {
  stress::Options o;
  o.seed = seed;
  o.workers = 4;
  o.sharers = 2;
  o.ops = 150;
  o.mib = 256;
  return o;
}

TEST(Stress, WorkersSharersAndObserverLeaveAConsistentFilesystem) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const stress::Report r = stress::run(small(seed));
    EXPECT_TRUE(r.passed) << "seed " << seed << ": " << r.failure;
    EXPECT_GT(r.ops, 600u);
    EXPECT_GT(r.commits, 0u) << "the committer never ran among the operations";
  }
}

TEST(Stress, ThroughTheSoftwareCache) {
  stress::Options o = small(11);
  o.cache_mb = 2;  // small: lines are evicted and written back under the load
  const stress::Report r = stress::run(o);
  EXPECT_TRUE(r.passed) << r.failure;
}

TEST(Stress, PowerCutAmongThreadsComesBackInAStateEachWorkerAllows) {
  size_t cut_inside = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    stress::Options o = small(seed);
    o.cut = true;
    o.ops = 100;
    const stress::Report r = stress::run(o);
    EXPECT_TRUE(r.passed) << "seed " << seed << ": " << r.failure;
    cut_inside += r.cut_call != 0;
    EXPECT_LE(r.durable_states, r.matched_states);
    EXPECT_LE(r.matched_states, r.reached_states);
  }
  EXPECT_GT(cut_inside, 0u) << "no cut landed inside the workload";
}

// Clones and dedupes among all of it: each worker's among its own files and from the others'
// files into a file of its own, the sharers' between shared files, dedup passes by the
// observer; the blocks are really shared, and the counts match the extents after the
// remount (check_all).
TEST(Stress, ClonesDedupesAndDedupPassesAmongThreads) {
  for (uint64_t seed = 21; seed <= 22; ++seed) {
    const stress::Report r = stress::run(small(seed));
    EXPECT_TRUE(r.passed) << "seed " << seed << ": " << r.failure;
    EXPECT_GT(r.clones, 0u);
    EXPECT_GT(r.dedupes, 0u);
    EXPECT_GT(r.dedup_passes, 0u);
    EXPECT_GT(r.cloned_blocks, 0u) << "no clone shared a block";
  }
}

// The harness's own check can fail: a worker's model that claims a byte the filesystem never
// saw is reported.
TEST(Stress, AModelThatDisagreesWithTheFilesystemIsReported) {
  stress::Options o = small(5);
  o.tamper_model = true;
  const stress::Report r = stress::run(o);
  EXPECT_FALSE(r.passed);
  EXPECT_NE(r.failure.find("worker 0's subtree"), std::string::npos) << r.failure;
}

// A metadata buffer freed by the next transaction while a commit is still running (its gate
// already reopened) stays alive until that next transaction's commit has dropped it from its
// dirty list. (The bug: the running commit freed every dead buffer just after reopening its
// gate, this one too, and the next commit read it from its dirty list: a use after free that
// ASan reports, and garbage block numbers in the journal otherwise.)
TEST(Journal, ABufferFreedDuringACommitOutlivesTheNextCommitsDirtyList) {
  auto f = Formatted::make(16 << 20);
  ASSERT_TRUE(f);
  blockdev::BlockDevice* dev = f->dev.get();
  const Superblock& sb = f->sb;
  std::string log;
  Journal j(*dev, sb, f->rr.next_pos, f->rr.next_seq,
            [&](const std::string& s) { log += s + "\n"; });
  // Two data-area blocks, as metadata (kHeader: the only kind ever freed).
  const uint64_t a = sb.block_count - 100, b = sb.block_count - 99;
  {
    Journal::Txn t(j);
    j.dirty(j.create(a, MetaKind::kHeader));
  }
  bool ran = false;
  j.reopened = [&] {
    if (ran) return;
    ran = true;
    Journal::Txn t(j);  // the next transaction, while the first commit goes on
    MetaBuf* y = j.create(b, MetaKind::kHeader);
    std::memset(y->data, 0x5a, kBlockSize);
    j.dirty(y);
    j.forget_block(b);  // freed in the same transaction: it must never be written
  };
  EXPECT_EQ(j.commit(), 0) << log;
  ASSERT_TRUE(ran);
  EXPECT_EQ(j.commit(), 0) << log;  // prunes the dead buffer from its dirty list
  EXPECT_EQ(log, "");
  std::vector<uint8_t> home(kBlockSize);
  ASSERT_TRUE(dev->read(b, 1, home.data()).is_ok());
  EXPECT_NE(home[100], 0x5a) << "a freed buffer was checkpointed";
}

// A transaction that fills up asks for its commit (Journal::wants_commit, which the mounted
// filesystem's committer thread answers) at 7/16 of the capacity, from whichever operation
// enters then, and keeps asking until a commit comes; below that mark it never asks, and
// until half the capacity no operation commits in enter(). Several threads enter at once.
TEST(Journal, AFillingTransactionAsksForItsCommitBeforeAnOperationMust) {
  auto f = Formatted::make(16 << 20);
  ASSERT_TRUE(f);
  std::string log;
  Journal j(*f->dev, f->sb, f->rr.next_pos, f->rr.next_seq,
            [&](const std::string& s) { log += s + "\n"; });
  std::atomic<int> asked{0};
  j.wants_commit = [&] { asked.fetch_add(1); };
  const uint32_t ask_at = j.capacity() / 16 * Journal::kAskAtSixteenths;
  ASSERT_GT(j.capacity() / 2, ask_at + 8);
  // Distinct data-area blocks as metadata, one per transaction: after k of them, k are dirty.
  uint64_t next = f->sb.block_count - 1000;
  auto one = [&](uint64_t block) {
    Journal::Txn t(j);
    j.dirty(j.create(block, MetaKind::kHeader));
  };
  for (uint32_t i = 0; i < ask_at; ++i) one(next++);
  EXPECT_EQ(asked.load(), 0) << "asked below " << ask_at << " dirty blocks";
  // Past the mark, from four threads at once, short of half the capacity.
  const uint32_t per_thread = (j.capacity() / 2 - ask_at) / 4;
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    const uint64_t first = next + t * per_thread;
    threads.emplace_back([&, first] {
      for (uint32_t i = 0; i < per_thread; ++i) one(first + i);
    });
  }
  for (std::thread& t : threads) t.join();
  next += 4 * per_thread;
  EXPECT_GE(asked.load(), static_cast<int>(4 * per_thread) - 1);
  EXPECT_EQ(j.commits.load(), 0u) << "an operation committed below half the capacity";
  // Answered: the next transaction starts empty and asks no more.
  EXPECT_EQ(j.commit(), 0) << log;
  EXPECT_EQ(j.commits.load(), 1u);
  const int before = asked.load();
  one(next++);
  EXPECT_EQ(asked.load(), before);
  EXPECT_EQ(log, "");
}

}  // namespace
}  // namespace warpfs::fs::test
