// LockedQueue on the GPU: one queue pair behind one lock, the baseline BaM measures its
// queue protocol against (BaM Fig 5.6, "locked queue"), shaped like the CPU LockedQueue
// (nvme/locked_queue.h) so that the two baselines are the same design:
//   submit:  take the lock; if a CID is free, write the SQE and ring the SQ doorbell, else
//            drain the CQ; unlock.
//   wait:    until our CID's completion is recorded, whoever gets the lock (try_lock: a
//            thread that finds it taken backs off instead of queueing) drains every posted
//            CQE into a per-CID table and rings the CQ head doorbell once.
//   finish:  take the lock, return the CID.
// CIDs bound the commands in flight to entries - 1, so the SQ and the CQ never overflow.
// It is a fair baseline: doorbells are batched per drain and CIDs are recycled from a stack.
//
// Memory: the lock, the ring state and the tables live in GPU memory (device-scope atomics
// would do; system scope is kept so that the lock is the one port.h defines); SQ, CQ and
// doorbells are the rig's mapped host memory.
//
// Thread-safety: execute() may be called from any number of GPU threads at once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "warpfs/gpu/check.h"
#include "warpfs/nvme/port.h"
#include "warpfs/nvme/queue_pair.h"
#include "warpfs/nvme/spec.h"

namespace warpfs::gpu {

class LockedQueueGpu {
 public:
  // Allocates the queue in GPU memory over `q` (device pointers). Free with destroy().
  static LockedQueueGpu* create(const nvme::QueueView& q) {
    LockedQueueGpu h{};  // zero-filled: an unlocked lock
    h.q_ = q;
    h.phase_ = 1;  // Base §4.6: the first pass posts phase tag 1
    std::vector<uint16_t> free(q.entries - 1);
    for (uint32_t c = 0; c + 1 < q.entries; ++c) free[c] = static_cast<uint16_t>(c);
    h.nfree_ = q.entries - 1;
    WARPFS_CUDA_CHECK(cudaMalloc(&h.free_, free.size() * sizeof(uint16_t)));
    WARPFS_CUDA_CHECK(
        cudaMemcpy(h.free_, free.data(), free.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    WARPFS_CUDA_CHECK(cudaMalloc(&h.done_, q.entries * sizeof(Done)));
    WARPFS_CUDA_CHECK(cudaMemset(h.done_, 0, q.entries * sizeof(Done)));
    LockedQueueGpu* d = nullptr;
    WARPFS_CUDA_CHECK(cudaMalloc(&d, sizeof(LockedQueueGpu)));
    WARPFS_CUDA_CHECK(cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice));
    return d;
  }
  static void destroy(LockedQueueGpu* d) {
    LockedQueueGpu h{};
    WARPFS_CUDA_CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    WARPFS_CUDA_CHECK(cudaFree(h.free_));
    WARPFS_CUDA_CHECK(cudaFree(h.done_));
    WARPFS_CUDA_CHECK(cudaFree(d));
  }

  // Submits `cmd` (its CID is overwritten) and waits for it; returns the NVMe Status Field.
  __device__ uint16_t execute(nvme::SubmissionEntry cmd) {
    uint16_t cid = 0;
    port::Backoff b;
    for (;;) {
      lock_.lock();
      if (nfree_ > 0) {
        cid = free_[--nfree_];
        cmd.cid = cid;
        done_[cid].state.value.store(1, port::Order::kRelaxed);
        q_.sq[sq_tail_] = cmd;
        sq_tail_ = sq_tail_ + 1 == q_.entries ? 0 : sq_tail_ + 1;
        // Seq_cst system-scope store: the SQE above reaches the host before the new tail.
        q_.sq_doorbell.ring(sq_tail_);
        lock_.unlock();
        break;
      }
      drain_locked();
      lock_.unlock();
      b.pause();
    }
    b.reset();
    // Acquire: the drainer's status write is visible once we see state 2.
    while (done_[cid].state.value.load(port::Order::kAcquire) != 2) {
      if (lock_.try_lock()) {
        drain_locked();
        lock_.unlock();
      }
      b.pause();
    }
    const uint16_t status = done_[cid].status;
    lock_.lock();
    done_[cid].state.value.store(0, port::Order::kRelaxed);
    free_[nfree_++] = cid;
    lock_.unlock();
    return status;
  }

 private:
  struct Done {
    port::Padded<port::Atomic<uint32_t>> state;  // 0 free, 1 in flight, 2 completed
    uint16_t status;
  };
  LockedQueueGpu() = default;

  // Lock holder: consume every posted CQE (phase tag as expected), ring the CQ head once.
  __device__ void drain_locked() {
    bool any = false;
    for (;;) {
      // Acquire: DW0..DW2 (and the data) were written before DW3 (the controller's release).
      const uint32_t dw3 = q_.cqe_dw3(cq_head_, port::Order::kAcquire);
      if (nvme::dw3_phase(dw3) != (phase_ != 0)) break;
      Done& d = done_[nvme::dw3_cid(dw3)];
      d.status = nvme::dw3_status(dw3);
      d.state.value.store(2, port::Order::kRelease);
      if (++cq_head_ == q_.entries) cq_head_ = 0, phase_ ^= 1;
      any = true;
    }
    if (any) q_.cq_doorbell.ring(cq_head_);
  }

  port::TicketLock lock_;  // guards everything below but done_[].state
  nvme::QueueView q_;
  uint32_t sq_tail_ = 0, cq_head_ = 0, phase_ = 1, nfree_ = 0;
  uint16_t* free_ = nullptr;  // CID stack, nfree_ entries
  Done* done_ = nullptr;      // per CID
};

}  // namespace warpfs::gpu
