// A queue pair as memory and doorbells (QueueView, plain data shared by every queue
// discipline), and RawQueuePair: the single-threaded ring discipline the admin queue and the
// low-level tests use, with doorbell batching (ring once for many submissions, as Linux's
// nvme_pci does on the last command of a batch).
//
// Thread-safety: QueueView is immutable after creation. RawQueuePair is not thread-safe;
// REQUIRES: one user at a time (debug builds abort when two calls overlap).
#pragma once

#include <atomic>
#include <cstdint>

#include "warpfs/nvme/check.h"
#include "warpfs/nvme/spec.h"
#include "warpfs/nvme/status.h"
#include "warpfs/nvme/transport.h"

namespace warpfs::nvme {

struct QueueView {
  uint16_t qid = 0;
  uint32_t entries = 0;  // SQ and CQ have the same number of entries
  SubmissionEntry* sq = nullptr;
  CompletionEntry* cq = nullptr;
  Doorbell sq_doorbell;
  Doorbell cq_doorbell;
  InterruptLine* irq = nullptr;  // null: poll only

  // DW3 of CQ slot i, read as one word so phase, CID and status agree.
  WARPFS_HD uint32_t cqe_dw3(uint32_t i, port::Order o) const {
    return reinterpret_cast<port::Atomic<uint32_t>*>(reinterpret_cast<uint8_t*>(cq + i) +
                                                     kCqeDw3Offset)
        ->load(o);
  }
};

class RawQueuePair {
 public:
  explicit RawQueuePair(const QueueView& v) : v_(v) {}
  const QueueView& view() const { return v_; }

  // Copies `cmd` into the next SQ slot; the device sees it after ring_sq().
  Status push(const SubmissionEntry& cmd);
  // Writes the SQ tail doorbell if anything was pushed since the last ring.
  void ring_sq();
  // Takes the next completion if the device has posted one (phase tag matches).
  bool pop(CompletionEntry* out);
  // Writes the CQ head doorbell if anything was popped since the last ring.
  void ring_cq();
  uint32_t in_flight() const {
    return sq_tail_ - sq_head_ + (sq_tail_ < sq_head_ ? v_.entries : 0);
  }

 private:
#if WARPFS_DEBUG_CHECKS
  // The REQUIRES above: a call that finds another one under way has a second user beside it.
  class OneUser {
   public:
    explicit OneUser(std::atomic<bool>& busy) : busy_(busy) {
      WARPFS_DCHECK(!busy_.exchange(true, std::memory_order_acquire),
                    "RawQueuePair used by two threads at once");
    }
    ~OneUser() { busy_.store(false, std::memory_order_release); }
    OneUser(const OneUser&) = delete;
    OneUser& operator=(const OneUser&) = delete;

   private:
    std::atomic<bool>& busy_;
  };
  std::atomic<bool> busy_{false};
#endif
  QueueView v_;
  uint32_t sq_tail_ = 0, sq_tail_rung_ = 0;
  uint32_t sq_head_ = 0;  // from the latest CQE (Base §4.6: SQ Head Pointer)
  uint32_t cq_head_ = 0, cq_head_rung_ = 0;
  bool phase_ = true;  // Base §4.6: the first pass posts phase tag 1
};

}  // namespace warpfs::nvme
