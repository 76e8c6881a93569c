// Fault injection in the emulated controller: the statuses a failing drive gives,
// on exactly the LBAs chosen, healing after `times` commands, and a full namespace.
#include "nvme/rig.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    WARPFS_EMULATED_ONLY() << "injects faults into the emulated controller";
    r_ = Rig::make();
    ASSERT_TRUE(r_);
    ASSERT_TRUE(r_->ctrl->create_queue_pair(1, 16, QueuePriority::kMedium, &v_).is_ok());
    qp_ = std::make_unique<RawQueuePair>(v_);
    buf_ = r_->alloc(8 * 4096);
    list_ = r_->alloc(4096);
  }
  uint16_t io(bool write, uint64_t slba, uint32_t n) {
    SubmissionEntry c = write ? make_write(r_->nsid, slba, n) : make_read(r_->nsid, slba, n);
    EXPECT_TRUE(fill_prps(&c, buf_.iova, uint64_t{n} * r_->lba,
                          PrpList{static_cast<uint64_t*>(list_.vaddr), list_.iova}));
    return static_cast<uint16_t>(sf(run_raw(*qp_, c)) & 0x7ff);  // without DNR
  }

  std::unique_ptr<Rig> r_;
  QueueView v_;
  std::unique_ptr<RawQueuePair> qp_;
  DmaRegion buf_, list_;
};

TEST_F(Faults, ReadErrorsHitOnlyTheChosenLbasAndHealAfterTimes) {
  Fault f;
  f.kind = FaultKind::kReadError;
  f.nsid = r_->nsid;
  f.slba = 100;
  f.nlb = 4;
  f.times = 2;
  r_->emu->inject(f);
  const uint16_t ure = make_status(sct::kMedia, sc::kUnrecoveredReadError, false);
  EXPECT_EQ(io(false, 96, 4), 0);     // ends just before the range
  EXPECT_EQ(io(false, 104, 4), 0);    // starts just after it
  EXPECT_EQ(io(true, 100, 4), 0);     // writes are not affected by a read fault
  EXPECT_EQ(io(false, 98, 4), ure);   // overlaps its start
  EXPECT_EQ(io(false, 103, 1), ure);  // its last LBA
  EXPECT_EQ(io(false, 100, 4), 0);    // healed after two failures
  EXPECT_EQ(r_->emu->faults_hit(), 2u);
}

TEST_F(Faults, WriteFaultsAndAFullNamespace) {
  Fault f;
  f.kind = FaultKind::kWriteFault;
  f.nsid = r_->nsid;
  f.slba = 0;
  f.nlb = 1;
  r_->emu->inject(f);
  EXPECT_EQ(io(true, 0, 8), make_status(sct::kMedia, sc::kWriteFault, false));
  EXPECT_EQ(io(false, 0, 8), 0);
  EXPECT_EQ(io(true, 8, 8), 0);
  r_->emu->clear_faults();
  EXPECT_EQ(io(true, 0, 8), 0);
  r_->emu->set_capacity_exceeded(true);
  EXPECT_EQ(io(true, 16, 1), make_status(sct::kGeneric, sc::kCapacityExceeded, false));
  EXPECT_EQ(io(false, 16, 1), 0);  // reads still work on a full device
  r_->emu->set_capacity_exceeded(false);
  EXPECT_EQ(io(true, 16, 1), 0);
  EXPECT_EQ(r_->emu->faults_hit(), 2u);
}

}  // namespace
}  // namespace warpfs::nvme::test
