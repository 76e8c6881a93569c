// The namespace I/O unit: transfers split at MDTS, DMA memory moved without a bounce and
// other memory bounced, priority classes reaching their queues, bad ranges refused, and
// every command counted and timed by class, from several threads at once; start() leaving
// transfers in flight for another thread to see through.
#include "warpfs/nvme/namespace_io.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

constexpr uint32_t kBlock = 4096;

struct NsRig {
  std::shared_ptr<BackingStore> store;
  std::unique_ptr<EmulatedTransport> transport;
  std::unique_ptr<Controller> ctrl;
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<NamespaceIo> ns;

  static std::unique_ptr<NsRig> make(EmulatedConfig cfg, NamespaceIo::Options no = {}) {
    auto r = std::make_unique<NsRig>();
    r->store = BackingStore::ram(16ull << 20);
    std::string err;
    r->transport = EmulatedTransport::create(cfg, r->store, &err);
    EXPECT_TRUE(r->transport) << err;
    if (!r->transport) return nullptr;
    ControllerOptions co;
    co.io_queues = 3;
    r->ctrl = Controller::open(*r->transport, co, &err);
    EXPECT_TRUE(r->ctrl) << err;
    if (!r->ctrl) return nullptr;
    EngineOptions eo;
    eo.log = [](const std::string&) {};
    r->engine = IoEngine::create(*r->ctrl, eo, &err);
    EXPECT_TRUE(r->engine) << err;
    if (!r->engine) return nullptr;
    r->ns = NamespaceIo::create(*r->engine, 1, kBlock, no, &err);
    EXPECT_TRUE(r->ns) << err;
    return r->ns ? std::move(r) : nullptr;
  }
  ~NsRig() {
    ns.reset();
    engine.reset();
    ctrl.reset();
  }
};

void pattern(uint8_t* p, uint64_t block, uint32_t blocks, uint8_t gen) {
  for (uint64_t i = 0; i < uint64_t{blocks} * kBlock; ++i)
    p[i] = static_cast<uint8_t>((block * kBlock + i) * 131 + gen);
}

TEST(NamespaceIo, LongTransfersSplitAtMdtsInDmaAndPlainMemory) {
  EmulatedConfig cfg;
  cfg.mdts = 2;  // 16 KiB per command
  auto r = NsRig::make(cfg);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->ns->block_count(), (16u << 20) / kBlock);
  constexpr uint32_t kBlocks = 40;  // ten commands
  std::vector<uint8_t> plain(kBlocks * kBlock), back(kBlocks * kBlock);
  pattern(plain.data(), 100, kBlocks, 1);
  const uint64_t writes0 = r->transport->counters().writes;
  BlockIo w{100, kBlocks, true, plain.data(), {}};
  r->ns->io(&w, 1);
  ASSERT_TRUE(w.status.is_ok()) << w.status.to_string();
  EXPECT_EQ(r->transport->counters().writes - writes0, kBlocks / 4);

  void* dma = nullptr;
  ASSERT_TRUE(r->ns->alloc(kBlocks * kBlock, &dma).is_ok());
  BlockIo rd{100, kBlocks, false, static_cast<uint8_t*>(dma), {}};
  r->ns->io(&rd, 1);
  ASSERT_TRUE(rd.status.is_ok()) << rd.status.to_string();
  EXPECT_EQ(0, std::memcmp(dma, plain.data(), plain.size()));
  BlockIo rp{100, kBlocks, false, back.data(), {}};  // bounced
  r->ns->io(&rp, 1);
  ASSERT_TRUE(rp.status.is_ok());
  EXPECT_EQ(back, plain);
  r->ns->free(dma, kBlocks * kBlock);

  const NamespaceIo::ClassStats ws = r->ns->stats(NamespaceIo::kWrite);
  const NamespaceIo::ClassStats rs = r->ns->stats(NamespaceIo::kRead);
  EXPECT_EQ(ws.latency.count, kBlocks / 4);  // one sample per command
  EXPECT_EQ(ws.bytes, uint64_t{kBlocks} * kBlock);
  EXPECT_EQ(rs.latency.count, kBlocks / 2);
  EXPECT_EQ(rs.bytes, 2ull * kBlocks * kBlock);
}

// DMA memory at a dword-aligned offset inside a page (where a FUSE request's data lies in the
// daemon's receive buffer) moves directly, PRP1 carrying the offset; at an offset that is not
// a multiple of 4, which no PRP entry can name, it is bounced. Both land whole.
TEST(NamespaceIo, DmaMemoryAtAnInPageOffsetMovesWithoutABounce) {
  EmulatedConfig cfg;
  cfg.mdts = 3;  // 32 KiB per command: 12 blocks are two commands, one with a PRP list
  auto r = NsRig::make(cfg);
  ASSERT_TRUE(r);
  constexpr uint32_t kBlocks = 12;
  constexpr size_t kBytes = kBlocks * kBlock;
  void* dma = nullptr;
  ASSERT_TRUE(r->ns->alloc(kBytes + 2 * kBlock, &dma).is_ok());
  auto* base = static_cast<uint8_t*>(dma);
  std::vector<uint8_t> want(kBytes);
  uint8_t gen = 1;
  for (const size_t offset : {size_t{80}, size_t{4092}, size_t{2}, size_t{4094}}) {
    const bool direct = offset % 4 == 0;
    pattern(want.data(), 200, kBlocks, ++gen);
    std::memcpy(base + offset, want.data(), kBytes);
    const uint64_t w0 = r->ns->stats(NamespaceIo::kWrite).bounced;
    BlockIo w{200, kBlocks, true, base + offset, {}};
    r->ns->io(&w, 1);
    ASSERT_TRUE(w.status.is_ok()) << offset << ": " << w.status.to_string();
    EXPECT_EQ(r->ns->stats(NamespaceIo::kWrite).bounced - w0, direct ? 0 : kBytes) << offset;
    std::memset(base, 0, kBytes + 2 * kBlock);
    const uint64_t r0 = r->ns->stats(NamespaceIo::kRead).bounced;
    BlockIo rd{200, kBlocks, false, base + offset, {}};
    r->ns->io(&rd, 1);
    ASSERT_TRUE(rd.status.is_ok()) << offset << ": " << rd.status.to_string();
    EXPECT_EQ(r->ns->stats(NamespaceIo::kRead).bounced - r0, direct ? 0 : kBytes) << offset;
    EXPECT_EQ(0, std::memcmp(base + offset, want.data(), kBytes)) << offset;
    ASSERT_TRUE(r->ns->flush().is_ok());
    std::vector<uint8_t> media(kBytes);  // and the device holds exactly the blocks written
    ASSERT_TRUE(r->store->read(200ull * kBlock, media.data(), kBytes).is_ok());
    EXPECT_EQ(media, want) << offset;
  }
  r->ns->free(dma, kBytes + 2 * kBlock);
}

TEST(NamespaceIo, BadRangesFailAloneInABatch) {
  auto r = NsRig::make(EmulatedConfig{});
  ASSERT_TRUE(r);
  std::vector<uint8_t> buf(3 * kBlock);
  const uint64_t n = r->ns->block_count();
  BlockIo ios[4] = {{0, 1, false, buf.data(), {}},
                    {n - 1, 2, false, buf.data() + kBlock, {}},
                    {n, 1, false, buf.data() + kBlock, {}},
                    {5, 0, false, buf.data() + 2 * kBlock, {}}};
  r->ns->io(ios, 4);
  EXPECT_TRUE(ios[0].status.is_ok());
  for (int i = 1; i < 4; ++i) EXPECT_EQ(ios[i].status.code(), Code::kInvalidArgument) << i;
  EXPECT_EQ(r->ns->trim(n - 1, 2).code(), Code::kInvalidArgument);
  EXPECT_EQ(r->ns->trim(0, 0).code(), Code::kInvalidArgument);
  ASSERT_TRUE(r->ns->trim(0, 4).is_ok());
  ASSERT_TRUE(r->ns->flush().is_ok());
  EXPECT_EQ(r->ns->stats(NamespaceIo::kTrim).latency.count, 1u);
  EXPECT_EQ(r->ns->stats(NamespaceIo::kFlush).latency.count, 1u);
  std::string err;
  EXPECT_EQ(NamespaceIo::create(*r->engine, 1, 3000, &err), nullptr);
  EXPECT_NE(err.find("block size"), std::string::npos) << err;
  EXPECT_EQ(NamespaceIo::create(*r->engine, 9, kBlock, &err), nullptr);
}

// The queues (by qid) that `n` reads of class `p` were fetched from.
std::set<uint16_t> queues_used(NsRig& r, Priority p, int n) {
  std::vector<uint8_t> buf(kBlock);
  r.transport->trace_fetches(true);
  for (int i = 0; i < n; ++i) {
    BlockIo io{static_cast<uint64_t>(i), 1, false, buf.data(), {}, p};
    r.ns->io(&io, 1);
    EXPECT_TRUE(io.status.is_ok());
  }
  r.transport->trace_fetches(false);
  const std::vector<uint16_t> t = r.transport->fetch_trace();
  return std::set<uint16_t>(t.begin(), t.end());
}

TEST(NamespaceIo, MetadataTransfersUseTheirOwnQueues) {
  auto r = NsRig::make(EmulatedConfig{});
  ASSERT_TRUE(r);
  const std::set<uint16_t> bulk = queues_used(*r, Priority::kBulk, 16);
  const std::set<uint16_t> meta = queues_used(*r, Priority::kMetadata, 16);
  ASSERT_FALSE(bulk.empty());
  ASSERT_FALSE(meta.empty());
  for (uint16_t q : meta) EXPECT_EQ(bulk.count(q), 0u) << "queue " << q << " serves both";

  auto flat = NsRig::make(EmulatedConfig{}, NamespaceIo::Options{false});
  ASSERT_TRUE(flat);
  const std::set<uint16_t> fbulk = queues_used(*flat, Priority::kBulk, 16);
  for (uint16_t q : queues_used(*flat, Priority::kMetadata, 16))
    EXPECT_EQ(fbulk.count(q), 1u) << "priorities off, yet queue " << q << " is not a bulk one";
}

TEST(NamespaceIo, ConcurrentTransfersFromManyThreadsLandWhole) {
  EmulatedConfig cfg;
  cfg.mdts = 1;  // 8 KiB: every transfer of more than two blocks is split
  cfg.worker_threads = 2;
  auto r = NsRig::make(cfg);
  ASSERT_TRUE(r);
  constexpr int kThreads = 4, kRounds = 50;
  constexpr uint32_t kSpan = 6;
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([&, t] {
      std::vector<uint8_t> w(kSpan * kBlock), back(kSpan * kBlock);
      const uint64_t base = 64 + static_cast<uint64_t>(t) * kSpan;
      for (int k = 0; k < kRounds; ++k) {
        pattern(w.data(), base, kSpan, static_cast<uint8_t>(k));
        BlockIo io{base,     kSpan, true,
                   w.data(), {},    (k & 1) ? Priority::kMetadata : Priority::kBulk};
        r->ns->io(&io, 1);
        ASSERT_TRUE(io.status.is_ok());
        BlockIo rd{base, kSpan, false, back.data(), {}};
        r->ns->io(&rd, 1);
        ASSERT_TRUE(rd.status.is_ok());
        ASSERT_EQ(back, w) << "thread " << t << " round " << k;
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(r->ns->stats(NamespaceIo::kWrite).bytes, uint64_t{kThreads} * kRounds * kSpan * kBlock);
}

// The emulated media's bandwidth (EmulatedConfig::bandwidth_bytes_per_s): every Read and
// Write, from several threads at once, reserves exactly its bytes / bandwidth on the
// controller's one channel (a Flush and a Deallocate nothing), and the data lands whole.
TEST(NamespaceIo, BandwidthLimitReservesEachTransfersTimeOnTheChannel) {
  EmulatedConfig cfg;
  cfg.bandwidth_bytes_per_s = 1ull << 30;  // 1 GiB/s: 4 KiB in 3814 ns
  cfg.latency_ns = 2000;
  cfg.worker_threads = 2;
  auto r = NsRig::make(cfg);
  ASSERT_TRUE(r);
  constexpr int kThreads = 4, kRounds = 20;
  constexpr uint32_t kSizes[] = {1, 3, 8};  // blocks: one command each (below MDTS)
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([&, t] {
      std::vector<uint8_t> w(8 * kBlock), back(8 * kBlock);
      const uint64_t base = 256 + static_cast<uint64_t>(t) * 8;
      for (int k = 0; k < kRounds; ++k) {
        const uint32_t n = kSizes[k % 3];
        pattern(w.data(), base, n, static_cast<uint8_t>(k));
        BlockIo io{base, n, true, w.data(), {}};
        r->ns->io(&io, 1);
        ASSERT_TRUE(io.status.is_ok());
        BlockIo rd{base, n, false, back.data(), {}};
        r->ns->io(&rd, 1);
        ASSERT_TRUE(rd.status.is_ok());
        ASSERT_EQ(0, std::memcmp(back.data(), w.data(), size_t{n} * kBlock)) << t << " " << k;
      }
    });
  }
  for (auto& x : th) x.join();
  ASSERT_TRUE(r->ns->flush().is_ok());
  ASSERT_TRUE(r->ns->trim(0, 16).is_ok());
  uint64_t want = 0;
  for (int k = 0; k < kRounds; ++k)
    want += 2 * (uint64_t{kSizes[k % 3]} * kBlock * 1'000'000'000ull / cfg.bandwidth_bytes_per_s);
  EXPECT_EQ(r->transport->counters().transfer_ns, want * kThreads);
}

// start(): transfers in DMA memory stay in flight on return (a 100 ms device: the first poll
// comes long before the completion) and a later poll() sees them through, with the data in
// and each transfer's status; one split at MDTS and one with a PRP list (more than two pages)
// among them. A Started passes to another thread, which polls it (idle() between polls) to
// its end. Plain memory, or more commands than one batch, are performed at once.
TEST(NamespaceIo, StartLeavesTransfersInFlightForAnotherThreadToPoll) {
  constexpr uint32_t kBlocks = 8;  // two commands of 4 blocks, each with a PRP list
  std::vector<uint8_t> src(3 * kBlocks * kBlock);
  pattern(src.data(), 300, 3 * kBlocks, 7);

  auto slow = NsRig::make([] {
    EmulatedConfig c;
    c.mdts = 2;
    c.latency_ns = 100'000'000;
    return c;
  }());
  ASSERT_TRUE(slow);
  BlockIo w2{300, 3 * kBlocks, true, src.data(), {}};
  slow->ns->io(&w2, 1);
  ASSERT_TRUE(w2.status.is_ok());
  void* dma = nullptr;
  ASSERT_TRUE(slow->ns->alloc(3 * kBlocks * kBlock, &dma).is_ok());
  auto* d = static_cast<uint8_t*>(dma);
  std::memset(d, 0, 3 * kBlocks * kBlock);
  BlockIo ios[3] = {{300, kBlocks, false, d, {}},                         // split, lists
                    {300 + kBlocks, 1, false, d + kBlocks * kBlock, {}},  // one page
                    {300 + kBlocks + 1, kBlocks - 1, false, d + (kBlocks + 1) * kBlock, {}}};
  const uint64_t reads0 = slow->ns->stats(NamespaceIo::kRead).latency.count;
  auto s = std::make_unique<NamespaceIo::Started>(*slow->ns);
  slow->ns->start(ios, 3, s.get());
  EXPECT_FALSE(s->poll()) << "a 100 ms read completed at once";
  std::thread other([&] {
    port::Backoff b;
    while (!s->poll()) s->idle(b);
  });
  other.join();
  for (const BlockIo& io : ios) EXPECT_TRUE(io.status.is_ok()) << io.status.to_string();
  EXPECT_EQ(std::memcmp(d, src.data(), (2 * kBlocks) * kBlock), 0);
  EXPECT_EQ(slow->ns->stats(NamespaceIo::kRead).latency.count - reads0, 2u + 1u + 2u);
  EXPECT_TRUE(s->poll());  // ended: stays ended

  // Plain memory: performed by start() itself.
  std::vector<uint8_t> plain(kBlocks * kBlock);
  BlockIo p{300, kBlocks, false, plain.data(), {}};
  slow->ns->start(&p, 1, s.get());
  EXPECT_TRUE(s->poll());
  ASSERT_TRUE(p.status.is_ok());
  EXPECT_EQ(std::memcmp(plain.data(), src.data(), kBlocks * kBlock), 0);

  // A range beyond the namespace: its status says so, by the time poll() is true.
  BlockIo bad{slow->ns->block_count(), 1, false, d, {}};
  slow->ns->start(&bad, 1, s.get());
  EXPECT_TRUE(s->poll());
  EXPECT_FALSE(bad.status.is_ok());

  // More commands than one batch (33 of 4 blocks): performed by start() itself.
  void* big = nullptr;
  ASSERT_TRUE(slow->ns->alloc(132 * kBlock, &big).is_ok());
  BlockIo many{300, 132, false, static_cast<uint8_t*>(big), {}};
  slow->ns->start(&many, 1, s.get());
  EXPECT_TRUE(s->poll());
  ASSERT_TRUE(many.status.is_ok());
  EXPECT_EQ(std::memcmp(big, src.data(), 3 * kBlocks * kBlock), 0);
  slow->ns->free(big, 132 * kBlock);

  // Destroyed in flight: the destructor waits for the commands (the memory stays valid).
  auto last = std::make_unique<NamespaceIo::Started>(*slow->ns);
  BlockIo again{300, kBlocks, false, d, {}};
  slow->ns->start(&again, 1, last.get());
  EXPECT_FALSE(last->poll());
  last.reset();
  EXPECT_TRUE(again.status.is_ok());
  slow->ns->free(dma, 3 * kBlocks * kBlock);
}

}  // namespace
}  // namespace warpfs::nvme::test
