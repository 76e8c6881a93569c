// IoEngine: the I/O path the layers above use. It creates the controller's I/O queue pairs,
// wraps each in a VirtualQueue, and puts a QueueMapper with two priority classes on top:
// metadata queues in the high WRR class, bulk queues in the low class (when the controller
// offers WRR; plain round robin otherwise). Commands go through mapper() directly, through
// an IoBatch for up to 32 in flight per thread, or through the synchronous helpers here.
//
// Thread-safety: everything except construction may be used from any number of threads.
// REQUIRES: the Controller outlives the engine; no I/O in flight at destruction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "warpfs/nvme/controller.h"
#include "warpfs/nvme/queue_mapper.h"
#include "warpfs/nvme/virtual_queue.h"

namespace warpfs::nvme {

struct EngineOptions {
  uint16_t metadata_queues = 1;
  uint16_t bulk_queues = 0;      // 0: every granted queue left after the metadata ones
  uint32_t queue_entries = 256;  // rounded down to a power of two within CAP.MQES
  QueueMapper::Options mapper;
};

class IoEngine {
 public:
  static std::unique_ptr<IoEngine> create(Controller& c, const EngineOptions& o,
                                          std::string* error);
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;
  ~IoEngine();

  Controller& controller() { return c_; }
  QueueMapper& mapper() { return *mapper_; }
  const std::vector<QueueView>& queue_views() const { return views_; }
  uint32_t queue_entries() const { return entries_; }

  // Synchronous convenience: one command through the mapper.
  Status execute(const SubmissionEntry& cmd, Priority p);

 private:
  explicit IoEngine(Controller& c) : c_(c) {}
  Controller& c_;
  uint32_t entries_ = 0;
  std::vector<QueueView> views_;
  std::vector<VirtualQueuePtr> vqs_;
  std::unique_ptr<QueueMapper> mapper_;
};

// Command builders (NVM §3.2). `prp_list` (a 4 KiB page of DMA memory, or null when the
// transfer spans at most two pages) receives the PRP list for longer transfers.
struct PrpList {
  uint64_t* vaddr = nullptr;
  uint64_t iova = 0;
};
// Fills PRP1/PRP2 for `len` bytes at bus address `iova` (contiguous). Returns false if the
// transfer needs a list and none was given, or more entries than one list page holds.
bool fill_prps(SubmissionEntry* cmd, uint64_t iova, uint64_t len, const PrpList& list);
SubmissionEntry make_read(uint32_t nsid, uint64_t slba, uint32_t blocks);
SubmissionEntry make_write(uint32_t nsid, uint64_t slba, uint32_t blocks, bool fua = false);
SubmissionEntry make_flush(uint32_t nsid);
SubmissionEntry make_write_zeroes(uint32_t nsid, uint64_t slba, uint32_t blocks, bool deallocate);
// DSM deallocate of `n` ranges already written to DMA memory at `iova`.
SubmissionEntry make_deallocate(uint32_t nsid, uint64_t iova, uint32_t n);

}  // namespace warpfs::nvme
