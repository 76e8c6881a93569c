#include "warpfs/nvme/queue_pair.h"

#include <cstring>

namespace warpfs::nvme {

Status RawQueuePair::push(const SubmissionEntry& cmd) {
#if WARPFS_DEBUG_CHECKS
  const OneUser one(busy_);
#endif
  const uint32_t next = (sq_tail_ + 1) % v_.entries;
  // Base §4.1.1: full when the tail is one entry behind the head.
  if (next == sq_head_) return Status::error(Code::kQueueFull, "submission queue full");
  std::memcpy(&v_.sq[sq_tail_], &cmd, sizeof cmd);
  sq_tail_ = next;
  return Status::ok();
}

void RawQueuePair::ring_sq() {
#if WARPFS_DEBUG_CHECKS
  const OneUser one(busy_);
#endif
  if (sq_tail_ == sq_tail_rung_) return;
  v_.sq_doorbell.ring(sq_tail_);  // one doorbell write for the whole batch
  sq_tail_rung_ = sq_tail_;
}

bool RawQueuePair::pop(CompletionEntry* out) {
#if WARPFS_DEBUG_CHECKS
  const OneUser one(busy_);
#endif
  // Acquire: the rest of the entry was written before its DW3 (phase tag).
  const uint32_t dw3 = v_.cqe_dw3(cq_head_, port::Order::kAcquire);
  if (dw3_phase(dw3) != phase_) return false;
  std::memcpy(out, &v_.cq[cq_head_], sizeof *out);
  sq_head_ = out->sq_head;
  if (++cq_head_ == v_.entries) cq_head_ = 0, phase_ = !phase_;
  return true;
}

void RawQueuePair::ring_cq() {
#if WARPFS_DEBUG_CHECKS
  const OneUser one(busy_);
#endif
  if (cq_head_ == cq_head_rung_) return;
  v_.cq_doorbell.ring(cq_head_);
  cq_head_rung_ = cq_head_;
}

}  // namespace warpfs::nvme
