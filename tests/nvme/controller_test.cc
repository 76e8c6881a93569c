// Bring-up, identification, features, log pages, reset, shutdown and arbitration through the
// driver: on any device where the assertion is the spec's, on the emulated model where it is
// the model's configuration or hooks.
#include <algorithm>
#include <set>
#include <thread>

#include "nvme/rig.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

uint64_t le64(const uint8_t* p) {  // the low 8 bytes of a 16-byte SMART counter
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

// The emulated controller echoes its configuration through Identify.
TEST(Controller, BringUpIdentifiesControllerAndNamespace) {
  WARPFS_EMULATED_ONLY() << "exact Identify values of a configured controller";
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

// What any NVM controller must report (Base §5.17.2.1), and what the driver derived from it.
TEST(Controller, IdentifyAndLimitsAreConsistentOnAnyDevice) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const IdentifyController& id = r->ctrl->identify();
  // Figure 275: the required SQ/CQ entry sizes of the NVM command set are 64 and 16 bytes.
  EXPECT_EQ(id.sqes & 0xf, 6);
  EXPECT_EQ(id.cqes & 0xf, 4);
  EXPECT_GE(id.sqes >> 4, 6);
  EXPECT_GE(id.cqes >> 4, 4);
  // A second Identify Controller answers the same.
  IdentifyController again{};
  SubmissionEntry cmd{};
  cmd.opcode = admin::kIdentify;
  cmd.cdw10 = cns::kController;
  ASSERT_TRUE(r->ctrl->admin(cmd, &again, sizeof again, false, nullptr).is_ok());
  EXPECT_EQ(0, std::memcmp(again.sn, id.sn, sizeof id.sn));
  EXPECT_EQ(0, std::memcmp(again.mn, id.mn, sizeof id.mn));
  EXPECT_EQ(again.mdts, id.mdts);
  EXPECT_EQ(again.nn, id.nn);

  const uint32_t mt = r->ctrl->max_transfer_bytes();
  EXPECT_GE(mt, kPage);
  EXPECT_EQ(mt % kPage, 0u);
  EXPECT_GE(r->ctrl->max_queue_entries(), 2u);
  EXPECT_LE(r->ctrl->max_queue_entries(), kIoQueueMaxEntries);
  EXPECT_GE(r->ctrl->io_queues_granted(), 1);

  // Every namespace the driver kept is a distinct active id within NN with a usable format.
  std::set<uint32_t> ids;
  for (const NamespaceInfo& ns : r->ctrl->namespaces()) {
    EXPECT_GE(ns.nsid, 1u);
    EXPECT_LE(ns.nsid, id.nn);
    EXPECT_TRUE(ids.insert(ns.nsid).second) << "namespace " << ns.nsid << " listed twice";
    EXPECT_GT(ns.lba_count, 0u);
    EXPECT_TRUE(ns.lba_bytes >= 512 && ns.lba_bytes <= 4096 &&
                (ns.lba_bytes & (ns.lba_bytes - 1)) == 0)
        << ns.lba_bytes;
    EXPECT_GE(ns.atomic_write_blocks, 1u);
  }
  EXPECT_EQ(ids.count(r->nsid), 1u);
  EXPECT_EQ(r->lba, r->ctrl->find_namespace(r->nsid)->lba_bytes);
  EXPECT_EQ(r->lbas, r->ctrl->find_namespace(r->nsid)->lba_count);
  EXPECT_EQ(r->ctrl->find_namespace(id.nn + 1), nullptr);
}

// A write to the namespace under test changes no other namespace at the same LBA: the driver
// puts the NSID where the device reads it. Other namespaces are only read.
TEST(Controller, WritesStayInTheirNamespace) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 16, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  const auto& all = r->ctrl->namespaces();
  DmaRegion before = r->alloc(all.size() * kPage), buf = r->alloc(kPage);
  auto* keep = static_cast<uint8_t*>(before.vaddr);
  for (size_t i = 0; i < all.size(); ++i) {
    SubmissionEntry rd = make_read(all[i].nsid, 7, 1);
    rd.prp1 = before.iova + i * kPage;
    ASSERT_EQ(sf(run_raw(qp, rd)), 0) << "namespace " << all[i].nsid;
  }
  const uint64_t gen = port::now_ns();  // differs from whatever an earlier run left there
  fill_pattern(buf.vaddr, r->lba, 7, gen);
  SubmissionEntry w = make_write(r->nsid, 7, 1);
  w.prp1 = buf.iova;
  ASSERT_EQ(sf(run_raw(qp, w)), 0);
  for (size_t i = 0; i < all.size(); ++i) {
    std::memset(buf.vaddr, 0xee, kPage);
    SubmissionEntry rd = make_read(all[i].nsid, 7, 1);
    rd.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, rd)), 0);
    if (all[i].nsid == r->nsid) {
      EXPECT_TRUE(check_pattern(buf.vaddr, r->lba, 7, gen)) << "namespace " << all[i].nsid;
    } else {
      EXPECT_EQ(0, std::memcmp(buf.vaddr, keep + i * kPage, all[i].lba_bytes))
          << "namespace " << all[i].nsid << " changed by a write to " << r->nsid;
    }
  }
}

TEST(Controller, SeveralNamespacesWith4KiBBlocksAndDoorbellStride) {
  WARPFS_EMULATED_ONLY() << "a configured doorbell stride and namespace layout";
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
  const ControllerOptions o;
  uint32_t dw0 = 0;
  SubmissionEntry get{};
  get.opcode = admin::kGetFeatures;
  get.cdw10 = fid::kNumberOfQueues;
  ASSERT_TRUE(r->ctrl->admin(get, nullptr, 0, false, &dw0).is_ok());
  // Base §5.27.1.5: the allocation (0's based) may exceed the 8 queues asked for (QEMU
  // reports its maximum); the driver uses what it asked for, at most what was allocated.
  const uint32_t allocated = std::min(dw0 & 0xffff, dw0 >> 16) + 1;
  EXPECT_EQ(r->ctrl->io_queues_granted(), std::min<uint32_t>(allocated, o.io_queues));
  if (r->emu) {
    EXPECT_EQ(dw0, 7u | (7u << 16));  // exactly the 8 asked for
  }

  get.cdw10 = fid::kArbitration;
  const Status arb = r->ctrl->admin(get, nullptr, 0, false, &dw0);
  if (Rig::fabrics()) {
    // The kernel's nvmet keeps no Arbitration feature (Invalid Field): over fabrics each
    // queue is its own connection and nothing arbitrates between them (NVMe-oF §2).
    EXPECT_TRUE(arb.is_ok() || r->status(arb.nvme_status()) ==
                                   r->status(make_status(sct::kGeneric, sc::kInvalidField)))
        << arb.to_string();
  } else {
    ASSERT_TRUE(arb.is_ok()) << arb.to_string();
  }
  if (r->ctrl->wrr()) {  // the weights were set at bring-up (Base §5.27.1.1)
    EXPECT_EQ(dw0 >> 24, o.high_weight);
    EXPECT_EQ((dw0 >> 16) & 0xff, o.medium_weight);
    EXPECT_EQ((dw0 >> 8) & 0xff, o.low_weight);
    EXPECT_EQ(dw0 & 7, 3u);  // arbitration burst of 8
  }

  SubmissionEntry set{};
  set.opcode = admin::kSetFeatures;
  set.cdw10 = fid::kVolatileWriteCache;
  get.cdw10 = fid::kVolatileWriteCache;
  if (!r->ctrl->volatile_write_cache()) {
    // Base §5.27.1.4: without a volatile write cache the feature cannot be set.
    set.cdw11 = 1;
    EXPECT_EQ(r->status(r->ctrl->admin(set, nullptr, 0, false, nullptr).nvme_status()),
              r->status(make_status(sct::kGeneric, sc::kInvalidField)));
    return;
  }
  if (Rig::fabrics()) {
    // nvmet reports a volatile write cache it does not let the host turn off (Set Features
    // Volatile Write Cache: Invalid Field); the cache is the backing file's or device's.
    const Status st = r->ctrl->admin(set, nullptr, 0, false, nullptr);
    if (!st.is_ok()) {
      EXPECT_EQ(r->status(st.nvme_status()),
                r->status(make_status(sct::kGeneric, sc::kInvalidField)));
      ASSERT_TRUE(r->ctrl->admin(get, nullptr, 0, false, &dw0).is_ok());
      EXPECT_EQ(dw0 & 1, 1u);
      return;
    }
  }
  for (uint32_t wce : {0u, 1u}) {  // off, then back on as a real device had it
    set.cdw11 = wce;
    ASSERT_TRUE(r->ctrl->admin(set, nullptr, 0, false, nullptr).is_ok());
    ASSERT_TRUE(r->ctrl->admin(get, nullptr, 0, false, &dw0).is_ok());
    EXPECT_EQ(dw0 & 1, wce);
  }
}

// Base §5.27.1.5: Number of Queues is refused once I/O queues exist.
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
  EXPECT_EQ(r->status(s.nvme_status()),
            r->status(make_status(sct::kGeneric, sc::kCommandSequenceError)));
}

// Base §5.16.1.3: the SMART log counts completed host commands and data units (thousands of
// 512-byte units, rounded up). The emulated controller starts from zero, so its counts are
// exact; on another device this test's commands raise them by at least as much.
TEST(Controller, SmartLogCountsCommandsAndData) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  auto smart = [&](SmartLog* log) {
    SubmissionEntry cmd{};
    cmd.opcode = admin::kGetLogPage;
    cmd.nsid = io::kBroadcastNsid;
    cmd.cdw10 = lid::kSmartHealth | ((sizeof(SmartLog) / 4 - 1) << 16);
    return r->ctrl->admin(cmd, log, sizeof *log, false, nullptr);
  };
  SmartLog before{}, after{};
  ASSERT_TRUE(smart(&before).is_ok());
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 16, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(kPage);
  const uint32_t blocks = static_cast<uint32_t>(kPage / r->lba);  // 4 KiB per write
  for (int i = 0; i < 5; ++i) {
    SubmissionEntry w = make_write(r->nsid, static_cast<uint64_t>(i) * blocks, blocks);
    w.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, w)), 0);
  }
  for (int i = 0; i < 3; ++i) {
    SubmissionEntry rd = make_read(r->nsid, 0, 1);
    rd.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, rd)), 0);
  }
  ASSERT_TRUE(smart(&after).is_ok());
  const uint64_t writes = le64(after.host_writes) - le64(before.host_writes);
  const uint64_t reads = le64(after.host_reads) - le64(before.host_reads);
  if (r->emu) {
    EXPECT_EQ(writes, 5u);
    EXPECT_EQ(reads, 3u);
    EXPECT_EQ(le64(after.data_units_written), 1u);  // 20 KiB = 40 units, in thousands rounded up
  } else if (Rig::fabrics()) {
    // nvmet reports what its backing block device accounts: nothing for a file or a RAM disk
    // (brd accounts no I/O), so only that the counts do not go backwards.
    EXPECT_GE(le64(after.host_writes), le64(before.host_writes));
    EXPECT_GE(le64(after.host_reads), le64(before.host_reads));
  } else {
    EXPECT_GE(writes, 5u);
    EXPECT_GE(reads, 3u);
    EXPECT_GE(le64(after.data_units_written),
              std::max<uint64_t>(le64(before.data_units_written), 1));
  }
  // Kelvin: a controller above freezing. The kernel's nvmet has no sensor and reports 0.
  if (!Rig::fabrics()) {
    EXPECT_GT(after.temperature, 273);
  }
}

// A second driver instance on the same transport resets the controller (CC.EN 1 -> 0) and
// starts over: queue ids from before are free again and data written before is still there
// (the first instance's shutdown made it durable).
TEST(Controller, ResetDeletesQueuesAndBringUpWorksAgain) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  DmaRegion buf = r->alloc(kPage);
  const uint64_t gen = port::now_ns();  // differs from whatever an earlier run left there
  {
    QueueView v;
    ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
    RawQueuePair qp(v);
    fill_pattern(buf.vaddr, r->lba, 3, gen);
    SubmissionEntry w = make_write(r->nsid, 3, 1);
    w.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, w)), 0);
  }
  r->ctrl.reset();
  std::string err;
  r->ctrl = Controller::open(*r->transport, {}, &err);
  ASSERT_TRUE(r->ctrl) << err;
  ASSERT_NE(r->ctrl->find_namespace(r->nsid), nullptr);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  std::memset(buf.vaddr, 0, kPage);
  SubmissionEntry rd = make_read(r->nsid, 3, 1);
  rd.prp1 = buf.iova;
  ASSERT_EQ(sf(run_raw(qp, rd)), 0);
  EXPECT_TRUE(check_pattern(buf.vaddr, r->lba, 3, gen));
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
  WARPFS_EMULATED_ONLY() << "the model's answer to an invalid admin queue setup";
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

// A host recovers from a refused enable (CSTS.CFS) as a driver does: CC.EN = 0, wait for
// RDY to clear (it is clear already: the refused enable never set it), a valid admin queue,
// CC.EN = 1, ready. Many rounds, so that the worker sometimes reads CC between the host's
// disable and its new enable: it once took the disable with the CC from before it, enabled
// that again (refused again, CFS) and then saw the new enable as no change (found by
// fuzz_nvme; the race needs the two writes to fall inside one worker round).
TEST(Controller, RecoveryFromARefusedEnableAlwaysBecomesReady) {
  WARPFS_EMULATED_ONLY() << "the model's worker and its register file";
  auto t = EmulatedTransport::create({}, BackingStore::ram(1 << 20), nullptr);
  ASSERT_TRUE(t);
  DmaRegion dma;
  ASSERT_TRUE(t->dma_alloc(2 * kPage, &dma).is_ok());
  const uint32_t cc_on = cc::kEn | (6u << cc::kIosqesShift) | (4u << cc::kIocqesShift);
  auto wait_csts = [&](uint32_t mask, uint32_t want) {
    const uint64_t end = port::now_ns() + 5'000'000'000ull;
    while ((t->read32(reg::kCsts) & mask) != want) {
      if (port::now_ns() > end) return false;
      port::thread_yield();
    }
    return true;
  };
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE(round);
    // Refused: memory size 8 KiB pages (CC.MPS = 1), which the model does not take.
    t->write32(reg::kAqa, 7 | (7u << 16));
    t->write64(reg::kAsq, dma.iova);
    t->write64(reg::kAcq, dma.iova + kPage);
    t->write32(reg::kCc, cc_on | (1u << cc::kMpsShift));
    ASSERT_TRUE(wait_csts(csts::kCfs | csts::kRdy, csts::kCfs)) << t->read32(reg::kCsts);
    // The recovery: no pause between the writes, as in the fuzzer's.
    t->write32(reg::kCc, 0);
    ASSERT_TRUE(wait_csts(csts::kRdy, 0));
    t->write32(reg::kAqa, 7 | (7u << 16));
    t->write64(reg::kAsq, dma.iova);
    t->write64(reg::kAcq, dma.iova + kPage);
    t->write32(reg::kCc, cc_on);
    ASSERT_TRUE(wait_csts(csts::kRdy | csts::kCfs, csts::kRdy)) << t->read32(reg::kCsts);
    t->write32(reg::kCc, 0);
    ASSERT_TRUE(wait_csts(csts::kRdy | csts::kCfs, 0)) << t->read32(reg::kCsts);
  }
}

// Needs no device: the emulated controller's and the image file's own error messages.
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
  WARPFS_EMULATED_ONLY() << "pauses the device and reads its fetch order";
  EmulatedConfig cfg;
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView hi, lo;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 64, QueuePriority::kHigh, &hi).is_ok());
  ASSERT_TRUE(r->ctrl->create_queue_pair(2, 64, QueuePriority::kLow, &lo).is_ok());
  RawQueuePair qh(hi), ql(lo);
  DmaRegion buf = r->alloc(4096);
  r->emu->pause(true);
  r->emu->trace_fetches(true);
  for (int i = 0; i < 48; ++i) {
    SubmissionEntry c = make_read(r->nsid, 0, 1);
    c.prp1 = buf.iova;
    ASSERT_TRUE(ql.push(c).is_ok());
    ASSERT_TRUE(qh.push(c).is_ok());
  }
  ql.ring_sq();
  qh.ring_sq();
  r->emu->pause(false);
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
  std::vector<uint16_t> trace = r->emu->fetch_trace();
  ASSERT_EQ(trace.size(), 96u);
  // Weights from ControllerOptions: high 15 (16 per round), low 0 (1 per round).
  const auto first_low = std::find(trace.begin(), trace.end(), uint16_t{2}) - trace.begin();
  EXPECT_EQ(first_low, 16);
  const auto high_in_first_34 = std::count(trace.begin(), trace.begin() + 34, uint16_t{1});
  EXPECT_EQ(high_in_first_34, 32);
}

// Every live queue is served, whichever worker owns it and however sparse the ids: the
// emulated controller's workers scan only up to the highest live SQ id, so queues created out
// of order, the highest deleted (the others still served) and created again must all
// complete commands. Three workers: each owns ids q % 3.
TEST(Controller, SparseQueueIdsAreServedAsTheyComeAndGo) {
  WARPFS_EMULATED_ONLY() << "sets the model's worker count";
  EmulatedConfig cfg;
  cfg.worker_threads = 3;
  ControllerOptions o;
  o.io_queues = 8;
  auto r = Rig::make(cfg, 64ull << 20, o);
  ASSERT_TRUE(r);
  const uint16_t top = r->ctrl->io_queues_granted();
  ASSERT_GE(top, 6);
  DmaRegion buf = r->alloc(kPage);
  const uint64_t gen = port::now_ns();
  auto write_read = [&](RawQueuePair& qp, uint64_t lba) {
    const uint16_t qid = qp.view().qid;
    fill_pattern(buf.vaddr, r->lba, lba, gen);
    SubmissionEntry w = make_write(r->nsid, lba, 1);
    w.prp1 = buf.iova;
    EXPECT_EQ(sf(run_raw(qp, w)), 0) << "write through queue " << qid;
    std::memset(buf.vaddr, 0, kPage);
    SubmissionEntry rd = make_read(r->nsid, lba, 1);
    rd.prp1 = buf.iova;
    EXPECT_EQ(sf(run_raw(qp, rd)), 0) << "read through queue " << qid;
    EXPECT_TRUE(check_pattern(buf.vaddr, r->lba, lba, gen)) << "queue " << qid;
  };
  QueueView vh, vl, vm, v0;
  ASSERT_TRUE(r->ctrl->create_queue_pair(top, 8, QueuePriority::kMedium, &vh).is_ok());
  ASSERT_TRUE(r->ctrl->create_queue_pair(2, 8, QueuePriority::kMedium, &vl).is_ok());
  ASSERT_TRUE(r->ctrl->create_queue_pair(4, 8, QueuePriority::kMedium, &vm).is_ok());
  // Queue 3 is worker 0's (ids modulo the worker count), whose scan starts at its stride.
  ASSERT_TRUE(r->ctrl->create_queue_pair(3, 8, QueuePriority::kMedium, &v0).is_ok());
  auto high = std::make_unique<RawQueuePair>(vh);
  RawQueuePair low(vl), mid(vm), zero(v0);
  write_read(*high, 10);
  write_read(low, 11);
  write_read(mid, 12);
  write_read(zero, 9);
  ASSERT_TRUE(r->ctrl->delete_queue_pair(top).is_ok());
  write_read(low, 13);
  write_read(mid, 14);
  ASSERT_TRUE(r->ctrl->delete_queue_pair(4).is_ok());
  write_read(low, 15);
  ASSERT_TRUE(r->ctrl->create_queue_pair(top, 8, QueuePriority::kMedium, &vh).is_ok());
  high = std::make_unique<RawQueuePair>(vh);  // a new queue: its rings start over
  write_read(*high, 16);
  write_read(low, 17);
}

// Waits (at most 10 s) until `n` workers of the rig's emulated controller are parked; returns
// how many are.
uint32_t wait_until_parked(Rig& r, uint32_t n) {
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (r.emu->counters().parked_workers < n && port::now_ns() < deadline) {
    port::thread_yield();
  }
  return r.emu->counters().parked_workers;
}

TEST(Controller, IdleControllerParksItsWorkers) {
  WARPFS_EMULATED_ONLY() << "the model's worker threads";
  EmulatedConfig cfg;
  cfg.worker_threads = 3;
  cfg.idle_spin_ns = 1'000'000;
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  EXPECT_EQ(wait_until_parked(*r, 3), 3u);
  // A doorbell wakes the parked owner and the command completes.
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(4096);
  SubmissionEntry c = make_read(r->nsid, 0, 1);
  c.prp1 = buf.iova;
  EXPECT_EQ(sf(run_raw(qp, c)), 0);
  EXPECT_GT(r->emu->counters().doorbell_kicks, 0u);
}

// busy_ns counts the worker threads' time in rounds that did work: it grows with commands.
TEST(Controller, BusyTimeGrowsWithCommands) {
  WARPFS_EMULATED_ONLY() << "the model's worker threads";
  EmulatedConfig cfg;
  cfg.worker_threads = 1;
  cfg.idle_spin_ns = ~0ull;  // never park: poll, as under a GPU rig
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 64, QueuePriority::kMedium, &v).is_ok());
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(4096);
  const uint64_t before = r->emu->counters().busy_ns;
  for (uint64_t lba = 0; lba < 200; ++lba) {
    SubmissionEntry c = make_read(r->nsid, lba, 1);
    c.prp1 = buf.iova;
    ASSERT_EQ(sf(run_raw(qp, c)), 0);
  }
  const EmulatedCounters after = r->emu->counters();
  EXPECT_GT(after.busy_ns, before);
  EXPECT_GE(after.io_commands, 200u);
}

// Inline mode: with every worker asleep, the thread that rings the doorbell runs the command
// itself, so its completion is in the CQ when the ring returns and no worker is woken.
TEST(Controller, InlineModeRunsCommandsInTheRingingThread) {
  WARPFS_EMULATED_ONLY() << "the model's inline mode";
  EmulatedConfig cfg;
  cfg.inline_io = true;
  cfg.worker_threads = 2;
  cfg.idle_spin_ns = 0;
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  ASSERT_EQ(wait_until_parked(*r, 2), 2u);
  const uint64_t kicks = r->emu->counters().doorbell_kicks;
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(4096);
  auto run_now = [&](SubmissionEntry c) {
    c.prp1 = buf.iova;
    EXPECT_TRUE(qp.push(c).is_ok());
    qp.ring_sq();
    CompletionEntry cqe{};
    const bool done = qp.pop(&cqe);  // no waiting: the ring ran it
    qp.ring_cq();
    return done ? static_cast<int>(sf(cqe)) : -1;
  };
  for (uint64_t lba = 0; lba < 20; ++lba) {
    fill_pattern(buf.vaddr, r->lba, lba, 7);
    ASSERT_EQ(run_now(make_write(r->nsid, lba, 1)), 0) << lba;
  }
  for (uint64_t lba = 0; lba < 20; ++lba) {
    std::memset(buf.vaddr, 0, r->lba);
    ASSERT_EQ(run_now(make_read(r->nsid, lba, 1)), 0) << lba;
    EXPECT_TRUE(check_pattern(buf.vaddr, r->lba, lba, 7)) << lba;
  }
  const int bad = run_now(make_read(r->nsid, r->lbas, 1));  // one past the end
  ASSERT_GE(bad, 0);
  EXPECT_EQ(bad & 0x7ff, make_status(sct::kGeneric, sc::kLbaOutOfRange) & 0x7ff);
  EXPECT_EQ(r->emu->counters().doorbell_kicks, kicks);
  EXPECT_EQ(r->emu->counters().parked_workers, 2u);
}

// Inline mode with timed completions (latency_ns): the ringing thread runs the command and
// leaves its completion to the worker, kicking the worker only if it is parked. Here the
// doorbell rings exactly while the worker has planned to sleep with nothing timed and has not
// yet announced itself parked (the hook holds it there). The worker must still post the
// completion when it falls due; before park() planned again after the announcement, it slept
// until the next doorbell, which never came.
TEST(Controller, InlineRingWhileTheWorkerPlansItsSleepIsNotLost) {
  WARPFS_EMULATED_ONLY() << "the model's inline mode and park()";
  std::atomic<int> stage{0};  // 1: armed, 2: the worker is in the window, 3: rung
  EmulatedConfig cfg;
  cfg.inline_io = true;
  cfg.worker_threads = 1;
  cfg.idle_spin_ns = 0;
  cfg.latency_ns = 1'000'000;  // far enough for a timed futex wait, not a yield
  cfg.park_window_hook = [&](uint64_t wake_at) {
    int armed = 1;
    if (wake_at != 0 || !stage.compare_exchange_strong(armed, 2)) return;
    const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
    while (stage.load() != 3 && port::now_ns() < deadline) port::thread_yield();
  };
  auto r = Rig::make(cfg);
  ASSERT_TRUE(r);
  QueueView v;
  ASSERT_TRUE(r->ctrl->create_queue_pair(1, 8, QueuePriority::kMedium, &v).is_ok());
  ASSERT_EQ(wait_until_parked(*r, 1), 1u);
  RawQueuePair qp(v);
  DmaRegion buf = r->alloc(4096);
  // Waits (at most 5 s, 5000 times the command's latency) for one completion.
  auto complete = [&](uint16_t* status) {
    const uint64_t deadline = port::now_ns() + 5'000'000'000ull;
    CompletionEntry cqe{};
    while (!qp.pop(&cqe)) {
      if (port::now_ns() > deadline) return false;
      port::thread_yield();
    }
    qp.ring_cq();
    *status = sf(cqe);
    return true;
  };
  SubmissionEntry a = make_read(r->nsid, 0, 1);
  a.prp1 = buf.iova;
  // The worker is parked, and only A's ring wakes it: its first sleep planned with nothing
  // timed comes after it has posted A's completion. That one is the window.
  stage.store(1);
  ASSERT_TRUE(qp.push(a).is_ok());
  qp.ring_sq();
  uint16_t st = 0xffff;
  ASSERT_TRUE(complete(&st));
  EXPECT_EQ(st, 0);
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (stage.load() != 2 && port::now_ns() < deadline) port::thread_yield();
  ASSERT_EQ(stage.load(), 2) << "the worker never planned a sleep with nothing timed";
  SubmissionEntry b = make_read(r->nsid, 1, 1);
  b.prp1 = buf.iova;
  ASSERT_TRUE(qp.push(b).is_ok());
  qp.ring_sq();  // runs B here (the worker holds no lock in the window): B is timed now
  stage.store(3);
  st = 0xffff;
  EXPECT_TRUE(complete(&st)) << "B's completion was never posted";
  EXPECT_EQ(st, 0);
}

}  // namespace
}  // namespace warpfs::nvme::test
