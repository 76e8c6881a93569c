// The debug checks behind the core's REQUIRES (nvme/check.h, fs/src/locks.h): a violated
// precondition aborts where checks are compiled in (sanitizer and Debug builds), and the
// locks know their owner there. Skipped in builds without checks.
#include <gtest/gtest.h>

#include <thread>

#include "fs/core_rig.h"
#include "internal.h"

namespace warpfs::fs::test {
namespace {

#define SKIP_WITHOUT_CHECKS() \
  if (!port::kDebugChecks) GTEST_SKIP() << "built without WARPFS_DEBUG_CHECKS"

TEST(Requires, LocksKnowTheirOwner) {
  SKIP_WITHOUT_CHECKS();
  Mutex m;
  EXPECT_FALSE(held_by_me(m));
  {
    std::lock_guard<Mutex> g(m);
    EXPECT_TRUE(held_by_me(m));
    bool other = true;
    std::thread([&] { other = held_by_me(m); }).join();
    EXPECT_FALSE(other);
  }
  EXPECT_FALSE(held_by_me(m));

  SharedMutex rw;
  {
    std::shared_lock<SharedMutex> s(rw);
    EXPECT_TRUE(held_by_me(rw));
    EXPECT_FALSE(held_exclusive_by_me(rw));
    bool other = true;
    std::thread([&] {
      std::shared_lock<SharedMutex> s2(rw);  // a second reader: only its own hold counts
      other = held_by_me(rw) && !held_exclusive_by_me(rw);
    }).join();
    EXPECT_TRUE(other);
  }
  EXPECT_FALSE(held_by_me(rw));
  {
    std::unique_lock<SharedMutex> x(rw);
    EXPECT_TRUE(held_exclusive_by_me(rw));
  }
  EXPECT_FALSE(held_by_me(rw));
}

TEST(RequiresDeathTest, NodeLocksWithoutTheNamespaceLockAborts) {
  SKIP_WITHOUT_CHECKS();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // TSan: no fork() from a threaded process
  Mutex ns;
  Node n(2);
  EXPECT_DEATH(NodeLocks locks(ns, {&n}), "NodeLocks without namespace_mu_");
  std::lock_guard<Mutex> g(ns);
  NodeLocks locks(ns, {&n});  // held: fine
  EXPECT_TRUE(held_exclusive_by_me(n.rw));
}

TEST(RequiresDeathTest, DirtyOutsideATransactionAborts) {
  SKIP_WITHOUT_CHECKS();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto f = Formatted::make(16 << 20);
  ASSERT_TRUE(f);
  Journal j(*f->dev, f->sb, f->rr.next_pos, f->rr.next_seq, [](const std::string&) {});
  MetaBuf* b = j.create(f->sb.block_count - 100, MetaKind::kHeader);
  EXPECT_FALSE(j.in_transaction());
  EXPECT_DEATH(j.dirty(b), "outside a transaction");
  {
    Journal::Txn t(j);
    EXPECT_TRUE(j.in_transaction());
    j.dirty(b);
  }
  EXPECT_FALSE(j.in_transaction());
  EXPECT_EQ(j.commit(), 0);
}

TEST(RequiresDeathTest, LayoutOfABlockBeforeTheGroupsAborts) {
  SKIP_WITHOUT_CHECKS();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Superblock sb{};
  sb.block_count = 3 * kBlocksPerGroup;
  sb.group_count = 2;
  sb.inodes_per_group = kInodesPerBlock;
  sb.gdt_start = 100;
  sb.gdt_blocks = 1;
  const Layout L(sb);
  EXPECT_EQ(L.group_of(L.first_group), 0u);
  EXPECT_DEATH((void)L.group_of(L.first_group - 1), "group_of a block before the first group");
  sb.group_count = 0;
  EXPECT_DEATH(Layout{sb}, "not validated");
}

}  // namespace
}  // namespace warpfs::fs::test
