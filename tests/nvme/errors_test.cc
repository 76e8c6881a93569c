// Every bad command gets its NVMe status, lands in the error log, and touches no memory
// outside the buffers it names; a stream of random commands never crashes the device.
#include <random>

#include "nvme/rig.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

constexpr uint16_t kGen(uint8_t code) {
  return make_status(sct::kGeneric, code);
}
constexpr uint16_t kSpec(uint8_t code) {
  return make_status(sct::kCommandSpecific, code);
}

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatedConfig cfg;
    cfg.mdts = 4;  // 64 KiB
    r_ = Rig::make(cfg, 8ull << 20);
    ASSERT_TRUE(r_);
    ASSERT_TRUE(r_->ctrl->create_queue_pair(1, 16, QueuePriority::kMedium, &v_).is_ok());
    qp_ = std::make_unique<RawQueuePair>(v_);
    buf_ = r_->alloc(32 * 4096);
    list_ = r_->alloc(4096);
    nsze_ = r_->ctrl->namespaces()[0].lba_count;
  }
  uint16_t io(SubmissionEntry c) { return sf(run_raw(*qp_, c)); }
  uint16_t admin(SubmissionEntry c) {
    Status s = r_->ctrl->admin(c, nullptr, 0, false, nullptr);
    return s.code() == Code::kNvme ? s.nvme_status() : (s.is_ok() ? 0 : 0xffff);
  }
  SubmissionEntry rd(uint64_t slba, uint32_t n) {
    SubmissionEntry c = make_read(1, slba, n);
    EXPECT_TRUE(fill_prps(&c, buf_.iova, uint64_t{n} * 512,
                          PrpList{static_cast<uint64_t*>(list_.vaddr), list_.iova}));
    return c;
  }

  std::unique_ptr<Rig> r_;
  QueueView v_;
  std::unique_ptr<RawQueuePair> qp_;
  DmaRegion buf_, list_;
  uint64_t nsze_ = 0;
};

TEST_F(Errors, InvalidOpcodes) {
  SubmissionEntry c{};
  c.opcode = 0x7e;
  c.nsid = 1;
  EXPECT_EQ(io(c), kGen(sc::kInvalidOpcode));
  c.opcode = 0x7f;
  EXPECT_EQ(admin(c), kGen(sc::kInvalidOpcode));
}

TEST_F(Errors, InvalidFields) {
  SubmissionEntry c = rd(0, 1);
  c.flags = 0x40;  // PSDT: SGLs, which this controller does not support
  EXPECT_EQ(io(c), kGen(sc::kInvalidField));
  EXPECT_EQ(io(rd(0, 129)), kGen(sc::kInvalidField));  // over MDTS (128 blocks of 512 B)
  SubmissionEntry id{};
  id.opcode = admin::kIdentify;
  id.cdw10 = 0x55;
  id.prp1 = buf_.iova;
  EXPECT_EQ(admin(id), kGen(sc::kInvalidField));
  SubmissionEntry gf{};
  gf.opcode = admin::kGetFeatures;
  gf.cdw10 = 0x77;
  EXPECT_EQ(admin(gf), kGen(sc::kInvalidField));
  SubmissionEntry sv{};
  sv.opcode = admin::kSetFeatures;
  sv.cdw10 = fid::kArbitration | (1u << 31);
  EXPECT_EQ(admin(sv), kSpec(sc::kFeatureNotSaveable));
}

TEST_F(Errors, LbaOutOfRange) {
  EXPECT_EQ(io(rd(nsze_, 1)), kGen(sc::kLbaOutOfRange));
  EXPECT_EQ(io(rd(nsze_ - 1, 2)), kGen(sc::kLbaOutOfRange));
  EXPECT_EQ(io(rd(~0ull - 1, 4)), kGen(sc::kLbaOutOfRange));  // slba + nlb overflows
  EXPECT_EQ(io(rd(nsze_ - 1, 1)), 0);
  EXPECT_EQ(io(make_write_zeroes(1, nsze_ - 2, 3, false)), kGen(sc::kLbaOutOfRange));
  DmaRegion ranges = r_->alloc(4096);
  static_cast<DsmRange*>(ranges.vaddr)[0] = DsmRange{0, 8, nsze_ - 4};
  EXPECT_EQ(io(make_deallocate(1, ranges.iova, 1)), kGen(sc::kLbaOutOfRange));
}

TEST_F(Errors, InvalidNamespace) {
  SubmissionEntry c = rd(0, 1);
  c.nsid = 0;
  EXPECT_EQ(io(c), kGen(sc::kInvalidNamespace));
  c.nsid = 2;
  EXPECT_EQ(io(c), kGen(sc::kInvalidNamespace));
  EXPECT_EQ(io(make_flush(9)), kGen(sc::kInvalidNamespace));
  SubmissionEntry id{};
  id.opcode = admin::kIdentify;
  id.cdw10 = cns::kNamespace;
  id.nsid = 5;
  id.prp1 = buf_.iova;
  EXPECT_EQ(admin(id), kGen(sc::kInvalidNamespace));
}

TEST_F(Errors, QueueCreationAndDeletion) {
  DmaRegion q = r_->alloc(64 * 64);
  SubmissionEntry c{};
  c.opcode = admin::kCreateIoCq;
  c.prp1 = q.iova;
  c.cdw11 = 1;
  c.cdw10 = 0 | (7u << 16);
  EXPECT_EQ(admin(c), kSpec(sc::kInvalidQueueId));  // qid 0 is the admin queue
  c.cdw10 = 1 | (7u << 16);
  EXPECT_EQ(admin(c), kSpec(sc::kInvalidQueueId));  // already exists
  c.cdw10 = 60 | (7u << 16);
  EXPECT_EQ(admin(c), kSpec(sc::kInvalidQueueId));  // beyond Number of Queues
  c.cdw10 = 2 | (0u << 16);
  EXPECT_EQ(admin(c), kSpec(sc::kInvalidQueueSize));  // one entry
  c.cdw10 = 2 | (0xffffu << 16);
  EXPECT_EQ(admin(c), kSpec(sc::kInvalidQueueSize));  // beyond CAP.MQES
  c.cdw10 = 2 | (7u << 16);
  c.cdw11 = 1 | 2 | (500u << 16);
  EXPECT_EQ(admin(c), kSpec(sc::kInvalidInterruptVector));
  c.cdw11 = 1;
  c.prp1 = q.iova + 64;
  EXPECT_EQ(admin(c), kGen(sc::kInvalidPrpOffset));
  c.prp1 = 0x5000;  // not DMA memory
  EXPECT_EQ(admin(c), kGen(sc::kDataTransferError));

  SubmissionEntry s{};
  s.opcode = admin::kCreateIoSq;
  s.prp1 = q.iova;
  s.cdw10 = 2 | (7u << 16);
  s.cdw11 = 1 | (3u << 16);  // CQ 3 does not exist
  EXPECT_EQ(admin(s), kSpec(sc::kCqInvalid));

  SubmissionEntry d{};
  d.opcode = admin::kDeleteIoCq;
  d.cdw10 = 1;
  EXPECT_EQ(admin(d), kSpec(sc::kInvalidQueueDeletion));  // SQ 1 still uses it
  d.opcode = admin::kDeleteIoSq;
  d.cdw10 = 9;
  EXPECT_EQ(admin(d), kSpec(sc::kInvalidQueueId));
}

TEST_F(Errors, InvalidPrpOffsetsAndAddresses) {
  SubmissionEntry c = make_read(1, 0, 1);
  c.prp1 = buf_.iova + 2;  // not dword aligned
  EXPECT_EQ(io(c), kGen(sc::kInvalidPrpOffset));
  c = make_read(1, 0, 16);  // two pages: PRP2 must be page aligned
  c.prp1 = buf_.iova;
  c.prp2 = buf_.iova + 4096 + 512;
  EXPECT_EQ(io(c), kGen(sc::kInvalidPrpOffset));
  c = make_read(1, 0, 32);  // four pages: a list whose second entry is misaligned
  DmaRegion list = r_->alloc(4096);
  auto* e = static_cast<uint64_t*>(list.vaddr);
  e[0] = buf_.iova + 4096, e[1] = buf_.iova + 8192 + 8, e[2] = buf_.iova + 12288;
  c.prp1 = buf_.iova;
  c.prp2 = list.iova;
  EXPECT_EQ(io(c), kGen(sc::kInvalidPrpOffset));
  c.prp2 = list.iova + 4;  // list pointer not qword aligned
  EXPECT_EQ(io(c), kGen(sc::kInvalidPrpOffset));
  c = make_read(1, 0, 1);
  c.prp1 = 0x1234000;  // no DMA memory there
  EXPECT_EQ(io(c), kGen(sc::kDataTransferError));
  SubmissionEntry lp{};
  lp.opcode = admin::kGetLogPage;
  lp.cdw10 = 0x42 | (15u << 16);
  lp.prp1 = buf_.iova;
  EXPECT_EQ(admin(lp), kSpec(sc::kInvalidLogPage));
}

// A transfer that would run past its buffer fails before a byte moves: the buffer and its
// neighbour keep their contents.
TEST_F(Errors, FailedTransferTouchesNothing) {
  DmaRegion a = r_->alloc(4096), b = r_->alloc(4096);
  std::memset(a.vaddr, 0xcc, 4096);
  std::memset(b.vaddr, 0xdd, 4096);
  SubmissionEntry c = make_read(1, 0, 8);
  c.prp1 = a.iova + 2048;  // first 2 KiB fit in a...
  c.prp2 = a.iova + 4096;  // ...the rest would be past its end
  EXPECT_EQ(io(c), kGen(sc::kDataTransferError));
  for (int i = 0; i < 4096; ++i) {
    ASSERT_EQ(static_cast<uint8_t*>(a.vaddr)[i], 0xcc);
    ASSERT_EQ(static_cast<uint8_t*>(b.vaddr)[i], 0xdd);
  }
}

TEST_F(Errors, RawQueueReportsFullAndErrorLogRecordsFailures) {
  r_->transport->pause(true);
  int pushed = 0;
  while (qp_->push(rd(0, 1)).is_ok()) ++pushed;
  EXPECT_EQ(pushed, 15);  // a 16-entry queue holds 15
  EXPECT_EQ(qp_->push(rd(0, 1)).code(), Code::kQueueFull);
  qp_->ring_sq();
  r_->transport->pause(false);
  CompletionEntry e;
  int got = 0;
  while (got < pushed) {
    while (qp_->pop(&e)) ++got;
    qp_->ring_cq();
  }
  SubmissionEntry c = rd(0, 1);
  c.nsid = 3;
  c.cid = 0x0bad;
  ASSERT_EQ(sf(run_raw(*qp_, c)), kGen(sc::kInvalidNamespace));
  ErrorLogEntry log[4] = {};
  SubmissionEntry lp{};
  lp.opcode = admin::kGetLogPage;
  lp.cdw10 = lid::kErrorInformation | ((sizeof log / 4 - 1) << 16);
  ASSERT_TRUE(r_->ctrl->admin(lp, log, sizeof log, false, nullptr).is_ok());
  EXPECT_GT(log[0].error_count, 0u);
  EXPECT_EQ(log[0].cid, 0x0bad);
  EXPECT_EQ(log[0].sqid, 1);
  EXPECT_EQ(log[0].nsid, 3u);
  EXPECT_EQ(log[0].status >> 1, kGen(sc::kInvalidNamespace));
}

TEST_F(Errors, InvalidDoorbellValueIsIgnoredAndLogged) {
  const uint64_t before = r_->transport->counters().errors;
  v_.sq_doorbell.ring(1000);  // beyond the 16-entry queue
  const uint64_t deadline = port::now_ns() + 10'000'000'000ull;
  while (r_->transport->counters().errors == before && port::now_ns() < deadline) {
    port::thread_yield();
  }
  EXPECT_GT(r_->transport->counters().errors, before);
  EXPECT_EQ(io(rd(0, 1)), 0);  // the controller keeps working
}

// Random commands on an I/O queue: every one completes with some status, nothing crashes,
// and a DMA region no command names keeps its contents.
TEST_F(Errors, RandomCommandsNeverCrashOrStray) {
  DmaRegion canary = r_->alloc(4096);
  std::memset(canary.vaddr, 0x5a, 4096);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3000; ++i) {
    SubmissionEntry c;
    auto* w = reinterpret_cast<uint64_t*>(&c);
    for (int k = 0; k < 8; ++k) w[k] = rng();
    static const uint8_t ops[] = {0, 1, 2, 8, 9, 0x7f};
    c.opcode = ops[rng() % 6];
    c.flags &= (rng() % 4 == 0) ? 0xff : 0;
    c.nsid = rng() % 4 == 0 ? static_cast<uint32_t>(rng()) : 1;
    c.cdw10 = static_cast<uint32_t>(rng() % (nsze_ + 8));
    c.cdw11 = rng() % 8 == 0 ? static_cast<uint32_t>(rng()) : 0;
    c.cdw12 = static_cast<uint32_t>(rng() % 64) | (rng() % 2 ? io::kCdw12Fua : 0);
    if (rng() % 3) c.prp1 = buf_.iova + (rng() % (16 * 4096)) * (rng() % 2 ? 1 : 4) / 4 * 4;
    if (rng() % 2) c.prp2 = buf_.iova + (rng() % 16) * 4096;
    (void)io(c);
  }
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(static_cast<uint8_t*>(canary.vaddr)[i], 0x5a);
  EXPECT_EQ(io(rd(0, 1)), 0);
}

}  // namespace
}  // namespace warpfs::nvme::test
