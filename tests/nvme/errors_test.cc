// Every bad command gets its NVMe status and touches no memory outside the buffers it names;
// a stream of random commands never crashes the device.
//
// Statuses the base specification mandates (invalid opcode, namespace, field, LBA range,
// queue identifiers and sizes) are checked on any device. Where a device may legitimately
// answer differently (an unsupported log page, a PRP offset the spec only says a controller
// "may" check) the emulated controller is held to its exact status and another device to the
// spec's alternatives; what would make a real device DMA to addresses nobody mapped, or needs
// the model's hooks, runs on the emulated controller only.
#include <algorithm>
#include <cstring>
#include <random>

#include "nvme/rig.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatedConfig cfg;
    cfg.mdts = 4;  // 64 KiB
    r_ = Rig::make(cfg, 8ull << 20);
    ASSERT_TRUE(r_);
    ASSERT_TRUE(r_->ctrl->create_queue_pair(1, 16, QueuePriority::kMedium, &v_).is_ok());
    qp_ = std::make_unique<RawQueuePair>(v_);
    // Room for one block more than MDTS allows (the over-MDTS read) and for 32 pages.
    buf_ = r_->alloc(std::max<uint64_t>(32 * kPage, r_->max_io_bytes() + kPage));
    list_ = r_->alloc(kPage);
    nsze_ = r_->lbas;
    bad_nsid_ = r_->ctrl->identify().nn + 1;  // beyond NN: an invalid NSID (Base §3.2.1)
  }
  // Statuses as Rig::status() compares them: exact on the emulated controller.
  uint16_t io(SubmissionEntry c) { return r_->status(sf(run_raw(*qp_, c))); }
  uint16_t admin(SubmissionEntry c) {
    Status s = r_->ctrl->admin(c, nullptr, 0, false, nullptr);
    return s.code() == Code::kNvme ? r_->status(s.nvme_status()) : (s.is_ok() ? 0 : 0xffff);
  }
  uint16_t gen(uint8_t code) const { return r_->status(make_status(sct::kGeneric, code)); }
  uint16_t spec(uint8_t code) const { return r_->status(make_status(sct::kCommandSpecific, code)); }
  SubmissionEntry rd(uint64_t slba, uint32_t n) {
    SubmissionEntry c = make_read(r_->nsid, slba, n);
    EXPECT_TRUE(fill_prps(&c, buf_.iova, uint64_t{n} * r_->lba,
                          PrpList{static_cast<uint64_t*>(list_.vaddr), list_.iova}));
    return c;
  }

  std::unique_ptr<Rig> r_;
  QueueView v_;
  std::unique_ptr<RawQueuePair> qp_;
  DmaRegion buf_, list_;
  uint64_t nsze_ = 0;
  uint32_t bad_nsid_ = 0;
};

TEST_F(Errors, InvalidOpcodes) {
  SubmissionEntry c{};
  c.opcode = 0x7e;
  c.nsid = r_->nsid;
  EXPECT_EQ(io(c), gen(sc::kInvalidOpcode));
  c.opcode = 0x7f;
  EXPECT_EQ(admin(c), gen(sc::kInvalidOpcode));
}

TEST_F(Errors, InvalidFields) {
  if (r_->emu) {  // PSDT = SGL on a controller without SGL support (QEMU's has it)
    SubmissionEntry c = rd(0, 1);
    c.flags = 0x40;
    EXPECT_EQ(io(c), gen(sc::kInvalidField));
  }
  // Base §5.17.2.1 (MDTS): a larger transfer is aborted with Invalid Field in Command.
  const uint32_t mt = r_->ctrl->max_transfer_bytes();
  if (r_->ctrl->identify().mdts != 0 && mt <= r_->max_io_bytes()) {
    EXPECT_EQ(io(rd(0, mt / r_->lba + 1)), gen(sc::kInvalidField)) << "MDTS " << mt << " bytes";
  }
  SubmissionEntry id{};
  id.opcode = admin::kIdentify;
  id.cdw10 = 0x55;  // a reserved CNS
  id.prp1 = buf_.iova;
  EXPECT_EQ(admin(id), gen(sc::kInvalidField));
  SubmissionEntry gf{};
  gf.opcode = admin::kGetFeatures;
  gf.cdw10 = 0x77;  // a reserved feature
  EXPECT_EQ(admin(gf), gen(sc::kInvalidField));

  // Saving Arbitration: not saveable here. A device that can save it saves the current value.
  uint32_t arb = 0;
  gf.cdw10 = fid::kArbitration;
  const Status got = r_->ctrl->admin(gf, nullptr, 0, false, &arb);
  if (Rig::fabrics() && !got.is_ok()) {  // nvmet keeps no Arbitration feature
    EXPECT_EQ(r_->status(got.nvme_status()), gen(sc::kInvalidField));
    return;
  }
  ASSERT_EQ(got.code(), Code::kOk);
  SubmissionEntry sv{};
  sv.opcode = admin::kSetFeatures;
  sv.cdw10 = fid::kArbitration | (1u << 31);
  sv.cdw11 = arb;
  const uint16_t saved = admin(sv);
  if (r_->emu) {
    EXPECT_EQ(saved, spec(sc::kFeatureNotSaveable));
  } else {
    EXPECT_TRUE(saved == 0 || saved == spec(sc::kFeatureNotSaveable) ||
                saved == gen(sc::kInvalidField))
        << std::hex << saved;
  }

  // A reserved log page: Invalid Log Page (Base §5.16); QEMU answers Invalid Field.
  SubmissionEntry lp{};
  lp.opcode = admin::kGetLogPage;
  lp.cdw10 = 0x42 | (15u << 16);
  lp.prp1 = buf_.iova;
  const uint16_t log = admin(lp);
  if (r_->emu) {
    EXPECT_EQ(log, spec(sc::kInvalidLogPage));
  } else {
    EXPECT_TRUE(log == spec(sc::kInvalidLogPage) || log == gen(sc::kInvalidField))
        << std::hex << log;
  }
}

TEST_F(Errors, LbaOutOfRange) {
  auto out_of_range = [&](SubmissionEntry c) {
    const uint16_t got = io(c);
    EXPECT_TRUE(r_->lba_range_status(got)) << "status " << std::hex << got << " for LBA "
                                           << std::dec << (uint64_t{c.cdw11} << 32 | c.cdw10);
  };
  out_of_range(rd(nsze_, 1));
  out_of_range(rd(nsze_ - 1, 2));
  out_of_range(rd(~0ull - 1, 4));  // slba + nlb overflows
  EXPECT_EQ(io(rd(nsze_ - 1, 1)), 0);
  if (r_->ctrl->identify().oncs & oncs::kWriteZeroes) {
    out_of_range(make_write_zeroes(r_->nsid, nsze_ - 2, 3, false));
  }
  if (r_->emu) {  // QEMU skips a deallocate range past the end: DSM is advisory
    DmaRegion ranges = r_->alloc(kPage);
    static_cast<DsmRange*>(ranges.vaddr)[0] = DsmRange{0, 8, nsze_ - 4};
    EXPECT_EQ(io(make_deallocate(r_->nsid, ranges.iova, 1)), gen(sc::kLbaOutOfRange));
  }
}

TEST_F(Errors, InvalidNamespace) {
  SubmissionEntry c = rd(0, 1);
  c.nsid = 0;
  EXPECT_EQ(io(c), gen(sc::kInvalidNamespace));
  c.nsid = bad_nsid_;
  EXPECT_EQ(io(c), gen(sc::kInvalidNamespace));
  EXPECT_EQ(io(make_flush(bad_nsid_)), gen(sc::kInvalidNamespace));
  SubmissionEntry id{};
  id.opcode = admin::kIdentify;
  id.cdw10 = cns::kNamespace;
  id.nsid = bad_nsid_;
  id.prp1 = buf_.iova;
  std::memset(buf_.vaddr, 0xa5, kPage);
  const uint16_t st = admin(id);
  if (Rig::fabrics() && st == 0) {
    // The kernel's nvmet answers an Identify of any NSID but FFFFFFFFh with a zeroed
    // structure, as for an inactive namespace, even beyond NN (Linux 6.1).
    const auto* p = static_cast<const uint8_t*>(buf_.vaddr);
    EXPECT_TRUE(std::all_of(p, p + kPage, [](uint8_t b) { return b == 0; }));
  } else {
    EXPECT_EQ(st, gen(sc::kInvalidNamespace));
  }
}

// Base §5.4, §5.5, §5.6, §5.7: the command specific statuses of queue creation and deletion.
TEST_F(Errors, QueueCreationAndDeletion) {
  uint32_t nq = 0;  // Number of Queues as allocated: NSQA in 15:0, NCQA in 31:16, 0's based
  SubmissionEntry get{};
  get.opcode = admin::kGetFeatures;
  get.cdw10 = fid::kNumberOfQueues;
  ASSERT_EQ(r_->ctrl->admin(get, nullptr, 0, false, &nq).code(), Code::kOk);
  const uint32_t ncqa = (nq >> 16) + 1, nsqa = (nq & 0xffff) + 1;
  if (ncqa < 2 || nsqa < 2) GTEST_SKIP() << "needs two I/O queue pairs; the device has one";

  DmaRegion q = r_->alloc(64 * 64);
  SubmissionEntry c{};
  c.opcode = admin::kCreateIoCq;
  c.prp1 = q.iova;
  c.cdw11 = 1;  // physically contiguous, no interrupts
  c.cdw10 = 0 | (7u << 16);
  EXPECT_EQ(admin(c), spec(sc::kInvalidQueueId));  // qid 0 is the admin queue
  c.cdw10 = 1 | (7u << 16);
  EXPECT_EQ(admin(c), spec(sc::kInvalidQueueId));  // already exists
  if (ncqa < 0xffff) {
    c.cdw10 = (ncqa + 1) | (7u << 16);
    EXPECT_EQ(admin(c), spec(sc::kInvalidQueueId));  // beyond Number of Queues
  }
  c.cdw10 = 2 | (0u << 16);
  EXPECT_EQ(admin(c), spec(sc::kInvalidQueueSize));  // one entry
  if (r_->ctrl->max_queue_entries() < kIoQueueMaxEntries) {
    c.cdw10 = 2 | (0xffffu << 16);
    EXPECT_EQ(admin(c), spec(sc::kInvalidQueueSize));  // beyond CAP.MQES
  }
  c.cdw10 = 2 | (7u << 16);
  c.cdw11 = 1 | 2 | (2048u << 16);  // no MSI-X table has more than 2048 entries
  EXPECT_EQ(admin(c), spec(sc::kInvalidInterruptVector));
  c.cdw11 = 1;
  c.prp1 = q.iova + 64;  // contiguous queues start on a page boundary
  EXPECT_EQ(admin(c), gen(sc::kInvalidPrpOffset));
  if (r_->emu) {      // a real device only reaches the address when it posts a completion
    c.prp1 = 0x5000;  // not DMA memory
    EXPECT_EQ(admin(c), gen(sc::kDataTransferError));
  }

  SubmissionEntry s{};
  s.opcode = admin::kCreateIoSq;
  s.prp1 = q.iova;
  s.cdw10 = 2 | (7u << 16);
  s.cdw11 = 1 | (3u << 16);  // CQ 3 does not exist
  EXPECT_EQ(admin(s), spec(sc::kCqInvalid));

  SubmissionEntry d{};
  d.opcode = admin::kDeleteIoCq;
  d.cdw10 = 1;
  EXPECT_EQ(admin(d), spec(sc::kInvalidQueueDeletion));  // SQ 1 still uses it
  d.opcode = admin::kDeleteIoSq;
  d.cdw10 = 9;  // never created (or beyond Number of Queues)
  EXPECT_EQ(admin(d), spec(sc::kInvalidQueueId));
}

// The emulated controller checks every PRP's alignment (Base §4.3 lets a controller report
// Invalid PRP Offset, it does not require it) and refuses addresses outside DMA memory, where
// a real device behind an IOMMU would fault.
TEST_F(Errors, InvalidPrpOffsetsAndAddresses) {
  WARPFS_EMULATED_ONLY() << "PRP checks the spec leaves optional, DMA to unmapped addresses";
  const uint32_t per_page = static_cast<uint32_t>(kPage / r_->lba);
  SubmissionEntry c = make_read(r_->nsid, 0, 1);
  c.prp1 = buf_.iova + 2;  // not dword aligned
  EXPECT_EQ(io(c), gen(sc::kInvalidPrpOffset));
  c = make_read(r_->nsid, 0, 2 * per_page);  // two pages: PRP2 must be page aligned
  c.prp1 = buf_.iova;
  c.prp2 = buf_.iova + kPage + 512;
  EXPECT_EQ(io(c), gen(sc::kInvalidPrpOffset));
  c = make_read(r_->nsid, 0, 4 * per_page);  // four pages: a list with a misaligned entry
  DmaRegion list = r_->alloc(kPage);
  auto* e = static_cast<uint64_t*>(list.vaddr);
  e[0] = buf_.iova + kPage, e[1] = buf_.iova + 2 * kPage + 8, e[2] = buf_.iova + 3 * kPage;
  c.prp1 = buf_.iova;
  c.prp2 = list.iova;
  EXPECT_EQ(io(c), gen(sc::kInvalidPrpOffset));
  c.prp2 = list.iova + 4;  // list pointer not qword aligned
  EXPECT_EQ(io(c), gen(sc::kInvalidPrpOffset));
  c = make_read(r_->nsid, 0, 1);
  c.prp1 = 0x1234000;  // no DMA memory there
  EXPECT_EQ(io(c), gen(sc::kDataTransferError));
}

// A transfer that would run past its buffer fails before a byte moves: the buffer and its
// neighbour keep their contents.
TEST_F(Errors, FailedTransferTouchesNothing) {
  WARPFS_EMULATED_ONLY() << "the model's DMA bounds (an IOMMU may map the next page)";
  DmaRegion a = r_->alloc(kPage), b = r_->alloc(kPage);
  std::memset(a.vaddr, 0xcc, kPage);
  std::memset(b.vaddr, 0xdd, kPage);
  SubmissionEntry c = make_read(r_->nsid, 0, static_cast<uint32_t>(kPage / r_->lba));
  c.prp1 = a.iova + 2048;   // first 2 KiB fit in a...
  c.prp2 = a.iova + kPage;  // ...the rest would be past its end
  EXPECT_EQ(io(c), gen(sc::kDataTransferError));
  for (uint64_t i = 0; i < kPage; ++i) {
    ASSERT_EQ(static_cast<uint8_t*>(a.vaddr)[i], 0xcc);
    ASSERT_EQ(static_cast<uint8_t*>(b.vaddr)[i], 0xdd);
  }
}

// The driver tracks the SQ head from completions: until the device reports progress a
// 16-entry queue takes 15 commands (Base §4.1.1), then refuses; after the doorbell all 15
// complete.
TEST_F(Errors, RawQueueReportsFull) {
  int pushed = 0;
  while (qp_->push(rd(0, 1)).is_ok()) ++pushed;
  EXPECT_EQ(pushed, 15);
  EXPECT_EQ(qp_->push(rd(0, 1)).code(), Code::kQueueFull);
  qp_->ring_sq();
  CompletionEntry e;
  int got = 0;
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (got < pushed && port::now_ns() < deadline) {
    while (qp_->pop(&e)) {
      EXPECT_EQ(sf(e), 0);
      ++got;
    }
    qp_->ring_cq();
  }
  EXPECT_EQ(got, pushed);
  EXPECT_TRUE(qp_->push(rd(0, 1)).is_ok());  // room again
  qp_->ring_sq();
  got = 0;
  while (got < 1 && port::now_ns() < deadline) {
    got += qp_->pop(&e) ? 1 : 0;
  }
  qp_->ring_cq();
  EXPECT_EQ(got, 1);
}

TEST_F(Errors, ErrorLogRecordsFailures) {
  WARPFS_EMULATED_ONLY() << "exact error log contents (QEMU keeps no error log entries)";
  SubmissionEntry c = rd(0, 1);
  c.nsid = bad_nsid_;
  c.cid = 0x0bad;
  ASSERT_EQ(io(c), gen(sc::kInvalidNamespace));
  ErrorLogEntry log[4] = {};
  SubmissionEntry lp{};
  lp.opcode = admin::kGetLogPage;
  lp.cdw10 = lid::kErrorInformation | ((sizeof log / 4 - 1) << 16);
  ASSERT_TRUE(r_->ctrl->admin(lp, log, sizeof log, false, nullptr).is_ok());
  EXPECT_GT(log[0].error_count, 0u);
  EXPECT_EQ(log[0].cid, 0x0bad);
  EXPECT_EQ(log[0].sqid, 1);
  EXPECT_EQ(log[0].nsid, bad_nsid_);
  EXPECT_EQ(log[0].status >> 1, gen(sc::kInvalidNamespace));
}

TEST_F(Errors, InvalidDoorbellValueIsIgnoredAndLogged) {
  WARPFS_EMULATED_ONLY() << "the model's error counter (a real device may fail itself)";
  const uint64_t before = r_->emu->counters().errors;
  v_.sq_doorbell.ring(1000);  // beyond the 16-entry queue
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (r_->emu->counters().errors == before && port::now_ns() < deadline) {
    port::thread_yield();
  }
  EXPECT_GT(r_->emu->counters().errors, before);
  EXPECT_EQ(io(rd(0, 1)), 0);  // the controller keeps working
}

// Random commands on an I/O queue: every one completes with some status, nothing crashes,
// and a DMA region no command names keeps its contents.
TEST_F(Errors, RandomCommandsNeverCrashOrStray) {
  WARPFS_EMULATED_ONLY() << "robustness of the model (random PRPs and SGLs would DMA anywhere)";
  DmaRegion canary = r_->alloc(kPage);
  std::memset(canary.vaddr, 0x5a, kPage);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3000; ++i) {
    SubmissionEntry c;
    auto* w = reinterpret_cast<uint64_t*>(&c);
    for (int k = 0; k < 8; ++k) w[k] = rng();
    static const uint8_t ops[] = {0, 1, 2, 8, 9, 0x7f};
    c.opcode = ops[rng() % 6];
    c.flags &= (rng() % 4 == 0) ? 0xff : 0;
    c.nsid = rng() % 4 == 0 ? static_cast<uint32_t>(rng()) : r_->nsid;
    c.cdw10 = static_cast<uint32_t>(rng() % (nsze_ + 8));
    c.cdw11 = rng() % 8 == 0 ? static_cast<uint32_t>(rng()) : 0;
    c.cdw12 = static_cast<uint32_t>(rng() % 64) | (rng() % 2 ? io::kCdw12Fua : 0);
    if (rng() % 3) c.prp1 = buf_.iova + (rng() % (16 * kPage)) * (rng() % 2 ? 1 : 4) / 4 * 4;
    if (rng() % 2) c.prp2 = buf_.iova + (rng() % 16) * kPage;
    (void)io(c);
  }
  for (uint64_t i = 0; i < kPage; ++i) ASSERT_EQ(static_cast<uint8_t*>(canary.vaddr)[i], 0x5a);
  EXPECT_EQ(io(rd(0, 1)), 0);
}

}  // namespace
}  // namespace warpfs::nvme::test
