// The NVMe driver: brings a controller up over any Transport (Base §3.5.1), identifies it
// and its namespaces, issues admin commands, and creates I/O queue pairs for the queue
// disciplines above (VirtualQueue, LockedQueue, RawQueuePair).
//
// Thread-safety: admin() and queue creation/deletion are serialised internally and may be
// called from any thread. Destroying the Controller shuts the device down (CC.SHN, which
// makes the volatile write cache durable) and frees every queue; REQUIRES (unchecked): no I/O
// in flight (the queue disciplines above hold the in-flight counts, not the Controller).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "warpfs/nvme/queue_pair.h"
#include "warpfs/nvme/spec.h"
#include "warpfs/nvme/status.h"
#include "warpfs/nvme/transport.h"

namespace warpfs::nvme {

struct ControllerOptions {
  uint16_t io_queues = 8;  // requested; the controller may grant fewer
  uint32_t admin_entries = 32;
  bool wrr = true;           // use weighted round robin if CAP.AMS offers it
  uint8_t high_weight = 15;  // Set Features Arbitration (0's based weights)
  uint8_t medium_weight = 3;
  uint8_t low_weight = 0;
  uint64_t admin_timeout_ns = 5'000'000'000ull;
};

struct NamespaceInfo {
  uint32_t nsid = 0;
  uint64_t lba_count = 0;
  uint32_t lba_bytes = 0;
  uint32_t atomic_write_blocks = 1;  // NAWUPF + 1 when NSABP, else AWUPF + 1
};

class Controller {
 public:
  // Resets the controller, sets up the admin queue, enables it and identifies everything.
  static std::unique_ptr<Controller> open(Transport& t, const ControllerOptions& o,
                                          std::string* error);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  Transport& transport() { return t_; }
  const IdentifyController& identify() const { return *id_; }
  const std::vector<NamespaceInfo>& namespaces() const { return namespaces_; }
  const NamespaceInfo* find_namespace(uint32_t nsid) const;
  uint32_t max_transfer_bytes() const { return max_transfer_; }
  uint32_t max_queue_entries() const { return cap_.mqes() + 1; }
  uint16_t io_queues_granted() const { return granted_; }
  bool wrr() const { return wrr_; }
  bool volatile_write_cache() const { return id_->vwc & 1; }

  // Runs one admin command synchronously. `data` (up to 4 KiB) is copied to the device
  // before (to_device) or from it after the command; PRP1 is filled in. dw0 may be null.
  Status admin(SubmissionEntry cmd, void* data, size_t len, bool to_device, uint32_t* dw0);

  // Creates I/O CQ and SQ `qid` (1..io_queues_granted) with `entries` slots each, CQ
  // interrupts on vector qid % vectors. The memory is owned by the Controller.
  Status create_queue_pair(uint16_t qid, uint32_t entries, QueuePriority prio, QueueView* out);
  Status delete_queue_pair(uint16_t qid);
  // Normal shutdown (Base §3.6.1); idempotent. The destructor calls it.
  Status shutdown();

  // Recovery after a failure (a command that never completed, CSTS.CFS, an admin timeout):
  // a Controller Level Reset (Base §3.7.2) deletes every queue, so this disables the
  // controller, starts the admin queue afresh, enables it, sets Number of Queues and the
  // arbitration weights again and re-creates every I/O queue pair on its own memory, zeroed,
  // so the QueueViews handed out stay valid (as Linux's nvme_reset_work does).
  // REQUIRES (unchecked): nobody uses the I/O queues (IoEngine quiesces them first; only it
  // sees their users).
  Status reset();
  // True once an admin command timed out: the controller takes no more until reset().
  bool needs_reset();

 private:
  Controller(Transport& t, const ControllerOptions& o);
  struct IoQueueMemory {
    uint16_t qid = 0;
    uint32_t entries = 0;
    QueuePriority prio = QueuePriority::kMedium;
    uint16_t vector = 0;
    DmaRegion sq, cq;
  };

  bool bring_up(std::string* error);
  Status start_admin(const char** stage);
  Status configure_queues(const char** stage);
  Status create_queues(const IoQueueMemory& q);
  Status wait_ready(bool ready, uint64_t timeout_ns);
  Status disable();
  // CAP.TO: how long the controller may take to change CSTS.RDY.
  uint64_t ready_timeout_ns() const {
    return (cap_.to_500ms() > 0 ? cap_.to_500ms() : 1) * 500'000'000ull;
  }
  uint32_t doorbell_stride() const { return cap_.dstrd(); }

  Transport& t_;
  ControllerOptions o_;
  Cap cap_{};
  std::mutex admin_mu_;  // serialises admin commands and the queue table
  DmaRegion admin_sq_{}, admin_cq_{}, scratch_{};
  std::unique_ptr<RawQueuePair> admin_;
  std::unique_ptr<IdentifyController> id_;
  std::vector<NamespaceInfo> namespaces_;
  std::vector<IoQueueMemory> io_queues_;
  uint32_t max_transfer_ = 0;
  uint16_t granted_ = 0;
  bool wrr_ = false;
  bool shut_down_ = false;
  bool failed_ = false;    // an admin command timed out and may still complete: reset needed
  uint16_t next_cid_ = 0;  // admin command ids, under admin_mu_
};

}  // namespace warpfs::nvme
