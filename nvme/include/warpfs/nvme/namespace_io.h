// NamespaceIo: the NVMe namespace I/O unit. It moves whole blocks between memory and one
// namespace through the IoEngine's queue mapper, and is everything the layers above need to
// know of NVMe: block b is LBAs [b * L, (b + 1) * L) with L = block_bytes / lba_bytes.
//
//   - io() takes up to kMaxIos transfers and has them in flight together as one IoBatch
//     (up to 32 commands from one thread). A transfer longer than the controller's MDTS is
//     split into several commands (NVMe Base §5.15.2.2, Figure 275, MDTS); each command's
//     PRP list (§4.1.1) comes from a per-call scratch page pooled across calls.
//   - start() is io() in two halves: it returns with the commands in flight, and whoever
//     holds the Started (any thread, one at a time) polls them to their end, so that no
//     thread waits out the device's latency for one request (BaM Ch. 7: a warp issues and
//     goes on; the FUSE daemon answers a read when it completes).
//   - Memory from alloc() is DMA memory: transfers in it go to the device without a copy.
//     Any other memory is bounced through pooled DMA scratch (copied in before a write,
//     out after a read).
//   - Each transfer names its priority class (queue_mapper.h): metadata commands go to the
//     queues created in the high weighted-round-robin class, bulk ones to the low class.
//     Flush is in the metadata class (a commit waits on it).
//   - Every command is counted and timed by class (read, write, flush, trim) for the live
//     view: from its submission to its completion, so a batch's transfers each count the
//     batch's time (each is complete by then).
//
// Errors are values: each transfer's status says how it ended (the first failed command of
// a split transfer decides it).
//
// Thread-safety: everything may be called from any number of threads at once.
// REQUIRES: the IoEngine outlives the NamespaceIo; no I/O in flight at destruction.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "warpfs/nvme/io_batch.h"
#include "warpfs/nvme/io_engine.h"
#include "warpfs/nvme/latency.h"
#include "warpfs/nvme/port.h"
#include "warpfs/nvme/queue_mapper.h"
#include "warpfs/nvme/status.h"
#include "warpfs/nvme/transport.h"

namespace warpfs::nvme {

// One transfer: `count` whole blocks from `block`, into or out of `data`.
struct BlockIo {
  uint64_t block = 0;
  uint32_t count = 1;
  bool write = false;
  uint8_t* data = nullptr;
  Status status;                        // set by io()
  Priority priority = Priority::kBulk;  // the class of its commands
};

class NamespaceIo {
 public:
  static constexpr int kMaxIos = 32;  // one warp

 private:
  // Per-call scratch: one PRP list page per command in flight and a bounce buffer for data
  // that does not live in DMA memory. Pooled so that a miss path does not allocate.
  struct Scratch {
    DmaRegion lists;
    DmaRegion bounce;
  };

 public:
  struct Options {
    // false: every command goes to the bulk class, whatever the transfer asks (a baseline
    // for measuring what the metadata class buys).
    bool priorities = true;
  };

  // The classes commands are counted and timed by.
  enum Class : unsigned { kRead, kWrite, kFlush, kTrim, kClasses };
  static constexpr const char* kClassNames[kClasses] = {"read", "write", "flush", "trim"};
  struct ClassStats {
    LatencyHistogram::Snapshot latency;  // count, max and quantiles of command latency
    uint64_t bytes = 0;                  // data moved (reads and writes)
    uint64_t bounced = 0;                // of which copied through the bounce buffer
  };

  // REQUIRES: block_bytes is a power of two, a multiple of the namespace's LBA size and at
  // most 64 KiB (checked: an error otherwise).
  static std::unique_ptr<NamespaceIo> create(IoEngine& engine, uint32_t nsid, uint32_t block_bytes,
                                             const Options& o, std::string* error);
  static std::unique_ptr<NamespaceIo> create(IoEngine& engine, uint32_t nsid, uint32_t block_bytes,
                                             std::string* error) {
    return create(engine, nsid, block_bytes, Options{}, error);
  }
  ~NamespaceIo();
  NamespaceIo(const NamespaceIo&) = delete;
  NamespaceIo& operator=(const NamespaceIo&) = delete;

  uint32_t nsid() const { return nsid_; }
  uint32_t block_bytes() const { return block_bytes_; }
  uint64_t block_count() const { return block_count_; }
  IoEngine& engine() { return e_; }

  // DMA memory (from the transport) that io() moves without a copy.
  Status alloc(size_t bytes, void** out);
  // REQUIRES (unchecked): no I/O in flight on the memory.
  void free(void* p, size_t bytes);

  // Performs every transfer (at most kMaxIos), all in flight together where the device
  // allows, and sets each one's status.
  void io(BlockIo* ios, int n);

  // Transfers in flight from start(): their commands stay on the device's queues until a
  // poll() has seen every completion; then each transfer's status is set and the Started may
  // start again. Destroying one that is in flight waits for its commands (a submitted
  // command must be seen through). Thread-safety: one thread at a time; it may pass between
  // threads where a lock or a queue orders their uses.
  class Started {
   public:
    explicit Started(NamespaceIo& ns) : ns_(ns), batch_(ns.e_.mapper()) {}
    ~Started();
    Started(const Started&) = delete;
    Started& operator=(const Started&) = delete;

    // Polls the commands once: true once every one has completed (and at once for a
    // Started that holds nothing in flight). The read and write latencies counted are to the
    // poll that found the last completion.
    bool poll();
    // Sleeps (bounded) until a command may have completed, or backs off (IoBatch::idle): call
    // after a poll() that returned false; `b` is the caller's, reset by it on progress.
    void idle(port::Backoff& b) { batch_.idle(b); }

   private:
    friend class NamespaceIo;
    void finish();  // every completion seen: statuses, statistics, scratch back

    NamespaceIo& ns_;
    IoBatch batch_;
    BlockIo* ios_ = nullptr;
    uint64_t t0_ = 0;
    struct Piece {
      uint32_t io;  // the transfer it belongs to
      uint32_t bytes;
    };
    Piece pieces_[IoBatch::kWidth] = {};
    size_t npieces_ = 0;
    Scratch sc_;
    bool in_flight_ = false;
  };
  // Starts the transfers (at most kMaxIos) and returns with their commands in flight, where
  // every transfer lies in memory from alloc() and they take one batch's commands at most;
  // `s` then holds them until its poll() returns true. Otherwise it performs them as io() does
  // (a bounced transfer needs its copy after the read) and s.poll() is true at once. Either
  // way each transfer's status is set by the time s.poll() returns true.
  // REQUIRES: s holds nothing in flight; `ios` and the memory stay until then.
  void start(BlockIo* ios, int n, Started* s);
  // Makes everything completed so far durable (NVMe Flush, in the metadata class unless
  // Options::priorities is off).
  Status flush();
  // Tells the device the blocks no longer hold data (Dataset Management, deallocate).
  Status trim(uint64_t block, uint64_t count);

  ClassStats stats(Class c) const;

 private:
  NamespaceIo(IoEngine& e, uint32_t nsid);  // in the .cc: ScratchPool is complete there
  // The bus address of [p, p + len) if it lies inside memory from alloc(), else 0.
  uint64_t iova_of(const void* p, size_t len);
  Priority priority(Priority asked) const { return o_.priorities ? asked : Priority::kBulk; }
  // [block, block + count) is a non-empty range inside the namespace.
  bool in_range(uint64_t block, uint64_t count) const {
    return count != 0 && block < block_count_ && count <= block_count_ - block;
  }
  void note(Class c, uint64_t t0, uint64_t bytes);
  // The LBA `off` bytes into a transfer from `block`.
  uint64_t lba_of(uint64_t block, uint64_t off) const {
    return (block * block_bytes_ + off) >> lba_shift_;
  }
  SubmissionEntry rw_command(const BlockIo& io, uint64_t lba, uint32_t bytes, uint64_t iova,
                             const PrpList& list) const;
  static PrpList list_page(const Scratch& sc, size_t k);
  struct Cmd;
  void run_round(BlockIo* ios, Cmd* cmds, size_t n, const Scratch& sc);

  class ScratchPool;  // DMA scratch (PRP lists, bounce buffers) reused across calls
  std::unique_ptr<ScratchPool> pool_;
  IoEngine& e_;
  Transport& t_;
  Options o_;
  uint32_t nsid_;
  uint32_t block_bytes_ = 0;
  uint32_t lba_shift_ = 0;
  uint64_t block_count_ = 0;
  uint32_t max_transfer_ = 0;
  // Memory from alloc(): written under mu_ (rare), read lock-free by io() on every call.
  // A slot is live while `bytes` is non-zero; published with release, read with acquire.
  struct Region {
    port::Atomic<uint64_t> vaddr, iova, bytes;
  };
  static constexpr uint32_t kMaxRegions = 256;
  std::mutex mu_;
  Region regions_[kMaxRegions] = {};
  port::Atomic<uint32_t> nregions_ = {};
  std::vector<DmaRegion> owned_;  // under mu_, for free() and the destructor
  // Relaxed atomics: every caller adds at once; readers see a recent value.
  LatencyHistogram latency_[kClasses];
  std::atomic<uint64_t> bytes_[kClasses] = {};
  std::atomic<uint64_t> bounced_[kClasses] = {};
};

}  // namespace warpfs::nvme
