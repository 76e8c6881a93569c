// IoEngine: the I/O path the layers above use. It creates the controller's I/O queue pairs,
// wraps each in a VirtualQueue, and puts a QueueMapper with two priority classes on top:
// metadata queues in the high WRR class, bulk queues in the low class (when the controller
// offers WRR; plain round robin otherwise). Commands go through mapper() directly, through
// an IoBatch for up to 32 in flight per thread, or through the synchronous helpers here.
//
// Bounded waiting. A watchdog thread looks at every queue a few times per timeout:
// a queue with commands outstanding and no completion for `io_timeout_ns`, or CSTS.CFS, or an
// admin command that timed out, makes it recover(): every queue stops (their waiters finish
// with Host Aborted Command, which the layers above turn into EIO), the controller is reset
// and its queue pairs re-created, and the queues run again. If the reset fails the queues are
// dead: every command fails at once, nothing waits. A command stuck among a steady stream on
// its queue is noticed when the queue stalls on its command id, at most one lap of the queue
// later, then after the timeout.
//
// Thread-safety: everything except construction may be used from any number of threads.
// REQUIRES: no I/O in flight at destruction; (unchecked) the Controller outlives the engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
  // No completion on a busy queue for this long resets the controller (Linux's default I/O
  // timeout is 30 s too). 0: no watchdog.
  uint64_t io_timeout_ns = 30'000'000'000ull;
  // Recovery messages (one line each, no newline); default: standard error.
  std::function<void(const std::string&)> log;
};

struct EngineCounters {
  uint64_t timeouts = 0;       // queues found with no progress for io_timeout_ns
  uint64_t fatal_status = 0;   // CSTS.CFS seen
  uint64_t resets = 0;         // controller resets that brought the queues back
  uint64_t failed_resets = 0;  // resets that did not (the queues are dead)
  bool dead = false;
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
  // Whether every I/O queue's completions come from a running host thread without delay
  // (each queue's InterruptLine says `prompt`: the emulated controller run inline with no
  // latency or bandwidth model). A drive, or an emulation that models its time, is not.
  bool prompt() const {
    for (const QueueView& v : views_) {
      if (v.irq == nullptr || !v.irq->prompt) return false;
    }
    return !views_.empty();
  }
  uint32_t queue_entries() const { return entries_; }

  // Synchronous convenience: one command through the mapper.
  Status execute(const SubmissionEntry& cmd, Priority p);

  // Stops every queue (commands in flight fail with Host Aborted Command), resets the
  // controller, re-creates the queues and lets commands in again; `why` is logged. On failure
  // the queues are dead. The watchdog calls it; tests and tools may too.
  Status recover(const std::string& why);
  EngineCounters counters() const;
  // Each I/O queue pair's commands in flight and completed so far (relaxed reads, for the
  // live view); empty while a recovery rebuilds the queues.
  struct QueueLoad {
    uint16_t qid = 0;
    uint64_t outstanding = 0, completed = 0;
  };
  std::vector<QueueLoad> queue_loads() const;

 private:
  explicit IoEngine(Controller& c) : c_(c) {}
  void watchdog();
  // The reason to recover now, or "" (called by the watchdog every period).
  std::string check(uint64_t now_ns);
  void log(const std::string& line) const;

  Controller& c_;
  EngineOptions o_;
  std::thread watchdog_;
  std::mutex wd_mu_;  // guards stop_
  std::condition_variable wd_cv_;
  bool stop_ = false;
  mutable std::mutex recover_mu_;  // one recovery at a time; vqs_ and views_ change under it
  struct Progress {
    uint64_t completed = 0;
    uint64_t since_ns = 0;
  };
  std::vector<Progress> progress_;  // per queue; under recover_mu_
  std::atomic<uint64_t> timeouts_{0}, fatal_{0}, resets_{0}, failed_resets_{0};
  std::atomic<bool> dead_{false};
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
