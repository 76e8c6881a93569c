// Every NVM command with its data verified, PRP edge cases, phase tags across many wraps,
// and completions out of submission order.
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "nvme/rig.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

constexpr uint64_t kPage = 4096;

// Builds PRP1/PRP2 by hand for data scattered over `pages` (bus addresses of whole pages),
// starting `offset` bytes into the first one. PRP lists go into `lists` (DMA memory) starting
// at byte `list_offset`, chaining to the next list page when one fills (Base §4.3).
struct HandPrp {
  uint64_t prp1 = 0, prp2 = 0;
};
HandPrp build_prps(const std::vector<uint64_t>& pages, uint64_t offset, uint64_t len,
                   const DmaRegion& lists, uint64_t list_offset) {
  HandPrp h;
  h.prp1 = pages[0] + offset;
  const uint64_t first = std::min(len, kPage - offset);
  const uint64_t rest = (len - first + kPage - 1) / kPage;  // further pages
  if (rest == 0) return h;
  if (rest == 1) {
    h.prp2 = pages[1];
    return h;
  }
  auto* base = static_cast<uint8_t*>(lists.vaddr);
  uint64_t at = list_offset;  // byte position of the next entry within `lists`
  h.prp2 = lists.iova + at;
  for (uint64_t i = 0; i < rest; ++i) {
    const bool last_slot = (at % kPage) == kPage - 8;
    if (last_slot && i + 1 < rest) {  // chain to the next list page
      const uint64_t next = (at / kPage + 1) * kPage;
      uint64_t ptr = lists.iova + next;
      std::memcpy(base + at, &ptr, 8);
      at = next;
    }
    std::memcpy(base + at, &pages[1 + i], 8);
    at += 8;
  }
  return h;
}

class DataPath : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatedConfig cfg;
    cfg.mdts = 10;  // 4 MiB transfers: PRP lists that chain over several pages
    r_ = Rig::make(cfg, 64ull << 20);
    ASSERT_TRUE(r_);
    ASSERT_TRUE(r_->ctrl->create_queue_pair(1, 64, QueuePriority::kMedium, &v_).is_ok());
    qp_ = std::make_unique<RawQueuePair>(v_);
  }
  uint16_t run(SubmissionEntry c) { return sf(run_raw(*qp_, c)); }

  std::unique_ptr<Rig> r_;
  QueueView v_;
  std::unique_ptr<RawQueuePair> qp_;
};

TEST_F(DataPath, WriteThenReadEverySizeUpToMdts) {
  DmaRegion wbuf = r_->alloc(4 << 20), rbuf = r_->alloc(4 << 20), list = r_->alloc(4 * kPage);
  auto pages_of = [](const DmaRegion& d, uint64_t len) {
    std::vector<uint64_t> p;
    for (uint64_t i = 0; i * kPage < len; ++i) p.push_back(d.iova + i * kPage);
    return p;
  };
  uint64_t lba = 0;
  // Up to 8192 blocks = 4 MiB = 1024 pages: the PRP list chains over three list pages.
  for (uint32_t blocks : {1u, 7u, 8u, 9u, 16u, 17u, 100u, 1024u, 4096u, 8192u}) {
    const uint64_t len = uint64_t{blocks} * 512;
    fill_pattern(wbuf.vaddr, len, lba, blocks);
    SubmissionEntry w = make_write(1, lba, blocks);
    HandPrp hw = build_prps(pages_of(wbuf, len), 0, len, list, 0);
    w.prp1 = hw.prp1, w.prp2 = hw.prp2;
    ASSERT_EQ(run(w), 0) << blocks;
    std::memset(rbuf.vaddr, 0xee, len);
    SubmissionEntry rd = make_read(1, lba, blocks);
    HandPrp hr = build_prps(pages_of(rbuf, len), 0, len, list, 0);
    rd.prp1 = hr.prp1, rd.prp2 = hr.prp2;
    ASSERT_EQ(run(rd), 0) << blocks;
    EXPECT_TRUE(check_pattern(rbuf.vaddr, len, lba, blocks)) << blocks << " blocks";
    lba += blocks;
  }
  // The driver's own builder agrees with the hand-built lists for one-list-page transfers.
  fill_pattern(wbuf.vaddr, 2 << 20, 77, 77);
  SubmissionEntry w = make_write(1, 20000, 4096);
  ASSERT_TRUE(
      fill_prps(&w, wbuf.iova, 2 << 20, PrpList{static_cast<uint64_t*>(list.vaddr), list.iova}));
  ASSERT_EQ(run(w), 0);
  SubmissionEntry rd = make_read(1, 20000, 4096);
  HandPrp hr = build_prps(pages_of(rbuf, 2 << 20), 0, 2 << 20, list, 0);
  rd.prp1 = hr.prp1, rd.prp2 = hr.prp2;
  ASSERT_EQ(run(rd), 0);
  EXPECT_TRUE(check_pattern(rbuf.vaddr, 2 << 20, 77, 77));
}

// Data scattered over pages in random order, a first page entered at an offset, a PRP list
// that starts mid-page and chains over two list pages: bytes land where the entries say.
TEST_F(DataPath, ScatteredPagesOffsetsAndChainedLists) {
  std::mt19937_64 rng(42);
  for (uint64_t offset : {0ull, 4ull, 512ull, 4092ull}) {
    for (uint64_t list_offset : {0ull, 8ull, 4000ull, 4088ull}) {
      const uint64_t len = 700 * 512 + (offset ? kPage - offset : 0);  // 700 blocks
      const uint64_t npages = (offset + len + kPage - 1) / kPage;
      DmaRegion pool = r_->alloc(npages * kPage), list = r_->alloc(4 * kPage);
      std::vector<uint64_t> order(npages);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<uint64_t> pages;
      for (uint64_t p : order) pages.push_back(pool.iova + p * kPage);
      // The logical stream: byte i lives at page order[(offset + i) / kPage].
      auto at = [&](uint64_t i) {
        const uint64_t pos = offset + i;
        return static_cast<uint8_t*>(pool.vaddr) + order[pos / kPage] * kPage + pos % kPage;
      };
      std::vector<uint8_t> want(len);
      for (uint64_t i = 0; i < len; ++i) want[i] = static_cast<uint8_t>(rng());
      for (uint64_t i = 0; i < len; ++i) *at(i) = want[i];
      const uint32_t blocks = static_cast<uint32_t>(len / 512);
      SubmissionEntry w = make_write(1, 1000, blocks);
      HandPrp h = build_prps(pages, offset, uint64_t{blocks} * 512, list, list_offset);
      w.prp1 = h.prp1, w.prp2 = h.prp2;
      ASSERT_EQ(run(w), 0) << offset << "/" << list_offset;
      // Read back into a plain contiguous buffer and compare the stream.
      DmaRegion out = r_->alloc(uint64_t{blocks} * 512), list2 = r_->alloc(kPage);
      SubmissionEntry rd = make_read(1, 1000, blocks);
      ASSERT_TRUE(fill_prps(&rd, out.iova, uint64_t{blocks} * 512,
                            PrpList{static_cast<uint64_t*>(list2.vaddr), list2.iova}));
      ASSERT_EQ(run(rd), 0);
      EXPECT_EQ(0, std::memcmp(out.vaddr, want.data(), uint64_t{blocks} * 512))
          << "offset " << offset << " list offset " << list_offset;
      r_->transport->dma_free(pool);
      r_->transport->dma_free(list);
      r_->transport->dma_free(out);
      r_->transport->dma_free(list2);
    }
  }
}

TEST_F(DataPath, WriteZeroesAndDeallocateReadBackZeroes) {
  DmaRegion buf = r_->alloc(64 * 512), list = r_->alloc(kPage);
  const PrpList pl{static_cast<uint64_t*>(list.vaddr), list.iova};
  fill_pattern(buf.vaddr, 64 * 512, 1, 1);
  SubmissionEntry w = make_write(1, 100, 64);
  ASSERT_TRUE(fill_prps(&w, buf.iova, 64 * 512, pl));
  ASSERT_EQ(run(w), 0);
  ASSERT_EQ(run(make_write_zeroes(1, 104, 4, false)), 0);  // blocks 104..107
  ASSERT_EQ(run(make_write_zeroes(1, 120, 16, true)), 0);  // deallocate 120..135
  DmaRegion ranges = r_->alloc(kPage);
  auto* rg = static_cast<DsmRange*>(ranges.vaddr);
  rg[0] = DsmRange{0, 3, 140};  // 140..142
  rg[1] = DsmRange{0, 1, 163};  // 163
  ASSERT_EQ(run(make_deallocate(1, ranges.iova, 2)), 0);
  std::memset(buf.vaddr, 0xaa, 64 * 512);
  SubmissionEntry rd = make_read(1, 100, 64);
  ASSERT_TRUE(fill_prps(&rd, buf.iova, 64 * 512, pl));
  ASSERT_EQ(run(rd), 0);
  std::vector<uint8_t> expect(64 * 512);
  fill_pattern(expect.data(), expect.size(), 1, 1);
  auto zero = [&](uint64_t from, uint64_t n) {
    std::memset(expect.data() + (from - 100) * 512, 0, n * 512);
  };
  zero(104, 4), zero(120, 16), zero(140, 3), zero(163, 1);
  EXPECT_EQ(0, std::memcmp(buf.vaddr, expect.data(), expect.size()));
}

TEST_F(DataPath, FlushAndFuaSucceed) {
  DmaRegion buf = r_->alloc(kPage);
  SubmissionEntry w = make_write(1, 0, 8, /*fua=*/true);
  w.prp1 = buf.iova;
  EXPECT_EQ(run(w), 0);
  EXPECT_EQ(run(make_flush(1)), 0);
  EXPECT_EQ(run(make_flush(io::kBroadcastNsid)), 0);
  EXPECT_GE(r_->transport->counters().flushes, 2u);
}

// A 4-entry queue wrapped hundreds of times: the phase tag flips on every pass and the driver
// must follow it, with the doorbell values wrapping too.
TEST(PhaseTag, HundredsOfWrapsOfASmallQueue) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 4, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(kPage);
  for (uint64_t i = 0; i < 1200; ++i) {  // 300 wraps of the 4-entry CQ
    const uint64_t lba = i % 64;
    fill_pattern(buf.vaddr, 512, lba, i);
    SubmissionEntry w = make_write(1, lba, 1);
    w.prp1 = buf.iova;
    CompletionEntry c = run_raw(qp, w);
    ASSERT_EQ(sf(c), 0);
    ASSERT_EQ(c.sq_id, 1);
    std::memset(buf.vaddr, 0, 512);
    SubmissionEntry rd = make_read(1, lba, 1);
    rd.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, rd)), 0);
    ASSERT_TRUE(check_pattern(buf.vaddr, 512, lba, i)) << i;
  }
}

// With latency jitter and shuffling, completions arrive out of submission order, carry the
// SQ head, and each still names its own command.
TEST(Completions, OutOfOrderWithSqHeadInEveryEntry) {
  EmulatedConfig cfg;
  cfg.latency_ns = 20'000;
  cfg.latency_jitter_ns = 200'000;
  cfg.shuffle_completions = true;
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 64, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(32 * kPage);
  int reordered = 0;
  for (int round = 0; round < 20; ++round) {
    for (uint16_t i = 0; i < 32; ++i) {
      SubmissionEntry c = make_read(1, i, 1);
      c.cid = i;
      c.prp1 = buf.iova + i * kPage;
      ASSERT_TRUE(qp.push(c).is_ok());
    }
    qp.ring_sq();
    std::vector<uint16_t> order;
    CompletionEntry e;
    const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
    while (order.size() < 32 && port::now_ns() < deadline) {
      while (qp.pop(&e)) {
        ASSERT_EQ(sf(e), 0);
        ASSERT_LT(e.sq_head, 64);
        order.push_back(e.cid);
      }
      qp.ring_cq();
    }
    ASSERT_EQ(order.size(), 32u);
    EXPECT_EQ(std::set<uint16_t>(order.begin(), order.end()).size(), 32u);
    reordered += std::is_sorted(order.begin(), order.end()) ? 0 : 1;
  }
  EXPECT_GT(reordered, 10);
}

}  // namespace
}  // namespace warpfs::nvme::test
