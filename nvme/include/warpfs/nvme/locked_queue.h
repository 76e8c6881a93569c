// LockedQueue: one queue pair behind one mutex, the baseline BaM measures its protocol
// against (BaM Fig 5.6, "locked queue"). Submission takes the lock, writes the entry and
// rings the doorbell; completion takes the lock, drains every posted entry into a per-CID
// table, rings the CQ head doorbell once, and each thread then picks up its own status.
// It is a fair baseline, not a straw man: doorbells are batched per drain and CIDs are
// recycled from a free list.
//
// Thread-safety: execute() may be called from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "warpfs/nvme/queue_pair.h"

namespace warpfs::nvme {

class LockedQueue {
 public:
  explicit LockedQueue(const QueueView& q);
  // Submits `cmd` and waits for its completion; returns the NVMe status field.
  uint16_t execute(const SubmissionEntry& cmd, uint32_t* dw0 = nullptr);

 private:
  struct Done {
    port::Padded<port::Atomic<uint32_t>> state;  // 0 free, 1 in flight, 2 completed
    uint16_t status = 0;
    uint32_t dw0 = 0;
  };
  bool drain_locked();

  std::mutex mu_;  // guards qp_, free_
  RawQueuePair qp_;
  std::vector<uint16_t> free_;
  std::unique_ptr<Done[]> done_;
  InterruptLine* irq_;
};

}  // namespace warpfs::nvme
