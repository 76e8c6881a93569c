#include "warpfs/nvme/locked_queue.h"

namespace warpfs::nvme {

LockedQueue::LockedQueue(const QueueView& q) : qp_(q), done_(new Done[q.entries]()), irq_(q.irq) {
  // At most entries - 1 commands in flight: the SQ can never overflow.
  for (uint32_t c = q.entries - 1; c-- > 0;) free_.push_back(static_cast<uint16_t>(c));
}

bool LockedQueue::drain_locked() {
  bool any = false;
  CompletionEntry cqe;
  while (qp_.pop(&cqe)) {
    Done& d = done_[cqe.cid];
    d.status = static_cast<uint16_t>(cqe.status >> 1);
    d.dw0 = cqe.dw0;
    d.state.value.store(2, port::Order::kRelease);
    any = true;
  }
  qp_.ring_cq();
  return any;
}

uint16_t LockedQueue::execute(const SubmissionEntry& cmd, uint32_t* dw0) {
  uint16_t cid;
  port::Backoff b;
  for (;;) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!free_.empty()) {
        cid = free_.back();
        free_.pop_back();
        SubmissionEntry c = cmd;
        c.cid = cid;
        done_[cid].state.value.store(1, port::Order::kRelaxed);
        (void)qp_.push(c);  // cannot be full: CIDs bound what is in flight
        qp_.ring_sq();
        break;
      }
      drain_locked();
    }
    b.pause();
  }
  Done& d = done_[cid];
  b.reset();
  while (d.state.value.load(port::Order::kAcquire) != 2) {
    const uint32_t seen = irq_ ? irq_->count.value.load(port::Order::kAcquire) : 0;
    bool progress;
    {
      std::lock_guard<std::mutex> g(mu_);
      progress = drain_locked();
    }
    if (progress || d.state.value.load(port::Order::kAcquire) == 2) continue;
    if (irq_ != nullptr && b.should_block()) {
      irq_->wait(seen, 200'000);
    } else {
      b.pause();
    }
  }
  const uint16_t status = d.status;
  if (dw0 != nullptr) *dw0 = d.dw0;
  std::lock_guard<std::mutex> g(mu_);
  d.state.value.store(0, port::Order::kRelaxed);
  free_.push_back(cid);
  return status;
}

}  // namespace warpfs::nvme
