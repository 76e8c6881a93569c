// Internal: the emulated controller's device model. See warpfs/nvme/emulated.h for the
// contract. Lock order: Worker::mu of worker 0, then of workers 1..n-1 in index order, then
// a CqState::mu, then error_mu_/trace_mu_. Admin commands run on worker 0 and take every
// worker's mu before changing the queue tables, so a worker reads them under its own mu.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <queue>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "emu_store.h"
#include "warpfs/nvme/emulated.h"
#include "warpfs/nvme/spec.h"

namespace warpfs::nvme {

class EmulatedController {
 public:
  EmulatedController(const EmulatedConfig& config, std::shared_ptr<BackingStore> store);
  ~EmulatedController();
  bool start(std::string* error);

  // Transport surface.
  uint32_t read32(uint32_t offset);
  void write32(uint32_t offset, uint32_t value);
  uint64_t read64(uint32_t offset);
  void write64(uint32_t offset, uint64_t value);
  Doorbell doorbell(uint16_t qid, bool cq);
  InterruptLine* interrupt(uint16_t vector);
  uint16_t vectors() const { return config_.interrupt_vectors; }
  emu::DmaSpace& dma() { return dma_; }

  void pause(bool paused);
  EmulatedCounters counters() const;
  void trace_fetches(bool enable);
  std::vector<uint16_t> fetch_trace() const;
  void power_cut(double persist_probability);
  const EmulatedConfig& config() const { return config_; }
  void inject(const Fault& f);
  void inject_fatal(bool persistent);
  void clear_faults();
  void set_capacity_exceeded(bool full) { capacity_exceeded_.store(full); }
  uint64_t faults_hit() const { return faults_hit_.load(); }

 private:
  struct Namespace {
    uint64_t base;  // byte offset in the backing store
    uint64_t lba_count;
    uint32_t lba_shift;  // log2 of the LBA size
  };
  struct SqState {
    bool live = false;
    SubmissionEntry* ring = nullptr;
    uint32_t size = 0;
    uint32_t head = 0;  // owned by the SQ's worker
    uint16_t cqid = 0;
    QueuePriority prio = QueuePriority::kMedium;
  };
  struct CqState {
    std::mutex mu;  // serialises posting: several SQs (workers) may share a CQ
    bool live = false;
    CompletionEntry* ring = nullptr;
    uint32_t size = 0;
    uint32_t tail = 0;
    uint32_t head = 0;  // the last valid CQ head doorbell value
    bool phase = true;  // Base §4.6: the first pass through a CQ posts phase tag 1
    bool ien = false;
    uint16_t vector = 0;
    uint32_t sq_refs = 0;
  };
  struct Completion {
    uint64_t due_ns;
    uint16_t sqid;
    uint16_t cid;
    uint16_t status;
    uint32_t dw0;
    bool operator>(const Completion& o) const { return due_ns > o.due_ns; }
  };
  struct Worker {
    std::thread thread;
    std::mutex mu;
    DoorbellKick kick;
    std::priority_queue<Completion, std::vector<Completion>, std::greater<>> timed;
    std::vector<Completion> ready;    // due, in posting order
    std::vector<Completion> blocked;  // their CQ was full
    // post_ready()'s scratch (kept: no allocation per round): the vectors to raise, and the
    // (vector, key) of each CQE posted to an interrupt-enabled CQ (InterruptLine::raise_key).
    std::vector<uint16_t> raised;
    std::vector<std::pair<uint16_t, uint32_t>> keys;
    std::vector<Completion> still_blocked;
    std::vector<emu::Segment> segs;
    std::mt19937_64 rng;
    uint64_t last_work_ns = 0;
    // How late this worker's timed futex waits return, averaged (park()): it sleeps until
    // 1.5 times that before a due completion and yields the rest of the way. Worker thread
    // only. A guess until the first timed wait has measured it.
    uint64_t overshoot_ns = 20'000;
    // Time in arbitration rounds that found work (EmulatedCounters::busy_ns): written by this
    // worker's thread only, read by counters() from any thread (relaxed atomic).
    std::atomic<uint64_t> busy_ns{0};
    // This worker's I/O counts (EmulatedCounters, the SMART log): written by whoever holds mu
    // (the worker or an inline ringer) with a load and a store, read by counters() from any
    // thread. Per worker, so that workers share no counter line (one shared line of atomics
    // that every command incremented cost the GPU rig's 14 workers more than the command).
    struct IoCounts {
      std::atomic<uint64_t> commands{0}, reads{0}, writes{0}, flushes{0}, bytes_read{0},
          bytes_written{0};
    } io;
    EmulatedController* owner = nullptr;
    unsigned idx = 0;
  };
  struct Result {
    uint16_t status;
    uint32_t dw0;
    bool lost = false;  // an injected kNoCompletion: no completion is ever posted
  };

  void run(unsigned idx);
  bool pass(unsigned idx);
  bool run_inline(unsigned idx);
  static constexpr int kInlineRounds = 64;
  bool has_work(unsigned idx);
  // When the worker must run next for completions it holds (0: none held). REQUIRES w.mu.
  static uint64_t next_wake(const Worker& w, uint64_t now);
  void park(unsigned idx);
  bool handle_cc();
  void reset_locked();
  uint32_t fetch(Worker& w, uint16_t qid, uint32_t budget);
  bool post_ready(Worker& w);
  bool post(const Completion& c, Worker& w);
  void clear_doorbells();  // every SQ tail and CQ head register back to 0
  void lock_others();
  void unlock_others();

  Result execute_admin(Worker& w, const SubmissionEntry& cmd);
  Result execute_io(Worker& w, const SubmissionEntry& cmd);
  Result identify(Worker& w, const SubmissionEntry& cmd);
  Result get_log_page(Worker& w, const SubmissionEntry& cmd);
  Result features(const SubmissionEntry& cmd, bool set);
  Result create_cq(const SubmissionEntry& cmd);
  Result create_sq(const SubmissionEntry& cmd);
  Result delete_queue(const SubmissionEntry& cmd, bool cq);
  Result read_write(Worker& w, const SubmissionEntry& cmd, const Namespace& ns, bool write);
  Result dataset_management(Worker& w, const SubmissionEntry& cmd, const Namespace& ns);
  // Builds the segment list for a transfer of `len` bytes described by PRP1/PRP2 (Base §4.3).
  uint16_t map_prps(const SubmissionEntry& cmd, uint64_t len, std::vector<emu::Segment>* out);
  Result copy_out(Worker& w, const SubmissionEntry& cmd, const void* data, size_t len);
  void log_error(uint16_t sqid, const SubmissionEntry& cmd, uint16_t status, uint64_t lba);
  void log_error_raw(uint16_t sqid, uint16_t cid, uint16_t status);

  uint32_t reg_load(uint32_t offset) const;
  void reg_store(uint32_t offset, uint32_t value);
  unsigned worker_of(uint16_t qid) const { return qid % workers_.size(); }
  uint64_t page_bytes() const { return 4096; }  // CC.MPS = 0 is all this device supports
  uint64_t max_transfer() const { return config_.mdts ? page_bytes() << config_.mdts : ~0ull; }

  EmulatedConfig config_;
  emu::Media media_;
  emu::DmaSpace dma_;
  std::vector<Namespace> namespaces_;
  uint32_t dstrd_;
  uint64_t store_bytes_;
  std::unique_ptr<port::Atomic<uint32_t>[]> regs_;  // the register file (BAR0)
  uint32_t reg_words_;
  std::unique_ptr<InterruptLine[]> irqs_;
  // Queue state, changed only with every worker's mu held (lock_others() from worker 0's
  // pass, which holds its own), read by a worker under its own mu.
  std::vector<SqState> sqs_;
  // One past the highest live SQ id (1 while only the admin queue is): arbitration and
  // has_work() look at SQs below it only, each worker at its own (q % workers). Sized for
  // max_io_queues (64 by default), a pass over every slot was 9 % of the daemon's samples in
  // 4 KiB O_DIRECT reads, with 5 queues live. Same rule as sqs_. set_sq_end() recomputes it.
  uint32_t sq_end_ = 1;
  void set_sq_end();
  // The first SQ id that worker `idx` serves, and the step to its next.
  uint32_t first_sq(unsigned idx) const { return idx; }
  uint32_t sq_step() const { return static_cast<uint32_t>(workers_.size()); }
  std::unique_ptr<CqState[]> cqs_;
  std::deque<Worker> workers_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};
  std::atomic<bool> dead_{false};

  // Worker 0's controller state (under worker 0's mu).
  uint32_t cc_seen_ = 0;
  // Set by write32 when the host clears CC.EN: the worker resets even if the host sets EN
  // again before it has looked (a controller that never became ready answers at once).
  std::atomic<bool> disable_seen_{false};
  bool enabled_ = false;
  uint16_t granted_sq_ = 0;  // 0's based count granted by Number of Queues
  uint16_t granted_cq_ = 0;
  uint32_t arbitration_ = 0;  // Set Features FID 01h CDW11
  bool wrr_active_ = false;
  uint32_t io_queues_live_ = 0;

  mutable std::mutex error_mu_;
  std::deque<ErrorLogEntry> error_log_;  // newest first, at most 64
  uint64_t error_count_ = 0;

  // Injected faults (test hook). `any_fault_` keeps the common path to one relaxed load.
  Result injected(uint32_t nsid, uint64_t slba, uint64_t nlb, bool write);
  std::mutex fault_mu_;
  std::vector<Fault> faults_;
  std::atomic<bool> any_fault_{false};
  // Injected CSTS.CFS: 0 none, 1 until the next reset, 2 for good. Worker 0 raises the bit.
  std::atomic<uint8_t> fatal_{0};
  std::atomic<bool> capacity_exceeded_{false};
  std::atomic<uint64_t> faults_hit_{0};
  mutable std::mutex trace_mu_;
  std::atomic<bool> tracing_{false};
  std::vector<uint16_t> trace_;

  std::atomic<uint64_t> n_admin_{0}, n_errors_{0}, n_kicks_{0};
  // Sum of a per-worker I/O count over the workers.
  uint64_t io_sum(std::atomic<uint64_t> Worker::IoCounts::*field) const;
  // The bandwidth model's channel (config_.bandwidth_bytes_per_s): when it is next free,
  // and the time reserved on it in all. Workers reserve with a compare-and-swap; relaxed
  // orders suffice: only the value matters, nothing else is published through it.
  std::atomic<uint64_t> channel_free_ns_{0}, transfer_ns_{0};
  // When a transfer of `cmd` (a Read or Write) fetched at `now` ends on the channel; `now`
  // for any other command or without a bandwidth.
  uint64_t transfer_end(const SubmissionEntry& cmd, uint64_t now);
};

}  // namespace warpfs::nvme
