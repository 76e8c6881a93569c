// QueueMapper: spreads commands over several VirtualQueues (GPU4FS thesis §4.1.2), with
// priority classes mapped onto the controller's weighted round robin arbitration.
//
// Each class owns N slots, each slot naming one of the class's K virtual queues (N >= K).
// A command takes `ticket = fetch_add(ticket)` and goes to the queue of slot ticket % N.
// After completing, a thread checks the queue's pressure (the largest number of commands a
// submitter found ahead of it, kept with an atomic max: the thesis's heuristic). Past a
// threshold, the one thread that takes the pressure reading moves its slot to a less loaded
// queue with a compare-and-swap on the slot, so concurrent movers cannot double-move it.
//
// Choosing the target. The thesis's "least outstanding commands" choice herded every mover
// onto the same queue until it became the worst, and the demonstrator fell back to a
// pseudo-random victim (§6, "issues with balancing"). Here a mover samples two queues and
// takes the less loaded one (the power of two choices: different movers pick different
// targets), moves only if the target is clearly better, and never lets a queue own more than
// `max_slots_per_queue` slots or fewer than one: the mapping cannot collapse onto a few queues.
//
// Priority classes (thesis §2.2.4, Base §4.13.2): kMetadata commands use queues created with
// the high WRR class, kBulk the low class, so a command of the first is never stuck behind a
// deep queue of the second when the controller offers WRR; without WRR the classes still have
// separate queues and so no head-of-line blocking between them. Which commands a caller sends
// as which is the caller's choice: the filesystem's journal and metadata I/O, its cache
// lines' write-backs and Flush are kMetadata; file data is kBulk (NamespaceIo, BlockIo).
//
// GPU threads route through the same rule (gpu/io.cuh): the mapper's whole state is one block
// of plain data, Tables, with one layout under g++ and nvcc, which the GPU rig builds with this
// constructor (over the VirtualQueues' GPU addresses) and copies into GPU memory. The static
// route/complete/rebalance take the tables to use; the members use the mapper's own.
//
// Thread-safety: route/complete/execute are safe from any number of threads (host or GPU,
// each on its own copy of the tables). Construction and the queue list are fixed before
// first use.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "warpfs/nvme/check.h"
#include "warpfs/nvme/port.h"
#include "warpfs/nvme/virtual_queue.h"

namespace warpfs::nvme {

enum class Priority : uint8_t { kMetadata = 0, kBulk = 1 };
inline constexpr int kPriorityClasses = 2;

class QueueMapper {
 public:
  static constexpr uint32_t kMaxQueues = 256;
  static constexpr uint32_t kMaxSlots = 1024;

  struct Options {
    uint32_t slots_per_queue = 4;      // N = slots_per_queue * K
    uint32_t max_slots_per_queue = 0;  // 0: 2 * slots_per_queue
    uint64_t remap_threshold = 0;      // 0: a quarter of the queue's entries
    // Entries per queue; 0: read from the first queue. The GPU rig gives it: its queues are
    // in GPU memory, which the constructor cannot read.
    uint32_t queue_entries = 0;
  };

  struct Route {
    uint32_t cls = 0;
    uint32_t slot = 0;
    uint32_t queue = 0;  // index within the class
    uint64_t ticket = 0;
    VirtualQueue* vq = nullptr;
  };

  // A value alone on a 128-byte line under both compilers (port::Padded's line is 64 B under
  // g++ and 128 B under nvcc): Tables must have one layout, since the host library builds
  // them and GPU code reads a copy. On x86, 128 B also keeps the adjacent-line prefetcher from
  // pairing two slots.
  template <typename T>
  struct alignas(128) Line {
    T value;
  };
  struct Class {
    Line<port::Atomic<uint64_t>> ticket;
    uint32_t nslots = 0, nqueues = 0, max_mapped = 0;
    uint64_t threshold = 0;
    VirtualQueue* queues[kMaxQueues] = {};
    Line<port::Atomic<uint32_t>> slots[kMaxSlots];
    Line<port::Atomic<uint32_t>> mapped[kMaxQueues];
  };
  // Everything the mapper knows: plain, trivially copyable data.
  struct Tables {
    Class cls[kPriorityClasses];
    Line<port::Atomic<uint64_t>> remaps;
  };

  // queues[c] are the virtual queues of class c (a class may reuse another's queues when
  // the controller granted too few). REQUIRES: every class has 1..kMaxQueues queues.
  QueueMapper(std::vector<std::vector<VirtualQueue*>> queues, const Options& o);

  Route route(Priority p) { return route(t_.get(), p); }
  // The routing rule over tables `t`: this mapper's, or a copy of them in GPU memory.
  WARPFS_HD static Route route(Tables* t, Priority p) {
    Class& c = t->cls[static_cast<int>(p)];
    Route r;
    r.cls = static_cast<uint32_t>(p);
    r.ticket = c.ticket.value.fetch_add(1, port::Order::kRelaxed);
    r.slot = static_cast<uint32_t>(r.ticket % c.nslots);
    r.queue = c.slots[r.slot].value.load(port::Order::kRelaxed);
    r.vq = c.queues[r.queue];
    return r;
  }

  // Called after a routed command completes: may move its slot to a less loaded queue.
  void complete(const Route& r) { complete(t_.get(), r); }
  WARPFS_HD static void complete(Tables* t, const Route& r) {
    rebalance(
        t, r, [t, &r](uint32_t q) { return t->cls[r.cls].queues[q]->outstanding(); },
        [&r] { return r.vq->pressure(); }, [&r] { return r.vq->take_pressure(); });
  }

  // The remapping decision with the load made pluggable, so that a model-based test can
  // drive it with synthetic loads. `load(q)` is queue q's outstanding commands;
  // `pressure()`/`take_pressure()` read and reset the routed queue's pressure.
  template <typename Load, typename Pressure, typename Take>
  bool rebalance(const Route& r, Load&& load, Pressure&& pressure, Take&& take) {
    return rebalance(t_.get(), r, load, pressure, take);
  }
  template <typename Load, typename Pressure, typename Take>
  WARPFS_HD static bool rebalance(Tables* t, const Route& r, Load&& load, Pressure&& pressure,
                                  Take&& take) {
    Class& c = t->cls[r.cls];
    if (c.nqueues < 2 || pressure() <= c.threshold) return false;
    if (take() <= c.threshold) return false;  // another thread took this reading
    // Two choices, drawn from the ticket (a cheap hash; movers pick different pairs).
    const uint64_t h = (r.ticket + 1) * 0x9e3779b97f4a7c15ull;
    const uint32_t a = static_cast<uint32_t>((h >> 17) % c.nqueues);
    const uint32_t b = static_cast<uint32_t>((h >> 41) % c.nqueues);
    const uint32_t target = load(a) <= load(b) ? a : b;
    if (target == r.queue) return false;
    if (load(target) + c.threshold / 2 >= load(r.queue)) return false;  // not clearly better
    if (c.mapped[target].value.load(port::Order::kRelaxed) >= c.max_mapped) return false;
    if (c.mapped[r.queue].value.load(port::Order::kRelaxed) <= 1) return false;
    uint32_t expected = r.queue;
    if (!c.slots[r.slot].value.compare_exchange(expected, target, port::Order::kRelaxed)) {
      return false;
    }
    // The counts may be off by one transiently; they only gate future moves.
    c.mapped[r.queue].value.fetch_sub(1, port::Order::kRelaxed);
    c.mapped[target].value.fetch_add(1, port::Order::kRelaxed);
    t->remaps.value.fetch_add(1, port::Order::kRelaxed);
    return true;
  }

  // Host only: one synchronous command.
  uint16_t execute(const SubmissionEntry& cmd, Priority p, uint32_t* dw0 = nullptr) {
    Route r = route(p);
    const uint16_t s = r.vq->execute(cmd, dw0);
    complete(r);
    return s;
  }

  // The mapper's state, to copy elsewhere (the GPU rig copies it into GPU memory).
  const Tables& tables() const { return *t_; }

  uint32_t slots(Priority p) const { return cls(p).nslots; }
  uint32_t queues(Priority p) const { return cls(p).nqueues; }
  uint32_t slot_queue(Priority p, uint32_t slot) const {
    return cls(p).slots[slot].value.load(port::Order::kRelaxed);
  }
  uint32_t mapped(Priority p, uint32_t q) const {
    return cls(p).mapped[q].value.load(port::Order::kRelaxed);
  }
  uint32_t max_mapped(Priority p) const { return cls(p).max_mapped; }
  uint64_t remaps() const { return t_->remaps.value.load(port::Order::kRelaxed); }

 private:
  const Class& cls(Priority p) const { return t_->cls[static_cast<int>(p)]; }

  std::unique_ptr<Tables> t_;
};
static_assert(sizeof(QueueMapper::Line<port::Atomic<uint32_t>>) == 128,
              "one layout of the tables under g++ and nvcc");
static_assert(std::is_trivially_copyable_v<QueueMapper::Tables>,
              "the GPU rig copies the tables bytewise");

}  // namespace warpfs::nvme
