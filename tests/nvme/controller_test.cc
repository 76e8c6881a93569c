// Bring-up, identification, features, log pages, reset, shutdown and arbitration of the
// emulated controller through the driver.
#include <algorithm>
#include <thread>

#include "nvme/rig.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

TEST(Controller, BringUpIdentifiesControllerAndNamespace) {
  EmulatedConfig cfg;
  cfg.mdts = 5;
  cfg.max_io_queues = 16;
  cfg.serial = "SN-TEST-42";
  auto r = Rig::make(cfg, 32ull << 20);
  ASSERT_TRUE(r);
  const IdentifyController& id = r->ctrl->identify();
  EXPECT_EQ(std::string(id.sn, 10), "SN-TEST-42");
  EXPECT_EQ(std::string(id.mn, 6), "warpfs");
  EXPECT_EQ(id.mdts, 5);
  EXPECT_EQ(id.nn, 1u);
  EXPECT_EQ(id.sqes, 0x66);
  EXPECT_EQ(id.cqes, 0x44);
  EXPECT_TRUE(id.oncs & oncs::kDatasetManagement);
  EXPECT_TRUE(id.oncs & oncs::kWriteZeroes);
  EXPECT_EQ(id.vwc & 1, 1);
  EXPECT_EQ(r->ctrl->max_transfer_bytes(), 4096u << 5);
  ASSERT_EQ(r->ctrl->namespaces().size(), 1u);
  const NamespaceInfo& ns = r->ctrl->namespaces()[0];
  EXPECT_EQ(ns.nsid, 1u);
  EXPECT_EQ(ns.lba_bytes, 512u);
  EXPECT_EQ(ns.lba_count, (32ull << 20) / 512);
  EXPECT_EQ(ns.atomic_write_blocks, 8u);  // 4 KiB power-fail atomic unit
  EXPECT_EQ(r->ctrl->max_queue_entries(), cfg.max_queue_entries);
  EXPECT_TRUE(r->ctrl->wrr());
  EXPECT_EQ(r->ctrl->io_queues_granted(), 8);  // ControllerOptions default asks for 8
}

TEST(Controller, SeveralNamespacesWith4KiBBlocksAndDoorbellStride) {
  EmulatedConfig cfg;
  cfg.namespaces = {NamespaceConfig{4096, 1024}, NamespaceConfig{512, 4096},
                    NamespaceConfig{4096, 0}};
  cfg.doorbell_stride = 2;
  auto r = Rig::make(cfg, 16ull << 20);
  ASSERT_TRUE(r);
  EXPECT_EQ(Cap{r->transport->read64(reg::kCap)}.dstrd(), 2u);
  const auto& ns = r->ctrl->namespaces();
  ASSERT_EQ(ns.size(), 3u);
  EXPECT_EQ(ns[0].lba_bytes, 4096u);
  EXPECT_EQ(ns[0].lba_count, 1024u);
  EXPECT_EQ(ns[0].atomic_write_blocks, 1u);
  EXPECT_EQ(ns[1].lba_bytes, 512u);
  EXPECT_EQ(ns[2].lba_count, ((16ull << 20) - (4ull << 20) - (2ull << 20)) / 4096);

  // Same LBA numbers in different namespaces are different data.
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 16, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(8192);
  for (uint32_t nsid = 1; nsid <= 3; ++nsid) {
    const uint32_t lb = ns[nsid - 1].lba_bytes;
    fill_pattern(buf.vaddr, lb, 7, nsid);
    SubmissionEntry w = make_write(nsid, 7, 1);
    w.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, w)), 0);
  }
  for (uint32_t nsid = 1; nsid <= 3; ++nsid) {
    const uint32_t lb = ns[nsid - 1].lba_bytes;
    std::memset(buf.vaddr, 0, lb);
    SubmissionEntry rd = make_read(nsid, 7, 1);
    rd.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, rd)), 0);
    EXPECT_TRUE(check_pattern(buf.vaddr, lb, 7, nsid)) << "namespace " << nsid;
  }
}

TEST(Controller, FeaturesRoundTrip) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  uint32_t dw0 = 0;
  SubmissionEntry get{};
  get.opcode = admin::kGetFeatures;
  get.cdw10 = fid::kNumberOfQueues;
  ASSERT_TRUE(r->ctrl->admin(get, nullptr, 0, false, &dw0).is_ok());
  EXPECT_EQ(dw0 & 0xffff, 7u);  // 0's based: 8 SQs
  EXPECT_EQ(dw0 >> 16, 7u);

  get.cdw10 = fid::kArbitration;
  ASSERT_TRUE(r->ctrl->admin(get, nullptr, 0, false, &dw0).is_ok());
  EXPECT_EQ(dw0 >> 24, 15u);  // high priority weight set at bring-up
  EXPECT_EQ(dw0 & 7, 3u);

  SubmissionEntry set{};
  set.opcode = admin::kSetFeatures;
  set.cdw10 = fid::kVolatileWriteCache;
  set.cdw11 = 0;
  ASSERT_TRUE(r->ctrl->admin(set, nullptr, 0, false, nullptr).is_ok());
  get.cdw10 = fid::kVolatileWriteCache;
  ASSERT_TRUE(r->ctrl->admin(get, nullptr, 0, false, &dw0).is_ok());
  EXPECT_EQ(dw0, 0u);
}

TEST(Controller, NumberOfQueuesCannotChangeAfterQueuesExist) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  SubmissionEntry set{};
  set.opcode = admin::kSetFeatures;
  set.cdw10 = fid::kNumberOfQueues;
  set.cdw11 = 3 | (3u << 16);
  Status s = r->ctrl->admin(set, nullptr, 0, false, nullptr);
  EXPECT_EQ(s.nvme_status(), make_status(sct::kGeneric, sc::kCommandSequenceError));
}

TEST(Controller, SmartLogCountsCommandsAndData) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 16, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(4096);
  for (int i = 0; i < 5; ++i) {
    SubmissionEntry w = make_write(1, static_cast<uint64_t>(i) * 8, 8);
    w.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, w)), 0);
  }
  for (int i = 0; i < 3; ++i) {
    SubmissionEntry rd = make_read(1, 0, 1);
    rd.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, rd)), 0);
  }
  SmartLog log{};
  SubmissionEntry cmd{};
  cmd.opcode = admin::kGetLogPage;
  cmd.nsid = io::kBroadcastNsid;
  cmd.cdw10 = lid::kSmartHealth | ((sizeof(SmartLog) / 4 - 1) << 16);
  ASSERT_TRUE(r->ctrl->admin(cmd, &log, sizeof log, false, nullptr).is_ok());
  uint64_t writes = 0, reads = 0, units_written = 0;
  std::memcpy(&writes, log.host_writes, 8);
  std::memcpy(&reads, log.host_reads, 8);
  std::memcpy(&units_written, log.data_units_written, 8);
  EXPECT_EQ(writes, 5u);
  EXPECT_EQ(reads, 3u);
  EXPECT_EQ(units_written, 1u);  // 20 KiB = 40 units of 512 B, reported in thousands rounded up
  EXPECT_GT(log.temperature, 273);
}

TEST(Controller, ResetDeletesQueuesAndBringUpWorksAgain) {
  auto store = BackingStore::ram(8 << 20);
  std::string err;
  auto t = EmulatedTransport::create({}, store, &err);
  ASSERT_TRUE(t) << err;
  {
    auto c = Controller::open(*t, {}, &err);
    ASSERT_TRUE(c) << err;
    QueueView v;
    ASSERT_TRUE(c->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
    RawQueuePair qp(v);
    DmaRegion buf;
    ASSERT_TRUE(t->dma_alloc(4096, &buf).is_ok());
    fill_pattern(buf.vaddr, 512, 3, 1);
    SubmissionEntry w = make_write(1, 3, 1);
    w.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, w)), 0);
  }
  // A second driver instance resets the controller (CC.EN 1 -> 0) and starts over; queue
  // ids from before are free again and the data written before is still there.
  auto c = Controller::open(*t, {}, &err);
  ASSERT_TRUE(c) << err;
  QueueView v;
  ASSERT_TRUE(c->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  DmaRegion buf;
  ASSERT_TRUE(t->dma_alloc(4096, &buf).is_ok());
  SubmissionEntry rd = make_read(1, 3, 1);
  rd.prp1 = buf.iova;
  ASSERT_EQ(sf(run_raw(qp, rd)), 0);
  EXPECT_TRUE(check_pattern(buf.vaddr, 512, 3, 1));
}

TEST(Controller, ShutdownReportsCompleteAndRefusesFurtherAdmin) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  ASSERT_TRUE(r->ctrl->shutdown().is_ok());
  EXPECT_EQ(r->transport->read32(reg::kCsts) & csts::kShstMask, csts::kShstComplete);
  SubmissionEntry get{};
  get.opcode = admin::kGetFeatures;
  get.cdw10 = fid::kArbitration;
  EXPECT_EQ(r->ctrl->admin(get, nullptr, 0, false, nullptr).code(), Code::kNotReady);
}

TEST(Controller, BadAdminQueueSetupSetsFatalStatus) {
  auto store = BackingStore::ram(1 << 20);
  std::string err;
  auto t = EmulatedTransport::create({}, store, &err);
  ASSERT_TRUE(t);
  t->write32(reg::kAqa, 0);           // 1-entry queues: invalid
  t->write64(reg::kAsq, 0xdead0000);  // not DMA memory
  t->write64(reg::kAcq, 0xbeef0000);
  t->write32(reg::kCc, cc::kEn | (6u << cc::kIosqesShift) | (4u << cc::kIocqesShift));
  const uint64_t deadline = port::now_ns() + 5'000'000'000ull;
  while (!(t->read32(reg::kCsts) & (csts::kCfs | csts::kRdy)) && port::now_ns() < deadline) {
    port::thread_yield();
  }
  EXPECT_EQ(t->read32(reg::kCsts), csts::kCfs);
}

TEST(Controller, MissingImageAndBadDeviceNamesAreClearErrors) {
  std::string err;
  EmulatedConfig big;
  big.namespaces = {NamespaceConfig{4096, 1024}};  // 4 MiB on a 1 MiB store
  EXPECT_EQ(EmulatedTransport::create(big, BackingStore::ram(1 << 20), &err), nullptr);
  EXPECT_NE(err.find("smaller than the configured namespaces"), std::string::npos) << err;
  EXPECT_EQ(BackingStore::open_file("/nonexistent/dir/x.img", 0, &err), nullptr);
  EXPECT_NE(err.find("/nonexistent/dir/x.img"), std::string::npos);
}

// Weighted round robin (Base §4.13.2): with both queues full when arbitration starts, the
// high-priority SQ gets (HPW + 1) fetches for every (LPW + 1) of the low one.
TEST(Controller, WeightedRoundRobinFavoursHighPriorityQueue) {
  EmulatedConfig cfg;
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView hi, lo;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 64, QueuePriority::kHigh, &hi).is_ok());
  ASSERT_TRUE(r->ctrl->create_queue_pair(2, 64, QueuePriority::kLow, &lo).is_ok());
  RawQueuePair qh(hi), ql(lo);
  DmaRegion buf = r->alloc(4096);
  r->transport->pause(true);
  r->transport->trace_fetches(true);
  for (int i = 0; i < 48; ++i) {
    SubmissionEntry c = make_read(1, 0, 1);
    c.prp1 = buf.iova;
    ASSERT_TRUE(ql.push(c).is_ok());
    ASSERT_TRUE(qh.push(c).is_ok());
  }
  ql.ring_sq();
  qh.ring_sq();
  r->transport->pause(false);
  int got = 0;
  CompletionEntry cqe;
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (got < 96 && port::now_ns() < deadline) {
    while (qh.pop(&cqe)) ++got;
    while (ql.pop(&cqe)) ++got;
    qh.ring_cq();
    ql.ring_cq();
  }
  ASSERT_EQ(got, 96);
  std::vector<uint16_t> trace = r->transport->fetch_trace();
  ASSERT_EQ(trace.size(), 96u);
  // Weights from ControllerOptions: high 15 (16 per round), low 0 (1 per round).
  const auto first_low = std::find(trace.begin(), trace.end(), uint16_t{2}) - trace.begin();
  EXPECT_EQ(first_low, 16);
  const auto high_in_first_34 = std::count(trace.begin(), trace.begin() + 34, uint16_t{1});
  EXPECT_EQ(high_in_first_34, 32);
}

TEST(Controller, IdleControllerParksItsWorkers) {
  EmulatedConfig cfg;
  cfg.worker_threads = 3;
  cfg.idle_spin_ns = 1'000'000;
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (r->transport->counters().parked_workers < 3 && port::now_ns() < deadline) {
    port::thread_yield();
  }
  EXPECT_EQ(r->transport->counters().parked_workers, 3u);
  // A doorbell wakes the parked owner and the command completes.
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(4096);
  SubmissionEntry c = make_read(1, 0, 1);
  c.prp1 = buf.iova;
  EXPECT_EQ(sf(run_raw(qp, c)), 0);
  EXPECT_GT(r->transport->counters().doorbell_kicks, 0u);
}

}  // namespace
}  // namespace warpfs::nvme::test
