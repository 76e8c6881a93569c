// GPU-initiated NVMe I/O: a GPU thread builds a command, submits it through a VirtualQueue
// (the very header the CPU build uses, compiled for sm_90) and polls its completion. No CPU
// code runs in the per-command path: the emulated controller's host threads see the doorbell
// write and the SQ entry, move the data and post the CQE, which the GPU thread reads.
//
// Where things live (gpu/README.md has the picture):
//   VirtualQueue state (tickets, turns, marks, locks)  GPU memory: only GPU threads touch it.
//   SQ, CQ, data buffers                               pinned host memory mapped into the
//                                                      GPU (the controller is host code).
//   doorbells                                          the emulated register file, pinned and
//                                                      mapped the same way.
//
// Ordering (BaM §2.1.1: PTX acquire/release; every atomic here is system scope, port.h):
//  - Submission. The thread writes its data buffer (writes) and its SQE with plain stores,
//    then publishes the SQE with a release store of its tail mark; the tail-lock holder
//    acquires the mark and rings the doorbell with a system-scope seq_cst store. Release is
//    cumulative in PTX, so the controller thread that sees the doorbell value sees the SQE
//    and the data behind it.
//  - Completion. The controller copies the data into the buffer, then stores CQE DW3 with a
//    release store (x86: stores stay in order). The GPU thread reads DW3 with a system-scope
//    acquire load (virtual_queue.h, find_completion) before it reads the buffer, so it cannot
//    see stale data. BaM §8.2.1's pitfall (the CQE seen before the data, fixed there by an
//    extra flushing read) comes from an SSD's peer-to-peer writes into GPU memory taking a
//    different path than its CQ write; here both travel the same way (host stores to host
//    memory, read by the GPU over PCIe after an acquire), so no flushing read is needed.
//    Were the data buffers moved into GPU memory behind a DMA engine, it would be.
//
// Thread-safety: any number of GPU threads may call these at once. A thread that submitted
// keeps polling until its command completes (VirtualQueue's contract), so every thread that
// may submit must be resident: launch no more blocks than the GPU holds at once, or make
// sure no thread waits on a thread that has not started (the tests and benchmarks do).
#pragma once

#include <cstdint>

#include "warpfs/nvme/port.h"
#include "warpfs/nvme/queue_mapper.h"
#include "warpfs/nvme/spec.h"
#include "warpfs/nvme/virtual_queue.h"

namespace warpfs::gpu {

namespace port = warpfs::port;
namespace nvme = warpfs::nvme;

// What a kernel needs to issue I/O: the queues (device copies of VirtualQueue), the queue
// mapper's tables over them, and the namespace. Plain data, passed to kernels by value.
struct IoView {
  nvme::VirtualQueue* const* queues = nullptr;  // device array of `nqueues` device pointers
  uint32_t nqueues = 0;
  uint32_t nsid = 1;
  uint32_t lba_shift = 9;                       // log2(LBA bytes)
  nvme::QueueMapper::Tables* mapper = nullptr;  // GPU memory; both classes over `queues`
  bool rebalance = true;  // false: route only, never move a slot (RigOptions::rebalance)
};

// Does nothing while a submitter waits (it has one command in flight: nothing to help with).
struct NoHelp {
  WARPFS_HD void operator()() const {}
};

// Command builders (NVM §3.2.4 Read, §3.2.6 Write, §3.2 Flush). PRP1 only, plus PRP2 for a
// transfer that crosses one page boundary (Base §4.3); callers keep transfers within two
// pages, which covers every line size up to 4 KiB on aligned buffers.
__device__ inline nvme::SubmissionEntry make_rw(uint8_t opcode, uint32_t nsid, uint64_t slba,
                                                uint32_t nlb, uint64_t iova, uint32_t bytes) {
  nvme::SubmissionEntry c{};
  c.opcode = opcode;
  c.nsid = nsid;
  c.prp1 = iova;
  const uint64_t page_end = (iova | 4095u) + 1;
  c.prp2 = iova + bytes > page_end ? page_end : 0;
  c.cdw10 = static_cast<uint32_t>(slba);        // SLBA 31:0
  c.cdw11 = static_cast<uint32_t>(slba >> 32);  // SLBA 63:32
  c.cdw12 = (nlb - 1) & 0xffff;                 // NLB, 0's based
  return c;
}

// Submits `cmd` on `vq` and polls until it completes; returns the NVMe Status Field.
__device__ inline uint16_t execute(nvme::VirtualQueue* vq, const nvme::SubmissionEntry& cmd) {
  nvme::Ticket t;
  vq->submit(cmd, &t, NoHelp{});
  port::Backoff b;
  while (!vq->poll(&t)) b.pause();
  return t.status;
}

// Submits `cmd` on the queue the mapper routes it to (nvme/queue_mapper.h, the CPU's rule:
// slots round robin by ticket, a slot moved off a queue under pressure after completion,
// unless io.rebalance is off). GPU commands are all bulk. With one queue pair there is
// nothing to route.
__device__ inline uint16_t execute_routed(const IoView& io, const nvme::SubmissionEntry& cmd) {
  if (io.nqueues == 1) return execute(io.queues[0], cmd);
  const nvme::QueueMapper::Route r = nvme::QueueMapper::route(io.mapper, nvme::Priority::kBulk);
  const uint16_t s = execute(r.vq, cmd);
  if (io.rebalance) nvme::QueueMapper::complete(io.mapper, r);
  return s;
}

// Reads or writes `bytes` (a multiple of the LBA size, at most two pages) at byte offset
// `offset` of the namespace, to or from the DMA buffer at bus address `iova`.
__device__ inline uint16_t rw(const IoView& io, bool write, uint64_t offset, uint32_t bytes,
                              uint64_t iova) {
  const nvme::SubmissionEntry c =
      make_rw(write ? nvme::io::kWrite : nvme::io::kRead, io.nsid, offset >> io.lba_shift,
              bytes >> io.lba_shift, iova, bytes);
  return execute_routed(io, c);
}

__device__ inline uint16_t flush(const IoView& io) {
  nvme::SubmissionEntry c{};
  c.opcode = nvme::io::kFlush;
  c.nsid = io.nsid;
  return execute_routed(io, c);
}

}  // namespace warpfs::gpu
