// Bounded waiting: a command that never completes, a controller fatal status and a
// controller that stays broken. The engine's watchdog must turn each into a failed command
// (Host Aborted Command), reset the controller and re-create its queues, or fail every
// command at once when the reset does not work; nothing waits forever, data survives.
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "nvme/rig.h"
#include "warpfs/nvme/io_batch.h"
#include "warpfs/nvme/io_engine.h"

namespace warpfs::nvme::test {
namespace {

constexpr uint64_t kTimeoutNs = 150'000'000;  // the watchdog's I/O timeout in these tests

bool host_aborted(uint16_t status) {
  return status_sct(status) == sct::kPath && status_sc(status) == sc::kHostAbortedCommand;
}

class Recovery : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatedConfig cfg;  // on another device (vfio, foreign) only the explicit reset runs
    cfg.worker_threads = 2;
    r_ = Rig::make(cfg);
    ASSERT_TRUE(r_);
    EngineOptions eo;
    eo.metadata_queues = 1;
    eo.bulk_queues = 3;
    eo.queue_entries = 32;
    // A real device under emulation (QEMU with TCG) may be slow: no spurious resets there.
    eo.io_timeout_ns = Rig::real_device() ? 30'000'000'000ull : kTimeoutNs;
    eo.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> g(log_mu_);
      log_.push_back(line);
    };
    std::string err;
    engine_ = IoEngine::create(*r_->ctrl, eo, &err);
    ASSERT_TRUE(engine_) << err;
    buf_ = r_->alloc(80 * 4096);
  }
  void TearDown() override { engine_.reset(); }

  // One synchronous transfer of `n` blocks at `slba` through page `page` of buf_.
  uint16_t io(bool write, uint64_t slba, uint32_t n, uint32_t page = 0) {
    SubmissionEntry c = write ? make_write(r_->nsid, slba, n) : make_read(r_->nsid, slba, n);
    c.prp1 = buf_.iova + page * kPage;  // n * lba <= 4 KiB: one page, no PRP2
    return engine_->mapper().execute(c, Priority::kBulk);
  }
  uint8_t* page(uint32_t i) { return static_cast<uint8_t*>(buf_.vaddr) + i * kPage; }
  std::string log_text() {
    std::lock_guard<std::mutex> g(log_mu_);
    std::string all;
    for (const std::string& l : log_) all += l + "\n";
    return all;
  }
  // Bounded wait for the watchdog's reset to finish (the counters move when it has).
  bool await_resets(uint64_t n) {
    const uint64_t deadline = port::now_ns() + 20 * kTimeoutNs + 5'000'000'000ull;
    while (engine_->counters().resets + engine_->counters().failed_resets < n) {
      if (port::now_ns() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  }

  std::unique_ptr<Rig> r_;
  std::unique_ptr<IoEngine> engine_;
  DmaRegion buf_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(Recovery, AHungCommandTimesOutAndTheQueuesComeBack) {
  WARPFS_EMULATED_ONLY() << "injects hung commands and fatal statuses";
  // Data written before the hang must read back after the reset.
  std::memset(page(1), 0x5a, r_->lba);
  ASSERT_EQ(io(true, 20, 1, 1), 0);
  Fault f;
  f.kind = FaultKind::kNoCompletion;
  f.nsid = r_->nsid;
  f.slba = 10;
  f.nlb = 1;
  f.times = 1;
  r_->emu->inject(f);
  const uint16_t hung = io(false, 10, 1);
  EXPECT_TRUE(host_aborted(hung)) << status_name(hung);
  EXPECT_FALSE(hung & (1u << 14)) << "DNR: a retry after the reset may work";
  ASSERT_TRUE(await_resets(1));
  EngineCounters c = engine_->counters();
  EXPECT_EQ(c.timeouts, 1u);
  EXPECT_EQ(c.resets, 1u);
  EXPECT_FALSE(c.dead);
  EXPECT_NE(log_text().find("no completion for"), std::string::npos) << log_text();
  // The fault healed after one command: the same LBA reads now, and the old data is there.
  EXPECT_EQ(io(false, 10, 1), 0);
  std::memset(page(2), 0, r_->lba);
  ASSERT_EQ(io(false, 20, 1, 2), 0);
  EXPECT_EQ(std::memcmp(page(1), page(2), r_->lba), 0);
  // Every queue was re-created: commands on all of them complete (metadata and bulk).
  for (int i = 0; i < 64; ++i) {
    SubmissionEntry rd = make_read(r_->nsid, 30 + i, 1);
    rd.prp1 = buf_.iova + 3 * kPage;
    ASSERT_EQ(engine_->mapper().execute(rd, i % 2 ? Priority::kBulk : Priority::kMetadata), 0);
  }
  EXPECT_EQ(engine_->counters().resets, 1u);
}

TEST_F(Recovery, ThreadsInFlightDuringAResetAllFinish) {
  WARPFS_EMULATED_ONLY() << "injects hung commands and fatal statuses";
  // Four threads keep batches of writes and reads in flight over their own blocks; one
  // block hangs once. Every command must finish (done or aborted), and every block whose
  // last write succeeded must read back what that write wrote.
  constexpr int kThreads = 4;
  constexpr int kBlocksPerThread = 8;
  constexpr int kRounds = 40;
  Fault f;
  f.kind = FaultKind::kNoCompletion;
  f.nsid = r_->nsid;
  f.slba = 1000 + 3;  // thread 0's fourth block
  f.nlb = 1;
  f.times = 1;
  r_->emu->inject(f);
  std::atomic<int> aborted{0}, other_errors{0}, mismatches{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      const uint64_t base = 1000 + static_cast<uint64_t>(t) * kBlocksPerThread;
      // Each thread uses its own pages of buf_: kBlocksPerThread write pages, as many read.
      const uint32_t first = 4 + static_cast<uint32_t>(t) * 2 * kBlocksPerThread;
      std::vector<int> good(kBlocksPerThread, -1);  // round of the last acknowledged write
      for (int round = 0; round < kRounds; ++round) {
        IoBatch b(engine_->mapper());
        for (int i = 0; i < kBlocksPerThread; ++i) {
          std::memset(page(first + i), static_cast<uint8_t>(round * 16 + i + 1), r_->lba);
          SubmissionEntry w = make_write(r_->nsid, base + i, 1);
          w.prp1 = buf_.iova + (first + i) * kPage;
          b.submit(w, Priority::kBulk);
        }
        b.wait_all();
        for (int i = 0; i < kBlocksPerThread; ++i) {
          const uint16_t s = b.status(i);
          if (s == 0) {
            good[i] = round;
          } else if (host_aborted(s)) {
            aborted.fetch_add(1);
            good[i] = -2;  // unknown: the write may or may not have reached the media
          } else {
            other_errors.fetch_add(1);
          }
        }
        b.clear();
        for (int i = 0; i < kBlocksPerThread; ++i) {
          SubmissionEntry rd = make_read(r_->nsid, base + i, 1);
          rd.prp1 = buf_.iova + (first + kBlocksPerThread + i) * kPage;
          b.submit(rd, Priority::kMetadata);
        }
        b.wait_all();
        for (int i = 0; i < kBlocksPerThread; ++i) {
          const uint16_t s = b.status(i);
          if (host_aborted(s)) {
            aborted.fetch_add(1);
            continue;
          }
          if (s != 0) {
            other_errors.fetch_add(1);
            continue;
          }
          if (good[i] == round && page(first + kBlocksPerThread + i)[r_->lba - 1] !=
                                      static_cast<uint8_t>(round * 16 + i + 1)) {
            if (mismatches.fetch_add(1) < 3)
              ADD_FAILURE() << "thread " << t << " round " << round << " block " << i << " got "
                            << int(page(first + kBlocksPerThread + i)[r_->lba - 1]);
          }
        }
      }
    });
  }
  for (std::thread& t : ts) t.join();
  EXPECT_EQ(other_errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GE(aborted.load(), 1) << "the hung write must fail";
  ASSERT_TRUE(await_resets(1));
  EXPECT_EQ(engine_->counters().resets, 1u) << log_text();
  EXPECT_EQ(engine_->counters().timeouts, 1u);
  EXPECT_EQ(io(false, 1003, 1), 0);
}

TEST_F(Recovery, AFatalStatusResetsTheController) {
  WARPFS_EMULATED_ONLY() << "injects hung commands and fatal statuses";
  std::memset(page(1), 0xa5, r_->lba);
  ASSERT_EQ(io(true, 40, 1, 1), 0);
  r_->emu->inject_fatal(false);
  // Submitted to a failed controller: aborted by the reset (or, if it raced ahead of the
  // fatal status, done).
  const uint16_t s = io(false, 40, 1, 2);
  EXPECT_TRUE(s == 0 || host_aborted(s)) << status_name(s);
  ASSERT_TRUE(await_resets(1));
  EXPECT_GE(engine_->counters().fatal_status, 1u);
  EXPECT_EQ(engine_->counters().resets, 1u);
  EXPECT_NE(log_text().find("CSTS.CFS"), std::string::npos) << log_text();
  EXPECT_EQ(r_->transport->read32(reg::kCsts) & csts::kCfs, 0u);
  std::memset(page(2), 0, r_->lba);
  ASSERT_EQ(io(false, 40, 1, 2), 0);
  EXPECT_EQ(std::memcmp(page(1), page(2), r_->lba), 0);
}

TEST_F(Recovery, AControllerThatStaysBrokenFailsEveryCommandAtOnce) {
  WARPFS_EMULATED_ONLY() << "injects hung commands and fatal statuses";
  r_->emu->inject_fatal(true);
  const uint16_t first = io(false, 0, 1);
  EXPECT_TRUE(host_aborted(first)) << status_name(first);
  ASSERT_TRUE(await_resets(1));
  const EngineCounters c = engine_->counters();
  EXPECT_TRUE(c.dead);
  EXPECT_EQ(c.failed_resets, 1u);
  EXPECT_EQ(c.resets, 0u);
  EXPECT_NE(log_text().find("every command fails"), std::string::npos) << log_text();
  // Dead queues answer at once, with Do Not Retry, from any thread and through a batch.
  const uint16_t later = io(true, 0, 1);
  EXPECT_TRUE(host_aborted(later));
  EXPECT_TRUE(later & (1u << 14));
  IoBatch b(engine_->mapper());
  for (int i = 0; i < 8; ++i) {
    SubmissionEntry rd = make_read(r_->nsid, i, 1);
    rd.prp1 = buf_.iova;
    b.submit(rd, Priority::kBulk);
  }
  EXPECT_EQ(b.wait_all(), 8);
  // A second recovery refuses: nothing to bring back.
  EXPECT_FALSE(engine_->recover("test").is_ok());
}

TEST_F(Recovery, AnExplicitRecoverKeepsTheEngineUsable) {
  // recover() on a healthy controller (as after an admin timeout): the reset and the queue
  // re-creation work on any device (the VFIO guest runs this on QEMU's controller), data
  // written before it reads back after it, twice over.
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(engine_->recover("test reset").is_ok());
    std::memset(page(1), 0x30 + k, r_->lba);
    ASSERT_EQ(io(true, 50 + k, 1, 1), 0);
    std::memset(page(2), 0, r_->lba);
    ASSERT_EQ(io(false, 50 + k, 1, 2), 0);
    EXPECT_EQ(std::memcmp(page(1), page(2), r_->lba), 0);
  }
  EXPECT_EQ(engine_->counters().resets, 2u);
  EXPECT_EQ(engine_->counters().timeouts, 0u);
}

}  // namespace
}  // namespace warpfs::nvme::test
